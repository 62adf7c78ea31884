package layout

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/atomic"
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
}

// ReadModel reads the target geometry of an atomic checkpoint.
func ReadModel(r *atomic.Reader) (Model, error) {
	var m Model
	// Megatron-LM's torch and torch_dist formats both keep args there.
	if f := r.Manifest.Source.Format; (f != "megatron" && f != "torch_dist") || !r.HasFile(atomic.ExtraState) {
		return m, nil
	}
	v, err := r.Load(atomic.ExtraState)
	if err != nil {
		return m, err
	}
	d, ok := v.(*pyobj.Dict)
	if !ok {
		return m, fmt.Errorf("%s/%s: %s, not a dict", r.Dir, atomic.ExtraState, pyobj.TypeName(v))
	}
	av, ok := d.Get("args")
	ns, isObj := av.(*pyobj.Object)
	if !ok || !isObj {
		return m, nil // no args: nothing to check against
	}
	return MegatronModel(Args{Path: fmt.Sprintf("%s/%s", r.Dir, atomic.ExtraState), NS: ns})
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
// of the checkpoint (TPShard with the target's vocabulary padding), after
// checking what the target framework requires: for Megatron, that T
// divides the attention heads and query groups (the fused QKV, stored per
// query group, is then cut between groups) and every split dimension, as
// megatron.core's divide() asserts.
func (m Model) Slice(p *atomic.ParamEntry, meta Meta, T, t int, paddedVocab int64) (fragment.Shard, error) {
	if T < 1 || t < 0 || t >= T {
		return fragment.Shard{}, fmt.Errorf("%s: tensor-parallel rank %d of %d", p.Name, t, T)
	}
	var local int64
	if meta.Vocab && len(p.Shape) > 0 {
		pv, err := m.PaddedVocab(p.Name, p.Shape[0], T, paddedVocab)
		if err != nil {
			return fragment.Shard{}, err
		}
		local = pv / int64(T)
	}
	if m.Megatron && T > 1 {
		// megatron.core divides the heads and the query groups by TP for every layer.
		for _, c := range []struct {
			what string
			n    int64
		}{{"attention heads", m.Heads}, {"query groups", m.QueryGroups}} {
			if c.n <= 0 || c.n%int64(T) != 0 {
				return fragment.Shard{}, fmt.Errorf("%s: tensor-parallel size %d does not divide the %d %s", p.Name, T, c.n, c.what)
			}
		}
		if d := meta.CatDim; d >= 0 && d < len(p.Shape) && !meta.Vocab {
			parts := max(int64(meta.NSubParams), 1)
			if p.Shape[d]%(parts*int64(T)) != 0 {
				return fragment.Shard{}, fmt.Errorf("%s: tensor-parallel size %d does not divide dim %d of shape %v (%d fused parts)", p.Name, T, d, p.Shape, parts)
			}
		}
	}
	return TPShard(meta, p.Shape, T, t, local)
}
