//go:build cuda

// This file is built only with -tags cuda, on a machine with CUDA and NCCL
// (libcudart, libnccl and their headers). Nothing else in ucp needs it.

package load

/*
#cgo LDFLAGS: -lnccl -lcudart
#include <cuda_runtime.h>
#include <nccl.h>
#include <string.h>

static int ucp_nccl_id_bytes(void) { return NCCL_UNIQUE_ID_BYTES; }
*/
import "C"

import (
	"context"
	"encoding/binary"
	"fmt"
	"unsafe"
)

// NCCLComm all-gathers through NCCL on the GPUs of the group: the blocks go
// host -> device, one ncclAllGather, device -> host. The unique id that
// NCCL needs to form the group is exchanged over a bootstrap Comm (the TCP
// ring), which also carries the block sizes (NCCL gathers equal counts, so
// blocks are padded to the largest).
type NCCLComm struct {
	boot   Comm
	comm   C.ncclComm_t
	stream C.cudaStream_t
	device int
}

func cudaErr(what string, e C.cudaError_t) error {
	if e == C.cudaSuccess {
		return nil
	}
	return fmt.Errorf("%s: %s", what, C.GoString(C.cudaGetErrorString(e)))
}

func ncclErr(what string, r C.ncclResult_t) error {
	if r == C.ncclSuccess {
		return nil
	}
	return fmt.Errorf("%s: %s", what, C.GoString(C.ncclGetErrorString(r)))
}

// NewNCCLComm forms an NCCL group of boot's ranks on the given CUDA device.
func NewNCCLComm(ctx context.Context, boot Comm, device int) (*NCCLComm, error) {
	if err := cudaErr("cudaSetDevice", C.cudaSetDevice(C.int(device))); err != nil {
		return nil, err
	}
	var id C.ncclUniqueId
	idBytes := int(C.ucp_nccl_id_bytes())
	var mine []byte
	if boot.Rank() == 0 {
		if err := ncclErr("ncclGetUniqueId", C.ncclGetUniqueId(&id)); err != nil {
			return nil, err
		}
		mine = C.GoBytes(unsafe.Pointer(&id), C.int(idBytes))
	}
	all, err := boot.AllGather(ctx, mine)
	if err != nil {
		return nil, err
	}
	if len(all[0]) != idBytes {
		return nil, fmt.Errorf("rank 0 sent an NCCL id of %d bytes, want %d", len(all[0]), idBytes)
	}
	C.memcpy(unsafe.Pointer(&id), unsafe.Pointer(&all[0][0]), C.size_t(idBytes))
	c := &NCCLComm{boot: boot, device: device}
	if err := ncclErr("ncclCommInitRank", C.ncclCommInitRank(&c.comm, C.int(boot.Size()), id, C.int(boot.Rank()))); err != nil {
		return nil, err
	}
	if err := cudaErr("cudaStreamCreate", C.cudaStreamCreate(&c.stream)); err != nil {
		C.ncclCommDestroy(c.comm)
		return nil, err
	}
	return c, nil
}

func (c *NCCLComm) Rank() int { return c.boot.Rank() }
func (c *NCCLComm) Size() int { return c.boot.Size() }

// AllGather implements Comm.
func (c *NCCLComm) AllGather(ctx context.Context, block []byte) ([][]byte, error) {
	var size [8]byte
	binary.LittleEndian.PutUint64(size[:], uint64(len(block)))
	sizes, err := c.boot.AllGather(ctx, size[:])
	if err != nil {
		return nil, err
	}
	var most uint64
	lens := make([]uint64, len(sizes))
	for i, s := range sizes {
		if len(s) != 8 {
			return nil, fmt.Errorf("rank %d sent a malformed size", i)
		}
		lens[i] = binary.LittleEndian.Uint64(s)
		most = max(most, lens[i])
	}
	if most == 0 {
		return make([][]byte, len(sizes)), nil
	}
	n := C.size_t(most)
	var send, recv unsafe.Pointer
	if err := cudaErr("cudaMalloc", C.cudaMalloc(&send, n)); err != nil {
		return nil, err
	}
	defer C.cudaFree(send)
	if err := cudaErr("cudaMalloc", C.cudaMalloc(&recv, n*C.size_t(len(sizes)))); err != nil {
		return nil, err
	}
	defer C.cudaFree(recv)
	if err := cudaErr("cudaMemset", C.cudaMemset(send, 0, n)); err != nil {
		return nil, err
	}
	if len(block) > 0 {
		if err := cudaErr("cudaMemcpy", C.cudaMemcpy(send, unsafe.Pointer(&block[0]), C.size_t(len(block)), C.cudaMemcpyHostToDevice)); err != nil {
			return nil, err
		}
	}
	if err := ncclErr("ncclAllGather", C.ncclAllGather(send, recv, n, C.ncclUint8, c.comm, c.stream)); err != nil {
		return nil, err
	}
	if err := cudaErr("cudaStreamSynchronize", C.cudaStreamSynchronize(c.stream)); err != nil {
		return nil, err
	}
	host := make([]byte, int(n)*len(sizes))
	if err := cudaErr("cudaMemcpy", C.cudaMemcpy(unsafe.Pointer(&host[0]), recv, C.size_t(len(host)), C.cudaMemcpyDeviceToHost)); err != nil {
		return nil, err
	}
	out := make([][]byte, len(sizes))
	for i := range out {
		out[i] = host[uint64(i)*most : uint64(i)*most+lens[i]]
	}
	return out, nil
}

// Close destroys the NCCL group and the stream; the bootstrap Comm stays open.
func (c *NCCLComm) Close() error {
	C.cudaStreamDestroy(c.stream)
	return ncclErr("ncclCommDestroy", C.ncclCommDestroy(c.comm))
}
