// Package diff compares two checkpoints of any formats ucp reads, state by
// state: both sides are fragment tables, read in parallel chunks through
// mapreduce's reducers (ranged preads, the same float32 values convert
// writes), so memory stays bounded by workers x chunk size.
//
// Values are compared as float32 after conversion from the stored dtype,
// which is what convert writes: a bfloat16 tensor equals its float32
// widening; the stored dtypes are still reported side by side.
//
// Exact mode (rtol = atol = 0, the default) compares bit patterns: -0 and
// +0 differ, and NaNs are equal only with the same payload. With a
// tolerance, a and b match when |a-b| <= atol + rtol*|b| (B is the
// reference, as in numpy.isclose), any NaN matches any NaN, and infinities
// match only themselves.
package diff

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Options configure Compare.
type Options struct {
	RTol, ATol float64
	Workers    int   // concurrent comparers (at least 1)
	Memory     int64 // budget of the comparers' buffers in bytes (0: the plan's default chunks)
	ChunkElems int64 // largest chunk compared at once (0: from Memory)
}

// Entry is the comparison of one state (or the step) of one parameter.
type Entry struct {
	Param, State   string
	InA, InB       bool
	ShapeA, ShapeB []int64
	DTypeA, DTypeB string
	Elems          int64   // elements compared
	Differ         int64   // elements outside the tolerance (exact: different bits)
	NaN            int64   // of those, pairs where one side is NaN (or NaN payloads differ)
	MaxAbs         float64 // over pairs where neither is NaN
	MaxRel         float64 // |a-b| / |b|; +Inf where b is 0 and a is not
	First          int64   // first differing element (row-major), -1 if none
	mu             sync.Mutex
}

// Equal says whether the state is on both sides with the same shape and
// all its elements match.
func (e *Entry) Equal() bool {
	return e.InA && e.InB && torchfile.SameShape(e.ShapeA, e.ShapeB) && e.Differ == 0
}

// Status is a one-word verdict for listings.
func (e *Entry) Status() string {
	switch {
	case !e.InB:
		return "only in A"
	case !e.InA:
		return "only in B"
	case !torchfile.SameShape(e.ShapeA, e.ShapeB):
		return "shape differs"
	case e.Differ > 0:
		return "differs"
	}
	return "equal"
}

// Result is the comparison of two tables.
type Result struct {
	Entries   []*Entry
	BytesRead int64
}

// Equal says whether every entry is equal.
func (r *Result) Equal() bool {
	for _, e := range r.Entries {
		if !e.Equal() {
			return false
		}
	}
	return true
}

// Counts returns the number of entries per status.
func (r *Result) Counts() map[string]int {
	out := map[string]int{}
	for _, e := range r.Entries {
		out[e.Status()]++
	}
	return out
}

type pair struct {
	e      *Entry
	ai, as int // parameter and state of A (-1: none)
	bi, bs int
}

// Compare matches parameters by name and states by name and compares them.
func Compare(ctx context.Context, a, b *fragment.Table, opt Options) (*Result, error) {
	pairs, err := match(a, b)
	if err != nil {
		return nil, err
	}
	res := &Result{}
	for _, p := range pairs {
		res.Entries = append(res.Entries, p.e)
	}
	// The plan over A's states gives memory-bounded, row-aligned chunks.
	plan, err := mapreduce.NewPlan(a, mapreduce.PlanOptions{Nodes: 1, Cores: max(opt.Workers, 1), Memory: opt.Memory, ChunkElems: opt.ChunkElems})
	if err != nil {
		return nil, err
	}
	byA := map[[2]int]*pair{}
	for i := range pairs {
		p := &pairs[i]
		if p.as >= 0 && p.bs >= 0 && torchfile.SameShape(p.e.ShapeA, p.e.ShapeB) {
			byA[[2]int{p.ai, p.as}] = p
		}
	}
	var tasks []mapreduce.Task
	for _, tk := range plan.Tasks {
		if tk.Kind != mapreduce.ReduceTask {
			continue
		}
		o := plan.Outputs[tk.Output]
		if byA[[2]int{o.Param, o.State}] != nil {
			tasks = append(tasks, tk)
		}
	}
	step := streamElems(opt)
	sa, sb := mapreduce.NewSource(a), mapreduce.NewSource(b)
	defer sa.Close()
	defer sb.Close()
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for w := 0; w < max(opt.Workers, 1); w++ {
		ga, gb := sa.Gatherer(), sb.Gatherer()
		g.Go(func() error {
			var bufA, bufB []byte
			for {
				i := int(next.Add(1) - 1)
				if i >= len(tasks) {
					return nil
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				tk := tasks[i]
				o := plan.Outputs[tk.Output]
				p := byA[[2]int{o.Param, o.State}]
				// The task is compared in pieces of at most step elements:
				// buffers stay small (and in the CPU's cache) whatever the
				// plan's chunk.
				var c chunkStats
				c.first = -1
				for lo := tk.Start; lo < tk.End; lo += step {
					hi := min(lo+step, tk.End)
					n := 4 * (hi - lo)
					bufA, bufB = grow(bufA, n), grow(bufB, n)
					if err := ga.Read(p.ai, p.as, lo, hi, bufA); err != nil {
						return fmt.Errorf("A: %w", err)
					}
					if err := gb.Read(p.bi, p.bs, lo, hi, bufB); err != nil {
						return fmt.Errorf("B: %w", err)
					}
					if bytes.Equal(bufA, bufB) { // equal bits are equal in every mode
						c.elems += hi - lo
						continue
					}
					c.merge(compareChunk(dtype.Float32s(bufA), dtype.Float32s(bufB), lo, opt))
				}
				p.e.add(c)
			}
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i := range pairs {
		p := &pairs[i]
		if p.e.State == fragment.StepState && p.e.InA && p.e.InB {
			va, err := stepValue(a.Params[p.ai].Step)
			if err != nil {
				return nil, fmt.Errorf("A: %s: %w", p.e.Param, err)
			}
			vb, err := stepValue(b.Params[p.bi].Step)
			if err != nil {
				return nil, fmt.Errorf("B: %s: %w", p.e.Param, err)
			}
			p.e.add(compareStep(va, vb, opt))
		}
	}
	res.BytesRead = sa.BytesRead() + sb.BytesRead()
	return res, nil
}

// maxStreamElems bounds the elements compared at once per worker: two
// float32 buffers of 1 MiB, plus the raw reads behind them.
const maxStreamElems = 256 << 10

// bytesPerStreamElem is a comparer's memory per element in flight: two
// float32 buffers and the raw source reads of both sides (up to 8 bytes
// each, float64 sources).
const bytesPerStreamElem = 24

// streamElems is how many elements one worker compares at once: at most
// maxStreamElems, less when --memory is smaller.
func streamElems(opt Options) int64 {
	n := int64(maxStreamElems)
	if opt.ChunkElems > 0 {
		n = min(n, opt.ChunkElems)
	}
	if opt.Memory > 0 {
		n = min(n, max(opt.Memory/int64(max(opt.Workers, 1))/bytesPerStreamElem, 64))
	}
	return max(n, 1)
}

func grow(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// match pairs A's parameters and states with B's by name: A's order, then
// what only B has.
func match(a, b *fragment.Table) ([]pair, error) {
	index := func(t *fragment.Table, side string) (map[string]int, error) {
		m := map[string]int{}
		for i, p := range t.Params {
			if _, dup := m[p.Name]; dup {
				return nil, fmt.Errorf("%s (%s): parameter %s appears twice", t.Source, side, p.Name)
			}
			m[p.Name] = i
		}
		return m, nil
	}
	ia, err := index(a, "A")
	if err != nil {
		return nil, err
	}
	ib, err := index(b, "B")
	if err != nil {
		return nil, err
	}
	var out []pair
	add := func(name string, ai, bi int) {
		var pa, pb *fragment.Param
		if ai >= 0 {
			pa = a.Params[ai]
		}
		if bi >= 0 {
			pb = b.Params[bi]
		}
		seen := map[string]bool{}
		var states []string
		for _, p := range []*fragment.Param{pa, pb} {
			if p == nil {
				continue
			}
			for _, s := range p.States {
				if !seen[s.Name] {
					seen[s.Name] = true
					states = append(states, s.Name)
				}
			}
		}
		states = fragment.StateOrder(states)
		for _, s := range states {
			e := &Entry{Param: name, State: s, First: -1}
			pr := pair{e: e, ai: ai, as: -1, bi: bi, bs: -1}
			if pa != nil {
				if k := stateIndex(pa, s); k >= 0 {
					pr.as, e.InA, e.ShapeA, e.DTypeA = k, true, pa.Shape, stateDType(pa.States[k])
				}
			}
			if pb != nil {
				if k := stateIndex(pb, s); k >= 0 {
					pr.bs, e.InB, e.ShapeB, e.DTypeB = k, true, pb.Shape, stateDType(pb.States[k])
				}
			}
			out = append(out, pr)
		}
		if (pa != nil && pa.Step != nil) || (pb != nil && pb.Step != nil) {
			e := &Entry{Param: name, State: fragment.StepState, First: -1, InA: pa != nil && pa.Step != nil, InB: pb != nil && pb.Step != nil}
			if e.InA {
				e.ShapeA, e.DTypeA = []int64{}, stepDType(pa.Step)
			}
			if e.InB {
				e.ShapeB, e.DTypeB = []int64{}, stepDType(pb.Step)
			}
			out = append(out, pair{e: e, ai: ai, as: -1, bi: bi, bs: -1})
		}
	}
	for i, p := range a.Params {
		bi, ok := ib[p.Name]
		if !ok {
			bi = -1
		}
		add(p.Name, i, bi)
	}
	for i, p := range b.Params {
		if _, ok := ia[p.Name]; !ok {
			add(p.Name, -1, i)
		}
	}
	return out, nil
}

func stateIndex(p *fragment.Param, name string) int {
	for i, s := range p.States {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// stateDType names the stored dtypes of a state's fragments ("bfloat16",
// or "float32+bfloat16" when they are mixed).
func stateDType(st *fragment.State) string {
	seen := map[string]bool{}
	var out []string
	for _, f := range st.Frags {
		d := f.Src.DType().String()
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "+")
}

func stepDType(s *fragment.Step) string {
	if s.Tensor != nil {
		return s.Tensor.DType().String()
	}
	return pyobj.TypeName(s.Value)
}

// stepValue reads a step count as a float64.
func stepValue(s *fragment.Step) (float64, error) {
	if s.Tensor == nil {
		if v, ok := pyobj.Float(s.Value); ok {
			return v, nil
		}
		return 0, fmt.Errorf("step is a %s, want a number", pyobj.TypeName(s.Value))
	}
	if s.Tensor.Numel() != 1 {
		return 0, fmt.Errorf("%s: step tensor has %d elements, want 1", s.Tensor.Path, s.Tensor.Numel())
	}
	// Storage offsets are absolute in the file, which need not be one
	// torch.save zip (a DCP item lies inside a .distcp file): read by range.
	f, err := os.Open(s.Tensor.Path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	dt := s.Tensor.DType()
	raw := make([]byte, dt.Size())
	if err := torchfile.ReadRange(f, s.Tensor.T, 0, 1, raw); err != nil {
		return 0, fmt.Errorf("%s: %w", s.Tensor.Path, err)
	}
	if dt == dtype.Int64 {
		return float64(int64(leUint64(raw))), nil
	}
	f32 := make([]byte, 4)
	if err := dtype.ToFloat32(f32, raw, dt); err != nil {
		return 0, fmt.Errorf("%s: %w", s.Tensor.Path, err)
	}
	return float64(dtype.Float32s(f32)[0]), nil
}

func leUint64(b []byte) uint64 {
	var u uint64
	for i := 7; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	return u
}

// chunkStats is the comparison of one chunk.
type chunkStats struct {
	elems, differ, nan int64
	maxAbs, maxRel     float64
	first              int64
}

func (e *Entry) add(c chunkStats) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.Elems += c.elems
	e.Differ += c.differ
	e.NaN += c.nan
	e.MaxAbs = max(e.MaxAbs, c.maxAbs)
	e.MaxRel = max(e.MaxRel, c.maxRel)
	if c.first >= 0 && (e.First < 0 || c.first < e.First) {
		e.First = c.first
	}
}

// compareChunk compares elements start.. of two float32 chunks.
func compareChunk(a, b []float32, start int64, opt Options) chunkStats {
	c := chunkStats{elems: int64(len(a)), first: -1}
	exact := opt.RTol == 0 && opt.ATol == 0
	for i := range a {
		x, y := a[i], b[i]
		if math.Float32bits(x) == math.Float32bits(y) {
			continue
		}
		nx, ny := x != x, y != y
		if nx || ny {
			if !exact && nx && ny {
				continue
			}
			c.nan++
			c.note(start + int64(i))
			continue
		}
		d := math.Abs(float64(x) - float64(y))
		if math.IsInf(float64(x), 0) || math.IsInf(float64(y), 0) {
			d = math.Inf(1)
		}
		c.maxAbs = max(c.maxAbs, d)
		rel := math.Inf(1)
		if y != 0 {
			rel = d / math.Abs(float64(y))
		} else if d == 0 {
			rel = 0 // -0 vs +0
		}
		c.maxRel = max(c.maxRel, rel)
		if exact || !(d <= opt.ATol+opt.RTol*math.Abs(float64(y))) {
			c.note(start + int64(i))
		}
	}
	return c
}

// merge adds the statistics of a later piece of the same chunk.
func (c *chunkStats) merge(d chunkStats) {
	c.elems += d.elems
	c.differ += d.differ
	c.nan += d.nan
	c.maxAbs = max(c.maxAbs, d.maxAbs)
	c.maxRel = max(c.maxRel, d.maxRel)
	if c.first < 0 {
		c.first = d.first
	}
}

func (c *chunkStats) note(i int64) {
	c.differ++
	if c.first < 0 {
		c.first = i
	}
}

func compareStep(a, b float64, opt Options) chunkStats {
	c := chunkStats{elems: 1, first: -1}
	if a == b {
		return c
	}
	d := math.Abs(a - b)
	c.maxAbs = d
	c.maxRel = math.Inf(1)
	if b != 0 {
		c.maxRel = d / math.Abs(b)
	}
	if opt.RTol == 0 && opt.ATol == 0 || d > opt.ATol+opt.RTol*math.Abs(b) {
		c.note(0)
	}
	return c
}
