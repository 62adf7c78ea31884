// Command capi is ucp's C ABI: built with -buildmode=c-shared into
// python/ucp/libucp.so (make python), it exports the resume-time loader of
// package load to C callers such as the Python package's ctypes layer.
//
// Conventions, for every export:
//   - plain C types only; a checkpoint is an opaque integer handle (a
//     cgo.Handle), so C never holds a Go pointer;
//   - the return value is NULL on success, else an error message allocated
//     with malloc that the caller frees with ucp_free;
//   - a Go panic is recovered into such a message: none crosses into C;
//   - output tensors are caller-owned buffers (a torch tensor's data_ptr)
//     that Go fills in place and does not keep.
//
// ABI.md next to this file documents the functions.
package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime/cgo"
	"sync"
	"unsafe"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/load"
	"github.com/ucp-project/ucp/internal/torchfile"
)

func main() {} // required by -buildmode=c-shared; never runs

// ckpt is what a handle refers to: an opened atomic checkpoint.
type ckpt struct {
	r     *atomic.Reader
	model layout.Model
	mu    sync.Mutex
	metas map[string]layout.Meta // state file path -> its meta keys
}

// Layouts of ucp_shard and ucp_read.
const (
	layoutTP     = 0 // tensor-parallel slice: (n, rank) = (TP size, TP rank)
	layoutChunk  = 1 // dim-0 torch.chunk: (n, rank) = (world size, rank)
	maxDims      = 16
	maxElements  = 1 << 50 // bounds any element count or offset (8 PiB of bytes): sums cannot overflow
	maxItems     = 1 << 24 // bounds the tensors or numels of one call
	internalErrs = "ucp: internal error (please report): "
)

// Element types of ucp_read's destination; dtypeStored is the state's own
// (frozen parameters and buffers keep theirs: an int64 buffer read as is).
var dtypes = map[C.int]dtype.DType{0: dtype.Float32, 1: dtype.BFloat16, 2: dtype.Float16}

const dtypeStored = -1

// cerr turns an error into the C message the caller frees; nil stays NULL.
func cerr(err error) *C.char {
	if err == nil {
		return nil
	}
	return C.CString(err.Error())
}

// guard recovers a panic into *out; every export defers it first.
func guard(out **C.char) {
	if p := recover(); p != nil {
		*out = cerr(fmt.Errorf("%s%v", internalErrs, p))
	}
}

func lookup(h C.uintptr_t) (c *ckpt, err error) {
	defer func() {
		if recover() != nil { // cgo.Handle.Value panics on an invalid handle
			err = errors.New("ucp: invalid or closed checkpoint handle")
		}
	}()
	if h == 0 {
		return nil, errors.New("ucp: invalid or closed checkpoint handle")
	}
	c, ok := cgo.Handle(h).Value().(*ckpt)
	if !ok {
		return nil, errors.New("ucp: invalid checkpoint handle")
	}
	return c, nil
}

//export ucp_free
func ucp_free(p unsafe.Pointer) { C.free(p) }

//export ucp_open
func ucp_open(path *C.char, verify C.int, handle *C.uintptr_t) (msg *C.char) {
	defer guard(&msg)
	dir := C.GoString(path)
	r, err := atomic.OpenReader(dir, atomic.ReaderOptions{Verify: verify != 0})
	if err != nil {
		return cerr(fmt.Errorf("%s is not an atomic checkpoint (convert it with `ucp convert` first): %w", dir, err))
	}
	m, err := layout.ReadModel(r)
	if err != nil {
		return cerr(err)
	}
	*handle = C.uintptr_t(cgo.NewHandle(&ckpt{r: r, model: m, metas: map[string]layout.Meta{}}))
	return nil
}

//export ucp_close
func ucp_close(h C.uintptr_t) (msg *C.char) {
	defer guard(&msg)
	if _, err := lookup(h); err != nil {
		return cerr(err)
	}
	cgo.Handle(h).Delete()
	return nil
}

// info is ucp_info's JSON.
type info struct {
	Dir      string           `json:"dir"`
	Manifest *atomic.Manifest `json:"manifest"`
	Model    layout.Model     `json:"model"`
}

//export ucp_info
func ucp_info(h C.uintptr_t, out **C.char) (msg *C.char) {
	defer guard(&msg)
	c, err := lookup(h)
	if err != nil {
		return cerr(err)
	}
	b, err := json.Marshal(info{Dir: c.r.Dir, Manifest: c.r.Manifest, Model: c.model})
	if err != nil {
		return cerr(err)
	}
	*out = C.CString(string(b))
	return nil
}

// meta reads (once) the meta keys of a parameter's state file.
func (c *ckpt) meta(param, state string) (layout.Meta, *atomic.ParamEntry, error) {
	p, ok := c.r.Param(param)
	if !ok {
		return layout.Meta{}, nil, fmt.Errorf("%s: the checkpoint has no parameter %q", c.r.Dir, param)
	}
	var path string
	var have []string
	for _, f := range p.Files {
		if f.State == state {
			path = c.r.Dir + "/" + f.Path
		}
		if f.State != fragment.StepState {
			have = append(have, f.State)
		}
	}
	if path == "" || state == fragment.StepState {
		return layout.Meta{}, nil, fmt.Errorf("%s: parameter %s has no state %q (it has %v)", c.r.Dir, param, state, have)
	}
	c.mu.Lock()
	m, ok := c.metas[path]
	c.mu.Unlock()
	if ok {
		return m, p, nil
	}
	m, err := layout.ReadMeta(path)
	if err != nil {
		return m, nil, err
	}
	c.mu.Lock()
	c.metas[path] = m
	c.mu.Unlock()
	return m, p, nil
}

// shard is the part of a parameter's state one target rank holds.
// Every size and count crossing the ABI is 64-bit and checked here before
// anything is allocated: a degree beyond load.MaxRanks, a negative rank or
// element count is refused by name, never truncated or trusted.
func (c *ckpt) shard(param, state string, kind, n, rank, paddedVocab int64) (fragment.Shard, error) {
	if n < 1 || n > load.MaxRanks || rank < 0 || rank >= n {
		return fragment.Shard{}, fmt.Errorf("%s: rank %d of %d (the number of ranks must be 1 to %d)", param, rank, n, load.MaxRanks)
	}
	if paddedVocab < 0 || paddedVocab > maxElements {
		return fragment.Shard{}, fmt.Errorf("%s: padded vocabulary of %d rows", param, paddedVocab)
	}
	m, p, err := c.meta(param, state)
	if err != nil {
		return fragment.Shard{}, err
	}
	switch kind {
	case layoutTP:
		return c.model.Slice(p, m, int(n), int(rank), paddedVocab)
	case layoutChunk:
		return layout.DimChunk(p.Shape, int(rank), int(n))
	}
	return fragment.Shard{}, fmt.Errorf("unknown layout %d", kind)
}

//export ucp_shard
func ucp_shard(h C.uintptr_t, param, state *C.char, kind, n, rank, paddedVocab C.int64_t,
	shape *C.int64_t, ndim *C.int) (msg *C.char) {
	defer guard(&msg)
	c, err := lookup(h)
	if err != nil {
		return cerr(err)
	}
	if shape == nil || ndim == nil {
		return cerr(errors.New("ucp_shard: NULL output"))
	}
	sh, err := c.shard(C.GoString(param), C.GoString(state), int64(kind), int64(n), int64(rank), int64(paddedVocab))
	if err != nil {
		return cerr(err)
	}
	if len(sh.Shape) > maxDims {
		return cerr(fmt.Errorf("%s: %d dims (at most %d)", C.GoString(param), len(sh.Shape), maxDims))
	}
	out := unsafe.Slice((*int64)(unsafe.Pointer(shape)), maxDims)
	copy(out, sh.Shape)
	*ndim = C.int(len(sh.Shape))
	return nil
}

//export ucp_read
func ucp_read(h C.uintptr_t, param, state *C.char, kind, n, rank, paddedVocab, start, count C.int64_t,
	dt C.int, dst unsafe.Pointer, dstBytes C.int64_t, bytesRead *C.int64_t) (msg *C.char) {
	defer guard(&msg)
	c, err := lookup(h)
	if err != nil {
		return cerr(err)
	}
	t, ok := dtypes[dt]
	if !ok && dt != dtypeStored {
		return cerr(fmt.Errorf("unknown element type code %d", int(dt)))
	}
	name, st := C.GoString(param), C.GoString(state)
	if bytesRead == nil {
		return cerr(errors.New("ucp_read: NULL bytes_read"))
	}
	sh, err := c.shard(name, st, int64(kind), int64(n), int64(rank), int64(paddedVocab))
	if err != nil {
		return cerr(err)
	}
	total := torchfile.Numel(sh.Shape)
	s, k := int64(start), int64(count)
	if s < 0 || k < 0 || s > maxElements || k > maxElements || s+k > total {
		return cerr(fmt.Errorf("%s/%s: elements [%d, %d) of a shard of %d", name, st, s, s+k, total))
	}
	sf, err := c.r.OpenState(name, st)
	if err != nil {
		return cerr(err)
	}
	defer sf.Close()
	if dt == dtypeStored {
		t = sf.DType
	}
	if need := k * int64(t.Size()); int64(dstBytes) < need || (need > 0 && dst == nil) {
		return cerr(fmt.Errorf("%s/%s: a buffer of %d bytes for %d %v elements", name, st, int64(dstBytes), k, t))
	}
	if k == 0 {
		*bytesRead = 0
		return nil
	}
	got, err := layout.ReadLocalAs(sf, sh, s, k, t, unsafe.Slice((*byte)(dst), int64(dstBytes)))
	*bytesRead = C.int64_t(got)
	return cerr(err)
}

// Kinds of ucp_step's value.
const (
	stepNone   = 0
	stepInt    = 1
	stepFloat  = 2
	stepTensor = 3 // a 0-dim tensor; its value converted to double
)

//export ucp_step
func ucp_step(h C.uintptr_t, param *C.char, kind *C.int, value *C.double) (msg *C.char) {
	defer guard(&msg)
	c, err := lookup(h)
	if err != nil {
		return cerr(err)
	}
	k, v, err := step(c.r, C.GoString(param))
	*kind, *value = C.int(k), C.double(v)
	return cerr(err)
}

//export ucp_zero_pieces
func ucp_zero_pieces(stage, dp, rank C.int64_t, numels *C.int64_t, count C.int64_t, out **C.char) (msg *C.char) {
	defer guard(&msg)
	if count < 0 || count > maxItems || (count > 0 && numels == nil) || out == nil {
		return cerr(fmt.Errorf("ucp_zero_pieces: %d numels (0 to %d)", int64(count), maxItems))
	}
	if dp < 1 || dp > load.MaxRanks || rank < 0 || rank >= dp {
		return cerr(fmt.Errorf("ucp_zero_pieces: rank %d of %d (the number of ranks must be 1 to %d)", int64(rank), int64(dp), load.MaxRanks))
	}
	ns := make([]int64, int(count))
	if count > 0 {
		copy(ns, unsafe.Slice((*int64)(unsafe.Pointer(numels)), int(count)))
	}
	var sum int64
	for i, n := range ns {
		if n < 0 || n > maxElements {
			return cerr(fmt.Errorf("ucp_zero_pieces: numel %d of parameter %d (0 to %d)", n, i, int64(maxElements)))
		}
		if sum += n; sum > maxElements {
			return cerr(fmt.Errorf("ucp_zero_pieces: the parameters add up to more than %d elements", int64(maxElements)))
		}
	}
	var ps []layout.Piece
	var size int64
	var err error
	switch stage {
	case 1, 2:
		ps, size, err = layout.Zero12Pieces(ns, int(dp), int(rank))
	case 3:
		ps, size, err = layout.Zero3Pieces(ns, int(dp), int(rank))
	default:
		err = fmt.Errorf("ZeRO stage %d (1, 2 or 3)", int(stage))
	}
	if err != nil {
		return cerr(err)
	}
	rows := make([][4]int64, len(ps))
	for i, p := range ps {
		rows[i] = [4]int64{int64(p.Param), p.Local, p.N, p.At}
	}
	b, err := json.Marshal(map[string]any{"size": size, "pieces": rows})
	if err != nil {
		return cerr(err)
	}
	*out = C.CString(string(b))
	return nil
}

//export ucp_balance
func ucp_balance(weights *C.int64_t, count, n C.int64_t, owners *C.int64_t) (msg *C.char) {
	defer guard(&msg)
	if n < 1 || n > load.MaxRanks || count < 0 || count > maxItems || (count > 0 && (weights == nil || owners == nil)) {
		return cerr(fmt.Errorf("balance %d items over %d ranks", int(count), int(n)))
	}
	if count == 0 {
		return nil
	}
	w := unsafe.Slice((*int64)(unsafe.Pointer(weights)), int(count))
	o := unsafe.Slice((*int64)(unsafe.Pointer(owners)), int(count))
	for i, k := range load.Balance(w, int(n)) {
		o[i] = int64(k)
	}
	return nil
}

//export ucp_verify_state
func ucp_verify_state(h C.uintptr_t, param, state *C.char) (msg *C.char) {
	defer guard(&msg)
	c, err := lookup(h)
	if err != nil {
		return cerr(err)
	}
	name, st := C.GoString(param), C.GoString(state)
	p, ok := c.r.Param(name)
	if !ok {
		return cerr(fmt.Errorf("%s: the checkpoint has no parameter %q", c.r.Dir, name))
	}
	for _, f := range p.Files {
		if f.State == st {
			path := c.r.Dir + "/" + f.Path
			if err := c.r.Inside(path); err != nil {
				return cerr(err)
			}
			return cerr(atomic.VerifyFile(path, f.FileEntry))
		}
	}
	return cerr(fmt.Errorf("%s: parameter %s has no state %q", c.r.Dir, name, st))
}
