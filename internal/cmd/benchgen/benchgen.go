package main

// Generate writes a large GPT-like DeepSpeed checkpoint (ZeRO-2, bf16
// optimizer files, Megatron-DeepSpeed tensor parallelism) for benchmarks,
// with ucp's own torch writer: torch would take minutes at this size. The
// layout follows DeepSpeed's rules (formats/deepspeed/FORMAT.md) so that
// ucp converts it like any other checkpoint; values are pseudo-random.

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Config is the model and the parallelism.
type Config struct {
	Hidden, Layers, Vocab, Positions int
	TP, DP                           int
	Seed                             uint64
	// Zero3 writes the model as ZeRO-3 (bf16, one fp32 sub-group, TP 1)
	// instead of ZeRO-2 with Megatron-DeepSpeed tensor parallelism.
	Zero3 bool
	// Llama writes Megatron-DeepSpeed's Llama layout (RMSNorm, SwiGLU, no
	// biases, rotary positions, an untied output layer) with the training
	// arguments (args) such a run saves, as the fixture
	// testdata/fixtures/deepspeed/megatron_llama_tp2_z1_bf16_dp4 has them: a
	// source of a known model family, which reshard --to megatron needs.
	Llama bool
}

// Default is about 300M parameters: 4.3 GB of checkpoint at TP 2 x DP 4.
var Default = Config{Hidden: 2048, Layers: 4, Vocab: 50257, Positions: 2048, TP: 2, DP: 4, Seed: 1}

type param struct {
	name  string
	full  []int64
	split int // -1 replicated, else the TP split dim
	vocab bool
	// halves: two sub-parameters (SwiGLU's gate and up) concatenated on dim
	// 0, each split on dim 0 by TP (DeepSpeed's
	// parameter_with_2_sub_params_cat_dim_0).
	halves bool
}

// ffn is the MLP's hidden size: 4H, or for Llama SwiGLU's 8H/3 rounded up
// to a multiple of 64 (and of TP).
func (c Config) ffn() int64 {
	if !c.Llama {
		return 4 * int64(c.Hidden)
	}
	m := int64(64 * c.TP)
	return (8*int64(c.Hidden)/3 + m - 1) / m * m
}

// heads is the attention heads: a head dimension of 64 where it divides.
func (c Config) heads() int64 {
	if c.Hidden%64 == 0 {
		return int64(c.Hidden / 64)
	}
	return int64(c.TP)
}

func (c Config) paddedVocab() int64 {
	m := int64(128 * c.TP)
	return (int64(c.Vocab) + m - 1) / m * m
}

func (c Config) params() []param {
	if c.Llama {
		return c.llamaParams()
	}
	H := int64(c.Hidden)
	ps := []param{
		{name: "language_model.embedding.word_embeddings.weight", full: []int64{c.paddedVocab(), H}, split: 0, vocab: true},
		{name: "language_model.embedding.position_embeddings.weight", full: []int64{int64(c.Positions), H}, split: -1},
	}
	for i := 0; i < c.Layers; i++ {
		l := fmt.Sprintf("language_model.encoder.layers.%d.", i)
		ps = append(ps,
			param{name: l + "input_layernorm.weight", full: []int64{H}, split: -1},
			param{name: l + "input_layernorm.bias", full: []int64{H}, split: -1},
			param{name: l + "self_attention.query_key_value.weight", full: []int64{3 * H, H}, split: 0},
			param{name: l + "self_attention.query_key_value.bias", full: []int64{3 * H}, split: 0},
			param{name: l + "self_attention.dense.weight", full: []int64{H, H}, split: 1},
			param{name: l + "self_attention.dense.bias", full: []int64{H}, split: -1},
			param{name: l + "post_attention_layernorm.weight", full: []int64{H}, split: -1},
			param{name: l + "post_attention_layernorm.bias", full: []int64{H}, split: -1},
			param{name: l + "mlp.dense_h_to_4h.weight", full: []int64{4 * H, H}, split: 0},
			param{name: l + "mlp.dense_h_to_4h.bias", full: []int64{4 * H}, split: 0},
			param{name: l + "mlp.dense_4h_to_h.weight", full: []int64{H, 4 * H}, split: 1},
			param{name: l + "mlp.dense_4h_to_h.bias", full: []int64{H}, split: -1},
		)
	}
	ps = append(ps,
		param{name: "language_model.encoder.final_layernorm.weight", full: []int64{H}, split: -1},
		param{name: "language_model.encoder.final_layernorm.bias", full: []int64{H}, split: -1})
	return ps
}

func (c Config) llamaParams() []param {
	H, F := int64(c.Hidden), c.ffn()
	ps := []param{{name: "language_model.embedding.word_embeddings.weight", full: []int64{c.paddedVocab(), H}, split: 0, vocab: true}}
	for i := 0; i < c.Layers; i++ {
		l := fmt.Sprintf("language_model.encoder.layers.%d.", i)
		ps = append(ps,
			param{name: l + "input_layernorm.weight", full: []int64{H}, split: -1},
			param{name: l + "self_attention.query_key_value.weight", full: []int64{3 * H, H}, split: 0},
			param{name: l + "self_attention.dense.weight", full: []int64{H, H}, split: 1},
			param{name: l + "post_attention_layernorm.weight", full: []int64{H}, split: -1},
			param{name: l + "mlp.dense_h_to_4h.weight", full: []int64{2 * F, H}, split: 0, halves: true},
			param{name: l + "mlp.dense_4h_to_h.weight", full: []int64{H, F}, split: 1},
		)
	}
	return append(ps,
		param{name: "language_model.encoder.final_layernorm.weight", full: []int64{H}, split: -1},
		param{name: "language_model.output_layer.weight", full: []int64{c.paddedVocab(), H}, split: 0, vocab: true})
}

// args are the training arguments Megatron-DeepSpeed saves (an
// argparse.Namespace), with the sizes of this model.
func (c Config) args() *pyobj.Object {
	return &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}, Via: pyobj.ByNewObj, Built: true,
		State: pyobj.DictOf("num_layers", int64(c.Layers), "hidden_size", int64(c.Hidden), "ffn_hidden_size", c.ffn(),
			"num_attention_heads", c.heads(), "num_key_value_heads", c.heads(), "max_position_embeddings", int64(c.Positions),
			"seq_length", int64(c.Positions), "make_vocab_size_divisible_by", int64(128), "padded_vocab_size", c.paddedVocab(),
			"tensor_model_parallel_size", int64(c.TP), "pipeline_model_parallel_size", int64(1),
			"data_parallel_size", int64(c.DP), "world_size", int64(c.TP*c.DP), "swiglu", true, "add_bias_linear", false,
			"untie_embeddings_and_output_weights", true, "add_position_embedding", false, "normalization", "rmsnorm",
			"fp16", false, "bf16", true, "params_dtype", pyobj.DType{DType: dtype.BFloat16}, "optimizer", "adam", "lr", 1e-4,
			"min_lr", 1e-5, "weight_decay", 0.1, "adam_beta1", 0.9, "adam_beta2", 0.95, "adam_eps", 1e-8,
			"micro_batch_size", int64(4), "global_batch_size", int64(4*c.DP), "iteration", int64(100), "deepspeed", true,
			"zero_stage", int64(2), "no_pipeline_parallel", true, "use_rotary_position_embeddings", true,
			"layernorm_epsilon", 1e-5, "rank", int64(0))}
}

func (p param) local(T int) []int64 {
	s := append([]int64(nil), p.full...)
	if p.split >= 0 {
		s[p.split] /= int64(T)
	}
	return s
}

func numel(s []int64) int64 {
	n := int64(1)
	for _, d := range s {
		n *= d
	}
	return n
}

// Params returns the number of model parameters.
func (c Config) Params() int64 {
	var n int64
	for _, p := range c.params() {
		n += numel(p.full)
	}
	return n
}

func strs(ss ...string) *pyobj.List {
	l := &pyobj.List{}
	for _, s := range ss {
		l.Items = append(l.Items, s)
	}
	return l
}

func (c Config) uci() *pyobj.Dict {
	if c.Llama {
		// As Megatron-DeepSpeed's GPTModel.universal_checkpoint_info gives them
		// for this layout.
		return pyobj.DictOf(
			"universal_checkpoint_version", 0.2,
			"original_vocab_size", int64(c.Vocab),
			"padded_vocab_size", c.paddedVocab(),
			"vocabulary_parameter_patterns", strs("language_model.embedding.word_embeddings.weight", "language_model.output_layer.weight"),
			"tp_replicated_parameter_patterns", strs(
				`language_model.encoder.layers.\d+.input_layernorm.weight`, `language_model.encoder.layers.\d+.post_attention_layernorm.weight`,
				"language_model.encoder.final_layernorm.weight"),
			"parameter_with_row_parallelism_patterns", strs(
				`language_model.encoder.layers.\d+.self_attention.dense.weight`, `language_model.encoder.layers.\d+.mlp.dense_4h_to_h.weight`),
			"parameter_with_2_sub_params_cat_dim_0", strs(`language_model.encoder.layers.\d+.mlp.dense_h_to_4h.weight`),
		)
	}
	return pyobj.DictOf(
		"universal_checkpoint_version", 0.2,
		"original_vocab_size", int64(c.Vocab),
		"padded_vocab_size", c.paddedVocab(),
		"vocabulary_parameter_patterns", strs("language_model.embedding.word_embeddings.weight"),
		"tp_replicated_parameter_patterns", strs(
			"language_model.embedding.position_embeddings.weight",
			`language_model.encoder.layers.\d+.input_layernorm.weight`, `language_model.encoder.layers.\d+.input_layernorm.bias`,
			`language_model.encoder.layers.\d+.post_attention_layernorm.weight`, `language_model.encoder.layers.\d+.post_attention_layernorm.bias`,
			`language_model.encoder.layers.\d+.self_attention.dense.bias`, `language_model.encoder.layers.\d+.mlp.dense_4h_to_h.bias`,
			"language_model.encoder.final_layernorm.weight", "language_model.encoder.final_layernorm.bias"),
		"parameter_with_row_parallelism_patterns", strs(
			`language_model.encoder.layers.\d+.self_attention.dense.weight`, `language_model.encoder.layers.\d+.mlp.dense_4h_to_h.weight`),
	)
}

// Generate writes the checkpoint into dir (a save folder with 'latest').
func Generate(dir string, c Config) error {
	if c.Zero3 {
		return generateZero3(dir, c)
	}
	return c.writeTag(dir, func(g *errgroup.Group, td string, ps []param) {
		for t := 0; t < c.TP; t++ {
			g.Go(func() error { return c.writeModelStates(td, ps, t) })
			for dp := 0; dp < c.DP; dp++ {
				g.Go(func() error { return c.writeOptim(td, ps, t, dp) })
			}
		}
	})
}

// writeTag makes the tag folder td of dir, writes its files with the
// jobs that add starts (at most a CPU's worth at once), then 'latest'
// naming the tag.
func (c Config) writeTag(dir string, add func(g *errgroup.Group, td string, ps []param)) error {
	tag := "global_step100"
	td := filepath.Join(dir, tag)
	if err := os.MkdirAll(td, 0o755); err != nil {
		return err
	}
	ps := c.params()
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	add(&g, td, ps)
	if err := g.Wait(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "latest"), []byte(tag), 0o644)
}

// dsConfig is the ds_config of a bf16 run at the given ZeRO stage.
func dsConfig(stage int64) *pyobj.Dict {
	return pyobj.DictOf("train_micro_batch_size_per_gpu", int64(4), "bf16", pyobj.DictOf("enabled", true),
		"zero_optimization", pyobj.DictOf("stage", stage))
}

// groups are the optimizer's param groups, as indices into ps: one, or
// for Llama Megatron's two (weight decay for matrices, none for the 1-D
// norm weights).
func (c Config) groups(ps []param) [][]int {
	if !c.Llama {
		all := make([]int, len(ps))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	gs := make([][]int, 2)
	for i, p := range ps {
		k := 0
		if len(p.full) == 1 {
			k = 1
		}
		gs[k] = append(gs[k], i)
	}
	return gs
}

func (c Config) writeModelStates(td string, ps []param, t int) error {
	module := pyobj.NewDict(pyobj.OrderedDict)
	var blobs []*torchfile.Blob
	for _, p := range ps {
		b := &torchfile.Blob{DType: dtype.BFloat16, Shape: p.local(c.TP)}
		module.Set(p.name, b)
		blobs = append(blobs, b)
	}
	shapeList := &pyobj.List{}
	for _, g := range c.groups(ps) {
		shapes := pyobj.NewDict(pyobj.OrderedDict)
		for _, i := range g {
			shapes.Set(ps[i].name, pyobj.Size(ps[i].local(c.TP)))
		}
		shapeList.Items = append(shapeList.Items, shapes)
	}
	root := pyobj.DictOf(
		"module", module, "buffer_names", &pyobj.List{}, "optimizer", nil,
		"param_shapes", shapeList,
		"frozen_param_shapes", nil, "shared_params", pyobj.NewDict(pyobj.PlainDict), "frozen_param_fragments", nil,
		"lr_scheduler", pyobj.DictOf("last_batch_iteration", int64(99)), "data_sampler", nil, "random_ltd", nil,
		"sparse_tensor_module_names", &pyobj.Set{}, "skipped_steps", int64(0), "global_steps", int64(100),
		"global_samples", int64(100*4*c.DP), "dp_world_size", int64(c.DP), "mp_world_size", int64(c.TP),
		"ds_config", dsConfig(2), "ds_version", "0.14.5", "universal_checkpoint_info", c.uci(), "iteration", int64(100))
	if c.Llama {
		// Megatron-DeepSpeed's OptimizerParamScheduler state and its keys.
		root.Set("lr_scheduler", pyobj.DictOf("max_lr", 1e-4, "lr_warmup_steps", int64(10), "num_steps", int64(100*4*c.DP),
			"lr_decay_style", "cosine", "lr_decay_steps", int64(1000), "min_lr", 1e-5, "start_wd", 0.1, "end_wd", 0.1,
			"wd_incr_style", "constant", "wd_incr_steps", int64(1000)))
		root.Set("args", c.args())
		root.Set("checkpoint_version", 3.0)
		root.Set("tokens", int64(100*4*c.DP*c.Positions))
	}
	w, err := torchfile.Create(filepath.Join(td, fmt.Sprintf("mp_rank_%02d_model_states.pt", t)), root)
	if err != nil {
		return err
	}
	for i, b := range blobs {
		seg := segment{param: i, p: ps[i], lo: 0, hi: numel(b.Shape)}
		if err := c.fill(w, i, dtype.BFloat16, 0, []segment{seg}, t, 0); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Commit()
}

// optGroup is one param group's part of an optimizer file: its flat
// partition's tensors and where the parameters' elements go.
type optGroup struct {
	fp32, expAvg, expAvgSq *torchfile.Blob
	pad                    int64
	mappings               *pyobj.Dict
	segs                   []segment
}

// optimGroup lays out group g (indices into ps) for DP rank dp: the flat
// buffer padded to a multiple of 2*DP, split in DP partitions.
func (c Config) optimGroup(ps []param, g []int, t, dp int) optGroup {
	var total int64
	for _, i := range g {
		total += numel(ps[i].local(c.TP))
	}
	align := int64(2 * c.DP)
	S := (total + align - 1) / align * align / int64(c.DP)
	lo, hi := int64(dp)*S, int64(dp+1)*S
	og := optGroup{pad: max(0, min(S, hi-total)), mappings: pyobj.NewDict(pyobj.OrderedDict)}
	var off int64
	for _, i := range g {
		p := ps[i]
		n := numel(p.local(c.TP))
		if fs, fe := max(off, lo), min(off+n, hi); fs < fe {
			fa := &pyobj.Object{Class: &pyobj.Global{Module: "deepspeed.utils.tensor_fragment", Name: "fragment_address"},
				Via: pyobj.ByNewObj, Built: true, State: pyobj.DictOf("numel", fe-fs, "start", fs-lo)}
			og.mappings.Set(p.name, fa)
			// The partition [lo, hi) of the flat buffer: each parameter
			// overlapping it contributes its local elements [a, b); padding
			// stays zero.
			og.segs = append(og.segs, segment{param: i, p: p, lo: fs - off, hi: fe - off, at: fs - lo})
		}
		off += n
	}
	og.fp32 = &torchfile.Blob{DType: dtype.Float32, Shape: []int64{S - og.pad}, RequiresGrad: true}
	og.expAvg = &torchfile.Blob{DType: dtype.Float32, Shape: []int64{S}}
	og.expAvgSq = &torchfile.Blob{DType: dtype.Float32, Shape: []int64{S}}
	return og
}

func (c Config) writeOptim(td string, ps []param, t, dp int) error {
	states := pyobj.NewDict(pyobj.PlainDict)
	var groups, fp32s, pads, counts, mappings pyobj.List
	var ogs []optGroup
	for gi, g := range c.groups(ps) {
		og := c.optimGroup(ps, g, t, dp)
		ogs = append(ogs, og)
		wd := 0.1
		if c.Llama && gi == 1 {
			wd = 0.0
		}
		step := torchfile.NewBlob(dtype.Float32, nil, dtype.Float32Bytes([]float32{100}))
		states.Set(int64(gi), pyobj.DictOf("step", step, "exp_avg", og.expAvg, "exp_avg_sq", og.expAvgSq))
		groups.Items = append(groups.Items, pyobj.DictOf("lr", 1e-4, "betas", &pyobj.List{Items: []pyobj.Value{0.9, 0.95}}, "eps", 1e-8, "weight_decay", wd,
			"amsgrad", false, "foreach", nil, "maximize", false, "capturable", false, "params", &pyobj.List{Items: []pyobj.Value{int64(gi)}}))
		fp32s.Items = append(fp32s.Items, og.fp32)
		pads.Items = append(pads.Items, og.pad)
		counts.Items = append(counts.Items, int64(c.DP))
		mappings.Items = append(mappings.Items, og.mappings)
	}
	scaler := &pyobj.Object{Class: &pyobj.Global{Module: "deepspeed.runtime.fp16.loss_scaler", Name: "LossScaler"},
		Via: pyobj.ByNewObj, Built: true, State: pyobj.DictOf("cur_scale", 1.0, "dynamic", false)}
	osd := pyobj.DictOf(
		"loss_scaler", scaler, "dynamic_loss_scale", false, "overflow", false, "clip_grad", 1.0,
		"base_optimizer_state", pyobj.DictOf("state", states, "param_groups", &groups),
		"single_partition_of_fp32_groups", &fp32s,
		"zero_stage", pyobj.Enum{Class: &pyobj.Global{Module: "deepspeed.runtime.zero.config", Name: "ZeroStageEnum"}, Name: "gradients", ByName: true},
		"group_paddings", &pads,
		"partition_count", &counts,
		"ds_version", "0.14.5",
		"param_slice_mappings", &mappings)
	root := pyobj.DictOf("optimizer_state_dict", osd, "ds_config", dsConfig(2), "ds_version", "0.14.5")
	w, err := torchfile.Create(filepath.Join(td, fmt.Sprintf("bf16_zero_pp_rank_%d_mp_rank_%02d_optim_states.pt", dp, t)), root)
	if err != nil {
		return err
	}
	for i, b := range w.Layout.Blobs {
		if b.Data != nil {
			continue
		}
		for _, og := range ogs {
			state, ok := map[*torchfile.Blob]int{og.fp32: StateFP32, og.expAvg: StateExpAvg, og.expAvgSq: StateExpAvgSq}[b]
			if !ok {
				continue
			}
			if err := c.fill(w, i, dtype.Float32, state, og.segs, t, b.NBytes()); err != nil {
				w.Abort()
				return err
			}
		}
	}
	return w.Commit()
}

// States as Value numbers them.
const (
	StateFP32 = iota
	StateExpAvg
	StateExpAvgSq
)

// Value is the element at flat index i of the full (unsharded) tensor of
// parameter number param, for a state: a hash of the three, in
// [-0.02, 0.02). A converted checkpoint can be checked against it.
func Value(seed uint64, param, state int, i int64) float32 {
	x := seed ^ uint64(param)<<40 ^ uint64(state)<<56 ^ uint64(i)
	x += 0x9E3779B97F4A7C15 // splitmix64
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	x ^= x >> 31
	return float32(int32(x>>32)) / float32(math.MaxInt32) * 0.02
}

// segment is local elements [lo, hi) of one parameter's TP shard, written
// at element at of a blob.
type segment struct {
	param  int
	p      param
	lo, hi int64
	at     int64
}

// global maps element j of TP rank t's shard of p to its full-tensor index.
func (p param) global(j int64, t, T int) int64 {
	switch {
	case p.split < 0:
		return j
	case p.split == 0 && p.halves:
		// Local rows: this rank's rows of the first half, then of the second.
		cols := p.full[1]
		rows := p.full[0] / 2 / int64(T)
		r, col := j/cols, j%cols
		h := r / rows
		return (h*p.full[0]/2+int64(t)*rows+r%rows)*cols + col
	case p.split == 0:
		return j + int64(t)*numel(p.local(T))
	}
	// Split on dim 1 of a 2-D tensor.
	cols := p.full[1] / int64(T)
	r, col := j/cols, j%cols
	return r*p.full[1] + int64(t)*cols + col
}

// fill writes blob i (of total bytes, or the segments' extent when 0) of
// dtype dt: the segments' values, zeros elsewhere, 8 MB at a time.
func (c Config) fill(w *torchfile.Writer, i int, dt dtype.DType, state int, segs []segment, t int, total int64) error {
	es := int64(dt.Size())
	if total == 0 {
		total = w.Layout.Blobs[i].NBytes()
	}
	const chunk = 8 << 20
	buf := make([]byte, min(total, chunk))
	for off := int64(0); off < total; off += chunk {
		b := buf[:min(chunk, total-off)]
		clear(b)
		first, last := off/es, (off+int64(len(b)))/es // elements of the blob in this chunk
		for _, s := range segs {
			for e := max(first, s.at); e < min(last, s.at+s.hi-s.lo); e++ {
				v := Value(c.Seed, s.param, state, s.p.global(s.lo+e-s.at, t, c.TP))
				bits := math.Float32bits(v)
				k := (e - first) * es
				if es == 2 {
					binary.LittleEndian.PutUint16(b[k:], uint16(bits>>16))
				} else {
					binary.LittleEndian.PutUint32(b[k:], bits)
				}
			}
		}
		if err := w.WriteAt(i, b, off); err != nil {
			return err
		}
	}
	return nil
}
