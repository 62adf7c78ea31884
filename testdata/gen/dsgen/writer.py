"""Assemble and write every file of a case: latest, model states, layer files, optimizer states, truth."""
import argparse
import os
import random
from collections import OrderedDict

import numpy as np
import torch

from . import build, models, stubs


def _nest_megatron(flat):
    """GPTModel.state_dict_for_save_checkpoint(): Megatron-DeepSpeed monkey-patches the module's
    state_dict with it (--no-pipeline-parallel), so `module` is nested plain dicts whose leaves are
    the sub-modules' own state_dict() OrderedDicts (megatron/model/language_model.py)."""
    lm = {}
    emb, enc, out = {}, OrderedDict(), OrderedDict()
    for name, t in flat.items():
        parts = name.split(".")
        assert parts[0] == "language_model", name
        if parts[1] == "embedding":
            emb.setdefault(parts[2], OrderedDict())[".".join(parts[3:])] = t
        elif parts[1] == "encoder":
            enc[".".join(parts[2:])] = t
        elif parts[1] == "output_layer":
            out[".".join(parts[2:])] = t
        else:
            raise ValueError(name)
    lm["embedding"] = emb
    lm["encoder"] = enc
    if out:
        lm["output_layer"] = out
    return {"language_model": lm}


def module_state(case, rank):
    """`module` of the mp_rank file: model.state_dict() in low precision (None for pipelines)."""
    m = case.model
    if m.kind == "pipe":
        return None
    sd = OrderedDict()
    for item in m.sd_items:
        kind, name = item[0], item[1]
        if kind == "param":
            sd[name] = rank.lp[name] if name in rank.lp else rank.frozen[name]
        elif kind == "buffer":
            sd[name] = buffer_value(case, name)
        elif kind == "alias":
            sd[name] = sd[item[2]]  # tied weights: the same tensor object under two keys
    if m.kind == "megatron":
        return _nest_megatron(sd)
    return sd


_BUFFERS = {}


def buffer_value(case, name):
    key = (case.name, name)
    if key not in _BUFFERS:
        b = case.model.buffers[name]
        _BUFFERS[key] = b.to(case.lp_dtype) if b.is_floating_point() else b.clone()
    return _BUFFERS[key]


def buffer_names(case):
    return [item[1] for item in (case.model.sd_items or []) if item[0] == "buffer"]


def shared_params(case, pp, tp):
    # _get_shared_params only walks the model on global rank 0 (pp 0, tp 0, dp 0)
    if pp != 0 or tp != 0 or case.model.kind == "pipe":
        return {}
    return {item[1]: item[2] for item in (case.model.sd_items or []) if item[0] == "alias"}


def model_state_file(case, rank, client_state):
    T, P = case.tp, case.pp
    zero_stage2 = case.stage == 2
    frozen_shapes = frozen_frags = None
    if zero_stage2:
        frozen_shapes = OrderedDict((n, t.shape) for n, t in rank.frozen.items())
        # _get_param_fragment_func: param.detach().cpu() -- on CPU a new tensor on the same storage
        frozen_frags = OrderedDict((n, t.detach()) for n, t in rank.frozen.items())
    param_shapes = []
    for lay in rank.layouts:
        param_shapes.append(OrderedDict((n, torch.Size(s)) for n, s in zip(lay.names, lay.shapes)))
    state = dict(
        module=module_state(case, rank),
        buffer_names=buffer_names(case),
        optimizer=None,
        param_shapes=param_shapes,
        frozen_param_shapes=frozen_shapes,
        shared_params=shared_params(case, rank.pp, rank.tp),
        frozen_param_fragments=frozen_frags,
        lr_scheduler=build.lr_scheduler_state(case),
        data_sampler=None,
        random_ltd=None,
    )
    if not case.new_layout:
        state["sparse_tensor_module_names"] = set()
    state.update(skipped_steps=0, global_steps=case.steps,
                 global_samples=case.steps * case.micro_batch * case.dp,
                 dp_world_size=case.dp, mp_world_size=P * T)
    if case.new_layout:
        state["checkpoint_parallel_dimensions"] = {"pp_degree": P, "tp_degree": T}
    state.update(ds_config=build.ds_config(case), ds_version=case.ds_version)
    state.update(client_state)
    return state


def megatron_args(case):
    c = case.model.config
    a = argparse.Namespace()
    for k, v in [
        ("num_layers", c["layers"]), ("hidden_size", c["hidden"]), ("ffn_hidden_size", c["ffn"]),
        ("num_attention_heads", c["heads"]), ("num_key_value_heads", c["kv_heads"]),
        ("kv_channels", c["kv_channels"]), ("max_position_embeddings", c["seq"]),
        ("seq_length", c["seq"]), ("make_vocab_size_divisible_by", c["divisible_by"]),
        ("padded_vocab_size", c["padded_vocab"]), ("tensor_model_parallel_size", case.tp),
        ("pipeline_model_parallel_size", case.pp), ("data_parallel_size", case.dp),
        ("world_size", case.tp * case.pp * case.dp), ("swiglu", c["swiglu"]), ("add_bias_linear", True),
        ("untie_embeddings_and_output_weights", c["untie"]), ("add_position_embedding", True),
        ("position_embedding_type", "learned_absolute"), ("normalization", "layernorm"),
        ("fp16", case.dtype == "fp16"), ("bf16", case.dtype == "bf16"),
        ("params_dtype", case.lp_dtype), ("optimizer", "adam"), ("lr", case.lr), ("min_lr", 1e-05),
        ("weight_decay", case.weight_decay), ("adam_beta1", case.betas[0]), ("adam_beta2", case.betas[1]),
        ("adam_eps", 1e-08), ("ds_fused_adam", case.base == "fused"), ("micro_batch_size", case.micro_batch),
        ("global_batch_size", case.micro_batch * case.dp), ("train_iters", 100), ("iteration", case.steps),
        ("consumed_train_samples", case.steps * case.micro_batch * case.dp),
        ("consumed_train_tokens", case.steps * case.micro_batch * case.dp * c["seq"]),
        ("deepspeed", True), ("zero_stage", case.stage), ("no_pipeline_parallel", not c["pipe"]),
        ("universal_checkpoint", False), ("tokenizer_type", "GPT2BPETokenizer"), ("seed", 1234),
        ("save", "checkpoints/gpt"), ("load", None), ("no_save_rng", not case.save_rng),
        ("deepspeed_config_dict", build.ds_config(case)),
        ("rank", 0),
    ]:
        setattr(a, k, v)
    if c.get("llama"):
        # Megatron-DeepSpeed's Llama flags; its position_embedding_type is an enum, not recorded here.
        a.add_bias_linear, a.add_position_embedding = False, False
        del a.position_embedding_type
        a.use_rotary_position_embeddings, a.normalization, a.layernorm_epsilon = True, "rmsnorm", 1e-05
    return a


def megatron_rng_state(case, pp, tp):
    """megatron/checkpointing.py get_rng_state(): a one-element list (data_parallel_random_init off)."""
    seed = build._seed(case.name, "rng", pp, tp)
    rnd = random.Random(seed)
    nps = np.random.RandomState(seed % (2**32))
    tg = torch.Generator().manual_seed(seed)
    cuda = torch.tensor(list((seed + 7 * i) % 256 for i in range(16)), dtype=torch.uint8)
    tracker = torch.tensor(list((seed + 2718 + tp + 5 * i) % 256 for i in range(16)), dtype=torch.uint8)
    return [{
        "random_rng_state": rnd.getstate(),
        "np_rng_state": nps.get_state(),
        "torch_rng_state": tg.get_state(),
        "cuda_rng_state": cuda,
        "rng_tracker_states": {"model-parallel-rng": tracker},
    }]


def client_state(case, pp, tp):
    uci = build.universal_checkpoint_info(case)
    if case.uci == "megatron":
        # megatron/checkpointing.py save_checkpoint(): client_state passed to engine.save_checkpoint
        cs = {"args": megatron_args(case), "checkpoint_version": 3.0, "iteration": case.steps,
              "tokens": case.steps * case.micro_batch * case.dp * case.model.config["seq"],
              "universal_checkpoint_info": uci}
        if case.save_rng:
            cs["rng_state"] = megatron_rng_state(case, pp, tp)
        return cs
    if uci is None:
        return {}
    return {"universal_checkpoint_info": uci}


def layer_files(case, rank):
    """PipelineModule.save_state_dict: one file per LayerSpec with a state_dict, written by the stage
    that owns it (dp rank 0), tensors cloned (clone_tensors_for_torch_save), local keys."""
    out = OrderedDict()
    for p in rank.specs:
        if p.layer is None or rank.pp not in p.layer_file_stages:
            continue
        fn = f"layer_{p.layer:02d}-model_{rank.tp:02d}-model_states.pt"
        src = rank.lp[p.name] if p.name in rank.lp else rank.frozen[p.name]
        out.setdefault(fn, OrderedDict())[p.local] = src.detach().clone()
    return out


def optim_file_name(case, dp, mp):
    prefix = "bf16_" if case.bf16_files else ""
    return f"{prefix}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt"


def write_case(case, out_dir):
    """Write checkpoint/ and truth.pt of one case into out_dir/<case.name>/. Returns the folder."""
    stubs.register()
    root = os.path.join(out_dir, case.name)
    ckpt = os.path.join(root, "checkpoint")
    tagdir = os.path.join(ckpt, case.tag)
    os.makedirs(tagdir, exist_ok=True)
    for f in os.listdir(tagdir):
        os.remove(os.path.join(tagdir, f))
    ranks = {}
    for pp in range(case.pp):
        for tp in range(case.tp):
            rank = build.build_mp_rank(case, pp, tp)
            ranks[(pp, tp)] = rank
            mp = pp * case.tp + tp
            torch.save(model_state_file(case, rank, client_state(case, pp, tp)),
                       os.path.join(tagdir, f"mp_rank_{mp:02d}_model_states.pt"))
            for fn, sd in layer_files(case, rank).items():
                torch.save(sd, os.path.join(tagdir, fn))
            for r in range(case.dp):
                torch.save(build.optimizer_file_state(case, r, rank), os.path.join(tagdir, optim_file_name(case, r, mp)))
    with open(os.path.join(ckpt, "latest"), "w") as f:
        f.write(case.tag)
    if case.uci == "megatron":
        with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(case.steps))
    torch.save(truth(case, ranks), os.path.join(root, "truth.pt"))
    return root


def truth(case, ranks):
    m = case.model
    uci = build.universal_checkpoint_info(case)
    names = []
    for pp in range(case.pp):
        for plist in ranks[(pp, 0)].groups:
            for p in plist:
                if p.name not in names:
                    names.append(p.name)
    specs = {p.name: p for p in m.params}
    t = OrderedDict()
    pads = {}
    for (pp, tp), rank in ranks.items():
        pads[f"pp{pp}_tp{tp}"] = [[lay.padding(r, case.dp, case.opt) for lay in rank.layouts] for r in range(case.dp)]
    t["meta"] = {
        "generator": "testdata/gen/deepspeed_fixtures.py",
        "case": case.name,
        "description": case.desc,
        "stage": case.stage, "dp": case.dp, "tp": case.tp, "pp": case.pp, "dtype": case.dtype,
        "optimizer": "BF16_Optimizer" if case.opt == "bf16opt" else "DeepSpeedZeroOptimizer",
        "base_optimizer": {"adamw": "torch.optim.AdamW", "adam": "torch.optim.Adam",
                           "fused": "deepspeed.ops.adam.FusedAdam"}[case.base],
        "step_type": "int" if case.base == "fused" else "tensor",
        "steps": case.steps, "tag": case.tag, "ds_version": case.ds_version,
        "model_kind": m.kind, "model": dict(m.config),
        "param_groups": len(m.groups),
        "has_universal_checkpoint_info": uci is not None,
        "new_layout": case.new_layout,
        "group_paddings": pads,
        "notes": list(case.notes),
    }
    t["param_names"] = names
    t["shapes"] = OrderedDict((n, list(truth_shape(case, specs[n]))) for n in names)
    for k in build.KEYS:
        t[k] = OrderedDict((n, build.truth_value(case, specs[n], k)) for n in names)
    t["step"] = build.step_value(case)
    t["universal"] = OrderedDict((n, models.universal_keys(specs[n], case.tp, uci)) for n in names)
    rank0 = ranks[(0, 0)]
    t["frozen"] = OrderedDict((n, v.clone()) for n, v in rank0.frozen.items()) if case.tp == 1 else OrderedDict()
    t["buffers"] = OrderedDict((n, buffer_value(case, n).clone()) for n in buffer_names(case))
    t["shared_params"] = shared_params(case, 0, 0)
    if case.tp == 1 and case.pp == 1:
        t["lp_params"] = OrderedDict((n, v.clone()) for n, v in rank0.lp.items())
    t["universal_checkpoint_info"] = uci
    # what ds_to_universal writes to zero/optimizer_state.pt (§5.3): key order and param_groups
    if case.opt == "zero":
        keys = ["loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", "zero_stage", "group_paddings",
                "partition_count", "ds_version", "param_groups"]
    else:
        keys = ["clip_grad", "group_paddings", "partition_count", "ds_version", "param_groups"]
    t["optimizer_state_keys"] = keys
    bos = build.optimizer_file_state(case, 0, rank0)["optimizer_state_dict"]["base_optimizer_state"]
    t["param_groups"] = bos["param_groups"]
    return t


def truth_shape(case, p):
    s = list(p.shape)
    if p.vocab:
        s[0] = case.model.vocab[0]
    return s
