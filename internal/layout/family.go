package layout

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// FamilyTensor is one target rank's tensor of a model family's role (or
// fused roles), as pieces of the atomic checkpoint's parameters (State
// fp32: a writer sets the state it streams).
type FamilyTensor struct {
	Shape  []int64
	Pieces []StatePiece
}

// FamilySlicer cuts the roles of an atomic checkpoint of a known model
// family for a target framework, whatever the source's naming: every role
// is first taken as Hugging Face holds it (family.Source.Unfused: the
// source's own tensor, or row runs of a fused one), then fused and cut
// for the target's tensor-parallel rank. Both reshard writers use it.
type FamilySlicer struct {
	r     *atomic.Reader
	c     *family.Config
	views map[roleAt]family.Tensor
	list  []family.Tensor // Hugging Face's module order
}

type roleAt struct {
	role          string
	layer, expert int
}

// NewFamilySlicer resolves r's parameters to the roles of config c.
func NewFamilySlicer(r *atomic.Reader, c *family.Config) (*FamilySlicer, *family.Source, error) {
	var ps []family.Param
	for _, e := range r.Manifest.Params {
		ps = append(ps, family.Param{Name: e.Name, Shape: e.Shape})
	}
	src, err := family.Resolve(c, ps, r.Manifest.Source.Format)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", r.Dir, err)
	}
	hf, err := src.Unfused(family.HF)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", r.Dir, err)
	}
	s := &FamilySlicer{r: r, c: c, views: map[roleAt]family.Tensor{}, list: hf}
	for _, x := range hf {
		s.views[roleAt{x.Role, x.Layer, x.Expert}] = x
	}
	return s, src, nil
}

// Views lists every role as Hugging Face holds it, in the order its
// module registers them (family.Source.Unfused).
func (s *FamilySlicer) Views() []family.Tensor { return s.list }

// View is a role at a layer (-1: global) as Hugging Face holds it.
func (s *FamilySlicer) View(role string, layer int) (family.Tensor, bool) {
	v, ok := s.views[roleAt{role, layer, -1}]
	return v, ok
}

// Slice is TP rank t's (of T) tensor of the fused roles parts (one role
// when not fused) at a layer: QKV per query group, or [Q; K; V] when
// stacked (Megatron-DeepSpeed with GQA); gate/up as [gate_t; up_t];
// column-parallel rows, row-parallel columns, vocabulary rows of
// paddedVocab (zero beyond the source's), replicated roles whole.
func (s *FamilySlicer) Slice(parts []family.Role, layer, T, t int, stacked bool, paddedVocab int64) (FamilyTensor, error) {
	return s.SliceExpert(parts, layer, -1, T, t, stacked, paddedVocab)
}

// SliceExpert is Slice of a routed expert's roles (expert -1: none); an
// expert's or the shared expert's gate/up fuse at their own FFN size.
func (s *FamilySlicer) SliceExpert(parts []family.Role, layer, expert, T, t int, stacked bool, paddedVocab int64) (FamilyTensor, error) {
	r0 := parts[0]
	view := func(r family.Role) (family.Tensor, error) {
		v, ok := s.views[roleAt{r.Name, layer, expert}]
		if !ok {
			return v, fmt.Errorf("no %s", r.Name)
		}
		return v, nil
	}
	if r0.Fuse != family.NoFuse {
		spans, err := family.FusedRows(s.c.WithFFNOf(r0), r0.Fuse, stacked, false, T, t)
		if err != nil {
			return FamilyTensor{}, err
		}
		vs := make([]family.Tensor, len(parts))
		for i, x := range parts {
			if x.Part != i {
				return FamilyTensor{}, fmt.Errorf("fused parts out of order")
			}
			if vs[i], err = view(x); err != nil {
				return FamilyTensor{}, err
			}
		}
		cols := int64(1)
		if len(vs[0].Shape) == 2 {
			cols = vs[0].Shape[1]
		}
		var ft FamilyTensor
		var at int64
		for _, sp := range spans {
			pcs, err := s.Range(vs[sp.Part], sp.Row*cols, sp.N*cols, at)
			if err != nil {
				return FamilyTensor{}, err
			}
			ft.Pieces = append(ft.Pieces, pcs...)
			at += sp.N * cols
		}
		ft.Shape = []int64{at / cols}
		if len(vs[0].Shape) == 2 {
			ft.Shape = append(ft.Shape, cols)
		}
		return ft, nil
	}
	v, err := view(r0)
	if err != nil {
		return FamilyTensor{}, err
	}
	if T == 1 && (r0.TP != family.Vocab || paddedVocab == v.Shape[0]) {
		// The whole role: the source's tensor, or its rows in a fused one.
		pcs, err := s.Range(v, 0, torchfile.Numel(v.Shape), 0)
		return FamilyTensor{Shape: append([]int64(nil), v.Shape...), Pieces: pcs}, err
	}
	e, ok := s.r.Param(v.Pieces[0].Param)
	if !ok {
		return FamilyTensor{}, fmt.Errorf("no parameter %s", v.Pieces[0].Param)
	}
	if len(v.Pieces) != 1 || v.Pieces[0].Start != 0 || v.Pieces[0].Len != torchfile.Numel(e.Shape) {
		return FamilyTensor{}, fmt.Errorf("%s is stored in pieces of %s", v.Name, e.Name)
	}
	var sh fragment.Shard
	switch {
	case r0.TP == family.Vocab:
		if paddedVocab < e.Shape[0] {
			return FamilyTensor{}, fmt.Errorf("%s: %d vocabulary rows do not fit %d", e.Name, e.Shape[0], paddedVocab)
		}
		padded := []int64{paddedVocab, e.Shape[1]}
		p, err := fragment.Split{Dim: 0}.Shard(padded, t, T)
		if err != nil {
			return FamilyTensor{}, err
		}
		sh = fragment.StripPad(p, padded, 0, e.Shape[0])
	case r0.TP == family.Replicated || T == 1:
		sh = fragment.Shard{Shape: append([]int64(nil), e.Shape...)}
	case r0.TP == family.Column:
		if sh, err = (fragment.Split{Dim: 0}).Shard(e.Shape, t, T); err != nil {
			return FamilyTensor{}, err
		}
	case r0.TP == family.Row:
		if sh, err = (fragment.Split{Dim: 1}).Shard(e.Shape, t, T); err != nil {
			return FamilyTensor{}, err
		}
	}
	n := torchfile.Numel(sh.Shape) // vocabulary padding rows read as zeros (StripPad)
	return FamilyTensor{Shape: sh.Shape, Pieces: []StatePiece{{Param: e.Name, State: fragment.FP32, Shard: sh, N: n}}}, nil
}

// Range is elements [start, start+n) of a view, as pieces of the source's
// whole parameters written from element at.
func (s *FamilySlicer) Range(v family.Tensor, start, n, at int64) ([]StatePiece, error) {
	var out []StatePiece
	var off int64 // the view's element where the current piece starts
	for _, pc := range v.Pieces {
		lo, hi := max(start, off), min(start+n, off+pc.Len)
		if lo < hi {
			e, ok := s.r.Param(pc.Param)
			if !ok {
				return nil, fmt.Errorf("no parameter %s", pc.Param)
			}
			out = append(out, StatePiece{Param: e.Name, State: fragment.FP32, Shard: fragment.Shard{Shape: append([]int64(nil), e.Shape...)},
				Local: pc.Start + lo - off, N: hi - lo, At: at + lo - start})
		}
		off += pc.Len
	}
	if off < start+n {
		return nil, fmt.Errorf("%s: elements [%d,%d) beyond its %d", v.Name, start, start+n, off)
	}
	return out, nil
}

// ClipPieces are the elements [local, local+n) of a tensor made of
// pieces (each at its At), moved to start at element at.
func ClipPieces(pieces []StatePiece, local, n, at int64) []StatePiece {
	var out []StatePiece
	for _, pc := range pieces {
		lo, hi := max(local, pc.At), min(local+n, pc.At+pc.N)
		if lo >= hi {
			continue
		}
		x := pc
		x.Local = pc.Local + lo - pc.At
		x.N = hi - lo
		x.At = at + lo - local
		out = append(out, x)
	}
	return out
}
