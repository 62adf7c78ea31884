package family

import (
	"fmt"
	"strings"
)

// Param is a parameter of a checkpoint: its name and full shape.
type Param struct {
	Name  string
	Shape []int64
}

// Layout says how a checkpoint stores what the names do not tell.
type Layout struct {
	// Stacked: fused QKV rows [Q; K; V] (Megatron-DeepSpeed with GQA)
	// instead of per query group.
	Stacked bool
	// Interleaved: each head's q and k rows in adjacent-pair order
	// (Megatron's rotary_interleaved; torchtitan's complex RoPE).
	Interleaved bool
}

// LayoutOf returns the layout of a checkpoint of a format and naming:
// Megatron-DeepSpeed keeps GQA's fused QKV as [Q; K; V] (its universal
// checkpoint's SubparamShape; without GQA its per-head [q; k; v] is the
// grouped layout), rotary_interleaved models and torchtitan's complex-RoPE
// families have interleaved q/k rows.
func LayoutOf(format string, n Naming, f *Family, c *Config) Layout {
	return Layout{
		Stacked:     strings.HasPrefix(format, "deepspeed") && c.QueryGroups != c.Heads,
		Interleaved: c.RotaryInterleaved || (n == Titan && f.TitanInterleaved),
	}
}

// Detect reads the config from training arguments (FromArgs), takes the
// vocabulary from the embedding's rows and checks that the parameters
// are the family's (Resolve).
func Detect(a Args, params []Param, format string) (*Config, error) {
	c, err := FromArgs(a)
	if err != nil {
		return nil, err
	}
	if err := c.SetVocab(params); err != nil {
		return nil, err
	}
	if _, err := Resolve(c, params, format); err != nil {
		return nil, err
	}
	return c, nil
}

// SetVocab sets c.Vocab from the rows of the word embedding among params.
func (c *Config) SetVocab(params []Param) error {
	f, err := Get(c.Family)
	if err != nil {
		return err
	}
	var names []string
	for _, p := range params {
		names = append(names, p.Name)
	}
	alias := PipeNames(names, c.Layers)
	m := f.NewMatcher()
	for _, p := range params {
		n := p.Name
		if a, ok := alias[n]; ok {
			n = a
		}
		if mt, ok := m.Lookup(n); ok && mt.Role.Name == "embed" && len(p.Shape) == 2 {
			c.Vocab = p.Shape[0]
			return nil
		}
	}
	return fmt.Errorf("no word embedding among the parameters")
}

type roleKey struct {
	role          string
	layer, expert int
}

// Source is a checkpoint's parameters resolved to the roles of a family.
type Source struct {
	F      *Family
	C      *Config
	Naming Naming
	Layout Layout
	params map[string]Param
	byRole map[roleKey]string // role at a layer -> source parameter (the fused tensor for fused roles)
	alias  map[string]string  // Megatron-DeepSpeed pipeline name -> legacy name
}

// Resolve matches every parameter to a role of c's family: one naming for
// the whole checkpoint (Megatron-core's local and TE names may mix, as TE
// linears with local norms do), every role the config has present at
// every layer, nothing left over. Megatron-DeepSpeed pipeline names are
// first rewritten by PipeNames. format is the source format as the
// manifest records it ("megatron", "deepspeed", "dcp", "hf", ...): it
// decides the layouts names do not tell (LayoutOf).
func Resolve(c *Config, params []Param, format string) (*Source, error) {
	f, err := Get(c.Family)
	if err != nil {
		return nil, err
	}
	s := &Source{F: f, C: c, params: map[string]Param{}, byRole: map[roleKey]string{}}
	var all []string
	for _, p := range params {
		all = append(all, p.Name)
		s.params[p.Name] = p
	}
	s.alias = PipeNames(all, c.Layers)
	if err := s.pickNaming(params); err != nil {
		return nil, err
	}
	s.Layout = LayoutOf(format, s.Naming, f, c)
	missing := s.missing()
	// Every expert exactly once: a number beyond the config's experts is
	// another model's.
	for k, p := range s.byRole {
		if k.expert >= int(c.Experts) || (k.expert >= 0 && (k.layer < 0 || k.layer >= int(c.Layers))) {
			return nil, fmt.Errorf("%s is expert %d of layer %d, but the %s config has %d experts in %d layers", p, k.expert, k.layer, f.Name, c.Experts, c.Layers)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the checkpoint lacks %d parameter(s) of the %s model: %s", len(missing), f.Name, list(missing))
	}
	return s, nil
}

// pickNaming sets s.Naming and s.byRole: one naming for the whole
// checkpoint, the first in which every parameter has a role (a name two
// namings share, as torchtitan's newer lm_head.weight, goes with the rest).
func (s *Source) pickNaming(params []Param) error {
	f, m := s.F, s.F.NewMatcher()
	present := map[string]bool{}
	for _, r := range f.Present(s.C) {
		present[r.Name] = true
	}
	var best []string
	for _, group := range [][]Naming{{HF}, {Titan}, {Core, CoreTE}, {Legacy}} {
		byRole, unmatched, absent, dup := s.rolesIn(group, m, present, params)
		if len(unmatched) > 0 {
			if best == nil || len(unmatched) < len(best) {
				best = unmatched
			}
			continue
		}
		if dup != nil {
			return dup
		}
		if len(absent) > 0 {
			return fmt.Errorf("%d parameter(s) are roles the %s config does not have (check biases, q/k norms, tied embeddings): %s", len(absent), f.Name, list(absent))
		}
		s.Naming, s.byRole = group[0], byRole
		return nil
	}
	return fmt.Errorf("%d parameter(s) have no role in the %s family under one naming (%s): %s", len(best), f.Name, strings.Join(namingNames[:], ", "), list(best))
}

// rolesIn matches params to roles under the namings of group: the role of
// each matched parameter, the parameters that match none, those whose role
// the config lacks, and the first role two parameters claim.
func (s *Source) rolesIn(group []Naming, m *Matcher, present map[string]bool, params []Param) (byRole map[roleKey]string, unmatched, absent []string, dup error) {
	byRole = map[roleKey]string{}
	for _, p := range params {
		name := p.Name
		if a, ok := s.alias[name]; ok {
			name = a
		}
		var mt Match
		ok := false
		for _, n := range group {
			if mt, ok = m.LookupIn(name, n); ok {
				break
			}
		}
		if !ok {
			unmatched = append(unmatched, p.Name)
			continue
		}
		claimed := false
		for _, r := range s.F.Roles {
			if r.Names[mt.Naming] != mt.Role.Names[mt.Naming] || !r.At(s.C, mt.Layer) {
				continue
			}
			claimed = true
			if !present[r.Name] {
				absent = append(absent, fmt.Sprintf("%s (%s)", p.Name, r.Name))
				continue
			}
			k := roleKey{r.Name, mt.Layer, mt.Expert}
			if prev, ok := byRole[k]; ok && dup == nil {
				dup = fmt.Errorf("%s and %s are both the %s of layer %d", prev, p.Name, r.Name, mt.Layer)
			}
			byRole[k] = p.Name
		}
		if !claimed { // a MoE name on a dense layer, or the other way round
			absent = append(absent, fmt.Sprintf("%s (%s: not at layer %d)", p.Name, mt.Role.Name, mt.Layer))
		}
	}
	return byRole, unmatched, absent, dup
}

// missing lists the roles of the config that no parameter fills.
func (s *Source) missing() []string {
	var missing []string
	for _, r := range s.F.Present(s.C) {
		for _, l := range s.layers(r) {
			for _, e := range s.experts(r) {
				if _, ok := s.byRole[roleKey{r.Name, l, e}]; !ok {
					switch {
					case l < 0:
						missing = append(missing, r.Name)
					case e >= 0:
						missing = append(missing, fmt.Sprintf("%s of layer %d expert %d", r.Name, l, e))
					default:
						missing = append(missing, fmt.Sprintf("%s of layer %d", r.Name, l))
					}
				}
			}
		}
	}
	return missing
}

func list(x []string) string {
	if len(x) > 12 {
		return strings.Join(x[:12], ", ") + ", ..."
	}
	return strings.Join(x, ", ")
}

func (s *Source) layers(r Role) []int {
	if r.Scope == Global {
		return []int{-1}
	}
	var out []int
	for l := 0; l < int(s.C.Layers); l++ {
		if r.At(s.C, l) {
			out = append(out, l)
		}
	}
	return out
}

// experts lists the expert numbers of a role: -1 alone for roles outside
// the experts.
func (s *Source) experts(r Role) []int {
	if r.Scope != Expert {
		return []int{-1}
	}
	out := make([]int, s.C.Experts)
	for i := range out {
		out[i] = i
	}
	return out
}

// Param returns the source parameter holding a role at a layer (-1 for
// global roles).
func (s *Source) Param(role string, layer int) (string, bool) {
	return s.ExpertParam(role, layer, -1)
}

// ExpertParam returns the source parameter holding a role at a layer and
// expert (-1 for roles outside the experts).
func (s *Source) ExpertParam(role string, layer, expert int) (string, bool) {
	n, ok := s.byRole[roleKey{role, layer, expert}]
	return n, ok
}

// fused reports whether the source stores role r inside a fused tensor.
func (s *Source) fused(r Role) bool {
	return r.Fuse != NoFuse && (s.Naming == Core || s.Naming == CoreTE || s.Naming == Legacy)
}

// Piece is a run of elements of a source parameter.
type Piece struct {
	Param      string
	Start, Len int64
}

// Tensor is a target tensor: the concatenation of its pieces in Shape.
// AddOne: add 1 to every element in float32 (a Megatron
// apply_layernorm_1p norm going to a framework that stores the weight).
type Tensor struct {
	Name   string
	Role   string
	Layer  int
	Expert int // -1 outside the experts
	Shape  []int64
	Pieces []Piece
	AddOne bool
}

// Unfused lists the tensors of the model in an unfused naming (HF or
// Titan), in the family's order: fused sources split, q/k rows reordered
// between the interleaved and the rotate-half layouts, 1p norms restored.
func (s *Source) Unfused(target Naming) ([]Tensor, error) {
	if target != HF && target != Titan {
		return nil, fmt.Errorf("%s is a fused naming", target)
	}
	wantInter := target == Titan && s.F.TitanInterleaved
	var out []Tensor
	emit := func(r Role, l, e int) error {
		t, err := s.unfusedTensor(r, l, e, target, wantInter)
		if err != nil {
			return err
		}
		out = append(out, t)
		return nil
	}
	for _, r := range s.F.Present(s.C) {
		if r.Scope != Global || r.Name == "final_norm" || r.Name == "lm_head" {
			continue
		}
		if err := emit(r, -1, -1); err != nil {
			return nil, err
		}
	}
	present := s.F.Present(s.C)
	for l := 0; l < int(s.C.Layers); l++ {
		for i, r := range present {
			if !r.At(s.C, l) {
				continue
			}
			switch {
			case r.Scope == Layer:
				if err := emit(r, l, -1); err != nil {
					return nil, err
				}
			case r.Scope == Expert && (i == 0 || present[i-1].Scope != Expert):
				// A run of expert roles: expert by expert, in global order.
				for e := 0; e < int(s.C.Experts); e++ {
					for _, x := range present[i:] {
						if x.Scope != Expert {
							break
						}
						if !x.At(s.C, l) {
							continue
						}
						if err := emit(x, l, e); err != nil {
							return nil, err
						}
					}
				}
			}
		}
	}
	for _, r := range present {
		if r.Name == "final_norm" || r.Name == "lm_head" {
			if err := emit(r, -1, -1); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// unfusedTensor is role r of layer l (expert e) in the target naming: a
// part of a fused source, rows reordered between RoPE layouts, or the
// source whole.
func (s *Source) unfusedTensor(r Role, l, e int, target Naming, wantInter bool) (Tensor, error) {
	name := r.NameIn(target, l, e)
	if name == "" {
		return Tensor{}, fmt.Errorf("%s has no %s name for %s", s.F.Name, target, r.Name)
	}
	src, _ := s.ExpertParam(r.Name, l, e)
	p := s.params[src]
	t := Tensor{Name: name, Role: r.Name, Layer: l, Expert: e, AddOne: r.Norm && s.C.LayerNorm1p}
	cols := int64(1)
	if len(p.Shape) == 2 {
		cols = p.Shape[1]
	} else if len(p.Shape) != 1 {
		return Tensor{}, fmt.Errorf("%s: shape %v", src, p.Shape)
	}
	// q and k rows carry RoPE; a head's q/k norm weights (qwen3) are
	// indexed like its rows and move with them.
	rope := (r.Fuse == QKV && r.Part < 2) || r.Name == "q_norm" || r.Name == "k_norm"
	if s.fused(r) {
		if err := s.fusedPart(&t, r, src, p.Shape, cols, wantInter); err != nil {
			return Tensor{}, err
		}
		if wantInter && rope && !s.Layout.Interleaved {
			return Tensor{}, fmt.Errorf("%s: writing interleaved rows from a fused rotate-half source is not supported", src)
		}
		return t, nil
	}
	t.Shape = append([]int64(nil), p.Shape...)
	if rope && s.Layout.Interleaved != wantInter {
		pieces, err := ropeRows(src, p.Shape[0], cols, s.C.HeadDim, s.Layout.Interleaved)
		t.Pieces = pieces
		return t, err
	}
	t.Pieces = []Piece{{src, 0, numel(p.Shape)}}
	return t, nil
}

// fusedPart sets t's pieces and shape to role r's rows of the fused
// source src.
func (s *Source) fusedPart(t *Tensor, r Role, src string, shape []int64, cols int64, wantInter bool) error {
	cc := *s.C
	cc.FFN = s.C.ffnOf(r)
	spans, err := FusedRows(&cc, r.Fuse, s.Layout.Stacked, s.Layout.Interleaved && !wantInter, 1, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	var total int64
	for _, sp := range spans {
		total += sp.N
	}
	if shape[0] != total {
		return fmt.Errorf("%s: shape %v, but the %s config needs %d rows", src, shape, s.F.Name, total)
	}
	var rows int64
	for _, run := range PartRows(spans, r.Part) {
		t.Pieces = append(t.Pieces, Piece{src, run[0] * cols, run[1] * cols})
		rows += run[1]
	}
	t.Shape = []int64{rows}
	if len(shape) == 2 {
		t.Shape = append(t.Shape, cols)
	}
	return nil
}

// ropeRows reorders the rows of src (heads of dim d) between the
// interleaved and the rotate-half RoPE layouts: whole heads stay in place;
// within each head, HF row i is interleaved row 2i and HF row d/2+i row
// 2i+1.
func ropeRows(src string, nrows, cols, d int64, fromInterleaved bool) ([]Piece, error) {
	if nrows%d != 0 || d%2 != 0 {
		return nil, fmt.Errorf("%s: %d rows are not heads of dim %d", src, nrows, d)
	}
	var pieces []Piece
	for h := int64(0); h < nrows/d; h++ {
		for i := int64(0); i < d; i++ {
			var from int64
			if fromInterleaved { // interleaved -> half: target row i of the head
				if i < d/2 {
					from = 2 * i
				} else {
					from = 2*(i-d/2) + 1
				}
			} else { // half -> interleaved
				if i%2 == 0 {
					from = i / 2
				} else {
					from = d/2 + i/2
				}
			}
			pieces = append(pieces, Piece{src, (h*d + from) * cols, cols})
		}
	}
	return pieces, nil
}

func numel(s []int64) int64 {
	n := int64(1)
	for _, d := range s {
		n *= d
	}
	return n
}

// TPRules returns the tensor-parallel rule of every source parameter that
// holds exactly one role, unfused (Hugging Face and torchtitan names): the
// cut a loader applies to it at tp > 1. Fused tensors (Megatron's QKV and
// fc1) are left out: their sources record their own layouts.
func (s *Source) TPRules() map[string]TP {
	roles := map[string][]string{}
	for k, n := range s.byRole {
		roles[n] = append(roles[n], k.role)
	}
	out := map[string]TP{}
	for n, rs := range roles {
		r, ok := s.F.Role(rs[0])
		if !ok || s.fused(r) {
			continue
		}
		same := true
		for _, x := range rs[1:] {
			same = same && x == rs[0]
		}
		if same {
			out[n] = r.TP
		}
	}
	return out
}
