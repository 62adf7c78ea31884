package layout

import (
	"context"
	"fmt"
	"os"
	"sort"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// StateFill is a tensor to stream into a torch.save file being written (the
// resharding writers): pieces of atomic states at increasing element
// offsets, zeros elsewhere.
type StateFill struct {
	Blob   *torchfile.Blob
	Pieces []StatePiece
}

// StatePiece is elements [Local, Local+N) of a parameter's shard of one atomic
// state, written at element At of the blob.
type StatePiece struct {
	Param, State string
	Shard        fragment.Shard
	Local, N, At int64
}

// fillJob bounds the elements of one task shared among the workers: big
// enough that opening the state costs little, small enough that both
// workers stay busy on a file of a few large tensors.
const fillJob = 1 << 20

// WriteOptions say how WriteFile writes.
type WriteOptions struct {
	// Sync fsyncs the file before it is renamed into place, with
	// writeback started as each range is written (the final fsync then
	// finds most of the work done).
	Sync bool
	// Workers fill ranges of the tensors at once (< 1: one per CPU).
	Workers int
}

// WriteFile writes root to path, streaming each fill's pieces cast to its
// blob's dtype; blobs with Data are written as they are. The pieces are cut
// into tasks of at most fillJob elements that the workers share; bytes that
// need no conversion are copied in the kernel (Mover). It returns the
// file's size.
func WriteFile(ctx context.Context, r *atomic.Reader, path string, root pyobj.Value, fills []StateFill, o WriteOptions) (int64, error) {
	w, err := torchfile.Create(path, root)
	if err != nil {
		return 0, err
	}
	w.NoSync = !o.Sync
	w.Writeback = o.Sync
	index := map[*torchfile.Blob]int{}
	for i, b := range w.Layout.Blobs {
		index[b] = i
	}
	var fs []TensorFill
	for _, f := range fills {
		i, ok := index[f.Blob]
		if !ok {
			continue // a tensor the pickle does not reference
		}
		fs = append(fs, TensorFill{I: i, DType: f.Blob.DType, N: torchfile.Numel(f.Blob.Shape), Pieces: f.Pieces})
	}
	if err := WriteFills(ctx, r, w, fs, o.Workers, 0); err != nil {
		w.Abort()
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if err := w.Commit(); err != nil {
		return 0, err
	}
	return w.Layout.Size(), nil
}

// TensorFill is tensor I of a Sink, N elements of dtype DType: pieces of atomic
// states at their element offsets, zeros elsewhere.
type TensorFill struct {
	I      int
	DType  dtype.DType
	N      int64
	Pieces []StatePiece
}

// WriteFills writes every fill into w with workers Movers (< 1: one per
// CPU) sharing tasks of at most jobBytes bytes of one tensor (<= 0: fillJob
// elements): a large tensor spreads over all workers, and each worker's
// memory is its Mover's small buffers.
func WriteFills(ctx context.Context, r *atomic.Reader, w Sink, fills []TensorFill, workers int, jobBytes int64) error {
	var jobs []fillTask
	for _, f := range fills {
		js, err := fillTasks(f, jobBytes)
		if err != nil {
			return err
		}
		jobs = append(jobs, js...)
	}
	return Pooled(ctx, workers, jobs, func() *Mover { return &Mover{} }, (*Mover).Close,
		func(m *Mover, j fillTask) error { return m.fill(r, w, j) })
}

// fillTask is elements [at, at+n) of tensor i: zeros (pc nil) or elements
// [local, local+n) of a piece.
type fillTask struct {
	i      int
	dt     dtype.DType
	pc     *StatePiece
	local  int64
	at, n  int64
	stride int64 // element size
}

// fillTasks cuts one fill into tasks, checking that its pieces (sorted by
// offset, a copy) are disjoint and inside the tensor.
func fillTasks(f TensorFill, jobBytes int64) ([]fillTask, error) {
	dt := f.DType
	es := int64(dt.Size())
	job := int64(fillJob)
	if jobBytes > 0 {
		job = max(jobBytes/es, 1)
	}
	pcs := f.Pieces
	if !sort.SliceIsSorted(pcs, func(a, b int) bool { return pcs[a].At < pcs[b].At }) {
		pcs = append([]StatePiece(nil), pcs...)
		sort.SliceStable(pcs, func(a, b int) bool { return pcs[a].At < pcs[b].At })
	}
	var out []fillTask
	var at int64
	span := func(pc *StatePiece, local, upto int64) {
		for at < upto {
			n := min(upto-at, job)
			out = append(out, fillTask{i: f.I, dt: dt, pc: pc, local: local, at: at, n: n, stride: es})
			at += n
			local += n
		}
	}
	for k := range pcs {
		pc := &pcs[k]
		if pc.At < at || pc.N < 0 || pc.At+pc.N > f.N {
			return nil, fmt.Errorf("%s/%s: piece [%d,%d) outside or overlapping a tensor of %d", pc.Param, pc.State, pc.At, pc.At+pc.N, f.N)
		}
		span(nil, 0, pc.At)
		span(pc, pc.Local, pc.At+pc.N)
	}
	span(nil, 0, f.N)
	return out, nil
}

// Chunk is the most elements a Mover converts at once: its input and
// output buffers (at most 256 KiB each) stay in the CPU's cache between the
// read, the conversion and the write. Measured on Linux 6.18 (ext4, 2
// cores, a VM; README, Performance): copies from user memory into the page
// cache cost 0.5-0.8 s of system time per GB from a buffer this size, 2.4-3
// s from a large one.
const Chunk = 64 << 10

// Sink is an output file whose tensor payloads arrive in ranges:
// torchfile.Writer, atomic.File, safetensors.Writer, Regions.
type Sink interface {
	WriteAt(i int, p []byte, off int64) error
	CopyFrom(c *fsutil.Copier, i int, src *os.File, srcOff, off, n int64) error
}

// Mover moves elements of atomic states into tensors of output files: runs
// already in the output dtype are copied in the kernel (fsutil.Copier,
// the CRC taken on the way), the others read and converted through small
// buffers it reuses. One Mover per goroutine; it keeps the last state it
// opened until the next one or Close.
type Mover struct {
	copier       fsutil.Copier
	in, f32, out []byte
	zeros        []byte
	st           *atomic.State
	runs         []fragment.Run
}

// Close closes the state the Mover holds open.
func (m *Mover) Close() {
	if m.st != nil {
		m.st.Close()
		m.st = nil
	}
}

// Open opens param's state, or returns the one the Mover holds open; the
// Mover closes it (Close, or the next Open of another).
func (m *Mover) Open(r *atomic.Reader, param, state string) (*atomic.State, error) {
	if m.st != nil && m.st.Param == param && m.st.Name == state {
		return m.st, nil
	}
	m.Close()
	s, err := r.OpenState(param, state)
	if err != nil {
		return nil, err
	}
	m.st = s
	return s, nil
}

func (m *Mover) fill(r *atomic.Reader, w Sink, t fillTask) error {
	if t.pc == nil {
		return m.Zeros(w, t.i, t.at*t.stride, t.n*t.stride)
	}
	s, err := m.Open(r, t.pc.Param, t.pc.State)
	if err != nil {
		return err
	}
	return m.Move(w, t.i, t.at, s, t.pc.Shard, t.local, t.n, t.dt)
}

// Zeros writes n zero bytes at byte off of tensor i.
func (m *Mover) Zeros(w Sink, i int, off, n int64) error {
	if len(m.zeros) == 0 {
		m.zeros = make([]byte, Chunk*4)
	}
	for n > 0 {
		k := min(n, int64(len(m.zeros)))
		if err := w.WriteAt(i, m.zeros[:k], off); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// Move writes elements [start, start+n) of shard sh of st as dt at element
// at of tensor i of w: the state's own dtype (copied as stored), or
// float32, bfloat16 or float16, converted as torch does (through float32).
// Elements no run of the shard covers (padding) are written as zeros.
func (m *Mover) Move(w Sink, i int, at int64, st *atomic.State, sh fragment.Shard, start, n int64, dt dtype.DType) error {
	if dt != st.DType && dt != dtype.Float32 && dt != dtype.BFloat16 && dt != dtype.Float16 {
		return fmt.Errorf("%s: cannot load %v as %v (float32, bfloat16, float16 or %v)", st.Path, st.DType, dt, st.DType)
	}
	es := int64(dt.Size())
	m.runs = m.runs[:0]
	sh.Runs(st.Shape, start, n, func(r fragment.Run) { m.runs = append(m.runs, r) })
	sort.Slice(m.runs, func(a, b int) bool { return m.runs[a].Local < m.runs[b].Local })
	pos := start // next shard element to write
	for _, r := range m.runs {
		if r.Local > pos {
			if err := m.Zeros(w, i, (at+pos-start)*es, (r.Local-pos)*es); err != nil {
				return err
			}
		}
		if err := m.Range(w, i, (at+r.Local-start)*es, st, r.Full, r.N, dt); err != nil {
			return err
		}
		pos = r.Local + r.N
	}
	if end := start + n; end > pos {
		return m.Zeros(w, i, (at+pos-start)*es, (end-pos)*es)
	}
	return nil
}

// Range writes elements [full, full+n) of st as dt at byte off of tensor
// i: copied in the kernel when st is stored as dt, else converted in
// pieces of Chunk elements.
func (m *Mover) Range(w Sink, i int, off int64, st *atomic.State, full, n int64, dt dtype.DType) error {
	es, ss := int64(dt.Size()), int64(st.DType.Size())
	if dt == st.DType {
		if f, base := st.File(); f != nil {
			if err := w.CopyFrom(&m.copier, i, f, base+full*ss, off, n*es); err != nil {
				return err
			}
			st.Record(full, n, m.copier.Last)
			return nil
		}
	}
	m.in = grow(m.in, Chunk*ss)
	for n > 0 {
		k := min(n, Chunk)
		raw := m.in[:k*ss]
		if err := st.ReadRange(full, k, raw); err != nil {
			return err
		}
		out, err := m.cast(raw, st.DType, dt, k)
		if err != nil {
			return fmt.Errorf("%s: %w", st.Path, err)
		}
		if err := w.WriteAt(i, out, off); err != nil {
			return err
		}
		full, n, off = full+k, n-k, off+k*es
	}
	return nil
}

// cast converts k elements of raw from dtype from to dt, into the Mover's
// output buffer (raw itself when they agree).
func (m *Mover) cast(raw []byte, from, dt dtype.DType, k int64) ([]byte, error) {
	if from == dt {
		return raw, nil
	}
	if dt == dtype.Float32 {
		m.out = grow(m.out, 4*k)
		return m.out, dtype.ToFloat32(m.out, raw, from)
	}
	f32 := raw
	if from != dtype.Float32 {
		m.f32 = grow(m.f32, 4*k)
		if err := dtype.ToFloat32(m.f32, raw, from); err != nil {
			return nil, err
		}
		f32 = m.f32
	}
	m.out = grow(m.out, int64(dt.Size())*k)
	return m.out, dtype.FromFloat32(m.out, f32, dt)
}

// grow returns b resliced to n bytes, reallocated only when too small.
func grow(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}
