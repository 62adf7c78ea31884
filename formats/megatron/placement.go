package megatron

import (
	"fmt"

	"github.com/ucp-project/ucp/fragment"
	"github.com/ucp-project/ucp/patterns"
)

// placement is how the TP shards of one parameter rebuild it.
type placement struct {
	shape  []int64          // atomic shape (vocabulary padding stripped)
	shards []fragment.Shard // one per TP rank; one for replicated parameters
	info   fragment.Info
}

// placement builds the shards of a parameter of the given kind whose
// local tensors have first's shape. Info depends on the kind only, not on
// TP, so that the atomic files do not depend on the source layout.
func (b *builder) placement(k kind, first source, T int) (*placement, error) {
	local := first.lp.t.Shape
	where := fmt.Sprintf("%s: %s", first.f.rd.model, first.lp.local)
	if k == kindRep {
		return &placement{shape: clone(local), shards: []fragment.Shard{{Shape: clone(local)}}, info: fragment.Info{CatDim: -1}}, nil
	}
	dim := 0
	if k == kindRow {
		dim = 1
	}
	if len(local) <= dim || (k == kindRow || k == kindVocab) && len(local) != 2 {
		return nil, fmt.Errorf("%s has shape %v, which a %s parameter cannot have", where, local, k)
	}
	full := clone(local)
	full[dim] *= int64(T)
	pl := &placement{shape: clone(full), info: fragment.Info{CatDim: dim}}
	var pat patterns.Pattern = patterns.Split{Dim: dim}
	if k == kindSwiGLU {
		if local[0]%2 != 0 {
			return nil, fmt.Errorf("%s has %d rows, which cannot hold the gated halves [W; V] of SwiGLU", where, local[0])
		}
		sp, err := patterns.EqualSubParams(0, 2, full[0], T)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		pat = sp
		pl.info.NSubParams = 2
	}
	if T == 1 {
		pl.shards = []fragment.Shard{{Shape: clone(local)}}
	} else {
		shards, err := patterns.Shards(pat, full, T)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		pl.shards = shards
	}
	if err := b.checkShape(where, k, first.lp.local, full); err != nil {
		return nil, err
	}
	if k == kindVocab {
		V, err := b.vocabSize(where, full[0])
		if err != nil {
			return nil, err
		}
		if V < full[0] {
			pl.shape[0] = V
			for r := range pl.shards {
				sh := patterns.StripPad(pl.shards[r], full, 0, V)
				if len(sh.Maps) == 0 {
					// All rows of this rank are padding: a box of no rows at
					// the end of the vocabulary keeps its place along dim 0
					// (Shard-V) and places nothing.
					to, size := make([]int64, len(full)), clone(full)
					to[0], size[0] = V, 0
					sh.Maps = []fragment.BoxMap{{From: make([]int64, len(full)), To: to, Size: size}}
				}
				pl.shards[r] = sh
			}
			pl.info.VocabSize, pl.info.PaddedVocab = V, full[0]
		}
	}
	return pl, nil
}

// checkShape compares a merged shape with the geometry in args.
func (b *builder) checkShape(where string, k kind, local string, full []int64) error {
	a := b.a
	H := a.Hidden
	switch k {
	case kindVocab:
		if full[0] != a.PaddedVocab {
			return fmt.Errorf("%s: the tensor-parallel shards hold %d vocabulary rows but args.padded_vocab_size is %d", where, full[0], a.PaddedVocab)
		}
		if full[1] != H {
			return fmt.Errorf("%s: embedding width %d differs from args.hidden_size %d", where, full[1], H)
		}
	case kindQKV:
		rows := (a.Heads + 2*a.QueryGroups) * a.KVChannels
		if full[0] != rows {
			return fmt.Errorf("%s: the fused QKV has %d rows but args give (num_attention_heads %d + 2 x query groups %d) x kv_channels %d = %d",
				where, full[0], a.Heads, a.QueryGroups, a.KVChannels, rows)
		}
		if len(full) == 2 && full[1] != H {
			return fmt.Errorf("%s: the fused QKV has %d columns but args.hidden_size is %d", where, full[1], H)
		}
	case kindRow:
		if full[0] != H {
			return fmt.Errorf("%s: the row-parallel weight has %d rows but args.hidden_size is %d", where, full[0], H)
		}
	case kindCol, kindSwiGLU:
		if len(full) == 2 && full[1] != H {
			return fmt.Errorf("%s: the column-parallel weight has %d columns but args.hidden_size is %d", where, full[1], H)
		}
	}
	return nil
}

// vocabSize is the true vocabulary: args.vocab_size, else --vocab-size,
// else the padded size (kept, with a note).
func (b *builder) vocabSize(where string, padded int64) (int64, error) {
	a, o := b.a, b.opt.VocabSize
	var V int64
	switch {
	case a.VocabSize > 0:
		if o > 0 && o != a.VocabSize {
			return 0, fmt.Errorf("%s: --vocab-size %d contradicts args.vocab_size %d saved in the checkpoint", a.path, o, a.VocabSize)
		}
		V = a.VocabSize
	case o > 0:
		V = o
		b.note(fmt.Sprintf("vocabulary size %d from --vocab-size (args has no vocab_size); padding rows %d..%d dropped", o, o, padded-1))
	default:
		b.note(fmt.Sprintf("vocabulary padding kept: args has no vocab_size and no --vocab-size was given, so embeddings and the output layer keep all %d padded rows", padded))
		return padded, nil
	}
	if V > padded {
		return 0, fmt.Errorf("%s: vocabulary size %d exceeds the %d padded rows", where, V, padded)
	}
	return V, nil
}

// note adds a note once.
func (b *builder) note(s string) {
	for _, n := range b.table.Notes {
		if n == s {
			return
		}
	}
	b.table.Notes = append(b.table.Notes, s)
}

func clone(s []int64) []int64 { return append([]int64(nil), s...) }
