package layout

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// Model is the geometry a tensor-parallel target must respect. For
// Megatron-LM sources it comes from the args the converter carried into
// extra_state.pt; otherwise it is empty and slices follow DeepSpeed's
// universal loader (torch.chunk, no divisibility required).
type Model struct {
	Megatron     bool
	Heads        int64 // num_attention_heads
	QueryGroups  int64 // num_query_groups with GQA, else Heads
	VocabDivisor int64 // make_vocab_size_divisible_by
	// Family is the cut of each parameter the model family's table gives
	// (family.Source.TPRules), for a checkpoint whose manifest records a
	// family but whose source recorded no TP layout (Hugging Face,
	// torchtitan): a parameter without tp_layout is cut by its role.
	// A pointer, so that Models stay comparable.
	Family *FamilyCuts `json:"-"`
}

// FamilyCuts are the cuts of the parameters of a model family's roles.
type FamilyCuts struct {
	Params map[string]Meta
}

// ReadModel reads the target geometry of an atomic checkpoint.
func ReadModel(r *atomic.Reader) (Model, error) {
	var m Model
	// Megatron-LM's torch and torch_dist formats both keep args there.
	if f := r.Manifest.Source.Format; (f != "megatron" && f != "torch_dist") || !r.HasFile(atomic.ExtraState) {
		m = argsModel(r.Manifest.Source.Args)
		return m, m.familyRules(r)
	}
	v, err := r.Load(atomic.ExtraState)
	if err != nil {
		return m, err
	}
	path := fmt.Sprintf("%s/%s", r.Dir, atomic.ExtraState)
	d := pyobj.NewDec(path, v)
	av, ok := d.Opt("args")
	if !ok {
		return m, d.Err() // no args: nothing to check against
	}
	ns := av.AsObject("")
	if err := d.Err(); err != nil {
		return m, err
	}
	return MegatronModel(Args{Path: path, NS: ns})
}

// familyRules fills m.Family from the manifest's model family, when it
// records one and the parameters resolve to its roles: each unfused role's parameter gets its role's cut (column:
// dim 0, row: dim 1, vocabulary: dim 0 padded, replicated: whole), and the
// heads and query groups a cut must respect.
func (m *Model) familyRules(r *atomic.Reader) error {
	c := r.Manifest.Source.Model
	if c == nil {
		return nil
	}
	var ps []family.Param
	for _, e := range r.Manifest.Params {
		ps = append(ps, family.Param{Name: e.Name, Shape: e.Shape})
	}
	src, err := family.Resolve(c, ps, r.Manifest.Source.Format)
	if err != nil {
		// Not the family's parameters after all (a manifest edited by
		// hand?): no rule applies, and a parameter without a recorded
		// cut is refused at tp > 1 as before.
		return nil
	}
	if m.Heads == 0 {
		m.Heads, m.QueryGroups = c.Heads, c.QueryGroups
	}
	m.Family = &FamilyCuts{Params: map[string]Meta{}}
	for n, tp := range src.TPRules() {
		meta := Meta{CatDim: -1}
		switch tp {
		case family.Column:
			meta.CatDim = 0
		case family.Row:
			meta.CatDim = 1
		case family.Vocab:
			meta.CatDim, meta.Vocab = 0, true
		}
		m.Family.Params[n] = meta
	}
	return nil
}

func (m Model) familyCut(name string) (Meta, bool) {
	if m.Family == nil {
		return Meta{}, false
	}
	c, ok := m.Family.Params[name]
	return c, ok
}

// argsModel is the geometry in the scalar args the manifest carries
// (Megatron-DeepSpeed's, in the DeepSpeed model states): the heads, query
// groups and vocabulary divisor of its Megatron model.
func argsModel(args map[string]any) Model {
	var m Model
	num := func(k string) int64 {
		if v, ok := args[k].(float64); ok {
			return int64(v)
		}
		return 0
	}
	if h := num("num_attention_heads"); h > 0 {
		m.Megatron = true
		m.Heads, m.QueryGroups = h, h
		if g := num("num_key_value_heads"); g > 0 {
			m.QueryGroups = g
		}
		if g := num("num_query_groups"); g > 0 {
			m.QueryGroups = g
		}
		m.VocabDivisor = num("make_vocab_size_divisible_by")
	}
	return m
}

// PaddedVocab returns the vocabulary rows of a target at TP T: paddedVocab
// when the caller gives it (it must hold the checkpoint's rows and divide
// by T), Megatron's rule (a multiple of make_vocab_size_divisible_by x T)
// for Megatron sources, else ceil(rows/T) x T.
func (m Model) PaddedVocab(param string, rows int64, T int, paddedVocab int64) (int64, error) {
	switch {
	case paddedVocab > 0:
		if paddedVocab < rows {
			return 0, fmt.Errorf("%s: a padded vocabulary of %d rows is smaller than the checkpoint's %d", param, paddedVocab, rows)
		}
		if paddedVocab%int64(T) != 0 {
			return 0, fmt.Errorf("%s: tensor-parallel size %d does not divide the padded vocabulary of %d rows", param, T, paddedVocab)
		}
		return paddedVocab, nil
	case m.Megatron && m.VocabDivisor > 0:
		k := m.VocabDivisor * int64(T)
		return (rows + k - 1) / k * k, nil
	}
	return (rows + int64(T) - 1) / int64(T) * int64(T), nil
}

// Slice returns the shard tensor-parallel rank t of T holds of a parameter
// of the checkpoint (TPShard with the target's vocabulary padding). It
// cuts only what the checkpoint records how to cut (ParamEntry.TPLayout):
// at T > 1 a parameter with no recorded TP layout is refused by name, and
// buffers (integer or bool state) are never cut. Then it checks what the
// target framework requires: for Megatron, that T divides the attention
// heads and query groups (the fused QKV, stored per query group, is then
// cut between groups); for every source, that T divides the split
// dimension (vocabularies are padded instead), as megatron.core's divide()
// asserts.
func (m Model) Slice(p *atomic.ParamEntry, meta Meta, T, t int, paddedVocab int64) (fragment.Shard, error) {
	if T < 1 || t < 0 || t >= T {
		return fragment.Shard{}, fmt.Errorf("%s: tensor-parallel rank %d of %d", p.Name, t, T)
	}
	if fm, ok := m.familyCut(p.Name); ok && p.TPLayout == "" {
		// The source recorded no cut: the role's rule gives it.
		meta = fm
		fp := *p
		fp.TPLayout = atomic.TPFromFamily
		p = &fp
	}
	var local int64
	if meta.Vocab && len(p.Shape) > 0 {
		pv, err := m.PaddedVocab(p.Name, p.Shape[0], T, paddedVocab)
		if err != nil {
			return fragment.Shard{}, err
		}
		local = pv / int64(T)
	}
	if (m.Megatron || m.Family != nil) && T > 1 {
		// megatron.core divides the heads and the query groups by TP for every layer.
		for _, c := range []struct {
			what string
			n    int64
		}{{"attention heads", m.Heads}, {"query groups", m.QueryGroups}} {
			if c.n <= 0 || c.n%int64(T) != 0 {
				return fragment.Shard{}, fmt.Errorf("%s: tensor-parallel size %d does not divide the %d %s", p.Name, T, c.n, c.what)
			}
		}
	}
	if T > 1 {
		whole, err := keptWhole(p, meta)
		if err != nil || whole {
			return fragment.Shard{Shape: append([]int64(nil), p.Shape...)}, err
		}
		// Every tensor-parallel framework cuts evenly (megatron.core's
		// divide() asserts it); only the vocabulary is padded first.
		if d := meta.CatDim; d >= 0 && d < len(p.Shape) && !meta.Vocab {
			parts := max(int64(meta.NSubParams), 1)
			if p.Shape[d]%(parts*int64(T)) != 0 {
				return fragment.Shard{}, fmt.Errorf("%s: tensor-parallel size %d does not divide dim %d of shape %v (%d fused parts)", p.Name, T, d, p.Shape, parts)
			}
		}
	}
	return TPShard(meta, p.Shape, T, t, local)
}

// keptWhole reports whether a parameter stays whole on every
// tensor-parallel rank: buffers (an integer or bool state, as position
// ids) always, and one whose state file has no cut (no cat_dim: replicated,
// as DeepSpeed marks buffers). It refuses a parameter whose TP cut nothing
// records: the cat_dim 0 a source without tensor parallelism gets is DeepSpeed's
// default for an unsplit tensor, and cutting by it would split norms
// (11,) into (6,)/(5,) and row-parallel weights on the wrong dim.
//
// The model-family table (internal/family) is the other place a cut may
// come from: a converter that resolves a parameter's role there records
// the role's rule in the state file keys and TPLayout "family", which is
// accepted here as "source" is.
func keptWhole(p *atomic.ParamEntry, meta Meta) (bool, error) {
	dt, err := p.StateDType()
	if err != nil {
		return false, err
	}
	if !dt.IsFloat() || meta.CatDim < 0 && meta.SubSizes == nil && !meta.Vocab {
		return true, nil
	}
	switch p.TPLayout {
	case atomic.TPFromSource, atomic.TPFromFamily:
		return false, nil
	}
	return false, fmt.Errorf("%s: the atomic checkpoint does not record how this parameter is cut across tensor-parallel ranks "+
		"(no tp_layout in its manifest: the source was saved without tensor parallelism and no model-family rule covers it); "+
		"it loads only at tensor-parallel size 1", p.Name)
}
