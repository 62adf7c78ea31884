package megatron

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// Args are the training arguments the reader needs, from the
// argparse.Namespace saved as model_optim_rng.pt['args'].
type Args struct {
	path string
	ns   *pyobj.Object
	la   layout.Args // the strict attribute reader over ns

	TP, PP, VPP, EP, ETP int
	NumExperts           int
	NumLayers            int
	Hidden               int64
	Heads                int64
	QueryGroups          int64 // the real group count: num_attention_heads without GQA
	KVChannels           int64
	FFN                  int64 // 0 when absent
	MoEFFN               int64 // moe_ffn_hidden_size; 0 when absent or None
	MoEExtendedTP        bool  // core 0.8-0.9 --moe-extended-tp
	PaddedVocab          int64
	VocabSize            int64 // 0 when args has none
	SwiGLU               bool
	Untie                bool
	// MLALocal: multi-latent attention in megatron-core's local spec, whose
	// down projections are column-parallel (TE's are whole on every rank).
	MLALocal           bool
	DP, CP, World      int
	DistOpt            bool
	OverlapGradReduce  bool
	OverlapParamGather bool // overlap_param_gather_with_optimizer_step: no buckets
	BucketSize         int64
	NumBuckets         int64
	GradFP32           bool // accumulate_allreduce_grads_in_fp32
	UnevenPipeline     []string
}

// attr returns args.name, or false when the Namespace has no such attribute.
func (a *Args) attr(name string) (pyobj.Value, bool) { return a.ns.Attr(name) }

func (a *Args) missing(name, why string) error {
	return fmt.Errorf("%s: args has no attribute %q (needed for %s)", a.path, name, why)
}

// intAttr reads a required int attribute.
func (a *Args) intAttr(name, why string) (int64, error) {
	if v, ok := a.attr(name); !ok || v == nil {
		return 0, a.missing(name, why)
	}
	return a.la.Int(name, 0)
}

// optInt reads an int attribute that may be absent or None.
func (a *Args) optInt(name string, def int64) (int64, error) { return a.la.Int(name, def) }

// boolAttr reads a bool attribute; absent or None gives def.
func (a *Args) boolAttr(name string, def bool) (bool, error) { return a.la.Bool(name, def) }

// parseArgs reads the arguments of one model_optim_rng.pt root.
func parseArgs(path string, root *pyobj.Dict) (*Args, error) {
	rd := pyobj.NewDec(path, root)
	if !rd.Has("args") {
		return nil, fmt.Errorf("%s: no 'args' (the saved training arguments); ucp needs them for the parallel layout", path)
	}
	ns := pyobj.As[*pyobj.Object](rd.Key("args"), "an argparse.Namespace")
	if err := rd.Err(); err != nil {
		return nil, err
	}
	a := &Args{path: path, ns: ns, la: layout.Args{Path: path, NS: ns}}
	var err error
	get := func(dst *int, name, why string) {
		if err != nil {
			return
		}
		var n int64
		if n, err = a.intAttr(name, why); err == nil {
			if n <= 0 {
				err = fmt.Errorf("%s: args.%s is %d", path, name, n)
			}
			*dst = int(n)
		}
	}
	get(&a.TP, "tensor_model_parallel_size", "the tensor-parallel merge and the folder names")
	get(&a.PP, "pipeline_model_parallel_size", "the folder names and global layer numbers")
	get(&a.NumLayers, "num_layers", "global layer numbers")
	if err != nil {
		return nil, err
	}
	opt := func(name string, def int64) int64 {
		if err != nil {
			return 0
		}
		var n int64
		n, err = a.optInt(name, def)
		return n
	}
	optBool := func(name string, def bool) bool {
		if err != nil {
			return false
		}
		var b bool
		b, err = a.boolAttr(name, def)
		return b
	}
	a.VPP = int(opt("virtual_pipeline_model_parallel_size", 0))
	a.EP = int(opt("expert_model_parallel_size", 1))
	a.ETP = int(opt("expert_tensor_parallel_size", int64(a.TP)))
	a.NumExperts = int(opt("num_experts", 0))
	a.CP = int(opt("context_parallel_size", 1))
	a.World = int(opt("world_size", 0))
	a.DP = int(opt("data_parallel_size", 0))
	a.FFN = opt("ffn_hidden_size", 0)
	a.MoEFFN = opt("moe_ffn_hidden_size", 0)
	a.MoEExtendedTP = optBool("moe_extended_tp", false)
	a.VocabSize = opt("vocab_size", 0)
	a.Untie = optBool("untie_embeddings_and_output_weights", false)
	a.DistOpt = optBool("use_distributed_optimizer", false)
	a.OverlapGradReduce = optBool("overlap_grad_reduce", false)
	a.OverlapParamGather = optBool("overlap_param_gather_with_optimizer_step", false)
	a.BucketSize = opt("ddp_bucket_size", 0)
	a.NumBuckets = opt("ddp_num_buckets", 0)
	a.GradFP32 = optBool("accumulate_allreduce_grads_in_fp32", false)
	if mla := optBool("multi_latent_attention", false); mla && err == nil {
		impl, _ := a.attr("transformer_impl")
		a.MLALocal = impl == "local"
	}
	if err != nil {
		return nil, err
	}
	if a.EP <= 0 || a.ETP <= 0 || a.CP <= 0 || a.VPP < 0 {
		return nil, fmt.Errorf("%s: args has expert parallel %d, expert tensor parallel %d, context parallel %d, virtual pipeline %d", path, a.EP, a.ETP, a.CP, a.VPP)
	}
	if a.DP == 0 && a.World > 0 {
		a.DP = a.World / (a.TP * a.PP * a.CP)
	}
	// Arguments that move layers between pipeline stages: offsets then come
	// from the layer counts in the files (uniform otherwise).
	for _, name := range []string{"num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
		"decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout",
		"account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "standalone_embedding_stage"} {
		if v, ok := a.attr(name); ok && v != nil && v != false {
			a.UnevenPipeline = append(a.UnevenPipeline, name)
		}
	}
	return a, nil
}

// geometry reads the model geometry the shape checks and the merge rules
// need; requires tells which (only what the model uses is required).
func (a *Args) geometry(needSwiGLU, needVocab bool) error {
	var err error
	if a.Hidden, err = a.intAttr("hidden_size", "checking parameter shapes"); err != nil {
		return err
	}
	if a.Heads, err = a.intAttr("num_attention_heads", "checking the fused QKV shape"); err != nil {
		return err
	}
	if a.Heads <= 0 || a.Hidden <= 0 {
		return fmt.Errorf("%s: args has hidden_size %d and num_attention_heads %d", a.path, a.Hidden, a.Heads)
	}
	gqa, err := a.boolAttr("group_query_attention", false)
	if err != nil {
		return err
	}
	// num_query_groups keeps its argparse default 1 without GQA.
	a.QueryGroups = a.Heads
	if gqa {
		if a.QueryGroups, err = a.intAttr("num_query_groups", "the fused QKV shape with group_query_attention"); err != nil {
			return err
		}
	}
	if a.KVChannels, err = a.optInt("kv_channels", 0); err != nil {
		return err
	}
	if a.KVChannels == 0 {
		a.KVChannels = a.Hidden / a.Heads
	}
	if needSwiGLU {
		if v, ok := a.attr("swiglu"); !ok {
			return a.missing("swiglu", "merging fc1 / dense_h_to_4h shards (gated [W; V] halves)")
		} else if v == nil {
			return fmt.Errorf("%s: args.swiglu is None, not a bool", a.path)
		}
		b, err := a.la.Bool("swiglu", false)
		if err != nil {
			return err
		}
		// --quick-geglu gates fc1 the same way (gated_linear_unit,
		// core_transformer_config_from_args).
		q, err := a.boolAttr("quick_geglu", false)
		if err != nil {
			return err
		}
		a.SwiGLU = b || q
	}
	if needVocab {
		if a.PaddedVocab, err = a.intAttr("padded_vocab_size", "the vocabulary padding of embeddings and the output layer"); err != nil {
			return err
		}
	}
	return nil
}

// gradDType is the grad buffer dtype of a parameter of dtype dt.
func (a *Args) gradDType(dt dtype.DType) dtype.DType {
	if a.GradFP32 {
		return dtype.Float32
	}
	return dt
}

// denseDP is the data-parallel size of the dense buffers (DP x CP).
func (a *Args) denseDP() int {
	if a.DP <= 0 {
		return 0
	}
	return a.DP * a.CP
}

// expertDP is the data-parallel size of the expert buffers.
func (a *Args) expertDP() int {
	if a.World <= 0 {
		return 0
	}
	return a.World / (a.ETP * a.EP * a.PP)
}
