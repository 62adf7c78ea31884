"""Cut a case's full state into the files DeepSpeed ZeRO-3 writes, and write truth.pt.

What each file holds follows DeepSpeed (read, not copied):
* model states: deepspeed/runtime/engine.py `_save_checkpoint` (key order), `_get_zero_param_shapes`
  (one OrderedDict per sub-group, `ds_shape`), `_get_zero_frozen_param_attributes` (frozen shapes and
  `ds_tensor` partitions), `_get_shared_params` (global rank 0 only), `_get_buffer_names`.
  `save_checkpoint` first calls `checkpoint_event_prologue` -> `_partition_all_parameters`, so every
  parameter -- persistent small ones included -- is released and `module` holds numel-0 tensors for
  all params (deepspeed-real/z3_dp2_fp32 shows the same); buffers are full.
* optimizer states: engine.py `_save_zero_checkpoint` -> stage3.py `_rigid_state_dict` (key order),
  torch optimizer `state_dict()` over the per-sub-group fp32 partitions.
"""
import os
from collections import OrderedDict

import torch

from . import layout, pickling, stubs
from .model import LP_DTYPES, Alias, Buffer, Param, from_truth, generate, numel, tp_slice

TAG = "global_step3"

_HYPER = {
    # torch 1.13 AdamW defaults, in constructor order (what real DeepSpeed 0.14.5 + torch 1.13 wrote)
    "adamw": [("lr", 0.010000000000000002), ("betas", [0.9, 0.95]), ("eps", 1e-08), ("weight_decay", 0.01),
              ("amsgrad", False), ("foreach", None), ("maximize", False), ("capturable", False)],
    # torch 2.x AdamW adds differentiable and fused
    "adamw_t2": [("lr", 0.010000000000000002), ("betas", [0.9, 0.95]), ("eps", 1e-08), ("weight_decay", 0.01),
                 ("amsgrad", False), ("foreach", None), ("maximize", False), ("capturable", False),
                 ("differentiable", False), ("fused", None)],
    # deepspeed/ops/adam/fused_adam.py: defaults, then step() adds group['step'] = 0 (never advanced)
    "fused_adam": [("lr", 0.010000000000000002), ("bias_correction", True), ("betas", [0.9, 0.95]),
                   ("eps", 1e-08), ("weight_decay", 0.01)],
}


def _step_value(case):
    # torch Adam/AdamW keep a 0-dim float32 tensor per param; DeepSpeed FusedAdam a python int
    return case.steps if case.optimizer == "fused_adam" else torch.tensor(float(case.steps))


def full_state(case):
    if case.truth_from:
        entries, full = from_truth(case.truth_from, _step_value(case))
        return entries, full
    return case.entries, generate(case.entries, LP_DTYPES[case.dtype], case.seed, _step_value(case))


def param_group_hypers(case, g, cfg):
    """Hyper-params of group g in the key order torch's state_dict() emits them ('params' added last).
    DeepSpeed hands the config's optimizer params to the optimizer, so every group's `betas` is the very
    list object of ds_config (pickle memo-shares it; real files show this)."""
    user = dict((case.groups or [{}])[g])
    hyper = OrderedDict(user)
    for k, v in _HYPER[case.optimizer]:
        if k == "betas":
            v = cfg["optimizer"]["params"]["betas"]
        hyper.setdefault(k, v)
    if case.optimizer == "fused_adam":
        hyper["step"] = 0
    return hyper


def ds_config(case):
    cfg = {
        "train_micro_batch_size_per_gpu": case.micro_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1,
        "gradient_clipping": 1.0,
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-08,
                                                  "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01,
                                                     "warmup_num_steps": 2, "warmup_type": "linear"}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": case.persistence_threshold},
    }
    if case.sub_group_size != 1_000_000_000:
        cfg["zero_optimization"]["sub_group_size"] = case.sub_group_size
    if case.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    elif case.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if case.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": case.tp}
    return cfg


def loss_scaler(case):
    cls = stubs.register()
    if case.dtype == "fp16":
        # CreateLossScaler with fp16.initial_scale_power 8, hysteresis 2 (delayed_shift); 3 steps, no overflow
        s = cls["DynamicLossScaler"](init_scale=2 ** 8, scale_factor=2.0, scale_window=1000, min_scale=1,
                                     delayed_shift=2, consecutive_hysteresis=False,
                                     raise_error_at_min_scale=True, dtype=torch.float16)
        s.cur_iter = case.steps
        return s, True
    return cls["LossScaler"](scale=1.0), False


def _junk(n, dtype, gen):
    """Stand-in for uninitialised memory: DeepSpeed allocates partitions with torch.empty and copies only
    the real elements, so the padding of fp32 partitions (and frozen ds_tensors) is garbage -- the real
    z3_dp2_fp32 files hold values such as 1.8e31 and 1.2e-32 there. Deterministic, finite, never all-zero."""
    if n == 0:
        return torch.empty(0, dtype=dtype)
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    exp = torch.rand(n, generator=gen).double() * (8 if dtype == torch.float16 else 60) - (
        4 if dtype == torch.float16 else 30)
    return (sign * torch.pow(10.0, exp)).to(dtype)


def _partition(full, dp, rank, fill):
    """Rank `rank`'s ZeRO-3 partition of one tensor: Pn elements, real ones first, then padding."""
    flat = full.reshape(-1)
    n = flat.numel()
    pn = layout.partition_numel(n, dp)
    v = layout.valid(n, dp, rank)
    real = flat[rank * pn: rank * pn + v]
    return torch.cat([real, fill(pn - v, flat.dtype)])


class _Plan:
    """Everything about the layout that does not depend on the dp rank."""

    def __init__(self, case, entries):
        self.params = [e for e in entries if isinstance(e, Param)]
        self.trainable = [p for p in self.params if p.trainable]
        self.frozen = [p for p in self.params if not p.trainable]
        self.buffers = [e for e in entries if isinstance(e, Buffer)]
        self.aliases = [e for e in entries if isinstance(e, Alias)]
        self.ds_id = {p.name: i for i, p in enumerate(self.params)}  # zero.Init numbers params in order
        self.ngroups = len(case.groups or [{}])
        self.entries = entries


def _local(case, plan, full, t):
    """TP-local full tensors (still DP-unpartitioned) for tp rank t."""
    rule = {p.name: p.tp for p in plan.params}
    loc = {}
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        loc[key] = OrderedDict((n, tp_slice(x, rule[n], case.tp, t)) for n, x in getattr(full, key).items())
    loc["frozen"] = OrderedDict((n, tp_slice(x, rule[n], case.tp, t)) for n, x in full.frozen.items())
    return loc


def _sub_groups(case, plan, loc):
    out = []
    for g in range(plan.ngroups):
        names = [p.name for p in plan.trainable if p.group == g]
        if not names:
            raise ValueError(f"{case.name}: param group {g} has no trainable params")
        for sg in layout.sub_groups(names, [loc["fp32"][n].numel() for n in names], case.dp, case.sub_group_size):
            out.append((g, sg))
    return out


def optim_state(case, plan, loc, subgroups, r, gen):
    zero = lambda k, dt: torch.zeros(k, dtype=dt)  # noqa: E731 - Adam moments of padding stay 0
    junk = lambda k, dt: _junk(k, dt, gen)  # noqa: E731
    state, flats = {}, []
    for s, (g, names) in enumerate(subgroups):
        fp32 = torch.cat([_partition(loc["fp32"][n], case.dp, r, junk) for n in names])
        fp32.requires_grad = True  # stage3 keeps requires_grad on the fp32 partitions
        fp32.ds_id = f"{plan.ds_id[names[0]]}_{plan.ds_id[names[-1]]}"
        flats.append(fp32)
        step = case.steps if case.optimizer == "fused_adam" else torch.tensor(float(case.steps))
        state[s] = {
            "step": step,
            "exp_avg": torch.cat([_partition(loc["exp_avg"][n], case.dp, r, zero) for n in names]),
            "exp_avg_sq": torch.cat([_partition(loc["exp_avg_sq"][n], case.dp, r, zero) for n in names]),
        }
    cfg = ds_config(case)
    groups = []
    for g in range(plan.ngroups):
        h = param_group_hypers(case, g, cfg)
        h["params"] = [s for s, (gg, _) in enumerate(subgroups) if gg == g]
        groups.append(dict(h))
    scaler, dynamic = loss_scaler(case)
    ZeroStageEnum = stubs.register()["ZeroStageEnum"]
    osd = {
        "zero_stage": ZeroStageEnum.weights,
        "loss_scaler": scaler,
        "dynamic_loss_scale": dynamic,
        "overflow": False,
        "partition_count": case.dp,
        "optimizer_state_dict": {"state": state, "param_groups": groups},
        "fp32_flat_groups": flats,
    }
    return {"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": case.ds_version}


def _fresh(s):
    """A new str object equal to s. DeepSpeed builds module keys, buffer_names, shared_params and the
    engine's param-name table separately, so pickle does not memo-share them; copying the strings
    reproduces the byte layout of real files (checked against deepspeed-real/z3_dp2_fp32)."""
    return "".join([s[:1], s[1:]])


def model_state(case, plan, full, loc, subgroups, t, r, gen):
    lp = LP_DTYPES[case.dtype]
    data = {p.name: torch.empty(0, dtype=lp) for p in plan.params}  # released ZeRO-3 params
    module = OrderedDict()
    for e in plan.entries:
        if isinstance(e, Param):
            module[_fresh(e.name)] = data[e.name].detach()
        elif isinstance(e, Alias):
            module[_fresh(e.name)] = data[e.target].detach()
        else:
            module[_fresh(e.name)] = full.buffers[e.name].detach()
    module._metadata = module_metadata(plan.entries, case.module_versions)
    engine_name = {p.name: _fresh(p.name) for p in plan.params}  # engine.param_names
    param_shapes = [OrderedDict((engine_name[n], loc["fp32"][n].shape) for n in names) for _, names in subgroups]
    junk = lambda k, dt: _junk(k, dt, gen)  # noqa: E731
    frozen_shapes = OrderedDict((engine_name[p.name], loc["frozen"][p.name].shape) for p in plan.frozen)
    frozen_frags = OrderedDict((engine_name[p.name], _partition(loc["frozen"][p.name], case.dp, r, junk))
                               for p in plan.frozen)
    shared = {_fresh(a.name): _fresh(a.target) for a in plan.aliases} if (t, r) == (0, 0) else {}
    state = dict(
        module=module,
        buffer_names=[_fresh(b.name) for b in plan.buffers],
        optimizer=None,
        param_shapes=param_shapes,
        frozen_param_shapes=frozen_shapes,
        shared_params=shared,
        frozen_param_fragments=frozen_frags,
        lr_scheduler={"last_batch_iteration": case.steps - 1},
        data_sampler=None,
        random_ltd=None,
        sparse_tensor_module_names=set(),
        skipped_steps=0,
        global_steps=case.steps,
        global_samples=case.steps * case.micro_batch * case.dp,
        dp_world_size=case.dp,
        mp_world_size=case.tp,
    )
    if case.parallel_dims:
        state["checkpoint_parallel_dimensions"] = {"pp_degree": 1, "tp_degree": case.tp}
    state.update(ds_config=ds_config(case), ds_version=case.ds_version)
    if case.uci is not None:
        state["universal_checkpoint_info"] = case.uci  # client_state (Megatron-DS style) or AutoTP
    return state


def module_metadata(entries, versions):
    """nn.Module.state_dict() attaches `_metadata` (module prefix -> {'version': cls._version}) to the
    OrderedDict, in pre-order over modules; torch pickles it as the OrderedDict's state."""
    meta = OrderedDict()
    for e in entries:
        parts = e.name.split(".")[:-1]
        for i in range(len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix not in meta:
                meta[prefix] = {"version": (versions or {}).get(prefix, 1)}
    return meta


def file_names(case, t, r):
    prefix = "bf16_" if case.dtype == "bf16" else ""
    return (f"zero_pp_rank_{r}_mp_rank_{t:02d}_model_states.pt",
            f"{prefix}zero_pp_rank_{r}_mp_rank_{t:02d}_optim_states.pt")


def truth(case, plan, full, subgroups0):
    order = [n for _, names in subgroups0 for n in names]
    rule = {p.name: p.tp for p in plan.params}

    def local_numel(name, shape):
        n = numel(shape)
        return n // case.tp if rule[name] in ("col", "row") else n

    padding = OrderedDict()
    for p in plan.params:
        padding[p.name] = layout.padding(local_numel(p.name, p.shape), case.dp)
    shapes = OrderedDict((n, list(full.fp32[n].shape)) for n in order)
    meta = {
        "stage": 3, "dp": case.dp, "tp": case.tp, "dtype": case.dtype,
        "sub_group_size": case.sub_group_size,
        "notes": case.notes,
        "optimizer": {"adamw": "torch.optim.AdamW (torch 1.13)", "adamw_t2": "torch.optim.AdamW (torch 2.x keys)",
                      "fused_adam": "deepspeed.ops.adam.FusedAdam"}[case.optimizer],
        "step_type": "int" if case.optimizer == "fused_adam" else "0-dim float32 tensor",
        "ds_version": case.ds_version,
        "tag": TAG,
        "steps": case.steps,
        "param_groups": plan.ngroups,
        "sub_groups": [{"param_group": g, "params": list(names),
                        "partition_numel": sum(layout.partition_numel(local_numel(n, full.fp32[n].shape), case.dp)
                                               for n in names)} for g, names in subgroups0],
        "module_order": [e.name for e in plan.entries],
        "tp_rules": OrderedDict((p.name, p.tp or "none") for p in plan.params),
        "universal_checkpoint_info": case.uci,
        "torch2_pickle": case.torch2_pickle,
        "fp32_padding": "junk (DeepSpeed leaves torch.empty garbage there); exp_avg/exp_avg_sq padding is 0",
        "frozen_padding": "junk, like fp32 padding",
        "source": ("full trainable state from " + case.truth_from) if case.truth_from else f"seeded ({case.seed})",
        "generator": "testdata/gen/zero3_fixtures.py",
    }
    return {
        "meta": meta,
        "param_names": order,
        "shapes": shapes,
        "fp32": OrderedDict((n, full.fp32[n]) for n in order),
        "exp_avg": OrderedDict((n, full.exp_avg[n]) for n in order),
        "exp_avg_sq": OrderedDict((n, full.exp_avg_sq[n]) for n in order),
        "step": full.step,
        "frozen": full.frozen,
        "frozen_shapes": OrderedDict((n, list(x.shape)) for n, x in full.frozen.items()),
        "buffers": full.buffers,
        "shared_params": OrderedDict((a.name, a.target) for a in plan.aliases),
        "padding": padding,
    }


def write_case(case, out_root):
    stubs.register()
    entries, full = full_state(case)
    plan = _Plan(case, entries)
    case_dir = os.path.join(out_root, case.name)
    ckpt = os.path.join(case_dir, "checkpoint")
    tag_dir = os.path.join(ckpt, TAG)
    os.makedirs(tag_dir, exist_ok=True)
    for f in os.listdir(tag_dir):
        os.remove(os.path.join(tag_dir, f))
    written = []
    subgroups0 = None
    for t in range(case.tp):
        loc = _local(case, plan, full, t)
        subgroups = _sub_groups(case, plan, loc)
        if subgroups0 is None:
            subgroups0 = subgroups
        for r in range(case.dp):
            gen = torch.Generator().manual_seed(case.seed * 1000 + t * 100 + r + 7)
            mfile, ofile = file_names(case, t, r)
            pickling.save(model_state(case, plan, full, loc, subgroups, t, r, gen), os.path.join(tag_dir, mfile))
            pickling.save(optim_state(case, plan, loc, subgroups, r, gen), os.path.join(tag_dir, ofile),
                          torch2_attrs=case.torch2_pickle)
            written += [mfile, ofile]
    with open(os.path.join(ckpt, "latest"), "w") as f:
        f.write(TAG)  # engine writes the tag with no newline
    pickling.save(truth(case, plan, full, subgroups0), os.path.join(case_dir, "truth.pt"))
    return written
