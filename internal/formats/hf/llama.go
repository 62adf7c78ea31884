package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
)

// arch maps atomic tensors to the tensors and config.json of a
// transformers model class.
type arch interface {
	Map(r *atomic.Reader, plain []*Tensor, dt dtype.DType) ([]*Tensor, []byte, error)
}

// Archs are the known --arch values.
var Archs = []string{"llama"}

func archOf(name string) (arch, error) {
	switch name {
	case "":
		return nil, nil
	case "llama":
		return llama{}, nil
	}
	return nil, fmt.Errorf("unknown --arch %q (known: %s)", name, strings.Join(Archs, ", "))
}

// split says how one source tensor becomes output tensors.
type split uint8

const (
	whole  split = iota
	qkv          // fused QKV: rows per query group [q (heads/groups·d); k (d); v (d)]
	gateUp       // SwiGLU fc1: rows [gate; up]
)

// row is one line of a name mapping: a source name (atomic names of
// Megatron-LM core and legacy models; Megatron-DeepSpeed pipeline names are
// first rewritten to legacy ones) and the output name(s), %d being the
// global layer number. Other families (GPT-2, Mixtral experts) are more
// tables of rows.
type row struct {
	src   string
	out   []string // one name, or the parts of a split in order
	split split
	slot  int // order within the layer (or section), as transformers lists them
}

// L matches a layer prefix of both Megatron namings.
const L = `^(?:decoder|language_model\.encoder)\.layers\.(\d+)\.`

// llamaRows maps Megatron GPT models with GQA, SwiGLU and RMSNorm onto
// LlamaForCausalLM (transformers/models/llama/modeling_llama.py).
var llamaRows = []row{
	{`^(?:embedding|language_model\.embedding)\.word_embeddings\.weight$`, []string{"model.embed_tokens.weight"}, whole, 0},
	{L + `input_layernorm\.weight$`, []string{"model.layers.%d.input_layernorm.weight"}, whole, 0},
	{L + `self_attention\.linear_qkv\.layer_norm_weight$`, []string{"model.layers.%d.input_layernorm.weight"}, whole, 0},
	{L + `self_attention\.(?:linear_qkv|query_key_value)\.weight$`,
		[]string{"model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight", "model.layers.%d.self_attn.v_proj.weight"}, qkv, 1},
	{L + `self_attention\.(?:linear_proj|dense)\.weight$`, []string{"model.layers.%d.self_attn.o_proj.weight"}, whole, 4},
	{L + `(?:pre_mlp_layernorm|post_attention_layernorm)\.weight$`, []string{"model.layers.%d.post_attention_layernorm.weight"}, whole, 5},
	{L + `mlp\.linear_fc1\.layer_norm_weight$`, []string{"model.layers.%d.post_attention_layernorm.weight"}, whole, 5},
	{L + `mlp\.(?:linear_fc1|dense_h_to_4h)\.weight$`, []string{"model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight"}, gateUp, 6},
	{L + `mlp\.(?:linear_fc2|dense_4h_to_h)\.weight$`, []string{"model.layers.%d.mlp.down_proj.weight"}, whole, 8},
	{`^(?:decoder|language_model\.encoder)\.final_(?:layernorm|norm)\.weight$`, []string{"model.norm.weight"}, whole, 0},
	{`^(?:language_model\.)?output_layer\.weight$`, []string{"lm_head.weight"}, whole, 0},
}

var llamaRegexps = func() []*regexp.Regexp {
	out := make([]*regexp.Regexp, len(llamaRows))
	for i, r := range llamaRows {
		out[i] = regexp.MustCompile(r.src)
	}
	return out
}()

type llama struct{}

// geometry is what the mapping needs from the source's arguments.
type geometry struct {
	layers, heads, groups, headDim int64
	groupedQKV                     bool // Megatron's per-group layout; false: [Q; K; V] (Megatron-DeepSpeed GQA)
}

func argInt(args map[string]any, names ...string) (int64, bool) {
	for _, n := range names {
		switch v := args[n].(type) {
		case int64:
			return v, true
		case float64:
			return int64(v), true
		}
	}
	return 0, false
}

// argBool returns a recorded bool argument and whether it is recorded; a
// value of another type is an error.
func argBool(args map[string]any, where, name string) (v, ok bool, err error) {
	x, present := args[name]
	if !present {
		return false, false, nil
	}
	if v, ok = x.(bool); !ok {
		return false, false, fmt.Errorf("%s: source.args.%s is %v, not a bool", where, name, x)
	}
	return v, true, nil
}

func argFloat(args map[string]any, def float64, names ...string) float64 {
	for _, n := range names {
		switch v := args[n].(type) {
		case int64:
			return float64(v)
		case float64:
			return v
		}
	}
	return def
}

func llamaGeometry(r *atomic.Reader) (geometry, error) {
	args := r.Manifest.Source.Args
	where := r.Dir + "/" + atomic.ManifestName
	if args == nil {
		return geometry{}, fmt.Errorf("%s records no training arguments (source.args): --arch llama needs them; convert the checkpoint again with this ucp", where)
	}
	var g geometry
	var ok bool
	if g.layers, ok = argInt(args, "num_layers"); !ok {
		return g, fmt.Errorf("%s: source.args has no num_layers", where)
	}
	if g.heads, ok = argInt(args, "num_attention_heads"); !ok || g.heads <= 0 {
		return g, fmt.Errorf("%s: source.args has no num_attention_heads", where)
	}
	g.groups = g.heads
	gqa, _, err := argBool(args, where, "group_query_attention")
	if err != nil {
		return g, err
	}
	if gqa {
		if g.groups, ok = argInt(args, "num_query_groups"); !ok {
			return g, fmt.Errorf("%s: source.args has group_query_attention but no num_query_groups", where)
		}
	} else if n, ok := argInt(args, "num_key_value_heads"); ok && n > 0 { // Megatron-DeepSpeed
		g.groups = n
	}
	if g.groups <= 0 || g.heads%g.groups != 0 {
		return g, fmt.Errorf("%s: %d attention heads do not split into %d query groups", where, g.heads, g.groups)
	}
	hidden, ok := argInt(args, "hidden_size")
	if !ok {
		return g, fmt.Errorf("%s: source.args has no hidden_size", where)
	}
	if g.headDim, ok = argInt(args, "kv_channels"); !ok || g.headDim <= 0 {
		g.headDim = hidden / g.heads
	}
	sw, ok, err := argBool(args, where, "swiglu")
	if err != nil {
		return g, err
	}
	if ok && !sw {
		return g, fmt.Errorf("%s: the model has no SwiGLU MLP (args.swiglu is false); it is not a Llama model", where)
	}
	if n, ok := args["normalization"].(string); ok && n != "RMSNorm" {
		return g, fmt.Errorf("%s: the model uses %s, not RMSNorm; it is not a Llama model", where, n)
	}
	// Megatron-DeepSpeed keeps [Q; K; V] with GQA (its universal
	// checkpoint SubparamShape); without GQA its per-head [q; k; v] is the
	// grouped layout with one head per group.
	g.groupedQKV = !strings.HasPrefix(r.Manifest.Source.Format, "deepspeed") || g.groups == g.heads
	return g, nil
}

// pipeNames rewrites Megatron-DeepSpeed PipelineModule names (layer
// numbers as module indexes, tied_modules.embed) to legacy Megatron names.
func pipeNames(names []string, layers int64) map[string]string {
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

type mapped struct {
	t   *Tensor
	key [3]int64 // section (embed, layers, norm, head), layer, slot
}

// Map splits and renames the tensors; it fails on names no row covers.
func (llama) Map(r *atomic.Reader, plain []*Tensor, dt dtype.DType) ([]*Tensor, []byte, error) {
	g, err := llamaGeometry(r)
	if err != nil {
		return nil, nil, err
	}
	var all []string
	for _, p := range r.Params() {
		all = append(all, p.Name)
	}
	alias := pipeNames(all, g.layers)
	canon := func(n string) string {
		if a, ok := alias[n]; ok {
			return a
		}
		return n
	}
	var out []mapped
	var unmapped []string
	for _, t := range plain {
		name := canon(t.Name)
		ri := -1
		var m []string
		for i, re := range llamaRegexps {
			if m = re.FindStringSubmatch(name); m != nil {
				ri = i
				break
			}
		}
		if ri < 0 {
			unmapped = append(unmapped, t.Name)
			continue
		}
		rw := llamaRows[ri]
		key := [3]int64{0, 0, int64(rw.slot)}
		var layer int64
		if len(m) > 1 {
			layer, _ = strconv.ParseInt(m[1], 10, 64)
			key[0], key[1] = 1, layer
		} else if strings.HasPrefix(rw.out[0], "model.norm") {
			key[0] = 2
		} else if strings.HasPrefix(rw.out[0], "lm_head") {
			key[0] = 3
		}
		names := make([]string, len(rw.out))
		for i, o := range rw.out {
			names[i] = o
			if strings.Contains(o, "%d") {
				names[i] = fmt.Sprintf(o, layer)
			}
		}
		parts, err := splitTensor(t, rw.split, g)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		for i, p := range parts {
			p.Name = names[i]
			k := key
			k[2] += int64(i)
			out = append(out, mapped{p, k})
		}
	}
	if len(unmapped) > 0 {
		shown := unmapped
		if len(shown) > 20 {
			shown = shown[:20]
		}
		return nil, nil, fmt.Errorf("--arch llama maps no LlamaForCausalLM name to %d parameter(s): %s%s (biases, learned position embeddings, MoE experts and LayerNorm biases have no Llama counterpart; --params selects a subset)",
			len(unmapped), strings.Join(shown, ", "), map[bool]string{true: ", ...", false: ""}[len(unmapped) > len(shown)])
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].key, out[j].key
		for k := range a {
			if a[k] != b[k] {
				return a[k] < b[k]
			}
		}
		return false
	})
	seen := map[string]string{}
	tensors := make([]*Tensor, len(out))
	for i, m := range out {
		if prev, dup := seen[m.t.Name]; dup {
			return nil, nil, fmt.Errorf("%s and %s both map to %s", prev, m.t.Pieces[0].Param, m.t.Name)
		}
		seen[m.t.Name] = m.t.Pieces[0].Param
		tensors[i] = m.t
	}
	config, err := llamaConfig(r, g, all, canon, dt)
	if err != nil {
		return nil, nil, err
	}
	return tensors, config, nil
}

// splitTensor cuts a 2-D source into its parts by rows.
func splitTensor(t *Tensor, s split, g geometry) ([]*Tensor, error) {
	if s == whole {
		return []*Tensor{{DType: t.DType, Shape: t.Shape, Pieces: t.Pieces}}, nil
	}
	if len(t.Shape) != 2 {
		return nil, fmt.Errorf("shape %v: a fused weight must be 2-D", t.Shape)
	}
	rows, cols := t.Shape[0], t.Shape[1]
	src := t.Pieces[0].Param
	rowsOf := func(spans [][2]int64) *Tensor {
		var n int64
		p := &Tensor{DType: t.DType}
		for _, s := range spans {
			p.Pieces = append(p.Pieces, Piece{Param: src, Start: s[0] * cols, Len: s[1] * cols})
			n += s[1]
		}
		p.Shape = []int64{n, cols}
		return p
	}
	switch s {
	case gateUp:
		if rows%2 != 0 {
			return nil, fmt.Errorf("shape %v: SwiGLU fc1 needs an even number of rows", t.Shape)
		}
		return []*Tensor{rowsOf([][2]int64{{0, rows / 2}}), rowsOf([][2]int64{{rows / 2, rows / 2}})}, nil
	case qkv:
		d, qpg := g.headDim, g.heads/g.groups
		if rows != (g.heads+2*g.groups)*d {
			return nil, fmt.Errorf("shape %v: %d heads in %d query groups of dim %d need %d rows", t.Shape, g.heads, g.groups, d, (g.heads+2*g.groups)*d)
		}
		var q, k, v [][2]int64
		if g.groupedQKV {
			for grp := int64(0); grp < g.groups; grp++ {
				at := grp * (qpg + 2) * d
				q = append(q, [2]int64{at, qpg * d})
				k = append(k, [2]int64{at + qpg*d, d})
				v = append(v, [2]int64{at + (qpg+1)*d, d})
			}
		} else {
			q = [][2]int64{{0, g.heads * d}}
			k = [][2]int64{{g.heads * d, g.groups * d}}
			v = [][2]int64{{(g.heads + g.groups) * d, g.groups * d}}
		}
		return []*Tensor{rowsOf(q), rowsOf(k), rowsOf(v)}, nil
	}
	return nil, fmt.Errorf("unknown split %d", s)
}

// llamaConfig writes config.json as transformers' LlamaConfig.to_json_file
// does (sorted keys, indent 2), from the manifest's shapes and arguments.
func llamaConfig(r *atomic.Reader, g geometry, all []string, canon func(string) string, dt dtype.DType) ([]byte, error) {
	args := r.Manifest.Source.Args
	shape := func(re string) []int64 {
		x := regexp.MustCompile(re)
		for _, n := range all {
			if x.MatchString(canon(n)) {
				p, _ := r.Param(n)
				return p.Shape
			}
		}
		return nil
	}
	emb := shape(llamaRows[0].src)
	fc1 := shape(llamaRows[7].src)
	if len(emb) != 2 || len(fc1) != 2 {
		return nil, fmt.Errorf("%s: no word embedding or fc1 weight to read the model's sizes from", r.Dir)
	}
	tied := shape(llamaRows[10].src) == nil
	u, _, err := argBool(args, r.Dir, "untie_embeddings_and_output_weights")
	if err != nil {
		return nil, err
	}
	if u && tied {
		return nil, fmt.Errorf("%s: args untie the output layer, but the checkpoint has no output_layer.weight", r.Dir)
	}
	maxPos, ok := argInt(args, "max_position_embeddings", "seq_length")
	if !ok {
		return nil, fmt.Errorf("%s: source.args has no max_position_embeddings", r.Dir)
	}
	cfg := map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"hidden_size":             emb[1],
		"intermediate_size":       fc1[0] / 2,
		"num_hidden_layers":       g.layers,
		"num_attention_heads":     g.heads,
		"num_key_value_heads":     g.groups,
		"head_dim":                g.headDim,
		"vocab_size":              emb[0],
		"rms_norm_eps":            argFloat(args, 1e-5, "norm_epsilon", "layernorm_epsilon"),
		"rope_theta":              argFloat(args, 10000, "rotary_base", "rope_theta"),
		"max_position_embeddings": maxPos,
		"tie_word_embeddings":     tied,
		"torch_dtype":             dt.String(),
		"hidden_act":              "silu",
		"attention_bias":          false,
		"mlp_bias":                false,
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(cfg); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
