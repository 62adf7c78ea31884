package mapreduce

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	ucpatomic "github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Options configure Run.
type Options struct {
	Node    int // which node of the plan this process is
	Workers int // concurrent reducers (0: all cores)
	// CheckReplicas reads every replica of replicated parameters and
	// requires them to be identical, as ds_to_universal does.
	CheckReplicas bool
	// Progress, if set, is told of bytes read and written as they happen.
	Progress func(read, written int64)
	// PieceBytes bounds the output bytes a reducer gathers before it
	// writes them (0: DefaultPieceBytes).
	PieceBytes int64
}

// Stats report what a run did.
type Stats struct {
	Tasks        int   `json:"tasks"`
	BytesRead    int64 `json:"bytes_read"`
	BytesWritten int64 `json:"bytes_written"`
	// ReusedFiles and ReusedBytes are what a resumed run took over from
	// the killed one; BytesRead and BytesWritten count this run only.
	ReusedFiles int           `json:"reused_files"`
	ReusedBytes int64         `json:"reused_bytes"`
	Elapsed     time.Duration `json:"elapsed_ns"`
	Workers     []WorkerStats `json:"workers"`
}

// WorkerStats are one reducer's phase timings and its tasks on a timeline.
type WorkerStats struct {
	Tasks        int   `json:"tasks"`
	BytesRead    int64 `json:"bytes_read"`
	BytesWritten int64 `json:"bytes_written"`
	Phases
	Wait  time.Duration `json:"wait_ns"`
	Spans []Span        `json:"spans"`
}

// Phases is time spent reading the source, converting (casting, placing,
// averaging) and writing the output.
type Phases struct {
	Read    time.Duration `json:"read_ns"`
	Convert time.Duration `json:"convert_ns"`
	Write   time.Duration `json:"write_ns"`
}

// Busy is the time in all three phases.
func (p Phases) Busy() time.Duration { return p.Read + p.Convert + p.Write }

// Span is one task on the timeline, in nanoseconds since the run started,
// with the time it spent in each phase (they add up to End-Start).
type Span struct {
	Start int64  `json:"start_ns"`
	End   int64  `json:"end_ns"`
	Label string `json:"label"`
	Bytes int64  `json:"bytes"`
	Phases
}

// outFile is one output state or copied file shared by the tasks that
// write it.
type outFile struct {
	mu      sync.Mutex
	f       *ucpatomic.File       // a state file
	c       *ucpatomic.CopyTarget // a copied file
	src     *os.File              // the copied file's source
	err     error
	pending int32
}

type runner struct {
	t     *fragment.Table
	plan  *Plan
	w     *ucpatomic.Writer
	opt   Options
	src   *sources
	files map[int]*outFile // by output
	start time.Time
}

// Run executes the plan's tasks of node opt.Node, writing into w. On error
// every file of this run is removed; the caller aborts w.
func Run(ctx context.Context, plan *Plan, w *ucpatomic.Writer, opt Options) (*Stats, error) {
	workers := opt.Workers
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	if opt.PieceBytes <= 0 {
		opt.PieceBytes = DefaultPieceBytes
	}
	var tasks []Task
	for _, tk := range plan.NodeTasks(opt.Node) {
		// A resumed run reuses the files the killed one completed.
		if _, done := w.Done(plan.Outputs[tk.Output].Path); !done {
			tasks = append(tasks, tk)
		}
	}
	r := &runner{t: plan.t, plan: plan, w: w, opt: opt, src: newSources(), files: map[int]*outFile{}, start: time.Now()}
	defer r.src.close()
	for _, tk := range tasks {
		if tk.Kind == StepTask || tk.Kind == ValueTask {
			continue
		}
		if r.files[tk.Output] == nil {
			r.files[tk.Output] = &outFile{}
		}
		r.files[tk.Output].pending++
	}
	stats := &Stats{Tasks: len(tasks), Workers: make([]WorkerStats, workers)}
	stats.ReusedFiles, stats.ReusedBytes = w.Reused()
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for wi := 0; wi < workers; wi++ {
		ws := &stats.Workers[wi]
		g.Go(func() error {
			red := &reducer{r: r, ws: ws}
			for {
				i := int(next.Add(1) - 1)
				if i >= len(tasks) {
					return nil
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				t0, before := time.Now(), ws.Phases
				if err := red.run(tasks[i]); err != nil {
					return err
				}
				ws.Tasks++
				sp := Span{Start: int64(t0.Sub(r.start)), End: int64(time.Since(r.start)), Label: plan.Label(tasks[i]),
					Bytes: tasks[i].Bytes, Phases: Phases{Read: ws.Read - before.Read, Write: ws.Write - before.Write}}
				// Time in a task outside reads and writes is the reducer's own
				// work (placing runs, averaging): count it as convert, so
				// Wait is only time without a task.
				sp.Convert = time.Duration(sp.End-sp.Start) - sp.Read - sp.Write
				ws.Convert = before.Convert + sp.Convert
				ws.Spans = append(ws.Spans, sp)
			}
		})
	}
	err := g.Wait()
	stats.Elapsed = time.Since(r.start)
	for i := range stats.Workers {
		ws := &stats.Workers[i]
		ws.Wait = max(stats.Elapsed-ws.Busy(), 0)
		stats.BytesRead += ws.BytesRead
		stats.BytesWritten += ws.BytesWritten
	}
	if err != nil {
		for _, f := range r.files {
			if f.f != nil {
				f.f.Abort()
			}
			if f.c != nil {
				f.c.Abort()
			}
		}
		return stats, err
	}
	return stats, nil
}

// reducer is one worker's state: reusable buffers and its statistics.
type reducer struct {
	r       *runner
	ws      *WorkerStats
	out     []byte
	tmp     []byte
	raw     []byte
	acc     []float32
	iov     [][]byte
	windows map[string]*window
	uses    int64
	copier  fsutil.Copier // its buffer is reused by every copy task
}

func grow(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}

func (red *reducer) run(tk Task) error {
	r := red.r
	o := &r.plan.Outputs[tk.Output]
	switch tk.Kind {
	case CopyTask:
		t0 := time.Now()
		err := red.copyRange(tk, o)
		n := tk.End - tk.Start
		red.ws.Write += time.Since(t0)
		red.ws.BytesRead += n
		red.ws.BytesWritten += n
		if r.opt.Progress != nil {
			r.opt.Progress(n, n)
		}
		return err
	case StepTask:
		// A step is a few bytes read and one small file written: count it
		// as writing, which is what it waits on.
		t0 := time.Now()
		err := red.step(o)
		red.ws.Write += time.Since(t0)
		return err
	case ValueTask:
		// Its tensors are copied in the kernel: count it as writing. Its
		// bytes stay out of BytesRead and the progress, which count what
		// inspect and the plan say is read (the table's states and copies).
		t0 := time.Now()
		_, err := writeValue(r.w, o.Path, o.Value, 1)
		red.ws.Write += time.Since(t0)
		return err
	}
	p := r.t.Params[o.Param]
	st := p.States[o.State]
	es := int64(o.DType.Size())
	if cps, ok := red.directCopies(p, st, tk.Start, tk.End, o.DType); ok {
		return red.copyDirect(tk, o, p, cps)
	}
	f, err := red.stateFile(tk, o, p)
	if err != nil {
		return err
	}
	// The task is reduced and written a piece at a time through buffers
	// the reducer reuses: a task-sized buffer (64 MB) cost a page fault
	// per 4 KiB on its first use and evicted the cache between reading
	// and writing it.
	step := max(r.opt.PieceBytes/es, 1)
	for a := tk.Start; a < tk.End; a += step {
		b := min(a+step, tk.End)
		red.out = grow(red.out, es*(b-a))
		if err := red.reduce(p, st, a, b, o.DType); err != nil {
			return fmt.Errorf("parameter %s, state %s: %w", p.Name, st.Name, err)
		}
		t0 := time.Now()
		if err := f.WriteAt(0, red.out, es*a); err != nil {
			return err
		}
		red.ws.Write += time.Since(t0)
		red.ws.BytesWritten += es * (b - a)
		if r.opt.Progress != nil {
			r.opt.Progress(0, es*(b-a))
		}
	}
	return red.done(tk, f)
}

// DefaultPieceBytes is small enough for a piece to stay in the cache
// between its reads and its write, big enough that it is a few large
// reads and one write.
const DefaultPieceBytes = 4 << 20

// reduce fills red.out with full elements [start, end) of the state.
func (red *reducer) reduce(p *fragment.Param, st *fragment.State, start, end int64, odt dtype.DType) error {
	if p.Average {
		return red.average(p, st, start, end)
	}
	if err := red.gather(p, st, 0, start, end, red.out, odt); err != nil {
		return err
	}
	if red.r.opt.CheckReplicas {
		return red.checkReplicas(p, st, start, end, odt)
	}
	return nil
}

// stateFile returns the task's output file, created by the first task.
func (red *reducer) stateFile(tk Task, o *Output, p *fragment.Param) (*ucpatomic.File, error) {
	of := red.r.files[tk.Output]
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.f == nil && of.err == nil {
		of.f, of.err = red.r.w.CreateFile(o.Path, stateRoot(p, o), o.Shared)
	}
	return of.f, of.err
}

// done commits the file after its last task.
func (red *reducer) done(tk Task, f *ucpatomic.File) error {
	if atomic.AddInt32(&red.r.files[tk.Output].pending, -1) == 0 {
		if _, err := f.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// directCopy is a run of stored elements that lands unchanged in the
// output: n elements of tensor t from element src to full element full.
type directCopy struct {
	ref       *fragment.TensorRef
	src, full int64
	n         int64
}

// directCopies returns the task's elements as byte ranges to copy in the
// kernel when nothing needs converting: one replica (or replicas not
// checked), no averaging, every fragment stored contiguously in the output
// dtype and placed as one run. ZeRO's fp32 partitions are such: each
// parameter is a contiguous slice of a flat fp32 tensor.
func (red *reducer) directCopies(p *fragment.Param, st *fragment.State, start, end int64, odt dtype.DType) ([]directCopy, bool) {
	if p.Average || (red.r.opt.CheckReplicas && len(replicas(st)) > 1) {
		return nil, false
	}
	var out []directCopy
	for i := range st.Frags {
		f := &st.Frags[i]
		sh := &st.Shards[f.Shard]
		if sh.Replica != 0 {
			continue
		}
		if f.Src.DType() != odt || !f.Src.T.IsContiguous() || f.Src.T.Storage.Offset < 0 {
			return nil, false
		}
		ok, first := true, len(out)
		sh.Runs(p.Shape, f.LocalStart, f.Len, func(rn fragment.Run) {
			a, b := max(rn.Full, start), min(rn.Full+rn.N, end)
			if a >= b || !ok {
				return
			}
			src := f.SrcStart + (rn.Local + (a - rn.Full) - f.LocalStart)
			if src < 0 || src+(b-a) > f.Src.T.Numel() {
				ok = false // the buffered path reports it
				return
			}
			if k := len(out) - 1; k >= first && out[k].src+out[k].n == src && out[k].full+out[k].n == a {
				out[k].n += b - a // adjacent in the source and the output: one copy
				return
			}
			out = append(out, directCopy{ref: &f.Src, src: src, full: a, n: b - a})
			// Many small runs (a column split) cost a system call each:
			// the buffered path gathers them with one read.
			ok = len(out)-first <= 4
		})
		if !ok {
			return nil, false
		}
	}
	return out, true
}

// copyDirect copies the task's runs from the source files into the
// output file in the kernel.
func (red *reducer) copyDirect(tk Task, o *Output, p *fragment.Param, cps []directCopy) error {
	t0 := time.Now()
	f, err := red.stateFile(tk, o, p)
	if err != nil {
		return err
	}
	es := int64(o.DType.Size())
	var n int64
	for _, c := range cps {
		src, err := red.r.src.get(c.ref.Path)
		if err != nil {
			return err
		}
		if err := copyRef(f, &red.copier, 0, src, c.ref, c.src, c.full, c.n); err != nil {
			return fmt.Errorf("parameter %s, state %s: %w", p.Name, o.Name, err)
		}
		n += es * c.n
	}
	if err := red.done(tk, f); err != nil {
		return err
	}
	red.ws.Write += time.Since(t0)
	red.ws.BytesRead += n
	red.ws.BytesWritten += n
	if red.r.opt.Progress != nil {
		red.r.opt.Progress(n, n)
	}
	return nil
}

// copyRange copies a copy task's byte range; the file is created by its
// first task (its source checked against the size the plan was made
// with) and committed by its last.
func (red *reducer) copyRange(tk Task, o *Output) error {
	r := red.r
	of := r.files[tk.Output]
	of.mu.Lock()
	if of.c == nil && of.err == nil {
		of.src, of.err = r.src.get(o.Src)
		if of.err == nil {
			of.err = sameSize(of.src, o.Size)
		}
		if of.err == nil {
			of.c, of.err = r.w.CreateCopy(o.Path, o.Size)
		}
	}
	c, src, err := of.c, of.src, of.err
	of.mu.Unlock()
	if err != nil {
		return err
	}
	if err := c.CopyRange(&red.copier, src, tk.Start, tk.End-tk.Start); err != nil {
		return err
	}
	if atomic.AddInt32(&of.pending, -1) == 0 {
		if _, err := c.Commit(); err != nil {
			return err
		}
	}
	return nil
}

func sameSize(f *os.File, size int64) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != size {
		return fmt.Errorf("%s: %d bytes, but %d when the checkpoint was indexed (changed during the conversion?)", f.Name(), st.Size(), size)
	}
	return nil
}

// gather places the fragments of the shards with the given replica index
// that fall in full elements [start, end) into out, as elements of odt:
// float32, or the fragments' own dtype (copied bit for bit).
func (red *reducer) gather(p *fragment.Param, st *fragment.State, replica int, start, end int64, out []byte, odt dtype.DType) error {
	var runs []placeRun
	for _, f := range st.Frags {
		sh := &st.Shards[f.Shard]
		if sh.Replica != replica {
			continue
		}
		runs = runs[:0]
		lo, hi := int64(math.MaxInt64), int64(-1)
		sh.Runs(p.Shape, f.LocalStart, f.Len, func(rn fragment.Run) {
			a, b := max(rn.Full, start), min(rn.Full+rn.N, end)
			if a >= b {
				return
			}
			l := rn.Local + (a - rn.Full)
			runs = append(runs, placeRun{local: l, full: a, n: b - a})
			lo, hi = min(lo, l), max(hi, l+b-a)
		})
		if len(runs) == 0 {
			continue
		}
		if err := red.readInto(f, lo, hi, out, start, runs, odt); err != nil {
			return err
		}
	}
	return nil
}

// placeRun is a run clipped to a task: n elements from shard element local
// to full-tensor element full.
type placeRun struct{ local, full, n int64 }

// readInto reads the fragment's shard elements [lo, hi), converts them to
// odt (float32) or keeps them as they are (odt is their dtype) and copies
// each run to its place in out.
func (red *reducer) readInto(f fragment.Fragment, lo, hi int64, out []byte, start int64, runs []placeRun, odt dtype.DType) error {
	file, err := red.reader(f.Src.Path)
	if err != nil {
		return err
	}
	dt := f.Src.DType()
	if odt != dt && odt != dtype.Float32 {
		return fmt.Errorf("%s: a %v tensor cannot be written as %v", f.Src.Path, dt, odt)
	}
	n := hi - lo
	srcStart := f.SrcStart + (lo - f.LocalStart)
	es, oes := int64(dt.Size()), int64(odt.Size())
	t0 := time.Now()
	if dt == odt && len(runs) == 1 && runs[0].local == lo && runs[0].n == n {
		// Already in the output dtype and contiguous in the output: read in place.
		dst := out[oes*(runs[0].full-start) : oes*(runs[0].full-start+n)]
		if err := torchfile.ReadRange(file, f.Src.T, srcStart, n, dst); err != nil {
			return fmt.Errorf("%s: %w", f.Src.Path, err)
		}
		red.account(time.Since(t0), 0, es*n)
		return nil
	}
	if dt == odt && n*es >= preadvMin && f.Src.T.IsContiguous() && f.Src.T.Storage.Offset >= 0 &&
		srcStart >= 0 && srcStart+n <= f.Src.T.Numel() && contiguous(runs, lo) {
		// Runs back to back in the source (a row-parallel weight's rows):
		// one preadv puts each in its place, with no copy in user space.
		src, err := red.r.src.get(f.Src.Path)
		if err != nil {
			return err
		}
		red.iov = red.iov[:0]
		for _, rn := range runs {
			red.iov = append(red.iov, out[oes*(rn.full-start):oes*(rn.full-start+rn.n)])
		}
		if err := preadRuns(src, f.Src.T.FileOffset()+es*srcStart, red.iov); err != nil {
			return fmt.Errorf("%s: %w", f.Src.Path, err)
		}
		red.account(time.Since(t0), 0, es*n)
		return nil
	}
	red.raw = grow(red.raw, n*es)
	if err := torchfile.ReadRange(file, f.Src.T, srcStart, n, red.raw); err != nil {
		return fmt.Errorf("%s: %w", f.Src.Path, err)
	}
	t1 := time.Now()
	// Each run is converted (or copied) straight to its place in out: no
	// intermediate float32 buffer and no second copy (for float32 sources
	// split across rows, the conversion is the one copy).
	for _, rn := range runs {
		dst, src := out[oes*(rn.full-start):oes*(rn.full-start+rn.n)], red.raw[es*(rn.local-lo):es*(rn.local-lo+rn.n)]
		if dt == odt {
			copy(dst, src)
			continue
		}
		if err := dtype.ToFloat32(dst, src, dt); err != nil {
			return fmt.Errorf("%s: %w", f.Src.Path, err)
		}
	}
	red.account(t1.Sub(t0), time.Since(t1), n*es)
	return nil
}

// preadvMin is the least a fragment's runs must hold to be read with
// preadv; smaller reads go through the read-ahead window.
const preadvMin = 64 << 10

// contiguous reports whether the runs follow each other in the shard
// from element lo.
func contiguous(runs []placeRun, lo int64) bool {
	for _, rn := range runs {
		if rn.local != lo {
			return false
		}
		lo += rn.n
	}
	return true
}

func (red *reducer) account(read, convert time.Duration, bytesRead int64) {
	red.ws.Read += read
	red.ws.Convert += convert
	red.ws.BytesRead += bytesRead
	if red.r.opt.Progress != nil {
		red.r.opt.Progress(bytesRead, 0)
	}
}

// replicas returns the replica indexes of a state in order.
func replicas(st *fragment.State) []int {
	seen := map[int]bool{}
	var out []int
	for _, s := range st.Shards {
		if !seen[s.Replica] {
			seen[s.Replica] = true
			out = append(out, s.Replica)
		}
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// average computes the mean of all replicas in float32 exactly as
// ds_to_universal does: sum(slices) / len(slices), left to right from 0.
func (red *reducer) average(p *fragment.Param, st *fragment.State, start, end int64) error {
	n := end - start
	reps := replicas(st)
	if int64(cap(red.acc)) < n {
		red.acc = make([]float32, n)
	}
	acc := red.acc[:n]
	clear(acc)
	red.tmp = grow(red.tmp, 4*n)
	for _, rep := range reps {
		if err := red.gather(p, st, rep, start, end, red.tmp, dtype.Float32); err != nil {
			return err
		}
		for i := range acc {
			acc[i] += math.Float32frombits(binary.LittleEndian.Uint32(red.tmp[4*i:]))
		}
	}
	div := float32(len(reps))
	for i, v := range acc {
		binary.LittleEndian.PutUint32(red.out[4*i:], math.Float32bits(v/div))
	}
	return nil
}

// checkReplicas compares every other replica of [start, end) with replica
// 0 in red.out, element by element in odt.
func (red *reducer) checkReplicas(p *fragment.Param, st *fragment.State, start, end int64, odt dtype.DType) error {
	reps := replicas(st)
	if len(reps) < 2 {
		return nil
	}
	es := int64(odt.Size())
	red.tmp = grow(red.tmp, es*(end-start))
	for _, rep := range reps[1:] {
		if err := red.gather(p, st, rep, start, end, red.tmp, odt); err != nil {
			return err
		}
		if !bytes.Equal(red.tmp, red.out[:len(red.tmp)]) {
			for i := int64(0); i < end-start; i++ {
				a, b := red.tmp[es*i:es*i+es], red.out[es*i:es*i+es]
				if !bytes.Equal(a, b) {
					return fmt.Errorf("replica %d differs from replica 0 at element %d (%s vs %s); the copies are not identical",
						rep, start+i, elemString(a, odt), elemString(b, odt))
				}
			}
		}
	}
	return nil
}

// elemString prints one element of dt for an error message.
func elemString(b []byte, dt dtype.DType) string {
	switch dt {
	case dtype.Int64:
		return fmt.Sprint(int64(binary.LittleEndian.Uint64(b)))
	case dtype.Int32:
		return fmt.Sprint(int32(binary.LittleEndian.Uint32(b)))
	}
	var f [4]byte
	if err := dtype.ToFloat32(f[:], b, dt); err != nil {
		return fmt.Sprintf("%x", b)
	}
	return fmt.Sprint(math.Float32frombits(binary.LittleEndian.Uint32(f[:])))
}

// step writes a step file: its value, or its tensor's bytes read now.
func (red *reducer) step(o *Output) error {
	r := red.r
	p := r.t.Params[o.Param]
	s := p.Step
	if s.Tensor == nil {
		_, err := writeValue(r.w, o.Path, s.Value, 1)
		return err
	}
	file, err := r.src.get(s.Tensor.Path)
	if err != nil {
		return err
	}
	raw := make([]byte, s.Tensor.T.NBytes())
	if err := torchfile.ReadRange(file, s.Tensor.T, 0, s.Tensor.Numel(), raw); err != nil {
		return fmt.Errorf("%s: step of %s: %w", s.Tensor.Path, p.Name, err)
	}
	_, err = writeValue(r.w, o.Path, torchfile.NewBlob(s.Tensor.DType(), s.Tensor.T.Shape, raw), 1)
	return err
}

// sources keeps source files open for concurrent preads.
type sources struct {
	mu    sync.Mutex
	files map[string]*os.File
}

func newSources() *sources { return &sources{files: map[string]*os.File{}} }

func (s *sources) get(path string) (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.files[path]; ok {
		return f, nil
	}
	f, err := fsutil.Open(path)
	if err != nil {
		return nil, err
	}
	s.files[path] = f
	return f, nil
}

func (s *sources) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		f.Close()
	}
	s.files = map[string]*os.File{}
}
