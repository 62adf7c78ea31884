package megatron

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// kind is how the tensor-parallel shards of a parameter merge (NOTES.md §4).
type kind uint8

const (
	kindUnknown  kind = iota
	kindRep           // replicated: every TP rank holds the full tensor
	kindVocab         // vocabulary-parallel rows, padded to padded_vocab_size
	kindQKV           // fused QKV in the grouped layout: a plain dim-0 split
	kindCol           // column-parallel: dim-0 split
	kindSwiGLU        // gated fc1: each rank holds [W_r; V_r]
	kindRow           // row-parallel: dim-1 split
	kindGrouped1      // GroupedMLP weight1: all local experts' fc1, [H, nle*G*F/t]
	kindGrouped2      // GroupedMLP weight2: all local experts' fc2, [nle*F/t, H]
)

var kindNames = [...]string{"unknown", "replicated", "vocabulary", "fused QKV", "column-parallel", "SwiGLU fc1", "row-parallel",
	"GroupedMLP weight1", "GroupedMLP weight2"}

func (k kind) String() string { return kindNames[k] }

var (
	reVocab = regexp.MustCompile(`(^|\.)(word_embeddings|output_layer)\.weight$`)
	reQKV   = regexp.MustCompile(`\.(linear_qkv|query_key_value)\.(weight|bias)$`)
	reFC1   = regexp.MustCompile(`\.(linear_fc1|dense_h_to_4h)\.(weight|bias)\d*$`)
	reRow   = regexp.MustCompile(`\.(linear_proj|linear_fc2|dense|dense_4h_to_h)\.weight\d*$`)
	// Multi-latent attention: the up projections (and q without LoRA) are
	// column-parallel in both specs; the down projections only in the
	// local spec (mlaDownKind).
	reMLACol  = regexp.MustCompile(`\.self_attention\.(linear_q_proj|linear_q_up_proj|linear_kv_up_proj)\.weight$`)
	reMLADown = regexp.MustCompile(`\.self_attention\.(linear_q_down_proj|linear_kv_down_proj)\.weight$`)
	// Replicated on every TP rank: norms (TE fuses them into the next
	// linear as layer_norm_*), row-parallel biases, the router, learned
	// position embeddings.
	reRep = regexp.MustCompile(`(norm\.(weight|bias)|\.layer_norm_(weight|bias)|\.(linear_proj|linear_fc2|dense|dense_4h_to_h)\.bias\d*|\.router\.(weight|expert_bias)|\.shared_experts\.gate_weight|(^|\.)position_embeddings\.weight)$`)

	// Stage-local layer numbers (MCore decoder, legacy encoder/transformer).
	reLayer = regexp.MustCompile(`^(decoder\.layers\.|language_model\.encoder\.layers\.|language_model\.transformer\.layers\.)(\d+)\.`)
	// Local expert numbers: SequentialMLP and TEGroupedMLP.
	reSeqExpert     = regexp.MustCompile(`\.mlp\.experts\.local_experts\.(\d+)\.`)
	reGroupedExpert = regexp.MustCompile(`(\.mlp\.experts\.linear_fc[12]\.(?:weight|bias))(\d+)$`)
	// GroupedMLP (legacy grouped GEMM): the local experts fused in two
	// tensors per layer.
	reFusedGrouped = regexp.MustCompile(`\.mlp\.experts\.weight([12])$`)
)

// splitKind classifies a parameter by its name.
func splitKind(name string, swiglu bool) kind {
	if m := reFusedGrouped.FindStringSubmatch(name); m != nil {
		if m[1] == "1" {
			return kindGrouped1
		}
		return kindGrouped2
	}
	switch {
	case reVocab.MatchString(name):
		return kindVocab
	case reQKV.MatchString(name):
		return kindQKV
	case reFC1.MatchString(name):
		if swiglu {
			return kindSwiGLU
		}
		return kindCol
	case reRow.MatchString(name):
		return kindRow
	case reMLACol.MatchString(name):
		return kindCol
	case reRep.MatchString(name):
		return kindRep
	}
	return kindUnknown
}

// mlaDownKind is the split of an MLA down projection: column-parallel in
// megatron-core's local spec (ColumnParallelLinear, output gathered),
// whole on every rank in the TE spec (TELinear 'duplicated'); kindUnknown
// for other names.
func mlaDownKind(name string, local bool) kind {
	switch {
	case !reMLADown.MatchString(name):
		return kindUnknown
	case local:
		return kindCol
	}
	return kindRep
}

// isExpert reports whether a parameter belongs to the routed experts,
// which EP and ETP split. They are expert-parallel parameters
// (param.allreduce = False: the expert optimizer and DDP buffers) only
// with EP > 1 (see expertParallel).
func isExpert(name string) bool { return strings.Contains(name, ".mlp.experts.") }

// expertParallel reports whether a parameter is expert-parallel
// (allreduce = False): an expert with EP > 1. Megatron sets
// allreduce = not (is_expert and expert_parallel) on expert linears and
// GroupedMLP's weight1/weight2 alike (NOTES.md §4.1).
func expertParallel(name string, ep int) bool { return ep > 1 && isExpert(name) }

// isGrouped reports the fused GroupedMLP weights.
func isGrouped(name string) bool { return reFusedGrouped.MatchString(name) }

// isBuffer reports persistent buffers saved in the model state that are
// not parameters (the router's expert_bias).
func isBuffer(name string) bool { return strings.HasSuffix(name, ".expert_bias") }

// isWordEmbedding reports the input word embedding (MCore or legacy).
func isWordEmbedding(name string) bool {
	return name == "embedding.word_embeddings.weight" || name == "language_model.embedding.word_embeddings.weight"
}

// tiedCopyOf returns the word embedding a local name is a synchronized copy
// of, or "" when it is not one: MCore's output_layer.weight with tied
// embeddings, legacy word_embeddings_for_head.weight.
func tiedCopyOf(name string, untie bool) string {
	switch {
	case name == "output_layer.weight" && !untie:
		return "embedding.word_embeddings.weight"
	case name == "word_embeddings_for_head.weight":
		return "language_model.embedding.word_embeddings.weight"
	}
	return ""
}

// layerIndex returns the stage-local layer number of a name, or -1.
func layerIndex(name string) int {
	m := reLayer.FindStringSubmatch(name)
	if m == nil {
		return -1
	}
	n, err := strconv.Atoi(m[2])
	if err != nil {
		return -1
	}
	return n
}

// expertRef is where a local expert number sits in a name.
type expertRef struct {
	local    int    // local expert number, -1 for none
	grouped  bool   // TEGroupedMLP weight{j}; else SequentialMLP local_experts.{j}
	template string // the name with the expert number removed
}

func findExpert(name string) expertRef {
	if m := reSeqExpert.FindStringSubmatchIndex(name); m != nil {
		j, _ := strconv.Atoi(name[m[2]:m[3]])
		return expertRef{local: j, template: name[:m[2]] + "#" + name[m[3]:]}
	}
	if m := reGroupedExpert.FindStringSubmatchIndex(name); m != nil {
		j, _ := strconv.Atoi(name[m[4]:m[5]])
		return expertRef{local: j, grouped: true, template: name[:m[4]] + "#"}
	}
	return expertRef{local: -1}
}

// globalName maps a stage-local name to the atomic name: the layer number
// plus the chunk's layer offset, the local expert number plus the EP
// rank's first expert.
func globalName(local string, layerOffset, expertOffset int) string {
	name := local
	if m := reLayer.FindStringSubmatchIndex(name); m != nil && layerOffset != 0 {
		n, _ := strconv.Atoi(name[m[4]:m[5]])
		name = name[:m[4]] + strconv.Itoa(n+layerOffset) + name[m[5]:]
	}
	if expertOffset != 0 {
		if m := reSeqExpert.FindStringSubmatchIndex(name); m != nil {
			j, _ := strconv.Atoi(name[m[2]:m[3]])
			name = name[:m[2]] + strconv.Itoa(j+expertOffset) + name[m[3]:]
		} else if m := reGroupedExpert.FindStringSubmatchIndex(name); m != nil {
			j, _ := strconv.Atoi(name[m[4]:m[5]])
			name = name[:m[4]] + strconv.Itoa(j+expertOffset)
		}
	}
	return name
}

// checkName rejects names that cannot be a folder of the atomic checkpoint.
func checkName(path, name string) error {
	if name == "" || strings.Contains(name, "..") || strings.ContainsAny(name, "/\\\x00") {
		return fmt.Errorf("%s: parameter name %q cannot name a folder", path, name)
	}
	return nil
}
