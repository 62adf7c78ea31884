// Patterns (Kind, Pattern) name how a parameter is sharded across model-parallel
// ranks (the Universal Checkpointing patterns) and build the placements
// that rebuild the full tensor from the shards: Extract cuts a parameter's
// elements out of a flat partition, the pattern types Union shards along
// the right dims, and StripPad drops padding by leaving it unplaced.
//
// A pattern is derived from placements (Classify), except Partial, which
// the geometry cannot show: its copies were updated independently and are
// averaged, so the source format must say so.

package fragment

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/torchfile"
)

// Kind is a sharding pattern.
type Kind uint8

const (
	Unique    Kind = iota // one rank holds the whole tensor
	Replicate             // every rank holds an identical copy
	Partial               // every rank holds a copy updated independently; the atomic value is their mean
	ShardV                // split along dim 0 (or a flattened tensor split in ranges)
	ShardH                // split along one other dim
	ShardHy               // split along several dims
	ShardNC               // each rank holds several non-contiguous blocks (fused sub-parameters)
)

var kindNames = [...]string{"Unique", "Replicate", "Partial", "Shard-V", "Shard-H", "Shard-Hy", "Shard-NC"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// Pattern builds the shard that rank r of T holds of a full tensor.
type Pattern interface {
	Kind() Kind
	Shard(full []int64, r, T int) (Shard, error)
}

// Whole is held by a single rank (T must be 1).
type Whole struct{}

func (Whole) Kind() Kind { return Unique }

func (Whole) Shard(full []int64, r, T int) (Shard, error) {
	if T != 1 {
		return Shard{}, fmt.Errorf("a unique tensor cannot be held by %d ranks", T)
	}
	return Shard{Shape: clone(full)}, nil
}

// Replicated copies are identical; rank 0's is placed, the others are replicas.
type Replicated struct{}

func (Replicated) Kind() Kind { return Replicate }

func (Replicated) Shard(full []int64, r, T int) (Shard, error) {
	return Shard{Shape: clone(full), Replica: r, Label: fmt.Sprintf("tp%d", r)}, nil
}

// Averaged copies were updated independently; all are read and averaged.
// The parameter must be marked Average.
type Averaged struct{}

func (Averaged) Kind() Kind { return Partial }

func (Averaged) Shard(full []int64, r, T int) (Shard, error) {
	return Shard{Shape: clone(full), Replica: r, Label: fmt.Sprintf("tp%d", r)}, nil
}

// Split cuts dim Dim into consecutive pieces, one per rank: Shard-V on dim
// 0, Shard-H on another dim. Sizes, when set, gives each rank's length
// (uneven splits); otherwise the dim must divide evenly.
type Split struct {
	Dim   int
	Sizes []int64
}

func (s Split) Kind() Kind {
	if s.Dim == 0 {
		return ShardV
	}
	return ShardH
}

func (s Split) Shard(full []int64, r, T int) (Shard, error) {
	if s.Dim < 0 || s.Dim >= len(full) {
		return Shard{}, fmt.Errorf("split dim %d of a %d-dim tensor", s.Dim, len(full))
	}
	sizes := s.Sizes
	if sizes == nil {
		var err error
		if sizes, err = EvenSizes(full[s.Dim], T); err != nil {
			return Shard{}, fmt.Errorf("dim %d: %w", s.Dim, err)
		}
	}
	if len(sizes) != T {
		return Shard{}, fmt.Errorf("%d split sizes for %d ranks", len(sizes), T)
	}
	var off, sum int64
	for i, n := range sizes {
		if i < r {
			off += n
		}
		sum += n
	}
	if sum != full[s.Dim] {
		return Shard{}, fmt.Errorf("split sizes %v add up to %d, not dim %d's %d", sizes, sum, s.Dim, full[s.Dim])
	}
	shape := clone(full)
	shape[s.Dim] = sizes[r]
	to := make([]int64, len(full))
	to[s.Dim] = off
	return Shard{Shape: shape, Label: fmt.Sprintf("tp%d", r),
		Maps: []BoxMap{{From: make([]int64, len(full)), To: to, Size: clone(shape)}}}, nil
}

// Grid splits several dims at once (Shard-Hy): rank r is the row-major
// position in a grid with Counts[i] pieces along Dims[i].
type Grid struct {
	Dims   []int
	Counts []int
}

func (Grid) Kind() Kind { return ShardHy }

func (g Grid) Shard(full []int64, r, T int) (Shard, error) {
	total := 1
	for _, c := range g.Counts {
		total *= c
	}
	if total != T || len(g.Dims) != len(g.Counts) {
		return Shard{}, fmt.Errorf("grid %v over dims %v does not have %d cells", g.Counts, g.Dims, T)
	}
	shape, to := clone(full), make([]int64, len(full))
	rem := r
	for i := len(g.Dims) - 1; i >= 0; i-- {
		d, c := g.Dims[i], g.Counts[i]
		k := rem % c
		rem /= c
		sizes, err := EvenSizes(full[d], c)
		if err != nil {
			return Shard{}, fmt.Errorf("dim %d: %w", d, err)
		}
		shape[d] = sizes[k]
		to[d] = int64(k) * sizes[0]
	}
	return Shard{Shape: shape, Label: fmt.Sprintf("cell%d", r),
		Maps: []BoxMap{{From: make([]int64, len(full)), To: to, Size: clone(shape)}}}, nil
}

// SubParams is a fused parameter made of sub-parameters along Dim (fused
// QKV, SwiGLU's gate and up projections, fused experts): rank t holds
// Widths[k][t] of sub-parameter k, for every k, concatenated (Shard-NC).
type SubParams struct {
	Dim    int
	Widths [][]int64 // [sub-parameter][rank]
}

func (SubParams) Kind() Kind { return ShardNC }

// EqualSubParams splits n equal sub-parameters of a dim of length L evenly
// over T ranks, as SwiGLU's fused fc1 is split.
func EqualSubParams(dim int, n int, L int64, T int) (SubParams, error) {
	if n <= 0 || L%int64(n) != 0 {
		return SubParams{}, fmt.Errorf("dim of %d does not hold %d equal sub-parameters", L, n)
	}
	w := make([][]int64, n)
	for k := range w {
		sizes, err := EvenSizes(L/int64(n), T)
		if err != nil {
			return SubParams{}, err
		}
		w[k] = sizes
	}
	return SubParams{Dim: dim, Widths: w}, nil
}

// SubParamWidths returns the full width of each sub-parameter.
func (s SubParams) SubParamWidths() []int64 {
	out := make([]int64, len(s.Widths))
	for k, ws := range s.Widths {
		for _, w := range ws {
			out[k] += w
		}
	}
	return out
}

func (s SubParams) Shard(full []int64, r, T int) (Shard, error) {
	if s.Dim < 0 || s.Dim >= len(full) {
		return Shard{}, fmt.Errorf("sub-parameter dim %d of a %d-dim tensor", s.Dim, len(full))
	}
	var total, local int64
	for k, ws := range s.Widths {
		if len(ws) != T {
			return Shard{}, fmt.Errorf("sub-parameter %d has widths for %d ranks, not %d", k, len(ws), T)
		}
		for _, w := range ws {
			total += w
		}
		local += ws[r]
	}
	if total != full[s.Dim] {
		return Shard{}, fmt.Errorf("sub-parameter widths add up to %d, not dim %d's %d", total, s.Dim, full[s.Dim])
	}
	shape := clone(full)
	shape[s.Dim] = local
	sh := Shard{Shape: shape, Label: fmt.Sprintf("tp%d", r)}
	var subStart, at int64 // start of sub-parameter k in the full tensor; position in the shard
	for _, ws := range s.Widths {
		var before int64
		for t := 0; t < r; t++ {
			before += ws[t]
		}
		from, to, size := make([]int64, len(full)), make([]int64, len(full)), clone(full)
		from[s.Dim], to[s.Dim], size[s.Dim] = at, subStart+before, ws[r]
		sh.Maps = append(sh.Maps, BoxMap{From: from, To: to, Size: size})
		at += ws[r]
		for _, w := range ws {
			subStart += w
		}
	}
	return sh, nil
}

// EvenSizes splits L into T equal parts, or fails.
func EvenSizes(L int64, T int) ([]int64, error) {
	if T <= 0 || L%int64(T) != 0 {
		return nil, fmt.Errorf("length %d does not split evenly over %d ranks", L, T)
	}
	out := make([]int64, T)
	for i := range out {
		out[i] = L / int64(T)
	}
	return out, nil
}

// ChunkSizes splits L into T parts as torch.chunk and DTensor's Shard do:
// ceil(L/T) each, the last ones shorter or empty.
func ChunkSizes(L int64, T int) []int64 {
	out := make([]int64, T)
	c := (L + int64(T) - 1) / int64(T)
	for i := range out {
		s := min(int64(i)*c, L)
		out[i] = min(L, s+c) - s
	}
	return out
}

// Shards builds every rank's shard with pattern p.
func Shards(p Pattern, full []int64, T int) ([]Shard, error) {
	out := make([]Shard, T)
	for r := range out {
		s, err := p.Shard(full, r, T)
		if err != nil {
			return nil, err
		}
		out[r] = s
	}
	return out, nil
}

// StripPad leaves rows at and beyond limit along dim unplaced: the shards
// were built for a padded full tensor (vocabulary padding) and the atomic
// tensor keeps only the first limit rows.
func StripPad(s Shard, padded []int64, dim int, limit int64) Shard {
	if s.Maps == nil {
		s.Maps = []BoxMap{{From: make([]int64, len(padded)), To: make([]int64, len(padded)), Size: clone(padded)}}
	}
	out := s
	out.Maps = nil
	for _, m := range s.Maps {
		lo, hi := m.To[dim], m.To[dim]+m.Size[dim]
		if hi > limit {
			hi = limit
		}
		if hi <= lo {
			continue // the whole box is padding
		}
		c := BoxMap{From: clone(m.From), To: clone(m.To), Size: clone(m.Size)}
		c.Size[dim] = hi - lo
		out.Maps = append(out.Maps, c)
	}
	if out.Maps == nil {
		out.Maps = []BoxMap{} // all padding: nothing placed, but not "identity"
	}
	return out
}

// Extract cuts the elements of one parameter out of a flat partition: n
// elements starting at partStart of the partition are elements
// [localStart, localStart+n) of shard.
func Extract(partition TensorRef, partStart, n int64, shard int, localStart int64) Fragment {
	return Fragment{Shard: shard, LocalStart: localStart, Len: n, Src: partition, SrcStart: partStart}
}

// Classify derives a parameter's pattern from the placements of its first
// state, and returns the dims its shards split.
func Classify(p *Param) (Kind, []int) {
	if p.Average {
		return Partial, nil
	}
	if len(p.States) == 0 {
		return Unique, nil
	}
	st := p.States[0]
	var placed []Shard
	replicas := 0
	for _, s := range st.Shards {
		if s.Replica > 0 {
			replicas++
		} else {
			placed = append(placed, s)
		}
	}
	splitDims := map[int]bool{}
	for _, s := range placed {
		if s.Maps != nil && len(s.Maps) == 0 {
			// A shard that places nothing holds only padding: the tensor
			// is split, and only vocabulary padding fills whole shards.
			splitDims[0] = true
			continue
		}
		if len(s.Maps) > 1 {
			return ShardNC, dimsOf(splitDimsOf(s, p.Shape))
		}
		for d := range splitDimsOf(s, p.Shape) {
			splitDims[d] = true
		}
	}
	if len(placed) == 1 && len(splitDims) == 0 {
		if replicas > 0 || p.Info.Replicas > 1 {
			return Replicate, nil
		}
		if len(st.Frags) > 1 {
			return ShardV, []int{-1} // a flattened tensor split in ranges (ZeRO)
		}
		return Unique, nil
	}
	dims := dimsOf(splitDims)
	switch {
	case len(dims) == 0:
		return Unique, nil
	case len(dims) > 1:
		return ShardHy, dims
	case dims[0] == 0:
		return ShardV, dims
	}
	return ShardH, dims
}

// splitDimsOf returns the dims along which a shard's maps cover less than
// the full tensor.
func splitDimsOf(s Shard, full []int64) map[int]bool {
	out := map[int]bool{}
	for _, m := range s.Maps {
		for d := range full {
			if m.Size[d] != full[d] {
				out[d] = true
			}
		}
	}
	return out
}

func dimsOf(m map[int]bool) []int {
	var out []int
	for d := 0; d < 64; d++ {
		if m[d] {
			out = append(out, d)
		}
	}
	return out
}

// PaddingElems returns how many stored elements of a state are not placed
// (vocabulary padding and other unplaced shard elements). ZeRO alignment
// padding is never referenced by a fragment, so it is not counted here.
func PaddingElems(st *State) int64 {
	var n int64
	for _, s := range st.Shards {
		if s.Replica == 0 {
			n += torchfile.Numel(s.Shape) - s.MappedCount()
		}
	}
	return n
}

func clone(s []int64) []int64 { return append([]int64(nil), s...) }
