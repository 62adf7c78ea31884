package fragment

import (
	"fmt"
	"sort"

	"github.com/ucp-project/ucp/internal/torchfile"
)

// Run is N elements that are consecutive both in a shard (from Local) and
// in the full tensor (from Full), in row-major order.
type Run struct {
	Local, Full, N int64
}

// Runs calls fn, in increasing local order within each map, for the runs
// that place shard elements [start, start+n) into the full tensor of shape
// full. Elements outside every map are padding and produce no run.
// Adjacent runs are merged, so a dim-0 split yields a single run.
func (s *Shard) Runs(full []int64, start, n int64, fn func(Run)) {
	if n <= 0 {
		return
	}
	if s.Maps == nil {
		fn(Run{Local: start, Full: start, N: n})
		return
	}
	end := start + n
	var pend Run
	flush := func() {
		if pend.N > 0 {
			fn(pend)
		}
		pend = Run{}
	}
	emit := func(r Run) {
		if pend.N > 0 && pend.Local+pend.N == r.Local && pend.Full+pend.N == r.Full {
			pend.N += r.N
			return
		}
		flush()
		pend = r
	}
	lst := torchfile.ContiguousStrides(s.Shape)
	fst := torchfile.ContiguousStrides(full)
	for _, m := range s.Maps {
		nd := len(m.Size)
		if nd == 0 {
			if start == 0 {
				emit(Run{0, 0, 1})
			}
			continue
		}
		// Dims after k cover both tensors entirely, so each "row" over
		// dims [0, k] is one contiguous run in both.
		k := nd - 1
		for k > 0 && m.Size[k] == s.Shape[k] && m.Size[k] == full[k] && m.From[k] == 0 && m.To[k] == 0 {
			k--
		}
		rowLen := int64(1)
		for d := k; d < nd; d++ {
			rowLen *= m.Size[d]
		}
		if torchfile.Numel(m.Size) == 0 {
			continue
		}
		idx := make([]int64, k) // position among rows, dims [0, k)
		for {
			lo, fo := m.From[k]*lst[k], m.To[k]*fst[k]
			for d := 0; d < k; d++ {
				lo += (m.From[d] + idx[d]) * lst[d]
				fo += (m.To[d] + idx[d]) * fst[d]
			}
			if lo >= end {
				break // rows go up in local order: the rest lie past the range
			}
			if a, b := max(lo, start), min(lo+rowLen, end); a < b {
				emit(Run{Local: a, Full: fo + (a - lo), N: b - a})
			}
			d := k - 1
			for ; d >= 0; d-- {
				idx[d]++
				if idx[d] < m.Size[d] {
					break
				}
				idx[d] = 0
			}
			if d < 0 {
				break
			}
		}
		flush()
	}
	flush()
}

// MappedCount returns how many elements of the shard the maps place.
func (s *Shard) MappedCount() int64 {
	if s.Maps == nil {
		return torchfile.Numel(s.Shape)
	}
	var n int64
	for _, m := range s.Maps {
		n += torchfile.Numel(m.Size)
	}
	return n
}

// Validate checks one state's geometry against the full shape: shards have
// the rank of the full tensor, maps lie inside both tensors, the maps of
// one shard do not overlap, the placed (replica 0) boxes tile the full
// tensor exactly, and each shard's fragments tile its elements exactly
// once. This is the coverage check: it proves every element is written
// exactly once before anything is written.
func (st *State) Validate(full []int64) error {
	numel := torchfile.Numel(full)
	var placed []box
	for i, s := range st.Shards {
		if s.Maps == nil {
			if !torchfile.SameShape(s.Shape, full) {
				return fmt.Errorf("shard %d (%s) has shape %v but no placement in the full shape %v", i, s.Label, s.Shape, full)
			}
			if s.Replica == 0 {
				placed = append(placed, box{lo: make([]int64, len(full)), size: full})
			}
			continue
		}
		var own []box
		for j, m := range s.Maps {
			if len(m.From) != len(full) || len(m.To) != len(full) || len(m.Size) != len(full) || len(s.Shape) != len(full) {
				return fmt.Errorf("shard %d (%s) map %d: rank differs from the full shape %v", i, s.Label, j, full)
			}
			for d := range full {
				if m.From[d] < 0 || m.To[d] < 0 || m.Size[d] < 0 || m.From[d]+m.Size[d] > s.Shape[d] || m.To[d]+m.Size[d] > full[d] {
					return fmt.Errorf("shard %d (%s) map %d: box from %v to %v size %v exceeds shard %v or full %v",
						i, s.Label, j, m.From, m.To, m.Size, s.Shape, full)
				}
			}
			own = append(own, box{lo: m.From, size: m.Size})
			if s.Replica == 0 {
				placed = append(placed, box{lo: m.To, size: m.Size})
			}
		}
		if err := disjoint(own); err != nil {
			return fmt.Errorf("shard %d (%s): maps overlap: %w", i, s.Label, err)
		}
	}
	var vol int64
	for _, b := range placed {
		vol += torchfile.Numel(b.size)
	}
	if err := disjoint(placed); err != nil {
		return fmt.Errorf("shards overlap in the full tensor: %w", err)
	}
	if vol != numel {
		return fmt.Errorf("shards place %d of the %d elements", vol, numel)
	}
	// Fragments tile each shard.
	perShard := make([][]Fragment, len(st.Shards))
	for _, f := range st.Frags {
		if f.Shard < 0 || f.Shard >= len(st.Shards) {
			return fmt.Errorf("fragment refers to shard %d of %d", f.Shard, len(st.Shards))
		}
		if f.Len < 0 || f.SrcStart < 0 || f.SrcStart+f.Len > f.Src.Numel() {
			return fmt.Errorf("fragment [%d,%d) of %s lies outside the stored tensor of %d elements",
				f.SrcStart, f.SrcStart+f.Len, f.Src.Path, f.Src.Numel())
		}
		perShard[f.Shard] = append(perShard[f.Shard], f)
	}
	for i, fs := range perShard {
		sort.Slice(fs, func(a, b int) bool { return fs[a].LocalStart < fs[b].LocalStart })
		var at int64
		for _, f := range fs {
			if f.LocalStart != at {
				if f.LocalStart < at {
					return fmt.Errorf("shard %d (%s): elements [%d,%d) come from two fragments", i, st.Shards[i].Label, f.LocalStart, at)
				}
				return fmt.Errorf("shard %d (%s): elements [%d,%d) come from no fragment", i, st.Shards[i].Label, at, f.LocalStart)
			}
			at += f.Len
		}
		if n := torchfile.Numel(st.Shards[i].Shape); at != n {
			return fmt.Errorf("shard %d (%s): fragments cover %d of its %d elements", i, st.Shards[i].Label, at, n)
		}
	}
	return nil
}

type box struct{ lo, size []int64 }

// disjoint reports an error if two non-empty boxes overlap. It sweeps
// along dim 0, comparing each box only with those whose dim-0 range is
// still open, so regular grids of many chunks stay cheap.
func disjoint(bs []box) error {
	var live []box
	for _, b := range bs {
		if len(b.size) > 0 && torchfile.Numel(b.size) > 0 {
			live = append(live, b)
		}
	}
	if len(live) < 2 {
		return nil
	}
	if len(live[0].lo) == 0 {
		return fmt.Errorf("two 0-dim boxes")
	}
	sort.Slice(live, func(i, j int) bool { return live[i].lo[0] < live[j].lo[0] })
	var active []box
	for _, b := range live {
		kept := active[:0]
		for _, a := range active {
			if a.lo[0]+a.size[0] > b.lo[0] {
				kept = append(kept, a)
			}
		}
		active = kept
		for _, a := range active {
			if overlap(a, b) {
				return fmt.Errorf("boxes at %v and %v (sizes %v, %v)", a.lo, b.lo, a.size, b.size)
			}
		}
		active = append(active, b)
	}
	return nil
}

func overlap(a, b box) bool {
	for d := range a.lo {
		if a.size[d] == 0 || b.size[d] == 0 {
			return false
		}
		if a.lo[d]+a.size[d] <= b.lo[d] || b.lo[d]+b.size[d] <= a.lo[d] {
			return false
		}
	}
	return true
}

// Validate checks every state of every parameter.
func (t *Table) Validate() error {
	for _, p := range t.Params {
		if len(p.States) == 0 {
			return fmt.Errorf("parameter %s has no states", p.Name)
		}
		for _, s := range p.States {
			if err := s.Validate(p.Shape); err != nil {
				return fmt.Errorf("parameter %s, state %s: %w", p.Name, s.Name, err)
			}
		}
	}
	return nil
}
