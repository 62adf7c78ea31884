package megatron

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// familyModelKeys adds the model's sharded tensors of a family source
// (Hugging Face, Megatron-DeepSpeed: planFamily's tensors, named and fused
// as megatron-core's GPTModel holds them, the mapping the legacy writer
// uses too) and returns their keys in module order. Each target tensor's
// key is the writer's key of its global Megatron name (a routed expert's:
// distExpertKey's, with the expert axis); its global shape is a TP rank's
// (expert-TP rank's) shape times T (U) on the split dimension (the padded
// vocabulary for the embedding and output layer); cut i's boxes (boxes:
// SwiGLU's gate and up box) take consecutive element ranges of the cut's
// tensor (rankTensor: [gate_t; up_t] for SwiGLU), in the rank file a
// Megatron source's chunk goes to (cut). A tied output layer's last-stage
// copy has no key, as with a Megatron source.
func (w *distWriter) familyModelKeys() ([]*dwKey, error) {
	p := w.p
	model := map[string]*dwKey{}
	var ordered []*dwKey
	for s, stage := range p.chunks {
		for _, list := range stage {
			for _, rp := range list {
				name := p.srcName(rp.src)
				if rp.local == "output_layer.weight" && name != rp.local {
					continue // the tied copy of the word embeddings
				}
				if isGrouped(name) {
					return nil, fmt.Errorf("%s: %s: --ckpt-format torch_dist does not write GroupedMLP's fused experts", p.r.Dir, name)
				}
				expert := -1
				if rp.routed {
					expert = rp.expert
				}
				key, layer := w.key(name)
				if expert >= 0 {
					ekey, g := distExpertKey(name)
					if g != expert {
						return nil, fmt.Errorf("%s: %s: expert %d, planned as %d", p.r.Dir, name, g, expert)
					}
					key, layer = w.key(ekey)
				}
				k := w.kind(name)
				if k == kindUnknown {
					return nil, fmt.Errorf("%s: %s: no torch_dist layout known for it", p.r.Dir, name)
				}
				n, fileOf := w.cut(s, expert)
				shape0, _ := p.rankTensor(rp.src, 0)
				full, err := globalShape(k, shape0, n)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", p.r.Dir, name, err)
				}
				mk := w.modelKey(model, &ordered, key, layer, expert, full)
				if rp.fp32 {
					mk.dt = dtype.Float32 // the router's expert_bias
				}
				// Cut i's boxes take the next elements of its tensor.
				var shape []int64
				var pcs []layout.StatePiece
				var at int64
				check := func(i int) error {
					if i >= 0 && at != torchfile.Numel(shape) {
						return fmt.Errorf("rank %d of %d holds %v, its torch_dist boxes %d elements", i, n, shape, at)
					}
					return nil
				}
				last := -1
				err = w.addBoxes(mk, k, full, n, fileOf, layer, expert, rp.src, func(i int, b [2][]int64) ([]layout.StatePiece, error) {
					if i != last {
						if err := check(last); err != nil {
							return nil, err
						}
						shape, pcs = p.rankTensor(rp.src, i)
						at, last = 0, i
					}
					m := torchfile.Numel(b[1])
					out := layout.ClipPieces(pcs, at, m, 0)
					at += m
					return out, nil
				})
				if err == nil {
					err = check(last)
				}
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", p.r.Dir, name, err)
				}
			}
		}
	}
	return ordered, nil
}

// globalShape is the torch_dist global shape of a tensor whose TP rank
// holds local (of T ranks) as the kind splits it.
func globalShape(k kind, local []int64, T int) ([]int64, error) {
	full := clone(local)
	d := -1
	switch k {
	case kindRep:
	case kindVocab, kindQKV, kindCol, kindSwiGLU:
		d = 0
	case kindRow:
		d = 1
	default:
		return nil, fmt.Errorf("no tensor-parallel rule for a %s tensor", k)
	}
	if d >= 0 {
		if d >= len(full) {
			return nil, fmt.Errorf("a %s tensor of shape %v", k, local)
		}
		full[d] *= int64(T)
	}
	return full, nil
}
