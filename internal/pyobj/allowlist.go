package pyobj

import (
	"sort"
	"strings"
)

// The allowlist names the globals that checkpoints are expected to hold:
// what torch.load(weights_only=True) accepts (torch/_weights_only_unpickler.py),
// plus the classes DeepSpeed, Megatron-LM and PyTorch Distributed Checkpoint
// pickle into their files. Decoding never executes any global; a global
// outside the list still decodes (as an inert *Object), and is reported so
// that a user can see that a file holds something unexpected.
var allowedGlobals = map[string]bool{
	// torch.load(weights_only=True)
	"collections.OrderedDict": true, "collections.Counter": true,
	"torch.nn.parameter.Parameter": true, "torch.serialization._get_layout": true,
	"torch.Size": true, "torch.Tensor": true, "torch.device": true,
	"torch._utils._rebuild_tensor": true, "torch._utils._rebuild_tensor_v2": true, "torch._utils._rebuild_tensor_v3": true,
	"torch._utils._rebuild_parameter": true, "torch._utils._rebuild_parameter_with_state": true,
	"torch._utils._rebuild_sparse_tensor": true, "torch._utils._rebuild_sparse_csr_tensor": true,
	"torch._utils._rebuild_meta_tensor_no_storage": true, "torch._utils._rebuild_qtensor": true,
	"torch._utils._rebuild_wrapper_subclass": true, "torch._utils._rebuild_nested_tensor": true,
	"torch._utils._rebuild_device_tensor_from_numpy": true, "torch._utils._rebuild_device_tensor_from_cpu_tensor": true,
	"torch._tensor._rebuild_from_type_v2": true, "torch.tensor._rebuild_from_type_v2": true,
	"_codecs.encode": true,
	"builtins.set":   true, "builtins.frozenset": true, "builtins.bytearray": true, "builtins.complex": true,
	"__builtin__.set": true, "__builtin__.frozenset": true, "__builtin__.bytearray": true, "__builtin__.complex": true,
	// Enum members are pickled as getattr(EnumClass, 'NAME') by Python 3.11+.
	"builtins.getattr": true, "__builtin__.getattr": true,
	// Protocol 0/1 objects: copy_reg._reconstructor(cls, object, None).
	"copy_reg._reconstructor": true, "copyreg._reconstructor": true, "__builtin__.object": true, "builtins.object": true,
	// DeepSpeed
	"deepspeed.utils.tensor_fragment.fragment_address":        true,
	"deepspeed.runtime.bf16_optimizer.fragment_address":       true,
	"deepspeed.checkpoint.universal_checkpoint.SubparamShape": true,
	"deepspeed.runtime.zero.config.ZeroStageEnum":             true,
	"deepspeed.runtime.fp16.loss_scaler.LossScaler":           true,
	"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler":    true,
	"deepspeed.runtime.fp16.loss_scaler.LossScalerBase":       true,
	// Megatron-LM: its arguments, RNG states (numpy), extra states
	"argparse.Namespace": true, "_io.BytesIO": true,
	"numpy.core.multiarray._reconstruct": true, "numpy._core.multiarray._reconstruct": true,
	"numpy.core.multiarray.scalar": true, "numpy._core.multiarray.scalar": true,
	"numpy.ndarray": true, "numpy.dtype": true,
	// PyTorch Distributed Checkpoint metadata
	"pathlib.PosixPath": true, "pathlib._local.PosixPath": true,
}

// allowedPrefixes are module families whose every member is expected:
// torch dtypes and storage classes, Megatron's enums, DCP's dataclasses.
var allowedPrefixes = []string{
	"torch.distributed.checkpoint.",
	"torch.distributed._shard.sharded_tensor.metadata.",
	"megatron.core.transformer.enums.",
	"megatron.core.enums.",
	"megatron.core.dist_checkpointing.",
	"numpy.dtypes.",
}

// Allowed reports whether module.name is a global that checkpoints are
// expected to contain.
func Allowed(module, name string) bool {
	full := module + "." + name
	if allowedGlobals[full] {
		return true
	}
	if module == "torch" {
		// dtypes (torch.float16), storage classes (torch.FloatStorage)
		// and legacy tensor classes (torch.FloatTensor).
		if strings.HasSuffix(name, "Storage") || strings.HasSuffix(name, "Tensor") {
			return true
		}
		_, isDType := torchDTypes[name]
		return isDType
	}
	for _, p := range allowedPrefixes {
		if strings.HasPrefix(full, p) {
			return true
		}
	}
	return false
}

// torchDTypes are the dtype attributes of the torch module.
var torchDTypes = map[string]bool{
	"float32": true, "float": true, "float64": true, "double": true, "float16": true, "half": true, "bfloat16": true,
	"complex32": true, "complex64": true, "cfloat": true, "complex128": true, "cdouble": true,
	"uint8": true, "uint16": true, "uint32": true, "uint64": true, "int8": true, "int16": true, "short": true,
	"int32": true, "int": true, "int64": true, "long": true, "bool": true,
	"float8_e4m3fn": true, "float8_e5m2": true, "float8_e4m3fnuz": true, "float8_e5m2fnuz": true, "float8_e8m0fnu": true,
	"qint8": true, "quint8": true, "qint32": true, "quint4x2": true, "quint2x4": true,
}

// Unexpected returns the globals of a decoded pickle (Options.Globals)
// that are not Allowed, sorted.
func Unexpected(globals map[string]int) []string {
	var out []string
	for g := range globals {
		i := strings.LastIndexByte(g, '.')
		if i < 0 || !Allowed(g[:i], g[i+1:]) {
			out = append(out, g)
		}
	}
	sort.Strings(out)
	return out
}
