package megatron

import (
	"fmt"
	"strings"

	"github.com/ucp-project/ucp/internal/fragment"
)

// placement is how the TP shards of one parameter rebuild it.
type placement struct {
	shape  []int64          // atomic shape (vocabulary padding stripped)
	shards []fragment.Shard // one per TP rank; one for replicated parameters
	info   fragment.Info
	// GroupedMLP weights: each (EP, expert-TP) rank, at ep*T+tp, holds a
	// different part, placed as one or more pieces (shards is nil).
	byEP   bool
	pieces [][]piece
}

// ranks is the number of ranks holding different parts.
func (pl *placement) ranks() int {
	if pl.byEP {
		return len(pl.pieces)
	}
	return len(pl.shards)
}

// rankPieces is how rank r's stored tensor is placed.
func (pl *placement) rankPieces(r int) []piece {
	if pl.byEP {
		return pl.pieces[r]
	}
	return []piece{{shard: pl.shards[r]}}
}

// placement builds the shards of a parameter of the given kind whose
// local tensors have first's shape. Info depends on the kind only, not on
// TP, so that the atomic files do not depend on the source layout.
func (b *builder) placement(k kind, first source, T int) (*placement, error) {
	local := first.lp.t.Shape
	where := fmt.Sprintf("%s: %s", first.f.rd.model, first.lp.local)
	if k == kindRep {
		return &placement{shape: clone(local), shards: []fragment.Shard{{Shape: clone(local)}}, info: fragment.Info{CatDim: -1, TPKnown: true}}, nil
	}
	if k == kindGrouped1 || k == kindGrouped2 {
		return b.groupedPlacement(k, first, T)
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
	pl := &placement{shape: clone(full), info: fragment.Info{CatDim: dim, TPKnown: true}}
	var pat fragment.Pattern = fragment.Split{Dim: dim}
	if k == kindSwiGLU {
		if local[0]%2 != 0 {
			return nil, fmt.Errorf("%s has %d rows, which cannot hold the gated halves [W; V] of SwiGLU", where, local[0])
		}
		sp, err := fragment.EqualSubParams(0, 2, full[0], T)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		pat = sp
		pl.info.NSubParams = 2
	}
	if T == 1 {
		pl.shards = []fragment.Shard{{Shape: clone(local)}}
	} else {
		shards, err := fragment.Shards(pat, full, T)
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
				sh := fragment.StripPad(pl.shards[r], full, 0, V)
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

// groupedPlacement places a GroupedMLP weight (NOTES.md §4.1): the atomic
// tensor is Megatron's TP = EP = 1 tensor, weight1 [H, E*G*F] or weight2
// [E*F, H]; the args give H, E, EP and G, the local shape gives F.
func (b *builder) groupedPlacement(k kind, first source, T int) (*placement, error) {
	a := b.a
	where := fmt.Sprintf("%s: %s", first.f.rd.model, first.lp.local)
	G := int64(1)
	if a.SwiGLU {
		G = 2
	}
	full, pieces, err := groupedShards(k == kindGrouped1, first.lp.t.Shape, a.Hidden, int64(a.NumExperts), a.EP, T, G)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	// F: moe_ffn_hidden_size, which defaults to ffn_hidden_size
	// (TransformerConfig.__post_init__; core <= 0.9 GroupedMLP used
	// ffn_hidden_size).
	ffn, from := a.MoEFFN, "moe_ffn_hidden_size"
	if ffn == 0 {
		ffn, from = a.FFN, "ffn_hidden_size"
	}
	E := int64(a.NumExperts)
	F := full[0] / E // weight2 rows
	if k == kindGrouped1 {
		F = full[1] / (E * G)
	}
	if ffn > 0 && F != ffn {
		return nil, fmt.Errorf("%s: shape %v over %d experts, expert parallel %d and expert tensor parallel %d gives an expert hidden size of %d but args.%s is %d",
			where, first.lp.t.Shape, E, a.EP, T, F, from, ffn)
	}
	// The TP split, as DeepSpeed's universal loader describes it: E*G (E)
	// equal sub-parameters along dim 1 (dim 0), each split over TP. It is
	// exact at EP = 1; EP then takes row blocks.
	info := fragment.Info{CatDim: 1, NSubParams: int(E * G), TPKnown: true}
	if k == kindGrouped2 {
		info = fragment.Info{CatDim: 0, NSubParams: int(E), TPKnown: true}
	}
	if info.NSubParams < 2 {
		info.NSubParams = 0
	}
	return &placement{shape: full, pieces: pieces, info: info, byEP: true}, nil
}

// piece is a part of one rank's stored tensor placed as its own shard:
// elements [off, off + numel(shard.Shape)) of the stored tensor, in
// row-major order. Most parameters have one piece per rank, at 0.
type piece struct {
	off   int64
	shard fragment.Shard
}

// groupedShards returns the full shape of a GroupedMLP weight and the
// pieces of each (EP rank e, expert-TP rank r) at index e*T + r, from the
// local shape (weight1 [H, nle*G*F/T], weight2 [nle*F/T, H]).
//
// Megatron uses the local weight1 as view(nle, H, G*F/T) and weight2 as
// view(nle, F/T, H): expert j's block is its fc1 (fc2) TP slice,
// transposed, gated halves [gate_r | up_r] along the last dim. The full
// tensors are the same at T = EP = 1: weight1 is [E, H, G*F] in memory.
//
// weight2: rank (e, r) holds, for each local expert j, rows [F/T) of the
// full rows of global expert e*nle+j at offset r*F/T: nle equal
// sub-parameters of the EP rank's nle*F rows (fragment.SubParams), moved
// down by e*nle*F rows. One piece.
//
// weight1: see weight1Pieces.
func groupedShards(weight1 bool, local []int64, H, E int64, EP, T int, G int64) ([]int64, [][]piece, error) {
	if len(local) != 2 {
		return nil, nil, fmt.Errorf("a GroupedMLP weight has shape %v, not 2 dims", local)
	}
	if E <= 0 || EP <= 0 || T <= 0 || E%int64(EP) != 0 {
		return nil, nil, fmt.Errorf("%d experts do not split over expert parallel %d", E, EP)
	}
	nle, t := E/int64(EP), int64(T)
	pieces := make([][]piece, EP*T)
	if weight1 {
		if local[0] != H || local[1]%(nle*G) != 0 || local[1] == 0 {
			return nil, nil, fmt.Errorf("weight1 has shape %v but hidden_size %d and %d local experts need [%d, %d x %d x F/%d]", local, H, nle, H, nle, G, T)
		}
		w := local[1] / (nle * G) // F/T
		full := []int64{H, E * G * w * t}
		for e := 0; e < EP; e++ {
			for r := 0; r < T; r++ {
				pieces[e*T+r] = weight1Pieces(H, E, nle, G, w, t, int64(e), int64(r))
			}
		}
		return full, label(pieces, T), nil
	}
	if local[1] != H || local[0]%nle != 0 || local[0] == 0 {
		return nil, nil, fmt.Errorf("weight2 has shape %v but hidden_size %d and %d local experts need [%d x F/%d, %d]", local, H, nle, nle, T, H)
	}
	w := local[0] / nle
	full := []int64{E * w * t, H}
	slice := []int64{nle * w * t, H} // one EP rank's rows
	var pat fragment.Pattern = fragment.Split{Dim: 0}
	if T > 1 {
		sp, err := fragment.EqualSubParams(0, int(nle), slice[0], T)
		if err != nil {
			return nil, nil, err
		}
		pat = sp
	}
	for e := 0; e < EP; e++ {
		for r := 0; r < T; r++ {
			var sh fragment.Shard
			var err error
			if T > 1 {
				sh, err = pat.Shard(slice, r, T)
				for i := range sh.Maps {
					sh.Maps[i].To[0] += int64(e) * slice[0]
				}
			} else {
				sh, err = pat.Shard(full, e, EP)
			}
			if err != nil {
				return nil, nil, err
			}
			pieces[e*T+r] = []piece{{shard: sh}}
		}
	}
	return full, label(pieces, T), nil
}

// weight1Pieces places the weight1 of rank (e, r). Call a line one
// (expert, hidden) pair: X = G*w elements on a rank (w = F/T), G*F in the
// full tensor. The full [H, E*G*F] holds E lines per row, in slots 0..E-1,
// and line L (global expert i, hidden h: L = i*H + h) sits in row L/E,
// slot L%E. Rank e stores lines [L0, L0+n), L0 = e*nle*H, n = nle*H, as
// [n, X]: within a line, local columns g*w + [0, w) are full columns
// slot*G*F + g*F + r*w + [0, w).
//
// Lines that fill whole full rows form one piece [m, E*X] (local row k =
// full row R+k; E*G boxes of m x w, one at T = 1). L0 is a multiple of E
// only when EP divides H: otherwise the rank's first lines finish a row
// that the previous rank started (a head piece [1, a*X]) and its last
// lines start one (a tail piece [1, b*X]); both are boxes within one row.
func weight1Pieces(H, E, nle, G, w, t, e, r int64) []piece {
	X, GF := G*w, G*w*t
	n, L0 := nle*H, e*nle*H
	// rowPiece places lines [l, l+m*k) of the rank (k per row, m rows) at
	// full row R, slots s0.. as a piece of shape [m, k*X].
	rowPiece := func(l, m, k, R, s0 int64) piece {
		sh := fragment.Shard{Shape: []int64{m, k * X}}
		if t == 1 { // whole lines: contiguous in both
			sh.Maps = []fragment.BoxMap{{From: []int64{0, 0}, To: []int64{R, s0 * GF}, Size: []int64{m, k * X}}}
		} else {
			for i := int64(0); i < k; i++ {
				for g := int64(0); g < G; g++ {
					sh.Maps = append(sh.Maps, fragment.BoxMap{From: []int64{0, i*X + g*w}, To: []int64{R, (s0+i)*GF + g*GF/G + r*w}, Size: []int64{m, w}})
				}
			}
		}
		return piece{off: l * X, shard: sh}
	}
	var out []piece
	a := min((E-L0%E)%E, n) // lines finishing a row the previous rank started
	if a > 0 {
		out = append(out, rowPiece(0, 1, a, L0/E, L0%E))
	}
	m := (n - a) / E
	if m > 0 {
		out = append(out, rowPiece(a, m, E, (L0+a)/E, 0))
	}
	if b := n - a - m*E; b > 0 {
		out = append(out, rowPiece(a+m*E, 1, b, (L0+a)/E+m, 0))
	}
	return out
}

// label names every piece by its rank.
func label(pieces [][]piece, T int) [][]piece {
	for i, ps := range pieces {
		for j := range ps {
			ps[j].shard.Label = fmt.Sprintf("ep%d tp%d", i/T, i%T)
			if len(ps) > 1 {
				ps[j].shard.Label += fmt.Sprintf(" part %d", j)
			}
		}
	}
	return pieces
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
		// MLA's up projections read the q and kv LoRA ranks, not the hidden state.
		up := strings.Contains(local, ".linear_q_up_proj.") || strings.Contains(local, ".linear_kv_up_proj.")
		if len(full) == 2 && full[1] != H && !up {
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
