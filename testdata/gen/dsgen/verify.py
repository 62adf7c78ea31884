"""Independent check of a generated case: read the files back the way DeepSpeed's tools do and
compare with truth.pt.

Nothing here imports the generator's layout code: degrees come from the file names
(deepspeed/checkpoint/reshape_3d_utils.py rules), the flat layout is recomputed from
param_shapes, fragments are cut with param_slice_mappings and merged with the rules of
ds_to_universal.merge_tp_slices (first match wins: replicated, average, 2 sub-params, sub-params,
default/row; then vocab truncation). Also checked: padding/partition invariants (spec §4), views
and storage sizes, module tensors as views into the padded bit16 buffer, frozen params and
buffers, zero_to_fp32-style reassembly, and -- with testdata/fixtures/deepspeed-real --
pickle GLOBALs and key orders against real DeepSpeed-written files of the same kind.
"""
import io
import math
import os
import pickletools
import re
import zipfile
from collections import OrderedDict, defaultdict

import torch

from . import stubs

REAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "deepspeed-real")

ALLOWED_GLOBALS = {
    "torch._utils _rebuild_tensor_v2", "collections OrderedDict", "torch Size", "__builtin__ set",
    "__builtin__ getattr", "deepspeed.utils.tensor_fragment fragment_address",
    "deepspeed.runtime.zero.config ZeroStageEnum", "deepspeed.runtime.fp16.loss_scaler LossScaler",
    "deepspeed.runtime.fp16.loss_scaler DynamicLossScaler", "torch float16", "torch bfloat16", "torch float32",
    "argparse Namespace", "numpy.core.multiarray _reconstruct", "numpy.core.multiarray scalar",
    "numpy ndarray", "numpy dtype", "_codecs encode",
    "torch FloatStorage", "torch HalfStorage", "torch BFloat16Storage", "torch LongStorage", "torch ByteStorage",
}


def pickle_globals(path):
    with zipfile.ZipFile(path) as z:
        name = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        data = z.read(name)
    out = set()
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        if op.name == "GLOBAL":
            out.add(arg)
    return out


def _load(path):
    return torch.load(path, map_location="cpu")


def _numel(shape):
    return math.prod(shape)


def _first_match(patterns, name):
    m = [p for p in patterns if re.match(p, name)]
    if len(m) > 1:
        raise AssertionError(f"{name} matches several patterns {m}")
    return m[0] if m else None


class Checker:
    def __init__(self, folder):
        self.folder = folder
        self.problems = []

    def check(self, cond, msg):
        if not cond:
            self.problems.append(msg)
        return cond


def verify_case(folder, large=False):
    stubs.register()
    c = Checker(folder)
    try:
        _verify(c, folder, large)
    except Exception as e:  # report, do not crash the whole run
        import traceback
        c.problems.append(f"exception: {e!r}\n{traceback.format_exc()}")
    return c.problems


def _verify(c, folder, large):
    truth = _load(os.path.join(folder, "truth.pt"))
    meta = truth["meta"]
    ckpt = os.path.join(folder, "checkpoint")
    with open(os.path.join(ckpt, "latest")) as f:
        raw = f.read()
    c.check(raw == raw.strip(), "latest has surrounding whitespace")
    tag = raw.strip()
    c.check(tag == meta["tag"], f"latest says {tag}, truth {meta['tag']}")
    tagdir = os.path.join(ckpt, tag)
    files = sorted(os.listdir(tagdir))

    mp_files = sorted(f for f in files if f.startswith("mp_rank_"))
    zero_files = []
    for prefix in ("zero_pp_rank_", "fp16_zero_pp_rank_", "bf16_zero_pp_rank_"):
        zero_files = [f for f in files if f.startswith(prefix)]
        if zero_files:
            break

    def dp_mp(f):
        m = re.search(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$", f)
        return int(m.group(1)), int(m.group(2))

    zero_files.sort(key=dp_mp)
    c.check(zero_files and zero_files[0].startswith("bf16_") == (meta["dtype"] == "bf16"),
            "optimizer file prefix does not follow bf16.enabled")
    mp_states = [_load(os.path.join(tagdir, f)) for f in mp_files]
    m0 = mp_states[0]
    if "checkpoint_parallel_dimensions" in m0:
        P, T = m0["checkpoint_parallel_dimensions"]["pp_degree"], m0["checkpoint_parallel_dimensions"]["tp_degree"]
    elif any(f.startswith("layer_01") for f in files):
        T = sum(1 for f in files if f.startswith("layer_01"))
        P = len(mp_files) // T
    else:
        T, P = len(mp_files), 1
    D = max(1, len(zero_files) // (P * T))
    c.check((D, T, P) == (meta["dp"], meta["tp"], meta["pp"]), f"inferred D,T,P={D},{T},{P} vs meta")
    c.check(len(zero_files) == D * T * P, "number of optimizer files")
    for i, s in enumerate(mp_states):
        c.check(s["mp_world_size"] == P * T and s["dp_world_size"] == D, f"{mp_files[i]}: world sizes")
        c.check(s["global_steps"] == meta["steps"], f"{mp_files[i]}: global_steps")
    uci = m0.get("universal_checkpoint_info")
    c.check((uci is not None) == meta["has_universal_checkpoint_info"], "universal_checkpoint_info presence")
    uci = uci or {}
    c.check(uci == (truth["universal_checkpoint_info"] or {}), "UCI differs from truth")
    pipe_rep = uci.get("pipeline_replicated_parameter_patterns", [])

    # per-tp shapes: union over pipeline stages (a name on several stages must agree)
    tp_shapes = [OrderedDict() for _ in range(T)]
    for pp in range(P):
        for tp in range(T):
            for g in mp_states[pp * T + tp]["param_shapes"]:
                for n, s in g.items():
                    if n in tp_shapes[tp]:
                        c.check(tp_shapes[tp][n] == s, f"{n}: shape differs across stages")
                    tp_shapes[tp][n] = s

    frags = defaultdict(dict)   # (name, tp, key) -> {dp: tensor}
    steps = []
    stage = None
    for pp in range(P):
        for tp in range(T):
            mp = pp * T + tp
            shapes = mp_states[mp]["param_shapes"]
            for dp in range(D):
                fname = zero_files[dp * (P * T) + mp]
                c.check(dp_mp(fname) == (dp, mp), f"{fname}: not at its sorted position")
                sd = _load(os.path.join(tagdir, fname))
                c.check(list(sd.keys()) == ["optimizer_state_dict", "ds_config", "ds_version"], f"{fname}: top keys")
                osd = sd["optimizer_state_dict"]
                st = int(osd.get("zero_stage", 1))
                stage = st if stage is None else stage
                c.check(st == meta["stage"], f"{fname}: zero_stage {st}")
                bf16opt = "zero_stage" not in osd
                c.check(bf16opt == (meta["optimizer"] == "BF16_Optimizer"), f"{fname}: optimizer kind")
                _check_partitions(c, fname, osd, shapes, dp, D, bf16opt)
                state = osd["base_optimizer_state"]["state"]
                fp32 = osd["single_partition_of_fp32_groups"]
                for g, mapping in enumerate(osd["param_slice_mappings"]):
                    flat = {"exp_avg": state[g]["exp_avg"], "exp_avg_sq": state[g]["exp_avg_sq"], "fp32": fp32[g]}
                    steps.append(state[g].get("step"))
                    for name, fa in mapping.items():
                        if pp > 0 and any(re.match(p, name) for p in pipe_rep):
                            continue
                        for k, t in flat.items():
                            frags[(name, tp, k)][dp] = t.narrow(0, fa.start, fa.numel)
    _check_steps(c, steps, truth["step"])

    # merge (ds_to_universal merge_tp_slices)
    names = list(tp_shapes[0].keys())
    c.check(names == truth["param_names"], f"param names/order differ: {names} vs {truth['param_names']}")
    rep = uci.get("tp_replicated_parameter_patterns", [])
    avg = uci.get("parameter_to_average_patterns", [])
    row = uci.get("parameter_with_row_parallelism_patterns", [])
    voc = uci.get("vocabulary_parameter_patterns", [])
    sw = uci.get("parameter_with_2_sub_params_cat_dim_0", [])
    subs = uci.get("parameter_with_sub_params", [])
    widths_by_pat = uci.get("sub_param_shard_widths", {})
    used = set()
    local_fp32 = {}  # (name, tp) -> merged local fp32 (for module checks)
    for name in names:
        extra_ref = truth["universal"][name]
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            slices = []
            for tp in range(T):
                parts = frags[(name, tp, k)]
                ranks = sorted(parts)
                c.check(bool(ranks) and ranks == list(range(ranks[0], ranks[0] + len(ranks))),
                        f"{name}: dp ranks holding fragments are not consecutive: {ranks}")
                s = torch.cat([parts[d] for d in sorted(parts)]).reshape(tp_shapes[tp][name])
                slices.append(s)
                if k == "fp32":
                    local_fp32[(name, tp)] = s
            extra = OrderedDict()
            sub_entry = sub_pat = None
            for e in subs:
                for p in e["patterns"]:
                    if re.match(p, name):
                        sub_entry, sub_pat = e, p
                        break
                if sub_entry:
                    break
            if (p := _first_match(rep, name)) is not None:
                used.add(p)
                for s in slices[1:]:
                    c.check(torch.equal(s, slices[0]), f"{name}/{k}: TP-replicated slices differ")
                param = slices[0]
            elif (p := _first_match(avg, name)) is not None:
                used.add(p)
                param = sum(slices) / len(slices)
            elif (p := _first_match(sw, name)) is not None:
                used.add(p)
                ch = [torch.chunk(s, 2, dim=0) for s in slices]
                param = torch.cat([torch.cat([x[0] for x in ch]), torch.cat([x[1] for x in ch])])
                extra["cat_dim"] = 0
                extra["param_n_sub_params"] = 2
            elif sub_entry is not None:
                used.add(sub_pat)
                pd = sub_entry["partition_dim"]
                sizes = sub_entry["shape"][pd]
                W = widths_by_pat[sub_pat]
                logical = [sum(d) if isinstance(d, tuple) else d for d in sub_entry["shape"]]
                views = []
                for tp, s in enumerate(slices):
                    rs = list(logical)
                    rs[pd] = sum(w[tp] for w in W)
                    views.append(s.view(rs))
                offs = [0] * T
                chunks = []
                for kk, _ in enumerate(sizes):
                    pieces = []
                    for tp, v in enumerate(views):
                        pieces.append(v.narrow(pd, offs[tp], W[kk][tp]))
                        offs[tp] += W[kk][tp]
                    chunks.append(torch.cat(pieces, pd))
                param = torch.cat(chunks, pd)
                extra["sub_param_shape"] = {"patterns": list(sub_entry["patterns"]), "shape": sub_entry["shape"],
                                            "partition_dim": pd}
            else:
                p = _first_match(row, name)
                if p is not None:
                    used.add(p)
                cat_dim = 1 if p is not None else 0
                param = torch.cat(slices, cat_dim)
                extra["cat_dim"] = cat_dim
            if (p := _first_match(voc, name)) is not None:
                used.add(p)
                param = param[: uci["original_vocab_size"], :]
                extra["vocab_tensor"] = True
            c.check(dict(extra) == dict(extra_ref) and list(extra) == list(extra_ref),
                    f"{name}: universal keys {dict(extra)} vs truth {dict(extra_ref)}")
            ref = truth[k][name]
            c.check(list(param.shape) == list(ref.shape) == truth["shapes"][name], f"{name}/{k}: shape")
            c.check(param.dtype == torch.float32 and torch.equal(param, ref), f"{name}/{k}: values differ from truth")
    all_pats = set(rep + avg + row + voc + sw + [p for e in subs for p in e["patterns"]])
    c.check(not (all_pats - used), f"unused UCI patterns {sorted(all_pats - used)}")

    _check_models(c, tagdir, files, mp_files, mp_states, truth, meta, local_fp32, T, P)
    if P == 1 and T == 1:
        _check_zero_to_fp32(c, tagdir, zero_files, m0, truth, D)
    if not large:
        _check_against_real(c, tagdir, files, zero_files, mp_files, meta)


def _check_steps(c, steps, ref):
    for s in steps:
        if isinstance(ref, int):
            c.check(type(s) is int and s == ref, f"step {s!r} vs truth {ref!r}")
        else:
            c.check(torch.is_tensor(s) and s.dim() == 0 and s.dtype == torch.float32 and torch.equal(s, ref),
                    f"step {s!r} vs truth {ref!r}")


def _check_partitions(c, fname, osd, shapes, r, D, bf16opt):
    G = len(shapes)
    c.check(osd["partition_count"] == [D] * G, f"{fname}: partition_count")
    c.check(len(osd["group_paddings"]) == G and len(osd["param_slice_mappings"]) == G, f"{fname}: group count")
    bos = osd["base_optimizer_state"]
    c.check(list(bos.keys()) == ["state", "param_groups"], f"{fname}: base_optimizer_state keys")
    c.check(list(bos["state"].keys()) == list(range(G)), f"{fname}: state keys")
    for g, shp in enumerate(shapes):
        c.check(bos["param_groups"][g]["params"] == [g], f"{fname}: param_groups[{g}].params")
        N = sum(_numel(s) for s in shp.values())
        A = math.ceil(N / (2 * D)) * 2 * D
        S = A // D
        zpad = max(0, min(S, (r + 1) * S - N))
        pad = (A - N if r == D - 1 else 0) if bf16opt else zpad
        c.check(osd["group_paddings"][g] == pad, f"{fname}: group_paddings[{g}]={osd['group_paddings'][g]} want {pad}")
        fp = osd["single_partition_of_fp32_groups"][g]
        c.check(fp.requires_grad, f"{fname}: fp32 partition should carry requires_grad=True")
        c.check(fp.storage().size() == S and fp.storage_offset() == 0, f"{fname}: fp32 storage != partition size")
        c.check(fp.numel() == (S if bf16opt else S - zpad), f"{fname}: fp32 numel {fp.numel()}")
        st = bos["state"][g]
        for k in ("exp_avg", "exp_avg_sq"):
            c.check(st[k].numel() == S and st[k].storage().size() == S, f"{fname}: {k} not padded to S")
            # the padding region of the rank's partition holds zeros (no gradient ever reaches it)
            c.check(torch.count_nonzero(st[k][S - zpad:]) == 0, f"{fname}: {k} padding not zero")
        whole = torch.empty(0, dtype=fp.dtype).set_(fp.storage(), 0, (S,))
        c.check(torch.count_nonzero(whole[S - zpad:]) == 0, f"{fname}: fp32 storage padding not zero")
        # recompute param_slice_mappings from param_shapes (walk order, §4.1 step 6)
        want, o = [], 0
        lo, hi = r * S, (r + 1) * S
        for n, s in shp.items():
            k = _numel(s)
            if o < hi and o + k > lo:
                fs, fe = max(o, lo), min(o + k, hi)
                want.append((n, fe - fs, fs - lo))
            o += k
        got = [(n, fa.numel, fa.start) for n, fa in osd["param_slice_mappings"][g].items()]
        c.check(got == want, f"{fname}: param_slice_mappings[{g}] {got} want {want}")
        c.check(type(osd["param_slice_mappings"][g]) is OrderedDict, f"{fname}: slice mapping not an OrderedDict")


def _module_lookup(module, name):
    if "language_model" in module and not isinstance(module["language_model"], torch.Tensor):
        parts = name.split(".")
        lm = module["language_model"]
        if parts[1] == "embedding":
            return lm["embedding"][parts[2]][".".join(parts[3:])]
        return lm[parts[1]][".".join(parts[2:])]
    return module[name]


def _check_models(c, tagdir, files, mp_files, mp_states, truth, meta, local_fp32, T, P):
    lp_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[meta["dtype"]]
    for pp in range(P):
        for tp in range(T):
            mp = pp * T + tp
            s = mp_states[mp]
            fn = mp_files[mp]
            c.check(fn == f"mp_rank_{mp:02d}_model_states.pt", f"{fn}: name")
            c.check(s["optimizer"] is None, f"{fn}: optimizer should be None under ZeRO")
            if meta["stage"] == 2:
                c.check(isinstance(s["frozen_param_shapes"], OrderedDict), f"{fn}: frozen_param_shapes")
            else:
                c.check(s["frozen_param_shapes"] is None and s["frozen_param_fragments"] is None, f"{fn}: frozen")
            if P > 1:
                c.check(s["module"] is None, f"{fn}: module must be None under pipeline parallelism")
                lookup = _layer_lookup(c, tagdir, files, tp, s["param_shapes"])
            else:
                lookup = lambda n, s=s: _module_lookup(s["module"], n)  # noqa: E731
            for gi, g in enumerate(s["param_shapes"]):
                group_storage = None
                o = 0
                N = sum(_numel(x) for x in g.values())
                D = meta["dp"]
                A = math.ceil(N / (2 * D)) * 2 * D
                for n, shape in g.items():
                    t = lookup(n)
                    if t is None:
                        o += _numel(shape)
                        continue
                    c.check(t.shape == shape and t.dtype == lp_dtype, f"{fn}: module {n} shape/dtype")
                    if (n, tp) in local_fp32 and not (pp > 0 and n.startswith("tied_modules")):
                        want = local_fp32[(n, tp)].to(lp_dtype)
                        c.check(torch.equal(t, want), f"{fn}: module {n} != fp32 master in low precision")
                    if P == 1:
                        # ZeRO-1/2: model params are views into one flat bit16 buffer per group
                        c.check(t.storage_offset() == o, f"{fn}: {n} offset {t.storage_offset()} want {o}")
                        c.check(t.storage().size() == A, f"{fn}: {n} storage {t.storage().size()} want {A}")
                        if group_storage is None:
                            group_storage = t.storage().data_ptr()
                        c.check(t.storage().data_ptr() == group_storage, f"{fn}: {n} not in its group's buffer")
                    o += _numel(shape)
            if P == 1 and pp == 0 and tp == 0 and T == 1:
                mod = s["module"]
                for n, ref in truth["frozen"].items():
                    c.check(torch.equal(mod[n], ref), f"{fn}: frozen {n} in module")
                    if meta["stage"] == 2:
                        c.check(s["frozen_param_shapes"][n] == ref.shape, f"{fn}: frozen shape {n}")
                        c.check(torch.equal(s["frozen_param_fragments"][n], ref), f"{fn}: frozen fragment {n}")
                if meta["stage"] == 2:
                    c.check(list(s["frozen_param_shapes"]) == list(truth["frozen"]), f"{fn}: frozen names")
                c.check(s["buffer_names"] == list(truth["buffers"]), f"{fn}: buffer_names")
                for n, ref in truth["buffers"].items():
                    c.check(torch.equal(mod[n], ref) and mod[n].dtype == ref.dtype, f"{fn}: buffer {n}")
                c.check(s["shared_params"] == truth["shared_params"], f"{fn}: shared_params")
                for alias, target in truth["shared_params"].items():
                    c.check(mod[alias] is mod[target], f"{fn}: alias {alias} is not the same tensor as {target}")
            elif mp != 0:
                c.check(s["shared_params"] == {}, f"{fn}: shared_params only on global rank 0")


def _layer_lookup(c, tagdir, files, tp, param_shapes):
    names = {n for g in param_shapes for n in g}
    table = {}
    for f in files:
        m = re.match(r"layer_(\d+)-model_(\d+)-model_states\.pt$", f)
        if not m or int(m.group(2)) != tp:
            continue
        sd = _load(os.path.join(tagdir, f))
        c.check(type(sd) is OrderedDict, f"{f}: not an OrderedDict")
        idx = int(m.group(1))
        for k, t in sd.items():
            c.check(t.storage().size() == t.numel(), f"{f}: {k} is not a compact clone")
            n = f"{idx}.{k}"
            if n not in names and f"tied_modules.embed.{k}" in names:
                n = f"tied_modules.embed.{k}"
            table[n] = t
    return lambda n: table.get(n)


def _check_zero_to_fp32(c, tagdir, zero_files, m0, truth, D):
    """zero_to_fp32 (ZeRO-1/2): concatenate the saved fp32 partitions per group and walk param_shapes."""
    parts = [_load(os.path.join(tagdir, f))["optimizer_state_dict"] for f in zero_files]
    if "zero_stage" not in parts[0]:
        return  # zero_to_fp32 rejects BF16_Optimizer files ("not a zero checkpoint")
    for g, shp in enumerate(m0["param_shapes"]):
        full = torch.cat([p["single_partition_of_fp32_groups"][g] for p in parts])
        o = 0
        for n, s in shp.items():
            k = _numel(s)
            c.check(torch.equal(full[o:o + k].view(s), truth["fp32"][n]), f"zero_to_fp32 {n}")
            o += k
        align = 2 * D
        c.check(math.ceil(o / align) == math.ceil(full.numel() / align), "zero_to_fp32 alignment sanity")


# ----------------------------------------------------------------------------------------------
# Comparison with the real DeepSpeed-written files

_REAL_OPTIM = {("DeepSpeedZeroOptimizer", "fp32"): "z1_dp2_fp32", ("DeepSpeedZeroOptimizer", "fp16"): "z1_dp2_fp16",
               ("DeepSpeedZeroOptimizer", "bf16"): "z2_dp2_bf16", ("BF16_Optimizer", "bf16"): "bf16opt_z1_dp2"}


def _real_files(case):
    d = os.path.join(REAL, case, "checkpoint")
    if not os.path.isdir(d):
        return None
    tag = open(os.path.join(d, "latest")).read().strip()
    d = os.path.join(d, tag)
    return d, sorted(os.listdir(d))


def _check_against_real(c, tagdir, files, zero_files, mp_files, meta):
    real_case = _REAL_OPTIM.get((meta["optimizer"], meta["dtype"]))
    found = _real_files(real_case) if real_case else None
    for f in files:
        g = pickle_globals(os.path.join(tagdir, f))
        c.check(g <= ALLOWED_GLOBALS, f"{f}: unexpected pickle globals {sorted(g - ALLOWED_GLOBALS)}")
    if not found:
        return
    rdir, rfiles = found
    rz = [f for f in rfiles if "optim_states" in f][0]
    rm = [f for f in rfiles if f.startswith("mp_rank_")][0]
    real_o = _load(os.path.join(rdir, rz))
    real_m = _load(os.path.join(rdir, rm))
    # optimizer files: same GLOBALs and key orders as the real file of the same kind
    rg = pickle_globals(os.path.join(rdir, rz))
    for f in zero_files:
        g = pickle_globals(os.path.join(tagdir, f))
        o = _load(os.path.join(tagdir, f))
        if not any(o["optimizer_state_dict"]["param_slice_mappings"]):
            # a rank that owns only padding pickles no fragment_address at all
            g = g | {"deepspeed.utils.tensor_fragment fragment_address"}
        c.check(g == rg, f"{f}: pickle globals {sorted(g ^ rg)} differ from real {rz}")
        c.check(list(o["optimizer_state_dict"]) == list(real_o["optimizer_state_dict"]),
                f"{f}: optimizer_state_dict key order differs from real")
        if "loss_scaler" in o["optimizer_state_dict"]:
            ls, rls = o["optimizer_state_dict"]["loss_scaler"], real_o["optimizer_state_dict"]["loss_scaler"]
            if type(ls).__name__ == type(rls).__name__:
                c.check(list(vars(ls)) == list(vars(rls)), f"{f}: loss scaler attribute order")
                c.check({k: type(v) for k, v in vars(ls).items()} == {k: type(v) for k, v in vars(rls).items()},
                        f"{f}: loss scaler attribute types")
        if meta["base_optimizer"] == "torch.optim.AdamW" and meta["model_kind"] == "flat" and meta["param_groups"] == 1:
            pg, rpg = o["optimizer_state_dict"]["base_optimizer_state"]["param_groups"][0], \
                real_o["optimizer_state_dict"]["base_optimizer_state"]["param_groups"][0]
            c.check(list(pg) == list(rpg), f"{f}: param_groups keys {list(pg)} vs real {list(rpg)}")
        for k in ("state",):
            st, rst = o["optimizer_state_dict"]["base_optimizer_state"][k][0], \
                real_o["optimizer_state_dict"]["base_optimizer_state"][k][0]
            c.check(list(st) == list(rst), f"{f}: state keys {list(st)} vs real {list(rst)}")
    # model files: top-level key order (client keys after ds_version)
    real_keys = list(real_m)
    for f in mp_files:
        s = _load(os.path.join(tagdir, f))
        keys = list(s)
        base = [k for k in keys if k in real_keys or k == "checkpoint_parallel_dimensions"]
        want = [k for k in real_keys if k != "universal_checkpoint_info"]
        if meta["new_layout"]:
            want = [k for k in want if k != "sparse_tensor_module_names"]
            want.insert(want.index("mp_world_size") + 1, "checkpoint_parallel_dimensions")
        if "universal_checkpoint_info" in keys:
            base.remove("universal_checkpoint_info")
        c.check(base == want, f"{f}: model-state key order {base} vs real {want}")
        c.check(keys[: len(want)] == want, f"{f}: client keys must follow ds_version")
        if meta["model_kind"] == "flat" and meta["dtype"] != "fp32" and not s["buffer_names"]:
            rg = pickle_globals(os.path.join(rdir, rm))
            g = pickle_globals(os.path.join(tagdir, f))
            c.check(g == rg, f"{f}: pickle globals {sorted(g ^ rg)} differ from real {rm}")
