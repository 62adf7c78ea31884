"""Writes Megatron-LM torch_dist fixtures with real megatron-core on CPU.

    python3 megatron_dist_fixtures.py MEGATRON_SRC OUT_DIR [CASE ...]

MEGATRON_SRC is a folder holding megatron-core's `megatron/` package (a release
tag of github:NVIDIA/Megatron-LM); run inside the Debian 13 chroot of
scripts/torch2-chroot.sh (torch 2.6), as `make megatron-fixtures` does. Not run
by CI: the fixtures are committed.

Each case builds a GPTModel (local spec, SwiGLU, GQA) with megatron-core at the
case's TP x PP x DP on gloo (one process per rank), wraps it in Megatron's DDP
with the distributed optimizer, runs optimizer steps on seeded synthetic
gradients (Megatron's DistributedOptimizer.step; forward/backward is not run,
as pipeline schedules need CUDA), and saves with Megatron's own
dist_checkpointing.save of {args, iteration, model.sharded_state_dict(),
optimizer.sharded_state_dict(...)}, as the training loop does.

Truth (truth.pt, written by rank 0) is gathered from the live run, never read
back from the files: each rank's TP-local model parameters, and its slice of
the fp32 main parameter and Adam moments that the distributed optimizer owns
(`_get_model_param_range_map`, `_get_main_param_and_optimizer_states`), are
gathered to rank 0 and merged over TP with the partition dim Megatron set on the
parameter (SwiGLU fc1: each rank's [gate_r; up_r] halves). Names are the
parameter names with global layer numbers, mapped through the layer's own
sharded_state_dict_keys_map (local-spec norms are saved under TE names).
Vocabulary rows are cut to the true vocabulary.

The CUDA calls megatron-core makes are shimmed to CPU in this driver
(Megatron's files are not changed): see install_shims.
"""

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = {
    # name: tp, pp, dp, dtype, sharding type, tied, vocab, padded vocab, args recorded
    "tp2_fp32_dprs": dict(tp=2, pp=1, dp=1, dtype="fp32", sharding="dp_reshardable", tied=False, args=True),
    "tp2_dp2_bf16_dprs": dict(tp=2, pp=1, dp=2, dtype="bf16", sharding="dp_reshardable", tied=False, args=True),
    "tp2_dp2_bf16_fullrs": dict(tp=2, pp=1, dp=2, dtype="bf16", sharding="fully_reshardable", tied=False, args=True),
    "tp2_pp2_tied_bf16_dprs": dict(tp=2, pp=2, dp=1, dtype="bf16", sharding="dp_reshardable", tied=True, args=False),
    "tp2_pp2_tied_bf16_fullrs": dict(tp=2, pp=2, dp=1, dtype="bf16", sharding="fully_reshardable", tied=True, args=False),
    # The same run saved with args (a training loop's save): a source ucp can reshard.
    "tp2_pp2_tied_bf16_dprs_args": dict(tp=2, pp=2, dp=1, dtype="bf16", sharding="dp_reshardable", tied=True, args=True),
    # args record transformer_impl='local': truth names are the live module's (no keys map).
    "tp2_dp2_bf16_fullrs_local": dict(tp=2, pp=1, dp=2, dtype="bf16", sharding="fully_reshardable", tied=False, args=True, impl=True),
    # Core <= 0.14 with torch 2.6: optimizer.state.{fp32_param,exp_avg,exp_avg_sq} with flattened_range.
    "tp2_dp2_bf16_fsms": dict(tp=2, pp=1, dp=2, dtype="bf16", sharding="fully_sharded_model_space", tied=False, args=True, impl=True),
    "tp2_dp2_fp32_fsms": dict(tp=2, pp=1, dp=2, dtype="fp32", sharding="fully_sharded_model_space", tied=False, args=True, impl=True),
    # DP 4: DP ranks' ranges split parameters (flattened_range starts inside a block).
    "tp2_dp4_fp32_fsms": dict(tp=2, pp=1, dp=4, dtype="fp32", sharding="fully_sharded_model_space", tied=False, args=True, impl=True),
    # MoE (SequentialMLP, 4 experts, top-2): experts TP-split at EP 1, whole experts over EP 2.
    "moe_tp2_fp32_dprs": dict(tp=2, pp=1, dp=1, dtype="fp32", sharding="dp_reshardable", tied=False, args=True, experts=4, ep=1),
    "moe_tp2_ep2_fp32_fullrs": dict(tp=2, pp=1, dp=2, dtype="fp32", sharding="fully_reshardable", tied=False, args=True, experts=4, ep=2),
    "moe_tp2_ep2_fp32_dprs": dict(tp=2, pp=1, dp=2, dtype="fp32", sharding="dp_reshardable", tied=False, args=True, experts=4, ep=2),
    # The same run with args recording the local spec (transformer_impl 'local'), as the _local case: a
    # source whose --ckpt-format torch output keeps the local spec's names, which a CPU run (no TE) loads.
    "moe_tp2_ep2_fp32_fullrs_local": dict(tp=2, pp=1, dp=2, dtype="fp32", sharding="fully_reshardable", tied=False, args=True,
                                          experts=4, ep=2, impl=True),
    "moe_tp2_dp2_fp32_fullrs_local": dict(tp=2, pp=1, dp=2, dtype="fp32", sharding="fully_reshardable", tied=False, args=True,
                                          experts=4, ep=1, impl=True),
    # DeepSeek-V3's aux-loss-free balancing (--moe-router-enable-expert-bias, which needs the sigmoid
    # router): the router's persistent fp32 expert_bias buffer (set_expert_bias), bf16 in Float16Module;
    # args record the local spec (loadable in --ckpt-format torch on CPU too).
    "moe_tp2_ep2_ebias_bf16_fullrs_local": dict(tp=2, pp=1, dp=2, dtype="bf16", sharding="fully_reshardable", tied=False,
                                                args=True, experts=4, ep=2, f16module=True, impl=True,
                                                cfg=dict(moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid")),
    # 8 heads in 4 query groups over 4 layers (loadable at TP 4 and at PP 2 x VPP 2), wrapped in
    # Float16Module as pretrain_gpt.py wraps a bf16 model (one DDP buffer, norms in bf16).
    "g4_tp2_dp2_bf16_dprs": dict(tp=2, pp=1, dp=2, dtype="bf16", sharding="dp_reshardable", tied=False, args=True,
                                 f16module=True, geom=dict(layers=4, hidden=16, heads=8, groups=4, kv=4, ffn=16)),
}

# Model geometry: GQA (4 heads, 2 query groups, head dim 4 with hidden 12, so
# np*hn != H), SwiGLU (ffn 8 -> fc1 16 rows), 2 layers, vocab 50 padded to 64.
NUM_LAYERS = 2
HIDDEN = 12
HEADS = 4
GROUPS = 2
KV_CHANNELS = 4
FFN = 8
VOCAB = 50
PADDED_VOCAB = 64  # Megatron pads to a multiple of make_vocab_size_divisible_by (32) x TP (2)
SEQ = 8
STEPS = 2
# UCP_MEGATRON_GEOMETRY=layers,hidden,heads,groups,kv_channels,ffn,vocab,padded_vocab builds the same
# model at another size (scripts/megatron-check.sh times loads of a ~120 MB one; never a stored fixture).
if os.environ.get("UCP_MEGATRON_GEOMETRY"):
    NUM_LAYERS, HIDDEN, HEADS, GROUPS, KV_CHANNELS, FFN, VOCAB, PADDED_VOCAB = (
        int(x) for x in os.environ["UCP_MEGATRON_GEOMETRY"].split(","))


def geometry(case):
    """The case's model geometry: the module's, or the case's own "geom"."""
    g = dict(layers=NUM_LAYERS, hidden=HIDDEN, heads=HEADS, groups=GROUPS, kv=KV_CHANNELS, ffn=FFN,
             padded_vocab=PADDED_VOCAB)
    g.update(case.get("geom", {}))
    return g


def padded_vocab(tp, divisible_by=32):
    """Megatron's padded vocabulary at TP (training/tokenizer: a multiple of
    make_vocab_size_divisible_by x TP): what a run at another TP builds."""
    m = divisible_by * tp
    return (VOCAB + m - 1) // m * m


def install_shims():
    """Run megatron-core's CUDA code paths on CPU."""
    # 0.18/0.19 import triton unconditionally in moe/{,ops/}paged_stash.py:
    # serve a stub to those files only (torch's compiler probes triton too).
    class Any:
        """Stands for any triton attribute: decorators return the function."""

        def __call__(self, *a, **k):
            return a[0] if len(a) == 1 and callable(a[0]) and not k else Any()

        def __getattr__(self, name):
            return Any()

    tri = types.ModuleType("triton")
    tri.__path__ = []
    tri.__version__ = "0.0.0"  # 0.18's ssm ops parse it once paged_stash has loaded the stub
    tri.__getattr__ = lambda name: Any()
    tl = types.ModuleType("triton.language")
    tl.__getattr__ = lambda name: Any()
    tri.language = tl
    # name -> (module, the importing file's path ends with one of these)
    stubs = {"triton": (tri, ("paged_stash.py",)), "triton.language": (tl, ("paged_stash.py",))}
    if os.environ.get("UCP_FUSED_ADAM") == "1":
        # cpu_shims/fused_adam.py as `apex.optimizers`, to megatron-core's optimizer package alone: its
        # import-time choice of Adam then takes the Apex branch, as on a GPU machine with Apex (the
        # module's docstring says why core 0.15's dp_reshardable needs it).
        spec = importlib.util.spec_from_file_location(
            "apex.optimizers", os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_shims", "fused_adam.py"))
        fused = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fused)
        apex = types.ModuleType("apex")
        apex.__path__ = []
        apex.optimizers = fused
        opt_files = tuple(os.path.join("megatron", "core", "optimizer", f)
                          for f in ("__init__.py", "distrib_optimizer.py"))
        stubs.update({"apex": (apex, opt_files), "apex.optimizers": (fused, opt_files)})

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name not in stubs:
                return None
            f = sys._getframe(1)
            while f is not None:
                path = f.f_code.co_filename
                if path.endswith(stubs[name][1]):
                    return importlib.machinery.ModuleSpec(name, self, is_package=name in ("triton", "apex"))
                if name.startswith("apex") and "importlib" not in path:
                    return None  # apex: only the importing file itself counts, never a caller up the stack
                f = f.f_back
            return None

        def create_module(self, spec):
            return stubs[spec.name][0]

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.distributed  # noqa: F401
    import megatron.core.dist_checkpointing  # noqa: F401
    for n in stubs:
        if sys.modules.get(n) is stubs[n][0]:
            del sys.modules[n]
    import warnings
    import megatron.core.model_parallel_config as mpc

    if not hasattr(mpc, "warnings"):
        # core 0.15.3's ModelParallelConfig.__post_init__ warns about EP x TP without sequence parallelism
        # through a `warnings` it never imports (NameError): give the module its import (as
        # megatron_grouped_fixtures.py does).
        mpc.warnings = warnings
    if os.environ.get("UCP_FUSED_ADAM") == "1":
        from megatron.core.optimizer import distrib_optimizer

        if not distrib_optimizer.HAVE_APEX_OR_TE:
            raise RuntimeError("UCP_FUSED_ADAM: megatron-core did not take the cpu_shims FusedAdam")

    torch.cuda.current_device = lambda: "cpu"

    def on_cpu(fn):
        def wrapped(*a, **k):
            d = k.get("device")
            if d is not None and "cuda" in str(d):
                k["device"] = "cpu"
            return fn(*a, **k)
        return wrapped

    for f in ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand", "zeros_like",
              "empty_like", "ones_like", "full_like", "as_tensor"):
        setattr(torch, f, on_cpu(getattr(torch, f)))
    orig_to = torch.Tensor.to

    def tensor_to(self, *a, **k):
        if a and "cuda" in str(a[0]):
            a = ("cpu",) + a[1:]
        if "cuda" in str(k.get("device", "")):
            k["device"] = "cpu"
        return orig_to(self, *a, **k)

    torch.Tensor.to = tensor_to
    torch.Tensor.cuda = lambda self, *a, **k: self

    orig_type = torch.Tensor.type

    def tensor_type(self, dtype=None, **kw):
        if dtype is None and not kw:
            return orig_type(self).replace("torch.", "torch.cuda.", 1)
        return orig_type(self, dtype, **kw)

    torch.Tensor.type = tensor_type

    class Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a):
            pass

        def synchronize(self):
            pass

        def record_event(self, *a):
            return Event()

        def wait_event(self, *a):
            pass

    class Event:
        def __init__(self, *a, **k):
            pass

        def record(self, *a):
            pass

        def wait(self, *a):
            pass

        def synchronize(self):
            pass

        def query(self):
            return True

    class StreamCtx:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    torch.cuda.Stream = Stream
    torch.cuda.Event = Event
    torch.cuda.current_stream = lambda *a, **k: Stream()
    torch.cuda.default_stream = lambda *a, **k: Stream()
    torch.cuda.stream = StreamCtx
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda s, *a, **k: torch.set_rng_state(s)
    torch.cuda.manual_seed = lambda s: None
    torch.cuda.manual_seed_all = lambda s: None
    torch.cuda.device_count = lambda: 1
    torch.cuda.set_device = lambda *a: None
    import numpy

    if not hasattr(numpy, "product"):
        numpy.product = numpy.prod  # core 0.15


def patch_dcp_load():
    import torch.distributed.checkpoint as tdcp
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    orig = tdcp.load

    def load(state_dict, storage_reader=None, *, planner=None, no_dist=False, **kw):
        # DCP's load(no_dist=...) arrived in torch 2.7; 2.6 has _load_state_dict(no_dist=...).
        if no_dist:
            return _load_state_dict(state_dict, storage_reader=storage_reader, planner=planner, no_dist=True)
        return orig(state_dict, storage_reader=storage_reader, planner=planner, **kw)

    tdcp.load = load


def patch_torch_adam_step():
    """megatron-core 0.19's load_parameter_state_from_fully_reshardable leaves torch Adam's 'step'
    out of the tensors it hands _set_main_param_and_optimizer_states, which then looks it up for
    every tensor of the live state ('step' included) and raises KeyError: Megatron's own
    fully_reshardable checkpoints do not load with torch AdamW (no TE/Apex, as on CPU) either
    (UCP_OWN=1 shows it). The step itself comes from the param groups (load_state_dict); the shim
    only lets the lookup skip it, as it skips every non-tensor. With dp_reshardable the tensors do
    hold a 'step': the LocalNonpersistentObject of sharded_param_state_dp_reshardable, i.e. the live
    step tensor from before the load, which _set_main_param_and_optimizer_states copies over the
    step load_state_dict has just set from the param groups (Megatron's own dp_reshardable
    checkpoints show the same with torch AdamW: UCP_OWN=1); the shim skips it too."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    orig = DistributedOptimizer._set_main_param_and_optimizer_states

    def set_states(self, model_param, tensors):
        return orig(self, model_param, {**tensors, "step": None})

    DistributedOptimizer._set_main_param_and_optimizer_states = set_states


def load_checkpoint_strict(ddps, opt, where):
    """Megatron's own load_checkpoint (megatron/training/checkpointing.py) of the run's --load into the DDP
    model chunks and the optimizer (the args already parsed and set), failing the check (exit naming `where`)
    where Megatron would only print: load_checkpoint retries a failing strict model load non-strictly, so the
    strict load's error is recorded and reported. Returns the iteration it loaded.

    core 0.19's load_parameter_state_from_dp_reshardable (torch_dist dp_reshardable) and
    load_parameter_state_from_dp_zero (the legacy distrib_optim.pt) lack the @torch.no_grad() of
    load_parameter_state_from_fully_reshardable: with fp32 parameters (no Float16Module) the main params are
    views of the model's, and their copy_ raises "a view of a leaf Variable that requires grad is being used
    in an in-place operation"; Megatron's own fp32 dp_reshardable fixture fails the same way. They run here
    under no_grad, as their fully_reshardable twin runs."""
    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.training.checkpointing import load_checkpoint

    for name in ("load_parameter_state_from_dp_reshardable", "load_parameter_state_from_dp_zero"):
        f = getattr(DistributedOptimizer, name, None)
        if f is not None:
            setattr(DistributedOptimizer, name, torch.no_grad()(f))
    errors = []
    for d in ddps:
        def strict_load(sd, strict=True, _load=d.load_state_dict):
            try:
                return _load(sd, strict=strict)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
                raise
        d.load_state_dict = strict_load
    iteration, _ = load_checkpoint(ddps, opt, None)
    if errors:
        sys.exit(f"FAIL {where}: load_checkpoint's strict model load failed: {errors[0][:2000]}")
    return iteration


def nan_before_load(model, opt):
    """Nothing may survive from initialization: every parameter (of every model chunk) and main
    parameter NaN before a load.
    torch AdamW (Megatron without TE/Apex, as on CPU) creates its state lazily, and
    DistributedOptimizer.state_dict() (called by sharded_state_dict) asserts one step over the states:
    create them as init_state_fn does, with a step, all NaN; the load replaces every value (a GPU run's
    FusedAdam keeps the step in its groups and needs no shim); the step -1 (one value: the assertion)
    must be replaced by the checkpoint's."""
    with torch.no_grad():
        for p in (p for m in chunks(model) for p in m.parameters()):
            p.fill_(float("nan"))
        for o in getattr(opt, "chained_optimizers", [opt]):
            # The main parameters the inner Adam steps: the distributed optimizer's shards, the
            # non-distributed optimizer's fp32 copies (or, in fp32, the model's own parameters).
            for g in o.optimizer.param_groups:
                for p in g["params"]:
                    p.fill_(float("nan"))
            o.init_state_fn(o.optimizer, o.config)
            for st in o.optimizer.state.values():
                for v in st.values():
                    v.fill_(float("nan"))
                if torch_adam(o):
                    st["step"] = torch.tensor(-1.0)
            if not torch_adam(o):  # a fused Adam (cpu_shims/fused_adam.py) keeps the step in its groups
                for g in o.optimizer.param_groups:
                    g["step"] = -1


def torch_adam(o):
    """Whether Megatron optimizer o steps torch's Adam/AdamW (a per-parameter step tensor) rather than a
    fused Adam (the step in each param group: TE/Apex, or the cpu_shims stand-in)."""
    return isinstance(o.optimizer, (torch.optim.Adam, torch.optim.AdamW))


def optimizer_steps(opt):
    """The step values Megatron optimizer opt holds: per parameter (torch Adam) or per non-empty param
    group (fused Adam)."""
    out = set()
    for o in getattr(opt, "chained_optimizers", [opt]):
        if torch_adam(o):
            out |= {float(st["step"]) for st in o.optimizer.state.values()}
        else:
            out |= {float(g["step"]) for g in o.optimizer.param_groups if g["params"]}
    return out


def build(case, rank, world):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.distributed import DistributedDataParallel as DDP, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    experts, ep = case.get("experts"), case.get("ep", 1)
    # etp: the expert tensor-parallel size (--expert-tensor-parallel-size; default TP). distopt False:
    # Megatron's non-distributed optimizer (FP32Optimizer / Float16OptimizerWithFloat16Params).
    etp, distopt = case.get("etp") or case["tp"], case.get("distopt", True)
    g = geometry(case)
    # vpp: model chunks as training.py get_model builds them (one GPTModel per
    # vp_stage, pre/post_process per chunk, DDP per chunk with bucketing only
    # on chunk 0); build then returns lists of DDP modules and models.
    vpp = case.get("vpp")
    vkw = dict(virtual_pipeline_model_parallel_size=vpp) if vpp else {}
    # first/last: an uneven split (--decoder-first/last-pipeline-num-layers, TransformerConfig's
    # num_layers_in_first/last_pipeline_stage).
    ukw = {k: case[c] for k, c in (("num_layers_in_first_pipeline_stage", "first"),
                                   ("num_layers_in_last_pipeline_stage", "last")) if case.get(c)}
    ps.initialize_model_parallel(case["tp"], case["pp"], expert_model_parallel_size=ep,
                                 **(dict(expert_tensor_parallel_size=etp) if experts else {}), **vkw)
    bf16 = case["dtype"] == "bf16"
    dt = torch.bfloat16 if bf16 else torch.float32
    cfg = TransformerConfig(
        num_layers=g["layers"], hidden_size=g["hidden"], num_attention_heads=g["heads"], num_query_groups=g["groups"],
        kv_channels=g["kv"], ffn_hidden_size=g["ffn"], gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False,
        tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
        use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
        bf16=bf16, params_dtype=dt, pipeline_dtype=dt, perform_initialization=True, **vkw, **ukw, **case.get("cfg", {}),
        **(dict(num_moe_experts=experts, moe_router_topk=2, moe_ffn_hidden_size=g["ffn"], expert_model_parallel_size=ep,
                expert_tensor_parallel_size=etp)
           if experts else {}),
    )
    torch.manual_seed(42)
    pp_rank = ps.get_pipeline_model_parallel_rank()
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=distopt,
                                            overlap_grad_reduce=False, bucket_size=None)
    models, ddps = [], []
    for v in range(vpp or 1):
        model = GPTModel(
            config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(num_experts=experts), vocab_size=g["padded_vocab"],
            max_sequence_length=SEQ, share_embeddings_and_output_weights=case["tied"], position_embedding_type="rope",
            **(dict(pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v),
                    post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v), vp_stage=v) if vpp else
               dict(pre_process=pp_rank == 0, post_process=pp_rank == case["pp"] - 1)),
        )
        # f16module: wrapped as pretrain_gpt.py wraps a 16-bit model (every parameter, norms too, in the
        # training dtype: one DDP buffer); the fixtures themselves are saved unwrapped.
        inner = model
        if case.get("f16module") and bf16:
            from megatron.core.transformer.module import Float16Module

            inner = Float16Module(cfg, model)
        ddps.append(DDP(config=cfg, ddp_config=ddp_cfg, module=inner, **(dict(disable_bucketing=v > 0) if vpp else {})))
        models.append(model)
    ocfg = OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.01, bf16=bf16, params_dtype=dt,
                           use_distributed_optimizer=distopt)
    opt = get_megatron_optimizer(ocfg, ddps)
    if vpp:
        return cfg, ddps, models, opt
    return cfg, ddps[0], models[0], opt


def chunks(x):
    """The model chunks (or their DDP modules) build returned: a list with vpp."""
    return x if isinstance(x, list) else [x]


def global_name(model, name, keys_map=True):
    """The parameter name with the global layer number and the names
    sharded_state_dict gives it (the layer's sharded_state_dict_keys_map);
    with keys_map=False the live module's own names (what --ckpt-format torch
    saves), for the cases whose args record the local spec."""
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        local = int(parts[2])
        layer = model.decoder.layers[local]
        rest = ".".join(parts[3:])
        for old, new in layer.submodules_config.sharded_state_dict_keys_map.items():
            if keys_map and rest.startswith(old):
                rest = new + rest[len(old):]
        m = re.match(r"mlp\.experts\.local_experts\.(\d+)\.(.*)", rest)
        if m:
            # Local expert j of EP rank e is global expert e * E/EP + j (moe/experts.py).
            from megatron.core import parallel_state as ps

            j = int(m.group(1)) + ps.get_expert_model_parallel_rank() * len(layer.mlp.experts.local_experts)
            rest = f"mlp.experts.local_experts.{j}.{m.group(2)}"
        return f"decoder.layers.{layer.layer_number - 1}.{rest}"
    return name


def synthetic_step(ddp, model, opt, step):
    """Seeded gradients for every parameter (equal on DP replicas and TP
    replicas of replicated parameters), then Megatron's optimizer step."""
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_rank()
    for d in chunks(ddp):
        d.zero_grad_buffer()
    for m in chunks(model):
        for name, p in m.named_parameters():
            seed = f"{global_name(m, name)}/{step}/{tp if getattr(p, 'tensor_model_parallel', False) else -1}"
            g = torch.Generator().manual_seed(zlib.crc32(seed.encode()))
            p.main_grad.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ok, _, _ = opt.step()
    assert ok, "optimizer step skipped"


def set_expert_bias(model):
    """Distinct values in the routers' expert_bias buffers (a real run's come from its token counts,
    which need a forward pass), equal on every rank, in float32 as the router keeps them
    (moe/router.py _maintain_float32_expert_bias: Float16Module cast them to bf16)."""
    for m in chunks(model):
        for name, b in m.named_buffers():
            if name.endswith("router.expert_bias"):
                g = torch.Generator().manual_seed(zlib.crc32(global_name(m, name).encode()))
                b.data = (torch.rand(b.shape, generator=g) - 0.5) * 0.1


def local_buffers(model, keys_map=True):
    """This rank's routers' expert_bias buffers by global name (float32, as saved)."""
    return {global_name(m, n, keys_map): b.detach().clone() for m in chunks(model) for n, b in m.named_buffers()
            if n.endswith("router.expert_bias")}


def local_truth(model, opt, keys_map=True):
    """This rank's pieces: model params (TP-local, full) and the owned flat
    ranges of the optimizer's fp32 state."""
    from megatron.core import parallel_state as ps

    out = []
    for m, name, p in [(m, n, p) for m in chunks(model) for n, p in m.named_parameters()]:
        # A routed expert is cut over the expert tensor-parallel group (expert TP may differ from TP).
        expert = ".experts." in name  # not .shared_experts.
        tp_rank, tp_size = ((ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()) if expert
                            else (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()))
        entry = dict(name=global_name(m, name, keys_map), tp=tp_rank, tp_size=tp_size,
                     dp=ps.get_data_parallel_rank(), pp=ps.get_pipeline_model_parallel_rank(),
                     tp_split=bool(getattr(p, "tensor_model_parallel", False)),
                     dim=getattr(p, "partition_dim", -1), shape=tuple(p.shape), weight=p.detach().float().clone(),
                     tied_copy=(name == "output_layer.weight" and getattr(p, "shared", False)))
        # The sub-optimizer (ChainedOptimizer) that owns a slice of p on this DP rank.
        chained = getattr(opt, "chained_optimizers", [opt])
        if not hasattr(chained[0], "model_param_gbuf_map"):
            # Non-distributed: the whole fp32 main parameter and its Adam state on every rank.
            mains = [mp for o in chained for mp in [main_param(o, p)] if mp is not None]
            assert len(mains) == 1, name
            st = next(o for o in chained if main_param(o, p) is not None).optimizer.state[mains[0]]
            entry["range"] = (0, p.numel())
            entry["states"] = {"param": mains[0].detach().float().clone().view(-1),
                               "exp_avg": st["exp_avg"].detach().float().clone().view(-1),
                               "exp_avg_sq": st["exp_avg_sq"].detach().float().clone().view(-1)}
            out.append(entry)
            continue
        owner = [o for o in chained if p in o.model_param_group_index_map]
        assert len(owner) <= 1, name
        if owner:
            o = owner[0]
            gi, dt, bi = o.model_param_gbuf_map[p]
            rng = o.gbuf_ranges[gi][dt][bi]["param_map"][p]["param"]
            st = o._get_main_param_and_optimizer_states(p)
            entry["range"] = (rng.start, rng.end)
            entry["states"] = {k: v.detach().float().clone().view(-1) for k, v in st.items()}
        out.append(entry)
    return out


def main_param(o, p):
    """The fp32 main parameter a non-distributed Megatron optimizer o keeps for model parameter p (its
    fp32_from_float16 copy, or p itself in fp32), or None when p is another sub-optimizer's."""
    for lps, mains in zip(getattr(o, "float16_groups", []), getattr(o, "fp32_from_float16_groups", [])):
        for lp, mp in zip(lps, mains):
            if lp is p:
                return mp
    for g in getattr(o, "fp32_from_fp32_groups", [g["params"] for g in o.optimizer.param_groups]):
        for q in g:
            if q is p:
                return q
    return None


def merge(entries, tp):
    """rank-0 merge of every rank's pieces into full tensors (tp: the tensor-parallel size of the
    pieces that do not say theirs)."""
    by = {}
    for e in entries:
        if e["tied_copy"]:
            continue
        by.setdefault(e["name"], []).append(e)
    full = {}
    for name, es in by.items():
        shape = es[0]["shape"]
        per_tp = {}
        for e in es:
            d = per_tp.setdefault(e["tp"], {"fp32": None, "exp_avg": None, "exp_avg_sq": None, "weight": e["weight"]})
            if "range" in e:
                for k, src in (("fp32", "param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
                    if d[k] is None:
                        d[k] = torch.full((int(torch.tensor(shape).prod()),), float("nan"))
                    lo, hi = e["range"]
                    d[k][lo:hi] = e["states"][src]
        e0 = es[0]
        tp = e0.get("tp_size", tp)
        states = {}
        for k in ("weight", "fp32", "exp_avg", "exp_avg_sq"):
            locs = []
            for r in range(tp if e0["tp_split"] else 1):
                v = per_tp[r][k] if r in per_tp else per_tp[min(per_tp)][k]
                v = v.view(shape)
                assert not torch.isnan(v).any(), (name, k, "not covered")
                locs.append(v)
            if e0["tp_split"] and tp > 1:
                if name.endswith("linear_fc1.weight"):
                    g = [x.chunk(2, dim=0) for x in locs]
                    t = torch.cat([x[0] for x in g] + [x[1] for x in g], dim=0)
                else:
                    t = torch.cat(locs, dim=e0["dim"])
            else:
                t = locs[0]
            if "word_embeddings" in name or name == "output_layer.weight":
                t = t[:VOCAB]
            states[k] = t.contiguous()
        # The save-time placement from Megatron's partition attributes.
        if tp == 1:
            states["pattern"] = "Unique"
        elif not e0["tp_split"]:
            states["pattern"] = "Replicate"
        elif name.endswith("linear_fc1.weight"):
            states["pattern"] = "Shard-NC"
        else:
            states["pattern"] = "Shard-V" if e0["dim"] == 0 else "Shard-H"
        full[name] = states
    return full


def model_order(names):
    """Parameters in the order of the model with all experts local (EP 1):
    first appearance over the ranks' named_parameters (rank order), a
    layer's experts together by global number."""
    rank0 = list(names)
    pos = {n: i for i, n in enumerate(rank0)}

    def key(n):
        m = re.match(r"(.*\.mlp\.experts\.local_experts\.)(\d+)\.(.*)", n)
        if not m:
            return (pos[n], -1, 0)
        first = min(i for r, i in pos.items() if r.startswith(m.group(1)))
        canon = [r for r in rank0 if r.startswith(m.group(1)) and r.endswith("." + m.group(3))][0]
        return (first, int(m.group(2)), pos[canon])

    return sorted(names, key=key)


def worker(rank, world, case_name, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo", LOCAL_RANK=str(rank))
    install_shims()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    case = CASES[case_name]
    from megatron.core import dist_checkpointing

    cfg, ddp, model, opt = build(case, rank, world)
    set_expert_bias(model)
    for s in range(STEPS):
        synthetic_step(ddp, model, opt, s)
    ckpt = os.path.join(out, case_name, "checkpoint")
    it = os.path.join(ckpt, "iter_%07d" % STEPS)
    model_sd = model.sharded_state_dict()
    state = {"checkpoint_version": 3.0, "iteration": STEPS, "model": model_sd,
             "optimizer": opt.sharded_state_dict(model_sd, metadata={"distrib_optim_sharding_type": case["sharding"]})}
    if case["args"]:
        g = geometry(case)
        state["args"] = argparse.Namespace(
            tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
            virtual_pipeline_model_parallel_size=None, data_parallel_size=case["dp"], world_size=world,
            num_layers=g["layers"], hidden_size=g["hidden"], num_attention_heads=g["heads"], num_query_groups=g["groups"],
            group_query_attention=True, kv_channels=g["kv"], ffn_hidden_size=g["ffn"], swiglu=True,
            vocab_size=VOCAB, padded_vocab_size=g["padded_vocab"], make_vocab_size_divisible_by=32,
            untie_embeddings_and_output_weights=not case["tied"], bf16=case["dtype"] == "bf16", fp16=False,
            use_distributed_optimizer=True, ckpt_format="torch_dist",
            num_experts=case.get("experts"), expert_model_parallel_size=case.get("ep", 1), **case.get("cfg", {}))
        if case.get("impl"):
            # What the training loop's args say about the layer spec (gpt_builders.py:
            # no --spec and transformer_impl 'local' builds get_gpt_layer_local_spec).
            state["args"].transformer_impl, state["args"].spec = "local", None
    if rank == 0:
        os.makedirs(it, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(state, it)
    pieces = [None] * world
    dist.all_gather_object(pieces, local_truth(model, opt, not case.get("impl")))
    bufs = [None] * world
    dist.all_gather_object(bufs, local_buffers(model, not case.get("impl")))
    if rank == 0:
        with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(STEPS))
        entries = [e for p in pieces for e in p]
        full = merge(entries, case["tp"])
        step = None
        for o in getattr(opt, "chained_optimizers", [opt]):
            for g in o.optimizer.param_groups:
                step = g.get("step", step)
        truth = {"param_names": model_order(list(full)), "step": step, "vocab_size": VOCAB, "padded_vocab_size": geometry(case)["padded_vocab"],
                 "degrees": dict(tp=case["tp"], pp=case["pp"], dp=case["dp"]),
                 "sharding": case["sharding"], "dtype": case["dtype"]}
        for k in ("weight", "fp32", "exp_avg", "exp_avg_sq"):
            truth[k] = {n: st[k] for n, st in full.items()}
        truth["patterns"] = {n: st["pattern"] for n, st in full.items()}
        if any(bufs):
            truth["buffers"] = {n: b for d in bufs for n, b in d.items()}
        torch.save(truth,
                   os.path.join(out, case_name, "truth.pt"))
    dist.barrier()
    dist.destroy_process_group()


def core_version(src):
    """megatron-core's version of the source tree ("0.19.0" -> "0_19")."""
    path = os.path.join(src, "megatron", "core", "package_info.py")
    info = {"__file__": path}
    with open(path) as f:
        exec(f.read(), info)
    major, minor = info["MAJOR"], info["MINOR"]
    return f"{major}_{minor}"


def main():
    src, out = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(CASES)
    sys.path.insert(0, src)
    version = core_version(src)
    if os.environ.get("UCP_ONE_CASE"):
        c = CASES[names[0]]
        world = c["tp"] * c["pp"] * c["dp"]
        mp.spawn(worker, args=(world, names[0], out, 29500 + list(CASES).index(names[0])), nprocs=world, join=True)
        return
    # One process tree per case under a watchdog: on a busy machine a rank can
    # vanish and leave its peers blocked in a collective; retry then.
    failed = []
    old_core = tuple(map(int, version.split("_"))) <= (0, 14)
    for name in names:
        if (CASES[name]["sharding"] == "fully_sharded_model_space") != old_core:
            # flattened_range: from 0.15 on the torch strategy refuses it with
            # torch >= 2.6; older cores are used only for it.
            print(f"{name}: skipped on core {version}", flush=True)
            continue
        if version == "0_15" and CASES[name]["sharding"] == "dp_reshardable":
            # 0.15's dp_reshardable asserts every optimizer state is a flat
            # slice, but torch.optim.Adam (no Apex/TE on CPU) keeps a 0-dim
            # step per parameter.
            print(f"{name}: skipped on core 0.15 (dp_reshardable needs a fused Adam)", flush=True)
            continue
        for attempt in range(3):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
            final = os.path.join(out, f"core{version}_{name}")
            try:
                r = subprocess.run([sys.executable, __file__, src, out, name], env=dict(os.environ, UCP_ONE_CASE="1"),
                                   timeout=int(os.environ.get("UCP_CASE_TIMEOUT", "300")), start_new_session=True)
                if r.returncode == 0:
                    shutil.rmtree(final, ignore_errors=True)
                    os.rename(os.path.join(out, name), final)
                    print("wrote", final, flush=True)
                    break
                print(f"{name}: exit {r.returncode}, attempt {attempt + 1}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{name}: timed out, attempt {attempt + 1}", flush=True)
        else:
            failed.append(name)
    if failed:
        sys.exit(f"failed 3 times: {failed}")


if __name__ == "__main__":
    main()
