package family

import (
	"fmt"
	"strconv"
	"strings"
)

// PipeNames rewrites Megatron-DeepSpeed PipelineModule names (layer
// numbers as module indexes, tied_modules.embed) to legacy Megatron names
// (the Legacy naming): the transformer layers are the modules whose
// children include self_attention, numbered from the first of them; the
// module right after the last layer is the final norm. Names it does not
// recognise are left out of the map.
func PipeNames(names []string, layers int64) map[string]string {
	out := map[string]string{}
	first := int64(-1)
	for _, n := range names {
		i := strings.IndexByte(n, '.')
		if k, err := strconv.ParseInt(n[:max(i, 0)], 10, 64); err == nil && strings.HasPrefix(n[i+1:], "self_attention.") {
			if first < 0 || k < first {
				first = k
			}
		}
	}
	for _, n := range names {
		if rest, ok := strings.CutPrefix(n, "tied_modules.embed."); ok {
			out[n] = "language_model.embedding." + rest
			continue
		}
		i := strings.IndexByte(n, '.')
		k, err := strconv.ParseInt(n[:max(i, 0)], 10, 64)
		if err != nil || first < 0 {
			continue
		}
		rest := n[i+1:]
		switch {
		case strings.HasPrefix(rest, "word_embeddings."):
			out[n] = "language_model.embedding." + rest
		case rest == "lm_head.weight":
			out[n] = "language_model.output_layer.weight"
		case k >= first && k < first+layers:
			out[n] = fmt.Sprintf("language_model.encoder.layers.%d.%s", k-first, rest)
		case k == first+layers && (rest == "weight" || rest == "bias"):
			out[n] = "language_model.encoder.final_layernorm." + rest
		}
	}
	return out
}
