//go:build cuda

// The CUDA side of the group load, built only with -tags cuda. It needs
// CUDA's cuda.h and NCCL's nccl.h to compile (make cuda-check) but links
// neither: libcuda.so.1 (the driver's, present wherever a GPU is) and
// libnccl.so.2 (UCP_NCCL_LIBRARY, else the one already loaded in the
// process, e.g. torch's, else the system's) are opened at run time, so a
// libucp.so built here loads on any machine and fails with a message, not a
// missing symbol, where there is no GPU. The driver API is used through
// the device's primary context, the one the CUDA runtime (and torch)
// uses, so device pointers from torch are valid here.

package load

/*
#cgo LDFLAGS: -ldl
#include <cuda.h>
#include <nccl.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	__typeof__(cuInit) *Init;
	__typeof__(cuDeviceGet) *DeviceGet;
	__typeof__(cuDevicePrimaryCtxRetain) *PrimaryCtxRetain;
	__typeof__(cuCtxPushCurrent_v2) *CtxPush;
	__typeof__(cuCtxPopCurrent_v2) *CtxPop;
	__typeof__(cuMemHostAlloc) *MemHostAlloc;
	__typeof__(cuMemFreeHost) *MemFreeHost;
	__typeof__(cuMemcpyHtoDAsync_v2) *MemcpyHtoDAsync;
	__typeof__(cuMemcpyDtoH_v2) *MemcpyDtoH;
	__typeof__(cuMemAlloc_v2) *MemAlloc;
	__typeof__(cuMemFree_v2) *MemFree;
	__typeof__(cuStreamCreate) *StreamCreate;
	__typeof__(cuStreamDestroy_v2) *StreamDestroy;
	__typeof__(cuStreamQuery) *StreamQuery;
	__typeof__(cuStreamWaitEvent) *StreamWaitEvent;
	__typeof__(cuEventCreate) *EventCreate;
	__typeof__(cuEventDestroy_v2) *EventDestroy;
	__typeof__(cuEventRecord) *EventRecord;
	__typeof__(cuEventQuery) *EventQuery;
	__typeof__(cuGetErrorString) *GetErrorString;
	__typeof__(cuPointerGetAttribute) *PointerGetAttribute;
} ucp_cu_t;

typedef struct {
	__typeof__(ncclGetUniqueId) *GetUniqueId;
	__typeof__(ncclCommInitRank) *CommInitRank;
	__typeof__(ncclCommDestroy) *CommDestroy;
	__typeof__(ncclCommAbort) *CommAbort;
	__typeof__(ncclCommGetAsyncError) *CommGetAsyncError;
	__typeof__(ncclBroadcast) *Broadcast;
	__typeof__(ncclGroupStart) *GroupStart;
	__typeof__(ncclGroupEnd) *GroupEnd;
	__typeof__(ncclGetErrorString) *GetErrorString;
} ucp_nccl_t;

static ucp_cu_t ucp_cu;
static ucp_nccl_t ucp_nccl;

#define UCP_SYM(lib, field, name) if (!(field = dlsym(lib, name))) return name;

// ucp_cu_open opens the driver API; NULL on success, else what is missing.
static const char *ucp_cu_open(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!h) return "libcuda.so.1";
	UCP_SYM(h, ucp_cu.Init, "cuInit")
	UCP_SYM(h, ucp_cu.DeviceGet, "cuDeviceGet")
	UCP_SYM(h, ucp_cu.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
	UCP_SYM(h, ucp_cu.CtxPush, "cuCtxPushCurrent_v2")
	UCP_SYM(h, ucp_cu.CtxPop, "cuCtxPopCurrent_v2")
	UCP_SYM(h, ucp_cu.MemHostAlloc, "cuMemHostAlloc")
	UCP_SYM(h, ucp_cu.MemFreeHost, "cuMemFreeHost")
	UCP_SYM(h, ucp_cu.MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
	UCP_SYM(h, ucp_cu.MemcpyDtoH, "cuMemcpyDtoH_v2")
	UCP_SYM(h, ucp_cu.MemAlloc, "cuMemAlloc_v2")
	UCP_SYM(h, ucp_cu.MemFree, "cuMemFree_v2")
	UCP_SYM(h, ucp_cu.StreamCreate, "cuStreamCreate")
	UCP_SYM(h, ucp_cu.StreamDestroy, "cuStreamDestroy_v2")
	UCP_SYM(h, ucp_cu.StreamQuery, "cuStreamQuery")
	UCP_SYM(h, ucp_cu.StreamWaitEvent, "cuStreamWaitEvent")
	UCP_SYM(h, ucp_cu.EventCreate, "cuEventCreate")
	UCP_SYM(h, ucp_cu.EventDestroy, "cuEventDestroy_v2")
	UCP_SYM(h, ucp_cu.EventRecord, "cuEventRecord")
	UCP_SYM(h, ucp_cu.EventQuery, "cuEventQuery")
	UCP_SYM(h, ucp_cu.GetErrorString, "cuGetErrorString")
	UCP_SYM(h, ucp_cu.PointerGetAttribute, "cuPointerGetAttribute")
	return NULL;
}

// ucp_nccl_open opens NCCL from path (or libnccl.so.2); NULL on success.
static const char *ucp_nccl_open(const char *path) {
	void *h = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
	if (!h) return dlerror();
	UCP_SYM(h, ucp_nccl.GetUniqueId, "ncclGetUniqueId")
	UCP_SYM(h, ucp_nccl.CommInitRank, "ncclCommInitRank")
	UCP_SYM(h, ucp_nccl.CommDestroy, "ncclCommDestroy")
	UCP_SYM(h, ucp_nccl.CommAbort, "ncclCommAbort")
	UCP_SYM(h, ucp_nccl.CommGetAsyncError, "ncclCommGetAsyncError")
	UCP_SYM(h, ucp_nccl.Broadcast, "ncclBroadcast")
	UCP_SYM(h, ucp_nccl.GroupStart, "ncclGroupStart")
	UCP_SYM(h, ucp_nccl.GroupEnd, "ncclGroupEnd")
	UCP_SYM(h, ucp_nccl.GetErrorString, "ncclGetErrorString")
	return NULL;
}

static CUresult ucp_init(void) { return ucp_cu.Init(0); }
static CUresult ucp_ctx(int dev, CUcontext *ctx) {
	CUdevice d;
	CUresult r = ucp_cu.DeviceGet(&d, dev);
	if (r != CUDA_SUCCESS) return r;
	r = ucp_cu.PrimaryCtxRetain(ctx, d);
	if (r != CUDA_SUCCESS) return r;
	return ucp_cu.CtxPush(*ctx);
}
static CUresult ucp_ctx_pop(void) { CUcontext c; return ucp_cu.CtxPop(&c); }
static const char *ucp_cu_err(CUresult r) {
	const char *s = NULL;
	if (ucp_cu.GetErrorString == NULL || ucp_cu.GetErrorString(r, &s) != CUDA_SUCCESS || s == NULL) return "unknown CUDA error";
	return s;
}
static CUresult ucp_host_alloc(void **p, size_t n) { return ucp_cu.MemHostAlloc(p, n, 0); }
static CUresult ucp_host_free(void *p) { return ucp_cu.MemFreeHost(p); }
static CUresult ucp_htod(uint64_t dst, void *src, size_t n, CUstream s) { return ucp_cu.MemcpyHtoDAsync((CUdeviceptr)dst, src, n, s); }
static CUresult ucp_dtoh(void *dst, uint64_t src, size_t n) { return ucp_cu.MemcpyDtoH(dst, (CUdeviceptr)src, n); }
static CUresult ucp_dev_alloc(uint64_t *p, size_t n) { CUdeviceptr d; CUresult r = ucp_cu.MemAlloc(&d, n); *p = (uint64_t)d; return r; }
static CUresult ucp_dev_free(uint64_t p) { return ucp_cu.MemFree((CUdeviceptr)p); }
static CUresult ucp_stream(CUstream *s) { return ucp_cu.StreamCreate(s, CU_STREAM_NON_BLOCKING); }
static CUresult ucp_stream_free(CUstream s) { return ucp_cu.StreamDestroy(s); }
static CUresult ucp_stream_query(CUstream s) { return ucp_cu.StreamQuery(s); }
static CUresult ucp_stream_wait(CUstream s, CUevent e) { return ucp_cu.StreamWaitEvent(s, e, 0); }
static CUresult ucp_event(CUevent *e) { return ucp_cu.EventCreate(e, CU_EVENT_DISABLE_TIMING); }
static CUresult ucp_event_free(CUevent e) { return ucp_cu.EventDestroy(e); }
static CUresult ucp_event_record(CUevent e, CUstream s) { return ucp_cu.EventRecord(e, s); }
static CUresult ucp_event_query(CUevent e) { return ucp_cu.EventQuery(e); }
// ucp_dev_range: the device ordinal of an allocation and its [start, start+size) (0 when not device memory).
static CUresult ucp_dev_range(uint64_t p, int *ordinal, uint64_t *start, size_t *size) {
	CUdeviceptr s = 0;
	size_t n = 0;
	CUresult r = ucp_cu.PointerGetAttribute(ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)p);
	if (r != CUDA_SUCCESS) return r;
	r = ucp_cu.PointerGetAttribute(&s, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)p);
	if (r != CUDA_SUCCESS) return r;
	r = ucp_cu.PointerGetAttribute(&n, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)p);
	*start = (uint64_t)s;
	*size = n;
	return r;
}

static int ucp_nccl_id_bytes(void) { return NCCL_UNIQUE_ID_BYTES; }
static ncclResult_t ucp_nccl_id(void *out) { return ucp_nccl.GetUniqueId((ncclUniqueId *)out); }
static ncclResult_t ucp_nccl_init(ncclComm_t *c, int n, void *id, int rank) {
	ncclUniqueId u;
	memcpy(&u, id, sizeof u);
	return ucp_nccl.CommInitRank(c, n, u, rank);
}
static ncclResult_t ucp_nccl_destroy(ncclComm_t c) { return ucp_nccl.CommDestroy(c); }
static ncclResult_t ucp_nccl_abort(ncclComm_t c) { return ucp_nccl.CommAbort(c); }
static ncclResult_t ucp_nccl_async(ncclComm_t c) { ncclResult_t e = ncclSuccess; ncclResult_t r = ucp_nccl.CommGetAsyncError(c, &e); return r != ncclSuccess ? r : e; }
static ncclResult_t ucp_nccl_bcast(uint64_t p, size_t n, int root, ncclComm_t c, CUstream s) {
	return ucp_nccl.Broadcast((void *)p, (void *)p, n, ncclUint8, root, c, (cudaStream_t)s);
}
static ncclResult_t ucp_nccl_group_start(void) { return ucp_nccl.GroupStart(); }
static ncclResult_t ucp_nccl_group_end(void) { return ucp_nccl.GroupEnd(); }
static const char *ucp_nccl_err(ncclResult_t r) { return ucp_nccl.GetErrorString ? ucp_nccl.GetErrorString(r) : "NCCL error"; }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/layout"
)

var (
	cuOnce sync.Once
	cuErr  error
	ncOnce sync.Once
	ncErr  error
)

func openCUDA() error {
	cuOnce.Do(func() {
		if missing := C.ucp_cu_open(); missing != nil {
			cuErr = fmt.Errorf("CUDA driver: cannot load %s (no NVIDIA driver on this machine?)", C.GoString(missing))
			return
		}
		cuErr = cuCheck("cuInit", C.ucp_init())
	})
	return cuErr
}

// openNCCL opens NCCL once: lib (a path), else UCP_NCCL_LIBRARY, else
// libnccl.so.2 (also found when the process loaded it already).
func openNCCL(lib string) error {
	ncOnce.Do(func() {
		if lib == "" {
			lib = os.Getenv("UCP_NCCL_LIBRARY")
		}
		path := C.CString(lib)
		defer C.free(unsafe.Pointer(path))
		if missing := C.ucp_nccl_open(path); missing != nil {
			ncErr = fmt.Errorf("NCCL: cannot load libnccl.so.2 (set UCP_NCCL_LIBRARY to its path; torch ships one): %s", C.GoString(missing))
		}
	})
	return ncErr
}

func cuCheck(what string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return fmt.Errorf("%s: %s (CUDA error %d)", what, C.GoString(C.ucp_cu_err(r)), int(r))
}

func ncCheck(what string, r C.ncclResult_t) error {
	if r == C.ncclSuccess {
		return nil
	}
	return fmt.Errorf("%s: %s (NCCL error %d)", what, C.GoString(C.ucp_nccl_err(r)), int(r))
}

// pinnedChunk is the size of each of the two pinned host buffers a rank
// reads its items into: reading one while the other is copied to the
// device.
const pinnedChunk = 64 << 20

// CUDAOptions add to GroupOptions for device loads.
type CUDAOptions struct {
	GroupOptions
	// NCCL uses NCCL even for a group of one (to test it on one GPU).
	NCCL bool
	// NCCLLibrary is the path of libnccl.so.2 to open (the caller's, e.g.
	// torch's); empty: UCP_NCCL_LIBRARY, else the system's.
	NCCLLibrary string
}

// LoadGroupCUDA is LoadGroup into CUDA device memory: ptrs[i] is the device
// address of item i's destination (its Bytes()) on the given device. Each
// rank reads its owned items (about 1/N of the bytes) into pinned host
// buffers, cast on the host to the destination dtype, and copies them once
// to their destination; grouped ncclBroadcasts, one group per layer,
// enqueued once the layer's copies are, land every item in the other
// ranks' destinations while the next layer is read. Nothing is staged
// back to the host. The ring comm carries the agreement and the NCCL id;
// every wait on the device is bounded by the timeout, after which the
// NCCL group is aborted.
func LoadGroupCUDA(ctx context.Context, comm *TCPComm, r *atomic.Reader, items []Item, ptrs []uint64, device int, opt CUDAOptions) (st GroupStats, err error) {
	start := time.Now()
	st = GroupStats{Transport: "nccl", Ranks: comm.Size(), Seconds: map[string]float64{}}
	defer func() {
		st.Seconds["total"] = time.Since(start).Seconds()
		if err != nil {
			comm.Close()
		}
	}()
	if len(ptrs) != len(items) {
		return st, fmt.Errorf("%d destinations for %d items", len(ptrs), len(items))
	}
	timeout := opt.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	runtime.LockOSThread() // a CUDA context is current per OS thread
	defer runtime.UnlockOSThread()
	if err := openCUDA(); err != nil {
		return st, err
	}
	var cctx C.CUcontext
	if err := cuCheck(fmt.Sprintf("the primary context of CUDA device %d", device), C.ucp_ctx(C.int(device), &cctx)); err != nil {
		return st, err
	}
	defer C.ucp_ctx_pop()
	for i, it := range items {
		if err := checkDevicePtr(it, ptrs[i], device); err != nil {
			return st, err
		}
	}
	t := time.Now()
	if err := agree(ctx, comm, items, opt.Args, timeout); err != nil {
		return st, err
	}
	st.Seconds["agree"] = time.Since(t).Seconds()
	p := makePlan(items, comm.Size())
	useNCCL := comm.Size() > 1 || opt.NCCL
	if !useNCCL {
		st.Transport = "cuda"
	}

	var copyS, ncclS C.CUstream
	if err := cuCheck("cuStreamCreate", C.ucp_stream(&copyS)); err != nil {
		return st, err
	}
	defer C.ucp_stream_free(copyS)
	if err := cuCheck("cuStreamCreate", C.ucp_stream(&ncclS)); err != nil {
		return st, err
	}
	defer C.ucp_stream_free(ncclS)
	g := &cudaRun{ctx: ctx, comm: comm, timeout: timeout, useNCCL: useNCCL, copyS: copyS, ncclS: ncclS, st: &st}
	if useNCCL {
		t := time.Now()
		if g.nc, err = ncclGroup(ctx, comm, device, timeout, opt.NCCLLibrary); err != nil {
			return st, err
		}
		defer func() {
			if !g.aborted {
				C.ucp_nccl_destroy(g.nc)
			}
		}()
		st.Seconds["nccl_init"] = time.Since(t).Seconds()
	}
	for k := range g.bufs {
		if err := cuCheck("cuMemHostAlloc (pinned)", C.ucp_host_alloc(&g.bufs[k], pinnedChunk)); err != nil {
			return st, err
		}
		defer C.ucp_host_free(g.bufs[k])
		if err := cuCheck("cuEventCreate", C.ucp_event(&g.evs[k])); err != nil {
			return st, err
		}
		defer C.ucp_event_free(g.evs[k])
		C.ucp_event_record(g.evs[k], copyS)
	}
	t = time.Now()
	if err := g.transfer(r, p, items, ptrs); err != nil {
		return st, err
	}
	st.Seconds["read"] = g.readT.Seconds()
	st.Seconds["exchange"] = (time.Since(t) - g.readT).Seconds()
	st.Seconds["wait_copy"] = g.waitT.Seconds()
	// Every rank finished its transfers before any closes the ring.
	if _, err := comm.allGather(ctx, nil, 0, timeout); err != nil {
		return st, err
	}
	return st, nil
}

// cudaRun is the state of one LoadGroupCUDA: the streams, the two pinned
// host buffers it alternates between, the NCCL group and the timings.
type cudaRun struct {
	ctx          context.Context
	comm         *TCPComm
	timeout      time.Duration
	useNCCL      bool
	nc           C.ncclComm_t
	aborted      bool
	copyS, ncclS C.CUstream
	bufs         [2]unsafe.Pointer
	evs          [2]C.CUevent
	k            int // the buffer to fill next
	readT, waitT time.Duration
	st           *GroupStats
}

// wait polls an event or stream until done, the timeout, or NCCL's
// asynchronous error; a stuck NCCL group is aborted so no rank hangs.
func (g *cudaRun) wait(what string, query func() C.CUresult) error {
	deadline := time.Now().Add(g.timeout)
	for {
		switch r := query(); r {
		case C.CUDA_SUCCESS:
			return nil
		case C.CUDA_ERROR_NOT_READY:
		default:
			return cuCheck(what, r)
		}
		if g.useNCCL && !g.aborted {
			if r := C.ucp_nccl_async(g.nc); r != C.ncclSuccess {
				C.ucp_nccl_abort(g.nc)
				g.aborted = true
				return ncCheck(what+": the NCCL group failed (a rank died or its link dropped)", r)
			}
		}
		if g.ctx.Err() != nil || time.Now().After(deadline) {
			if g.useNCCL && !g.aborted {
				C.ucp_nccl_abort(g.nc)
				g.aborted = true
			}
			if g.ctx.Err() != nil {
				return fmt.Errorf("rank %d: %s: %w", g.comm.Rank(), what, g.ctx.Err())
			}
			return fmt.Errorf("rank %d: %s: no progress for %v (a rank died, hangs or made a different call); the NCCL group was aborted", g.comm.Rank(), what, g.timeout)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// transfer copies the items this rank owns to the device and, layer by
// layer, broadcasts every item from its owner; it returns when both
// streams are done.
func (g *cudaRun) transfer(r *atomic.Reader, p plan, items []Item, ptrs []uint64) error {
	layerEvs := make([]C.CUevent, 0, len(p.layers))
	defer func() {
		for _, e := range layerEvs {
			C.ucp_event_free(e)
		}
	}()
	for _, layer := range p.layers {
		for _, i := range layer {
			if p.owner[i] != g.comm.Rank() {
				g.st.BytesReceived += items[i].Bytes()
				continue
			}
			if err := g.copyItem(r, items[i], ptrs[i]); err != nil {
				return err
			}
		}
		if !g.useNCCL {
			continue
		}
		// The layer's broadcasts start once its copies are done, on their own stream.
		var ev C.CUevent
		if err := cuCheck("cuEventCreate", C.ucp_event(&ev)); err != nil {
			return err
		}
		layerEvs = append(layerEvs, ev)
		C.ucp_event_record(ev, g.copyS)
		C.ucp_stream_wait(g.ncclS, ev)
		if err := g.broadcast(layer, items, ptrs, p.owner); err != nil {
			return err
		}
	}
	for _, s := range []C.CUstream{g.copyS, g.ncclS} {
		if err := g.wait("finishing the transfers", func() C.CUresult { return C.ucp_stream_query(s) }); err != nil {
			return err
		}
	}
	return nil
}

// copyItem reads an item this rank owns through the pinned buffers and
// copies it to its device address ptr on the copy stream.
func (g *cudaRun) copyItem(r *atomic.Reader, it Item, ptr uint64) error {
	s, err := r.OpenState(it.Param, it.State)
	if err != nil {
		return err
	}
	defer s.Close()
	es := int64(it.DType.Size())
	for done := int64(0); done < it.N; {
		n := min(it.N-done, pinnedChunk/es)
		w := time.Now()
		k := g.k
		if err := g.wait("copying to the device", func() C.CUresult { return C.ucp_event_query(g.evs[k]) }); err != nil {
			return err
		}
		g.waitT += time.Since(w)
		buf := unsafe.Slice((*byte)(g.bufs[k]), n*es)
		rt := time.Now()
		got, err := readChunkAs(s, it, done, n, buf)
		g.readT += time.Since(rt)
		g.st.BytesRead += got
		if err != nil {
			return err
		}
		if err := cuCheck("cuMemcpyHtoDAsync", C.ucp_htod(C.uint64_t(ptr+uint64(done*es)), g.bufs[k], C.size_t(n*es), g.copyS)); err != nil {
			return err
		}
		C.ucp_event_record(g.evs[k], g.copyS)
		g.k ^= 1
		done += n
	}
	if g.comm.Size() > 1 {
		g.st.BytesSent += it.Bytes()
	}
	return nil
}

// broadcast broadcasts a layer's items from their owners, as one NCCL group
// on the NCCL stream.
func (g *cudaRun) broadcast(layer []int, items []Item, ptrs []uint64, owner []int) error {
	if err := ncCheck("ncclGroupStart", C.ucp_nccl_group_start()); err != nil {
		return err
	}
	for _, i := range layer {
		if b := items[i].Bytes(); b > 0 {
			if err := ncCheck("ncclBroadcast", C.ucp_nccl_bcast(C.uint64_t(ptrs[i]), C.size_t(b), C.int(owner[i]), g.nc, g.ncclS)); err != nil {
				C.ucp_nccl_group_end()
				return err
			}
		}
	}
	return ncCheck("ncclGroupEnd", C.ucp_nccl_group_end())
}

// readChunkAs reads elements [done, done+n) of an item into buf.
func readChunkAs(s *atomic.State, it Item, done, n int64, buf []byte) (int64, error) {
	if it.Stored && s.DType != it.DType {
		return 0, fmt.Errorf("%s: stored as %v, the destination is %v", s.Path, s.DType, it.DType)
	}
	return readLocalAs(s, it, it.Start+done, n, buf)
}

// checkDevicePtr refuses a destination that is not device memory of the
// given device or does not hold the item's bytes.
func checkDevicePtr(it Item, p uint64, device int) error {
	b := it.Bytes()
	if b == 0 {
		return nil
	}
	var ord C.int
	var start C.uint64_t
	var size C.size_t
	if err := cuCheck("cuPointerGetAttribute", C.ucp_dev_range(C.uint64_t(p), &ord, &start, &size)); err != nil {
		return fmt.Errorf("%s/%s: the destination %#x is not CUDA device memory: %w", it.Param, it.State, p, err)
	}
	if int(ord) != device {
		return fmt.Errorf("%s/%s: the destination is on CUDA device %d, not %d", it.Param, it.State, int(ord), device)
	}
	if p+uint64(b) > uint64(start)+uint64(size) {
		return fmt.Errorf("%s/%s: a destination of %d bytes at %#x overruns its allocation [%#x, +%d)", it.Param, it.State, b, p, uint64(start), uint64(size))
	}
	return nil
}

// ncclGroup forms the NCCL group of the ring's ranks on the current device:
// rank 0's unique id goes around the ring.
func ncclGroup(ctx context.Context, comm *TCPComm, device int, timeout time.Duration, lib string) (C.ncclComm_t, error) {
	var nc C.ncclComm_t
	if err := openNCCL(lib); err != nil {
		return nc, err
	}
	n := int(C.ucp_nccl_id_bytes())
	var mine []byte
	if comm.Rank() == 0 {
		mine = make([]byte, n)
		if err := ncCheck("ncclGetUniqueId", C.ucp_nccl_id(unsafe.Pointer(&mine[0]))); err != nil {
			return nc, err
		}
	}
	all, err := comm.allGather(ctx, mine, n, timeout)
	if err != nil {
		return nc, err
	}
	if len(all[0]) != n {
		return nc, fmt.Errorf("rank 0 sent an NCCL id of %d bytes, want %d", len(all[0]), n)
	}
	// ncclCommInitRank waits for every rank: a rank that dies now would
	// hang it, so it runs aside (on its own thread, with this device's
	// context) and the load gives up after the timeout.
	id := C.CBytes(all[0])
	type result struct {
		nc  C.ncclComm_t
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer C.free(id)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var cctx C.CUcontext
		if err := cuCheck("the primary context", C.ucp_ctx(C.int(device), &cctx)); err != nil {
			done <- result{err: err}
			return
		}
		defer C.ucp_ctx_pop()
		var c C.ncclComm_t
		err := ncCheck("ncclCommInitRank", C.ucp_nccl_init(&c, C.int(comm.Size()), id, C.int(comm.Rank())))
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.nc, r.err
	case <-time.After(timeout):
		return nc, fmt.Errorf("rank %d: ncclCommInitRank: the group did not form within %v (a rank died or cannot reach this one)", comm.Rank(), timeout)
	case <-ctx.Done():
		return nc, ctx.Err()
	}
}

// DeviceBuffer is device memory for tests and tools without torch.
type DeviceBuffer struct {
	Ptr  uint64
	Size int64
}

// AllocDevice allocates n bytes on a CUDA device.
func AllocDevice(device int, n int64) (DeviceBuffer, error) {
	if err := openCUDA(); err != nil {
		return DeviceBuffer{}, err
	}
	var p C.uint64_t
	err := onDevice(device, func() error {
		return cuCheck("cuMemAlloc", C.ucp_dev_alloc(&p, C.size_t(max(n, 1))))
	})
	if err != nil {
		return DeviceBuffer{}, err
	}
	return DeviceBuffer{Ptr: uint64(p), Size: n}, nil
}

// onDevice runs f on a locked OS thread with the device's primary context
// current (the test and tool helpers below; the loader keeps its own).
func onDevice(device int, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cctx C.CUcontext
	if err := cuCheck("primary context", C.ucp_ctx(C.int(device), &cctx)); err != nil {
		return err
	}
	defer C.ucp_ctx_pop()
	return f()
}

// CopyToHost copies a device buffer back (tests only: the loader never does).
func (b DeviceBuffer) CopyToHost(device int, dst []byte) error {
	if int64(len(dst)) > b.Size {
		return errors.New("CopyToHost: destination larger than the buffer")
	}
	if len(dst) == 0 {
		return nil
	}
	return onDevice(device, func() error {
		return cuCheck("cuMemcpyDtoH", C.ucp_dtoh(unsafe.Pointer(&dst[0]), C.uint64_t(b.Ptr), C.size_t(len(dst))))
	})
}

// Free releases the buffer.
func (b DeviceBuffer) Free(device int) error {
	return onDevice(device, func() error { return cuCheck("cuMemFree", C.ucp_dev_free(C.uint64_t(b.Ptr))) })
}

// readLocalAs reads elements [start, start+n) of an item's shard into dst
// in the item's dtype.
func readLocalAs(s *atomic.State, it Item, start, n int64, dst []byte) (int64, error) {
	return layout.ReadLocalAs(s, it.Shard, start, n, it.DType, dst)
}
