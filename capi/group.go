package main

/*
#include <stdint.h>
// ucp_ptr turns an address the caller passed (a tensor's data_ptr) into a pointer.
static inline void *ucp_ptr(uint64_t p) { return (void *)(uintptr_t)p; }
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"runtime/cgo"
	"time"
	"unsafe"

	"github.com/ucp-project/ucp/internal/load"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// ucp_listen opens the TCP listener of this rank's place in a group load's
// ring, on host (an address of this machine the other ranks can reach)
// and a port the system picks. The caller exchanges the returned address
// with its peers (torch.distributed's all_gather_object) and passes the
// handle to ucp_group_load, which takes it over; ucp_listener_close
// releases one that is not used.
//
//export ucp_listen
func ucp_listen(host *C.char, handle *C.uintptr_t, addr **C.char) (msg *C.char) {
	defer guard(&msg)
	if handle == nil || addr == nil {
		return cerr(errors.New("ucp_listen: NULL output"))
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(C.GoString(host), "0"))
	if err != nil {
		return cerr(fmt.Errorf("ucp: listening for the group's ring: %w", err))
	}
	*handle = C.uintptr_t(cgo.NewHandle(ln))
	*addr = C.CString(ln.Addr().String())
	return nil
}

// takeListener returns the listener of a handle and deletes the handle.
func takeListener(h C.uintptr_t) (ln net.Listener, err error) {
	defer func() {
		if recover() != nil {
			err = errors.New("ucp: invalid or used listener handle")
		}
	}()
	if h == 0 {
		return nil, errors.New("ucp: invalid or used listener handle")
	}
	ln, ok := cgo.Handle(h).Value().(net.Listener)
	if !ok {
		return nil, errors.New("ucp: invalid listener handle")
	}
	cgo.Handle(h).Delete()
	return ln, nil
}

//export ucp_listener_close
func ucp_listener_close(h C.uintptr_t) (msg *C.char) {
	defer guard(&msg)
	ln, err := takeListener(h)
	if err != nil {
		return cerr(err)
	}
	return cerr(ln.Close())
}

// groupSpec is ucp_group_load's request (ABI.md).
type groupSpec struct {
	Rank    int64           `json:"rank"`
	World   int64           `json:"world"`
	Addrs   []string        `json:"addrs"`
	Timeout float64         `json:"timeout_s"`
	Device  int64           `json:"device"` // -1: CPU memory; else the CUDA device of every destination
	Args    json.RawMessage `json:"args"`
	Items   []groupItem     `json:"items"`
	// NCCLLibrary: the libnccl.so.2 to open (the process's own, e.g. torch's); ForceNCCL: NCCL even for one rank.
	NCCLLibrary string `json:"nccl_library"`
	ForceNCCL   bool   `json:"force_nccl"`
}

type groupItem struct {
	Param  string `json:"param"`
	State  string `json:"state"`
	Layout int64  `json:"layout"`
	N      int64  `json:"n"`
	Rank   int64  `json:"rank"`
	Padded int64  `json:"padded"`
	Start  int64  `json:"start"`
	Count  int64  `json:"count"`
	DType  int64  `json:"dtype"`
}

// items checks the spec against the checkpoint and the destinations:
// every shard from the manifest's shapes, every range inside its shard,
// every destination exactly the item's size.
func (c *ckpt) items(spec *groupSpec, ptrs []uint64, sizes []int64) ([]load.Item, error) {
	if len(spec.Items) != len(ptrs) {
		return nil, fmt.Errorf("ucp_group_load: %d items in the request, %d destinations", len(spec.Items), len(ptrs))
	}
	out := make([]load.Item, len(spec.Items))
	for i, q := range spec.Items {
		sh, err := c.shard(q.Param, q.State, q.Layout, q.N, q.Rank, q.Padded)
		if err != nil {
			return nil, err
		}
		total := torchfile.Numel(sh.Shape)
		if q.Start < 0 || q.Count < 0 || q.Start > maxElements || q.Count > maxElements || q.Start+q.Count > total {
			return nil, fmt.Errorf("%s/%s: elements [%d, %d) of a shard of %d", q.Param, q.State, q.Start, q.Start+q.Count, total)
		}
		it := load.Item{Param: q.Param, State: q.State, Shard: sh, Start: q.Start, N: q.Count}
		if q.DType == dtypeStored {
			p, _ := c.r.Param(q.Param)
			if it.DType, err = p.StateDType(); err != nil {
				return nil, err
			}
			it.Stored = true
		} else if t, ok := dtypes[C.int(q.DType)]; ok && q.DType >= 0 && q.DType < 3 {
			it.DType = t
		} else {
			return nil, fmt.Errorf("unknown element type code %d", q.DType)
		}
		if sizes[i] != it.Bytes() || (sizes[i] > 0 && ptrs[i] == 0) {
			return nil, fmt.Errorf("%s/%s: a destination of %d bytes at %#x for %d %v elements", q.Param, q.State, sizes[i], ptrs[i], q.Count, it.DType)
		}
		out[i] = it
	}
	return out, nil
}

// ucp_group_load loads a group's request (JSON, ABI.md) into the count
// destinations ptrs[i] of sizes[i] bytes: CPU memory, or CUDA device
// memory in a -tags cuda build. It takes over the listener. stats gets a
// JSON of load.GroupStats (free it with ucp_free), also after a failure.
//
//export ucp_group_load
func ucp_group_load(h C.uintptr_t, listener C.uintptr_t, request *C.char, ptrs *C.uint64_t, sizes *C.int64_t,
	count C.int64_t, stats **C.char) (msg *C.char) {
	defer guard(&msg)
	ln, err := takeListener(listener)
	if err != nil {
		return cerr(err)
	}
	defer ln.Close()
	c, err := lookup(h)
	if err != nil {
		return cerr(err)
	}
	if count < 0 || count > maxItems || (count > 0 && (ptrs == nil || sizes == nil)) || stats == nil || request == nil {
		return cerr(fmt.Errorf("ucp_group_load: %d destinations (0 to %d)", int64(count), maxItems))
	}
	var spec groupSpec
	if err := json.Unmarshal([]byte(C.GoString(request)), &spec); err != nil {
		return cerr(fmt.Errorf("ucp_group_load: malformed request: %w", err))
	}
	if spec.World < 1 || spec.World > load.MaxRanks || spec.Rank < 0 || spec.Rank >= spec.World || int64(len(spec.Addrs)) != spec.World {
		return cerr(fmt.Errorf("ucp_group_load: rank %d of %d with %d addresses", spec.Rank, spec.World, len(spec.Addrs)))
	}
	if spec.Timeout < 0 || spec.Timeout > 1e6 {
		return cerr(fmt.Errorf("ucp_group_load: timeout of %v s", spec.Timeout))
	}
	timeout := time.Duration(spec.Timeout * float64(time.Second))
	if timeout == 0 {
		timeout = load.DefaultTimeout
	}
	var ps []uint64
	var ss []int64
	if count > 0 {
		ps = unsafe.Slice((*uint64)(unsafe.Pointer(ptrs)), int(count))
		ss = unsafe.Slice((*int64)(unsafe.Pointer(sizes)), int(count))
	}
	items, err := c.items(&spec, ps, ss)
	if err != nil {
		return cerr(err)
	}
	opt := load.GroupOptions{Timeout: timeout, Args: string(spec.Args)}
	if len(spec.Args) == 0 {
		opt.Args = ""
	}
	t := time.Now()
	ctx := context.Background()
	dial, cancel := context.WithTimeout(ctx, timeout)
	comm, err := load.NewTCPComm(dial, int(spec.Rank), ln, spec.Addrs)
	cancel()
	if err != nil {
		return cerr(fmt.Errorf("ucp: forming the group's ring (timeout %v): %w", timeout, err))
	}
	defer comm.Close()
	connect := time.Since(t).Seconds()
	var st load.GroupStats
	if spec.Device < 0 {
		dst := make([][]byte, len(items))
		for i := range items {
			if ss[i] > 0 {
				dst[i] = unsafe.Slice((*byte)(C.ucp_ptr(C.uint64_t(ps[i]))), ss[i])
			}
		}
		st, err = load.LoadGroup(ctx, comm, c.r, items, dst, opt)
	} else {
		st, err = loadDevice(ctx, comm, c.r, items, ps, int(spec.Device), &spec, opt)
	}
	if st.Seconds == nil {
		st.Seconds = map[string]float64{}
	}
	st.Seconds["connect"] = connect
	if b, jerr := json.Marshal(st); jerr == nil {
		*stats = C.CString(string(b))
	}
	return cerr(err)
}
