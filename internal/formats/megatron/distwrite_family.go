package megatron

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// familyModelKeys adds the model's sharded tensors of a family source
// (Hugging Face, Megatron-DeepSpeed: planFamily's tensors, named and fused
// as megatron-core's GPTModel holds them, the mapping the legacy writer
// uses too) and returns their keys in module order. Each target tensor's
// key is distKey of its global Megatron name; its global shape is a TP
// rank's shape times T on the split dimension (the padded vocabulary for
// the embedding and output layer); TP rank t's boxes (boxes: SwiGLU's gate
// and up box) take consecutive element ranges of the rank's tensor
// (rankTensor: [gate_t; up_t] for SwiGLU). A tied output layer's
// last-stage copy has no key, as with a Megatron source.
func (w *distWriter) familyModelKeys() ([]*dwKey, error) {
	p := w.p
	T := p.o.TP
	model := map[string]*dwKey{}
	var ordered []*dwKey
	for s, stage := range p.chunks {
		for _, list := range stage {
			for _, rp := range list {
				name := p.srcName(rp.src)
				if rp.local == "output_layer.weight" && name != rp.local {
					continue // the tied copy of the word embeddings
				}
				if rp.routed || isExpert(name) || isGrouped(name) {
					return nil, fmt.Errorf("%s: %s: --ckpt-format torch_dist does not write the routed experts of a %s source yet (use --ckpt-format torch)", p.r.Dir, name, p.r.Manifest.Source.Format)
				}
				key, layer := distKey(name)
				k := splitKind(name, w.swiglu)
				if k == kindUnknown {
					return nil, fmt.Errorf("%s: %s: no torch_dist layout known for it", p.r.Dir, name)
				}
				shape0, _ := p.rankTensor(rp.src, 0)
				full, err := globalShape(k, shape0, T)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", p.r.Dir, name, err)
				}
				mk := w.modelKey(model, &ordered, key, layer, -1, full)
				for t := 0; t < T; t++ {
					shape, pcs := p.rankTensor(rp.src, t)
					bs, err := boxes(k, full, T, t)
					if err != nil {
						return nil, fmt.Errorf("%s: %s: %w", p.r.Dir, name, err)
					}
					var at int64
					for _, b := range bs {
						n := torchfile.Numel(b[1])
						ch := &dwChunk{rank: t + T*s, offsets: b[0], size: b[1], src: rp.src, pieces: layout.ClipPieces(pcs, at, n, 0)}
						if layer >= 0 {
							ch.offsets = append([]int64{int64(layer)}, ch.offsets...)
							ch.size = append([]int64{1}, ch.size...)
						}
						mk.chunks = append(mk.chunks, ch)
						at += n
					}
					if len(bs) > 0 && at != torchfile.Numel(shape) {
						return nil, fmt.Errorf("%s: %s: TP rank %d holds %v, its torch_dist boxes %d elements", p.r.Dir, name, t, shape, at)
					}
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
