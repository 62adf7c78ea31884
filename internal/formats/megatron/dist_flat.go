package megatron

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// reformulated reads MCoreMetadata.mcore_data: for each key saved with a
// flattened_range, nd_reformulated_orig_global_shape, the key's real
// global shape (DISTFORMAT.md §3a). Keys without it are saved as they are.
func (r *distReader) reformulated() (map[string][]int64, error) {
	out := map[string][]int64{}
	if r.c.Meta == nil {
		return out, nil
	}
	v, ok := r.c.Meta.Attrs["mcore_data"]
	if !ok || v == nil {
		return out, nil
	}
	md := pyobj.NewDec(filepath.Join(r.dir, dcp.MetadataFile)+": mcore_data", v)
	for _, it := range md.Items() {
		if it.Has("nd_reformulated_orig_global_shape") {
			out[it.Key] = it.Dec.Key("nd_reformulated_orig_global_shape").AsInts()
		}
	}
	return out, md.Err()
}

// flatState places the chunks of key t, saved with flattened_range, as one
// state of parameter p. Megatron saves such a key (global shape orig,
// local blocks of shape orig/F on a grid F) as a tensor of shape
// [F..., numel(block)]: the chunk at [b..., s] of sizes [1..., n] holds the
// elements [s, s+n) of block b in row-major order. A block is a shard,
// each chunk a fragment of it; SwiGLU's gate and up blocks of a TP rank
// go into that rank's [W_r; V_r] shard, as swigluState does.
func (r *distReader) flatState(name string, p *distParam, t *dcp.Tensor, orig []int64) (*fragment.State, error) {
	n := len(orig)
	if !torchfile.SameShape(orig, p.t.Size) {
		return nil, fmt.Errorf("%s: %q: nd_reformulated_orig_global_shape %v is not the model key %q's shape %v", r.dir, t.Key, orig, p.t.Key, p.t.Size)
	}
	if len(t.Size) != n+1 {
		return nil, fmt.Errorf("%s: %q has shape %v, not the flattened form of %v (one more axis)", r.dir, t.Key, t.Size, orig)
	}
	local := make([]int64, n)
	for d := range orig {
		if t.Size[d] <= 0 || orig[d]%t.Size[d] != 0 {
			return nil, fmt.Errorf("%s: %q: %d blocks do not split axis %d of %v evenly", r.dir, t.Key, t.Size[d], d, orig)
		}
		local[d] = orig[d] / t.Size[d]
	}
	if torchfile.Numel(local) != t.Size[n] {
		return nil, fmt.Errorf("%s: %q: flattened axis of %d elements, but blocks of %v hold %d", r.dir, t.Key, t.Size[n], local, torchfile.Numel(local))
	}
	pre := n - len(p.shape)
	for d := 0; d < pre; d++ {
		if local[d] != 1 {
			return nil, fmt.Errorf("%s: %q: blocks of %v span %d layers or experts on axis %d", r.dir, t.Key, local, local[d], d)
		}
	}
	st := &fragment.State{Name: name}
	var tpShards []fragment.Shard
	if p.k == kindSwiGLU {
		for tp := 0; tp < r.tp; tp++ {
			sh, err := r.tpShard(p, tp)
			if err != nil {
				return nil, err
			}
			tpShards = append(tpShards, sh)
		}
	}
	index := map[string]int{} // block (and copy) or TP rank -> shard index in st
	for _, ch := range t.Chunks {
		block := ch.Offsets[:n]
		if !slices.Equal(block[:pre], p.idx) {
			continue
		}
		for d := 0; d < n; d++ {
			if ch.Sizes[d] != 1 {
				return nil, fmt.Errorf("%s: %q: chunk at %v has sizes %v, not one block's flattened range", r.dir, t.Key, ch.Offsets, ch.Sizes)
			}
		}
		start, length := ch.Offsets[n], ch.Sizes[n]
		to := make([]int64, n-pre)
		for d := range to {
			to[d] = block[pre+d] * local[pre+d]
		}
		size := clone(local[pre:])
		if p.k == kindSwiGLU {
			if ch.Copy > 0 {
				continue // a repeated range: the first copy is placed
			}
			si, localStart, err := r.swigluBlock(st, tpShards, index, to, size)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: chunk at %v: %w", r.dir, t.Key, ch.Offsets, err)
			}
			st.Frags = append(st.Frags, fragment.Fragment{Shard: si, LocalStart: localStart + start, Len: length, Src: ch.Ref})
			continue
		}
		key := fmt.Sprint(block, ch.Copy)
		si, ok := index[key]
		if !ok {
			cut := clone(size)
			if p.k == kindVocab && r.vocab > 0 && len(cut) > 0 {
				if to[0] >= r.vocab {
					continue // padding rows only
				}
				cut[0] = min(cut[0], r.vocab-to[0])
			}
			st.Shards = append(st.Shards, fragment.Shard{Shape: size, Replica: ch.Copy, Label: fmt.Sprintf("block %v", block[pre:]),
				Maps: []fragment.BoxMap{{From: make([]int64, len(to)), To: to, Size: cut}}})
			si = len(st.Shards) - 1
			index[key] = si
		}
		st.Frags = append(st.Frags, fragment.Fragment{Shard: si, LocalStart: start, Len: length, Src: ch.Ref})
	}
	if len(st.Shards) == 0 {
		return nil, fmt.Errorf("%s: %q has no chunk for %s", r.dir, t.Key, p.name)
	}
	if r.tp == 1 && p.k == kindSwiGLU {
		for i := range st.Shards {
			st.Shards[i].Maps = nil // [W; V] whole: the two boxes are the identity
		}
	}
	return st, nil
}

// swigluBlock finds the TP rank whose [W_r; V_r] shard holds the box
// (to, size) of fc1, adds that shard to st on first use, and returns its
// index and the box's first element in it.
func (r *distReader) swigluBlock(st *fragment.State, tpShards []fragment.Shard, index map[string]int, to, size []int64) (int, int64, error) {
	for tp, sh := range tpShards {
		for _, m := range sh.Maps {
			if !torchfile.SameShape(m.To, to) || !torchfile.SameShape(m.Size, size) {
				continue
			}
			key := fmt.Sprintf("tp%d", tp)
			si, ok := index[key]
			if !ok {
				sh.Label = key
				st.Shards = append(st.Shards, sh)
				si = len(st.Shards) - 1
				index[key] = si
			}
			return si, m.From[0] * torchfile.Numel(sh.Shape[1:]), nil
		}
	}
	return 0, 0, fmt.Errorf("box at %v of sizes %v is not a SwiGLU half of a tensor-parallel rank (TP %d)", to, size, r.tp)
}

// withoutParamSteps returns the common state's optimizer dict without
// param_state, which fully_sharded_model_space leaves there holding only
// torch Adam's per-parameter 0-dim step tensors (the flat states are DCP
// keys; the step is also each param group's, which ucp reads). Anything
// else in param_state is an error: ucp would lose it.
func (r *distReader) withoutParamSteps(v pyobj.Value) (pyobj.Value, error) {
	var d *pyobj.Dict
	switch x := v.(type) {
	case *pyobj.Dict:
		d = x
	default:
		return v, nil // not one optimizer's dict: nothing to strip
	}
	if _, has := d.Get("param_state"); !has {
		return v, nil
	}
	where := r.dir + " common state: optimizer.param_state"
	pd := pyobj.NewDec(r.dir+" common state: optimizer", d).Dict("param_state")
	if err := pd.Err(); err != nil {
		return nil, err
	}
	for i := 0; i < pd.AsDict().Len(); i++ {
		k, _ := pd.AsDict().Item(i)
		ed := pd.Dict(k).AsDict()
		if err := pd.Err(); err != nil {
			return nil, err
		}
		for _, sk := range ed.Keys() {
			if sk != "step" {
				return nil, fmt.Errorf("%s[%s] has %s, which is not saved as a sharded tensor; ucp reads only the step there", where, pyobj.Repr(k), pyobj.Repr(sk))
			}
		}
	}
	out := d.Clone()
	out.Delete("param_state")
	return out, nil
}
