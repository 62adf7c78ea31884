package layout

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"runtime"
	"sort"
	"sync"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
	"golang.org/x/sync/errgroup"
)

// StateFill is a tensor to stream into a torch.save file being written (the
// resharding writers): pieces of atomic states at increasing element
// offsets, zeros elsewhere.
type StateFill struct {
	Blob   *torchfile.Blob
	Pieces []StatePiece
}

// StatePiece is elements [Local, Local+N) of a parameter's shard of one atomic
// state, written at element At of the blob. AddOne adds 1 to every element
// in float32 before the cast to the blob's dtype (the norm weights of
// Megatron's apply_layernorm_1p, which stores them minus one).
type StatePiece struct {
	Param, State string
	Shard        fragment.Shard
	Local, N, At int64
	AddOne       bool
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
	b := NewFiles(r, o)
	n, err := b.Add(ctx, path, root, fills)
	if err != nil {
		return 0, err
	}
	return n, b.Flush(ctx)
}

// Files writes torch.save files several at once: a writer of many files
// (the resharding writers' rank files) adds each and flushes at the end.
// The workers' tasks alternate between the files, so that two workers
// rarely write the same file at once: writes into one file serialise on
// its inode lock (ext4 takes i_rwsem for every buffered write, which
// copy_file_range's splice writes are), and the waiter spins on it.
// Measured on Linux 6.18 (ext4, 2 cores, a VM shared with other jobs at a
// load of 15-27; --no-sync, old and new binaries alternated 5 times), ucp
// reshard --to megatron --tp 2 --dp 2 of the generated 1.7 GB Llama
// (scripts/bench.sh's megatron case): the workers blocked on the inode
// lock 1087 and 1431 times a run before, 72 and 105 after (perf record -e
// sched:sched_switch); CPU (user+sys, best and median) 2.18 and 2.25 s
// before, 1.82 and 2.14 s after; --ckpt-format torch_dist 1.93/2.08 s
// before, 1.80/2.01 s after; reshard --to deepspeed --zero 2 --dp 3 of the
// generated 2.8 GB ZeRO-2 checkpoint 2.81/3.28 s before, 2.55/2.94 s after.
// A file's bytes are written only by Flush (or an Add that flushes), and
// every file has its final name once Flush returns, not before.
//
// A batch's commits (tail, fsync, rename) run in the background while the
// caller queues and writes the next batch, one batch after another: the
// fsyncs wait on the device's writeback and cache flush, and the next
// batch's copies need only the CPU and the page cache.
type Files struct {
	r     *atomic.Reader
	o     WriteOptions
	set   fileSet
	paths []string
	fill  []TensorFill
	// committing yields the error of the batches committing in the
	// background (nil: none is).
	committing chan error
}

// filesAtOnce is how many files Add queues, at least, before it flushes:
// enough for every worker to have a file of its own.
const filesAtOnce = 4

// NewFiles returns an empty Files writing with o (o.Workers workers shared
// by all files).
func NewFiles(r *atomic.Reader, o WriteOptions) *Files { return &Files{r: r, o: o} }

// Add creates path's file through a temporary name and queues its fills;
// it returns the size the file will have. When enough files are queued it
// writes them (Flush).
func (b *Files) Add(ctx context.Context, path string, root pyobj.Value, fills []StateFill) (int64, error) {
	w, err := torchfile.Create(path, root)
	if err != nil {
		b.Abort()
		return 0, err
	}
	w.NoSync = !b.o.Sync
	w.Writeback = b.o.Sync
	index := map[*torchfile.Blob]int{}
	for i, bl := range w.Layout.Blobs {
		index[bl] = i
	}
	first := b.set.add(w)
	b.paths = append(b.paths, path)
	for _, f := range fills {
		i, ok := index[f.Blob]
		if !ok {
			continue // a tensor the pickle does not reference
		}
		b.fill = append(b.fill, TensorFill{I: first + i, DType: f.Blob.DType, N: torchfile.Numel(f.Blob.Shape), Pieces: f.Pieces})
	}
	if len(b.set.ws) >= max(filesAtOnce, b.o.Workers) {
		return w.Layout.Size(), b.flush(ctx, false)
	}
	return w.Layout.Size(), nil
}

// WriteAll runs write with a Files, then writes the files it added
// (Flush), or removes them when write fails.
func WriteAll(ctx context.Context, r *atomic.Reader, o WriteOptions, write func(*Files) error) error {
	b := NewFiles(r, o)
	if err := write(b); err != nil {
		b.Abort()
		return err
	}
	return b.Flush(ctx)
}

// Flush writes the queued files and moves each into place; it returns
// once every file added so far is in place.
func (b *Files) Flush(ctx context.Context) error { return b.flush(ctx, true) }

// flush writes the queued files and leaves their commits to a goroutine
// that first waits for the batch before; with wait, it waits for them.
func (b *Files) flush(ctx context.Context, wait bool) error {
	set, paths, fill := b.set, b.paths, b.fill
	b.reset()
	prev := b.committing
	b.committing = nil
	if len(set.ws) > 0 {
		if err := WriteFills(ctx, b.r, &set, fill, b.o.Workers, 0); err != nil {
			abortFrom(set.ws, 0)
			if prev != nil {
				<-prev // files committed before stay; the caller's folder is incomplete
			}
			if len(paths) == 1 {
				return fmt.Errorf("%s: %w", paths[0], err)
			}
			return err
		}
		done := make(chan error, 1)
		go func(prev <-chan error) { done <- commitAfter(prev, set.ws) }(prev)
		prev = done
	}
	if prev == nil {
		return nil
	}
	if !wait {
		b.committing = prev
		return nil
	}
	return <-prev
}

// commitAfter commits ws once the batch before (prev, nil: none) is
// committed; on an error it removes the temporary files not committed.
func commitAfter(prev <-chan error, ws []*torchfile.Writer) error {
	if prev != nil {
		if err := <-prev; err != nil {
			abortFrom(ws, 0)
			return err
		}
	}
	for k, w := range ws {
		if err := w.Commit(); err != nil {
			abortFrom(ws, k+1)
			return err
		}
	}
	return nil
}

// Abort removes the queued files' temporary files, once the batches
// committing in the background are done (files committed stay).
func (b *Files) Abort() {
	if b.committing != nil {
		<-b.committing
		b.committing = nil
	}
	abortFrom(b.set.ws, 0)
	b.reset()
}

func (b *Files) reset() { b.set, b.paths, b.fill = fileSet{}, nil, nil }

func abortFrom(ws []*torchfile.Writer, from int) {
	for _, w := range ws[from:] {
		w.Abort()
	}
}

// fileSet is the Sink over several torchfile.Writers: tensor i is tensor
// i-first[k] of writer k.
type fileSet struct {
	ws    []*torchfile.Writer
	first []int
	n     int
}

func (s *fileSet) add(w *torchfile.Writer) int {
	at := s.n
	s.ws = append(s.ws, w)
	s.first = append(s.first, at)
	s.n += len(w.Layout.Blobs)
	return at
}

// FileOf is the index of tensor i's writer.
func (s *fileSet) FileOf(i int) int {
	return sort.Search(len(s.first), func(k int) bool { return s.first[k] > i }) - 1
}

func (s *fileSet) at(i int) (*torchfile.Writer, int, error) {
	k := s.FileOf(i)
	if k < 0 || i >= s.n {
		return nil, 0, fmt.Errorf("no tensor %d", i)
	}
	return s.ws[k], i - s.first[k], nil
}

func (s *fileSet) WriteAt(i int, p []byte, off int64) error {
	w, j, err := s.at(i)
	if err != nil {
		return err
	}
	return w.WriteAt(j, p, off)
}

func (s *fileSet) CopyFrom(c *fsutil.Copier, i int, src *os.File, srcOff, off, n int64) error {
	w, j, err := s.at(i)
	if err != nil {
		return err
	}
	return w.CopyFrom(c, j, src, srcOff, off, n)
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
// memory is its Mover's small buffers (at most MoverBytes).
func WriteFills(ctx context.Context, r *atomic.Reader, w Sink, fills []TensorFill, workers int, jobBytes int64) error {
	return WriteFillsProgress(ctx, r, w, fills, workers, jobBytes, nil)
}

// WriteFillsProgress is WriteFills telling progress (when not nil; from
// several goroutines) the bytes of each task once written: those it read
// from the state and those it wrote.
func WriteFillsProgress(ctx context.Context, r *atomic.Reader, w Sink, fills []TensorFill, workers int, jobBytes int64, progress func(read, written int64)) error {
	var jobs []fillTask
	for _, f := range fills {
		js, err := fillTasks(f, jobBytes)
		if err != nil {
			return err
		}
		jobs = append(jobs, js...)
	}
	q := newByFile(jobs, w)
	if workers < 1 {
		workers = runtime.GOMAXPROCS(0)
	}
	g, gctx := errgroup.WithContext(ctx)
	for range min(workers, max(len(jobs), 1)) {
		g.Go(func() error {
			m := &Mover{}
			defer m.Close()
			file := -1
			for {
				if err := gctx.Err(); err != nil {
					return err
				}
				var t fillTask
				var ok bool
				if t, file, ok = q.take(file); !ok {
					return nil
				}
				read, err := m.fill(r, w, t)
				if err != nil {
					return err
				}
				if progress != nil {
					progress(read, t.n*t.stride)
				}
			}
		})
	}
	return g.Wait()
}

// fileSink is a Sink whose tensors lie in several files.
type fileSink interface {
	// FileOf names tensor i's file (an index).
	FileOf(i int) int
}

// byFile is the tasks of a WriteFills queued per output file, each file's
// in order, and how many workers write each file now.
type byFile struct {
	mu   sync.Mutex
	q    [][]fillTask
	busy []int
}

func newByFile(jobs []fillTask, w Sink) *byFile {
	fs, ok := w.(fileSink)
	if !ok {
		return &byFile{q: [][]fillTask{jobs}, busy: []int{0}}
	}
	b := &byFile{}
	at := map[int]int{}
	for _, j := range jobs {
		k := fs.FileOf(j.i)
		n, ok := at[k]
		if !ok {
			n = len(b.q)
			at[k] = n
			b.q = append(b.q, nil)
			b.busy = append(b.busy, 0)
		}
		b.q[n] = append(b.q[n], j)
	}
	return b
}

// take returns the next task for a worker that finished one of queue
// prev (-1: none), and its queue: from the file the fewest workers write
// (see Files), prev among equals (the worker's Mover holds its states
// open), else the earliest. ok is false when no task is left.
func (b *byFile) take(prev int) (t fillTask, file int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if prev >= 0 {
		b.busy[prev]--
	}
	file = -1
	for k, q := range b.q {
		if len(q) > 0 && (file < 0 || b.busy[k] < b.busy[file] || b.busy[k] == b.busy[file] && k == prev) {
			file = k
		}
	}
	if file < 0 {
		return fillTask{}, -1, false
	}
	t, b.q[file] = b.q[file][0], b.q[file][1:]
	b.busy[file]++
	return t, file, true
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
			if pc != nil {
				// Cut where the shard's element is a multiple of job: for
				// a whole state (ZeRO ranges, unsliced tensors) job
				// elements of any dtype are whole 1 MiB blocks, so a copy
				// taking its CRC from the state's block CRC-32s reads back
				// only the blocks the piece itself starts and ends in.
				n = min(upto-at, job-local%job)
			}
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

// MoverBytes is about the most one Mover buffers when its pieces are
// whole states (no gather): input, float32 and output buffers of Chunk
// elements of at most 8 bytes, its zeros and its Copier's buffer. A
// writer bounding its memory runs at most budget/MoverBytes workers.
const MoverBytes = Chunk*(8+4+8) + 4*Chunk + fsutil.CopyBufSize

// Sink is an output file whose tensor payloads arrive in ranges:
// torchfile.Writer, atomic.File, safetensors.Writer, Regions.
type Sink interface {
	WriteAt(i int, p []byte, off int64) error
	CopyFrom(c *fsutil.Copier, i int, src *os.File, srcOff, off, n int64) error
}

// Mover moves elements of atomic states into tensors of output files: runs
// already in the output dtype are copied in the kernel (fsutil.Copier,
// the CRC taken on the way), the others read and converted through small
// buffers it reuses. One Mover per goroutine; it keeps the last two
// states it opened (tasks alternate between two files, see Files) until
// others or Close.
type Mover struct {
	copier       fsutil.Copier
	in, f32, out []byte
	zeros        []byte
	st           [2]*atomic.State // the last opened first
	runs         []fragment.Run
}

// Close closes the states the Mover holds open.
func (m *Mover) Close() {
	for i, s := range m.st {
		if s != nil {
			s.Close()
			m.st[i] = nil
		}
	}
}

// Open opens param's state, or returns one the Mover holds open; the
// Mover closes it (Close, or a later Open of others).
func (m *Mover) Open(r *atomic.Reader, param, state string) (*atomic.State, error) {
	for i, s := range m.st {
		if s != nil && s.Param == param && s.Name == state {
			m.st[0], m.st[i] = s, m.st[0]
			return s, nil
		}
	}
	s, err := r.OpenState(param, state)
	if err != nil {
		return nil, err
	}
	if old := m.st[1]; old != nil {
		old.Close()
	}
	m.st[0], m.st[1] = s, m.st[0]
	return s, nil
}

// fill writes task t and returns the bytes its range spans in the state.
func (m *Mover) fill(r *atomic.Reader, w Sink, t fillTask) (int64, error) {
	if t.pc == nil {
		return 0, m.Zeros(w, t.i, t.at*t.stride, t.n*t.stride)
	}
	s, err := m.Open(r, t.pc.Param, t.pc.State)
	if err != nil {
		return 0, err
	}
	return int64(s.DType.Size()) * t.n, m.Move(w, t.i, t.at, s, t.pc.Shard, t.local, t.n, t.dt, t.pc.AddOne)
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
// float32, bfloat16 or float16, converted as torch does (through float32);
// from a float32 state also float64, integers and bool (castFloat32).
// addOne adds 1 in float32 first (StatePiece.AddOne). Elements no run of
// the shard covers (padding) are written as zeros.
func (m *Mover) Move(w Sink, i int, at int64, st *atomic.State, sh fragment.Shard, start, n int64, dt dtype.DType, addOne bool) error {
	if dt != st.DType && dt != dtype.Float32 && dt != dtype.BFloat16 && dt != dtype.Float16 && st.DType != dtype.Float32 {
		return fmt.Errorf("%s: cannot load %v as %v (float32, bfloat16, float16 or %v)", st.Path, st.DType, dt, st.DType)
	}
	es := int64(dt.Size())
	m.runs = m.runs[:0]
	sh.Runs(st.Shape, start, n, func(r fragment.Run) { m.runs = append(m.runs, r) })
	sort.Slice(m.runs, func(a, b int) bool { return m.runs[a].Local < m.runs[b].Local })
	pos := start // next shard element to write
	for j := 0; j < len(m.runs); {
		r := m.runs[j]
		if r.Local > pos {
			if err := m.Zeros(w, i, (at+pos-start)*es, (r.Local-pos)*es); err != nil {
				return err
			}
		}
		if k := m.gatherable(j); k > j+1 {
			if err := m.gather(w, i, (at+r.Local-start)*es, st, m.runs[j:k], dt, addOne); err != nil {
				return err
			}
			last := m.runs[k-1]
			pos, j = last.Local+last.N, k
			continue
		}
		if err := m.Range(w, i, (at+r.Local-start)*es, st, r.Full, r.N, dt, addOne); err != nil {
			return err
		}
		pos, j = r.Local+r.N, j+1
	}
	if end := start + n; end > pos {
		return m.Zeros(w, i, (at+pos-start)*es, (end-pos)*es)
	}
	return nil
}

// Small runs (a slice along a dim > 0: one run per row) are gathered:
// runs of fewer than gatherRun elements whose span of the state is at most
// gatherSpan elements are read with one read of the whole span and written
// with one write, rather than a kernel copy (or a read and a write) each.
// On the generated Llama of scripts/bench.sh (hidden 1024), reshard --to
// megatron --tp 2 made 26239 copy_file_range, 42243 pread and 8552 pwrite
// calls, mostly of 2 KiB rows of the row-parallel weights.
const (
	gatherRun  = 16 << 10
	gatherSpan = 4 * Chunk
)

// gatherable returns the end k of the runs from j on that gather reads
// at once: small runs in increasing order of both their shard and their
// full positions, within gatherSpan elements of the state.
func (m *Mover) gatherable(j int) int {
	first := m.runs[j]
	k := j
	for ; k < len(m.runs); k++ {
		r := m.runs[k]
		if r.N >= gatherRun || r.Full+r.N-first.Full > gatherSpan {
			break
		}
		if k > j {
			p := m.runs[k-1]
			if r.Full < p.Full+p.N || r.Local < p.Local+p.N {
				break
			}
		}
	}
	return k
}

// gather writes runs (see gatherable) of st as dt at byte off of tensor
// i: one read of their span of the state, each run converted into its
// place in one output buffer (zeros between runs), one write.
func (m *Mover) gather(w Sink, i int, off int64, st *atomic.State, runs []fragment.Run, dt dtype.DType, addOne bool) error {
	first, last := runs[0], runs[len(runs)-1]
	es, ss := int64(dt.Size()), int64(st.DType.Size())
	span := last.Full + last.N - first.Full
	m.in = grow(m.in, span*ss)
	if err := st.ReadRange(first.Full, span, m.in); err != nil {
		return err
	}
	n := last.Local + last.N - first.Local
	m.out = grow(m.out, n*es)
	out := m.out
	pos := first.Local
	for _, r := range runs {
		clear(out[(pos-first.Local)*es : (r.Local-first.Local)*es])
		raw := m.in[(r.Full-first.Full)*ss : (r.Full-first.Full+r.N)*ss]
		if err := m.castInto(out[(r.Local-first.Local)*es:(r.Local-first.Local+r.N)*es], raw, st.DType, dt, r.N, addOne); err != nil {
			return fmt.Errorf("%s: %w", st.Path, err)
		}
		pos = r.Local + r.N
	}
	return w.WriteAt(i, out, off)
}

// Range writes elements [full, full+n) of st as dt at byte off of tensor
// i (plus one with addOne): copied in the kernel when st is stored as dt
// and nothing is added, else converted in pieces of Chunk elements.
func (m *Mover) Range(w Sink, i int, off int64, st *atomic.State, full, n int64, dt dtype.DType, addOne bool) error {
	es, ss := int64(dt.Size()), int64(st.DType.Size())
	if dt == st.DType && !addOne {
		if f, base := st.File(); f != nil {
			// With the state's block CRC-32s the copy is not read back
			// (fsutil.Copier.Blocks; atomic/FORMAT.md, "block_crc32").
			m.copier.Blocks = st.Blocks()
			err := w.CopyFrom(&m.copier, i, f, base+full*ss, off, n*es)
			m.copier.Blocks = nil
			if err != nil {
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
		out, err := m.cast(raw, st.DType, dt, k, addOne)
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

// cast converts k elements of raw from dtype from to dt (plus one with
// addOne), into the Mover's output buffer (raw itself when they agree and
// nothing is added).
func (m *Mover) cast(raw []byte, from, dt dtype.DType, k int64, addOne bool) ([]byte, error) {
	if from == dt && !addOne {
		return raw, nil
	}
	m.out = grow(m.out, int64(dt.Size())*k)
	return m.out, m.castInto(m.out, raw, from, dt, k, addOne)
}

// castInto converts k elements of raw from dtype from to dt into dst,
// through float32 (where addOne adds 1 to each) unless they agree.
func (m *Mover) castInto(dst, raw []byte, from, dt dtype.DType, k int64, addOne bool) error {
	switch {
	case addOne:
	case from == dt:
		copy(dst, raw)
		return nil
	case dt == dtype.Float32:
		return dtype.ToFloat32(dst, raw, from)
	}
	f32 := raw
	if from != dtype.Float32 || addOne {
		// raw may be the caller's: add in a copy.
		m.f32 = grow(m.f32, 4*k)
		if err := dtype.ToFloat32(m.f32, raw, from); err != nil {
			return err
		}
		f32 = m.f32
	}
	if addOne {
		for j := 0; j < len(f32); j += 4 {
			binary.LittleEndian.PutUint32(f32[j:], math.Float32bits(math.Float32frombits(binary.LittleEndian.Uint32(f32[j:]))+1))
		}
	}
	return castFloat32(dst, f32, dt)
}

// castFloat32 converts float32 elements to dt: the float types as torch's
// .to() rounds them (dtype.FromFloat32), float64 exactly, integers and
// bool (frozen buffers, which atomic checkpoints written before ucp kept
// their dtype hold exactly as float32) by truncation toward zero, as
// torch's float-to-int cast does.
func castFloat32(dst, src []byte, dt dtype.DType) error {
	switch dt {
	case dtype.Float32, dtype.BFloat16, dtype.Float16:
		return dtype.FromFloat32(dst, src, dt)
	}
	le := binary.LittleEndian
	n := len(src) / 4
	for k := 0; k < n; k++ {
		f := math.Float32frombits(le.Uint32(src[4*k:]))
		switch dt {
		case dtype.Float64:
			le.PutUint64(dst[8*k:], math.Float64bits(float64(f)))
		case dtype.Int64:
			le.PutUint64(dst[8*k:], uint64(int64(f)))
		case dtype.Int32:
			le.PutUint32(dst[4*k:], uint32(int32(f)))
		case dtype.Int16:
			le.PutUint16(dst[2*k:], uint16(int16(f)))
		case dtype.Int8:
			dst[k] = byte(int8(f))
		case dtype.Uint8:
			dst[k] = byte(f)
		case dtype.Bool:
			dst[k] = 0
			if f != 0 {
				dst[k] = 1
			}
		default:
			return fmt.Errorf("cannot write %v tensors", dt)
		}
	}
	return nil
}

// grow returns b resliced to n bytes, reallocated only when too small.
func grow(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}
