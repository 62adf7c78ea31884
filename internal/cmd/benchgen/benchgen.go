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
}

// Default is about 300M parameters: 4.3 GB of checkpoint at TP 2 x DP 4.
var Default = Config{Hidden: 2048, Layers: 4, Vocab: 50257, Positions: 2048, TP: 2, DP: 4, Seed: 1}

type param struct {
	name  string
	full  []int64
	split int // -1 replicated, else the TP split dim
	vocab bool
}

func (c Config) paddedVocab() int64 {
	m := int64(128 * c.TP)
	return (int64(c.Vocab) + m - 1) / m * m
}

func (c Config) params() []param {
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

func (c Config) uci() *pyobj.Dict {
	strs := func(ss ...string) *pyobj.List {
		l := &pyobj.List{}
		for _, s := range ss {
			l.Items = append(l.Items, s)
		}
		return l
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
	tag := "global_step100"
	td := filepath.Join(dir, tag)
	if err := os.MkdirAll(td, 0o755); err != nil {
		return err
	}
	ps := c.params()
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	for t := 0; t < c.TP; t++ {
		g.Go(func() error { return c.writeModelStates(td, ps, t) })
		var total int64
		for _, p := range ps {
			total += numel(p.local(c.TP))
		}
		align := int64(2 * c.DP)
		S := (total + align - 1) / align * align / int64(c.DP)
		for dp := 0; dp < c.DP; dp++ {
			g.Go(func() error { return c.writeOptim(td, ps, t, dp, total, S) })
		}
	}
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

func (c Config) writeModelStates(td string, ps []param, t int) error {
	module := pyobj.NewDict(pyobj.OrderedDict)
	shapes := pyobj.NewDict(pyobj.OrderedDict)
	var blobs []*torchfile.Blob
	for _, p := range ps {
		b := &torchfile.Blob{DType: dtype.BFloat16, Shape: p.local(c.TP)}
		module.Set(p.name, b)
		shapes.Set(p.name, pyobj.Size(p.local(c.TP)))
		blobs = append(blobs, b)
	}
	root := pyobj.DictOf(
		"module", module, "buffer_names", &pyobj.List{}, "optimizer", nil,
		"param_shapes", &pyobj.List{Items: []pyobj.Value{shapes}},
		"frozen_param_shapes", nil, "shared_params", pyobj.NewDict(pyobj.PlainDict), "frozen_param_fragments", nil,
		"lr_scheduler", pyobj.DictOf("last_batch_iteration", int64(99)), "data_sampler", nil, "random_ltd", nil,
		"sparse_tensor_module_names", &pyobj.Set{}, "skipped_steps", int64(0), "global_steps", int64(100),
		"global_samples", int64(100*4*c.DP), "dp_world_size", int64(c.DP), "mp_world_size", int64(c.TP),
		"ds_config", dsConfig(2), "ds_version", "0.14.5", "universal_checkpoint_info", c.uci(), "iteration", int64(100))
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

func (c Config) writeOptim(td string, ps []param, t, dp int, total, S int64) error {
	lo, hi := int64(dp)*S, int64(dp+1)*S
	pad := max(0, min(S, hi-total))
	mappings := pyobj.NewDict(pyobj.OrderedDict)
	var off int64
	for _, p := range ps {
		n := numel(p.local(c.TP))
		if fs, fe := max(off, lo), min(off+n, hi); fs < fe {
			fa := &pyobj.Object{Class: &pyobj.Global{Module: "deepspeed.utils.tensor_fragment", Name: "fragment_address"},
				Via: pyobj.ByNewObj, Built: true, State: pyobj.DictOf("numel", fe-fs, "start", fs-lo)}
			mappings.Set(p.name, fa)
		}
		off += n
	}
	fp32 := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{S - pad}, RequiresGrad: true}
	expAvg := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{S}}
	expAvgSq := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{S}}
	step := torchfile.NewBlob(dtype.Float32, nil, dtype.Float32Bytes([]float32{100}))
	group := pyobj.DictOf("lr", 1e-4, "betas", &pyobj.List{Items: []pyobj.Value{0.9, 0.95}}, "eps", 1e-8, "weight_decay", 0.1,
		"amsgrad", false, "foreach", nil, "maximize", false, "capturable", false, "params", &pyobj.List{Items: []pyobj.Value{int64(0)}})
	scaler := &pyobj.Object{Class: &pyobj.Global{Module: "deepspeed.runtime.fp16.loss_scaler", Name: "LossScaler"},
		Via: pyobj.ByNewObj, Built: true, State: pyobj.DictOf("cur_scale", 1.0, "dynamic", false)}
	osd := pyobj.DictOf(
		"loss_scaler", scaler, "dynamic_loss_scale", false, "overflow", false, "clip_grad", 1.0,
		"base_optimizer_state", pyobj.DictOf(
			"state", pyobj.DictOf(int64(0), pyobj.DictOf("step", step, "exp_avg", expAvg, "exp_avg_sq", expAvgSq)),
			"param_groups", &pyobj.List{Items: []pyobj.Value{group}}),
		"single_partition_of_fp32_groups", &pyobj.List{Items: []pyobj.Value{fp32}},
		"zero_stage", pyobj.Enum{Class: &pyobj.Global{Module: "deepspeed.runtime.zero.config", Name: "ZeroStageEnum"}, Name: "gradients", ByName: true},
		"group_paddings", &pyobj.List{Items: []pyobj.Value{pad}},
		"partition_count", &pyobj.List{Items: []pyobj.Value{int64(c.DP)}},
		"ds_version", "0.14.5",
		"param_slice_mappings", &pyobj.List{Items: []pyobj.Value{mappings}})
	root := pyobj.DictOf("optimizer_state_dict", osd, "ds_config", dsConfig(2), "ds_version", "0.14.5")
	w, err := torchfile.Create(filepath.Join(td, fmt.Sprintf("bf16_zero_pp_rank_%d_mp_rank_%02d_optim_states.pt", dp, t)), root)
	if err != nil {
		return err
	}
	// The partition [lo, hi) of the flat buffer: each parameter overlapping
	// it contributes its local elements [a, b); padding stays zero.
	var segs []segment
	off = 0
	for i, p := range ps {
		n := numel(p.local(c.TP))
		if fs, fe := max(off, lo), min(off+n, hi); fs < fe {
			segs = append(segs, segment{param: i, p: p, lo: fs - off, hi: fe - off, at: fs - lo})
		}
		off += n
	}
	for i, b := range w.Layout.Blobs {
		if b.Data != nil {
			continue
		}
		state := map[*torchfile.Blob]int{fp32: StateFP32, expAvg: StateExpAvg, expAvgSq: StateExpAvgSq}[b]
		if err := c.fill(w, i, dtype.Float32, state, segs, t, b.NBytes()); err != nil {
			w.Abort()
			return err
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
