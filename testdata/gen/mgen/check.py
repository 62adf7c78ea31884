"""Independent reader for the generated checkpoints (a Python reference for the Go reader).

It looks only at the checkpoint files (args inside them, dir names, dict structure) and the
rules of internal/formats/megatron/NOTES.md, rebuilds every atomic tensor, and compares with truth.pt.
It deliberately does not import the generator's model/layout code.
"""

import math
import os
import re
from collections import defaultdict

import torch

from .ckpt import install_megatron_stubs

BUFFER_SUFFIXES = (".expert_bias",)  # persistent non-parameter buffers in `model`


def _load(path):
    install_megatron_stubs()
    return torch.load(path, map_location="cpu")


def _flatten(d, prefix=""):
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, name + ".")
        else:
            yield name, v


def _split_kind(name, args):
    # GroupedMLP (core <= 0.16.1 moe/experts.py): all local experts fused in weight1 / weight2
    if re.search(r"\.mlp\.experts\.weight1$", name):
        return "gmm1"
    if re.search(r"\.mlp\.experts\.weight2$", name):
        return "gmm2"
    if name.endswith("word_embeddings.weight") or name.endswith("output_layer.weight"):
        return "vocab"
    if ".linear_qkv.weight" in name or ".linear_qkv.bias" in name or ".query_key_value." in name:
        return "qkv"
    if re.search(r"\.(linear_fc1|dense_h_to_4h)\.(weight|bias)\d*$", name):
        return "swiglu" if args.swiglu else "col"
    if re.search(r"\.(linear_proj|linear_fc2|dense|dense_4h_to_h)\.weight\d*$", name):
        return "row"
    return "rep"


def _is_expert(name):
    return ".mlp.experts." in name


class Layout:
    def __init__(self, args):
        self.a = args
        self.tp = args.tensor_model_parallel_size
        self.pp = args.pipeline_model_parallel_size
        self.vpp = args.virtual_pipeline_model_parallel_size
        self.ep = getattr(args, "expert_model_parallel_size", 1) or 1
        self.etp = getattr(args, "expert_tensor_parallel_size", None) or self.tp
        self.E = getattr(args, "num_experts", None) or 0
        self.L = args.num_layers
        self.dp = args.data_parallel_size
        self.world = args.world_size

    def parse_dir(self, d):
        parts = [int(x) for x in d[len("mp_rank_"):].split("_")]
        tp = parts.pop(0)
        pp = parts.pop(0) if self.pp > 1 else 0
        ep = parts.pop(0) if self.ep > 1 else 0
        assert not parts, d
        return tp, pp, ep

    def offset(self, p, v):
        if self.vpp:
            return v * (self.L // self.vpp) + p * (self.L // self.pp // self.vpp)
        return p * (self.L // self.pp)

    def atomic(self, local, p, v, e):
        """local name -> (atomic name, tied copy?)"""
        untie = self.a.untie_embeddings_and_output_weights
        if local == "word_embeddings_for_head.weight":
            return "language_model.embedding.word_embeddings.weight", True
        if local == "output_layer.weight" and not untie:
            return "embedding.word_embeddings.weight", True
        off = self.offset(p, v)
        name = re.sub(r"^(decoder\.layers\.|language_model\.encoder\.layers\.)(\d+)\.",
                      lambda m: f"{m.group(1)}{int(m.group(2)) + off}.", local)
        if self.E:
            nloc = self.E // self.ep
            name = re.sub(r"\.local_experts\.(\d+)\.",
                          lambda m: f".local_experts.{int(m.group(1)) + e * nloc}.", name)
            name = re.sub(r"(\.experts\.linear_fc[12]\.weight)(\d+)$",
                          lambda m: f"{m.group(1)}{int(m.group(2)) + e * nloc}", name)
        return name, False


def _groups_members(params, groups):
    """Assign params (named order) to saved param groups by (wd_mult == 0, is_expert_parallel):
    Megatron's rule is wd_mult 0 for '*.bias' and 1-D params."""
    out = []
    for g in groups:
        wd0 = g["wd_mult"] == 0.0
        ex = bool(g.get("is_expert_parallel", False))
        out.append([p for p in params
                    if (p["name"].endswith(".bias") or p["shape"].__len__() == 1) == wd0
                    and p["expert"] == ex])
    return out


def _pad(x, d):
    return int(math.ceil(x / d) * d)


def _layout(params, bucket_size, D, rules):
    """params: named order of one buffer. rules: head (core >= 0.8: 64 alignment, lcm(D,128)
    bucket padding), v07 (no alignment, lcm), v06 (no alignment, pad to D).
    Returns index {i: (start, end, bucket)}, buckets [(start, padded_end, unpadded)]."""
    align = 64 if rules == "head" else 1
    div = D if rules == "v06" else math.lcm(D, 128)
    idx, buckets = {}, []
    start = bstart = 0
    n_in = 0
    end = 0
    for i in reversed(range(len(params))):
        p = params[i]
        start = _pad(start, align)
        if p["shared"] and n_in:
            padded = _pad(start, div)
            buckets.append((bstart, padded, start - bstart))
            bstart, n_in, start = padded, 0, padded
        end = start + p["numel"]
        idx[i] = (start, end, len(buckets))
        n_in += 1
        if (bucket_size is not None and end - bstart >= bucket_size) or p["shared"]:
            padded = _pad(end, div)
            buckets.append((bstart, padded, end - bstart))
            bstart, n_in, start = padded, 0, padded
        else:
            start = end
    if n_in:
        buckets.append((bstart, _pad(end, div), end - bstart))
    return idx, buckets


def read_checkpoint(root):
    """Returns (atomic tensors {state: {name: tensor}}, model weights {name: tensor}, step, info)."""
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        it = f.read().strip()
    it_dir = os.path.join(root, "release" if it == "release" else f"iter_{int(it):07d}")
    dirs = sorted(d for d in os.listdir(it_dir) if d.startswith("mp_rank_"))
    sds = {d: _load(os.path.join(it_dir, d, "model_optim_rng.pt")) for d in dirs}
    args = sds[dirs[0]]["args"]
    lay = Layout(args)
    frags = defaultdict(lambda: defaultdict(dict))  # state -> atomic -> (tp, ep) -> tensor
    weights = defaultdict(dict)
    tied = []
    steps = set()
    for d in dirs:
        sd = sds[d]
        r, p, e = lay.parse_dir(d)
        chunks = ["model"] if "model" in sd else sorted(
            (k for k in sd if re.fullmatch(r"model\d+", k)), key=lambda k: int(k[5:]))
        nchunks = len(chunks)
        # model params per chunk, named order
        chunk_params = []
        for v, ck in enumerate(chunks):
            ps = []
            for name, val in _flatten(sd[ck]):
                if name.endswith("_extra_state") or name.endswith(BUFFER_SUFFIXES):
                    continue
                atom, is_tied = lay.atomic(name, p, v, e)
                first = p == 0 and v == 0
                last = p == lay.pp - 1 and v == nchunks - 1
                shared = (not args.untie_embeddings_and_output_weights and lay.pp > 1 and (
                    is_tied or (atom.endswith("word_embeddings.weight") and first and not last)))
                # expert-parallel (allreduce = False: expert optimizer and buffers) only with
                # EP > 1 (layers.py / experts.py: allreduce = not (is_expert and expert_parallel))
                ps.append({"name": name, "atomic": atom, "tied": is_tied, "tensor": val,
                           "shape": tuple(val.shape), "numel": val.numel(),
                           "expert": _is_expert(name) and lay.ep > 1, "shared": shared, "chunk": v})
                key = (r, e)
                if is_tied:
                    tied.append((atom, key, val))
                else:
                    weights[atom][key] = val
            chunk_params.append(ps)
        allp = [x for ps in chunk_params for x in ps]
        opt = sd["optimizer"]
        subs = opt if isinstance(opt, list) else [opt]
        kinds = [False, True][:len(subs)]
        dist = os.path.join(it_dir, d, "distrib_optim.pt")
        if os.path.exists(dist):
            ds = _load(dist)
            ds = ds if isinstance(ds, list) else [ds]
            for sub, dst, ex in zip(subs, ds, kinds):
                for g in sub["optimizer"]["param_groups"]:
                    steps.add(g["step"])
                if dst is None:
                    continue
                D = lay.world // (lay.etp * lay.ep * lay.pp) if ex else lay.dp
                bufs = []
                for v, ps in enumerate(chunk_params):
                    mine = [x for x in ps if x["expert"] == ex]
                    if not mine:
                        continue
                    bs = None  # training.py resolve_ddp_bucket_size + per-chunk rule
                    if args.overlap_grad_reduce and p == 0 and v == 0:
                        if getattr(args, "ddp_num_buckets", None):
                            bs = sum(x["numel"] for x in allp) // args.ddp_num_buckets
                        elif getattr(args, "ddp_bucket_size", None):
                            bs = args.ddp_bucket_size
                        else:
                            bs = max(40_000_000, 1_000_000 * lay.dp)
                    bufs.append((mine, bs))
                coalesced = dst.get("buckets_coalesced", False)
                for gi, (mine, bs) in enumerate(bufs):
                    (dkey, st), = dst[gi].items()
                    if coalesced:
                        for rules in ("head", "v07"):
                            idx, buckets = _layout(mine, bs, D, rules)
                            if sum(b[2] for b in buckets) == st["numel_unpadded"]:
                                break
                        else:
                            raise ValueError(f"{d}: no layout matches numel_unpadded {st['numel_unpadded']}")
                        assert st["param"].numel() == st["numel_unpadded"]
                        base = [0]
                        for b in buckets:
                            base.append(base[-1] + b[2])
                        for i, x in enumerate(mine):
                            s0, s1, b = idx[i]
                            off = s0 - buckets[b][0] + base[b]
                            for k, sk in (("param", "fp32"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
                                t = st[k][off:off + x["numel"]].reshape(x["shape"])
                                _put(frags, sk, x, (r, e), t)
                    else:
                        idx, buckets = _layout(mine, bs, D, "v06")
                        want = [b[1] - b[0] for b in buckets]
                        assert dst["per_bucket_numel"][gi][dkey] == want, (want, dst["per_bucket_numel"])
                        for i, x in enumerate(mine):
                            s0, s1, b = idx[i]
                            for k, sk in (("param", "fp32"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
                                t = st[k][b][s0 - buckets[b][0]:s1 - buckets[b][0]].reshape(x["shape"])
                                _put(frags, sk, x, (r, e), t)
        else:
            for sub, ex in zip(subs, kinds):
                mine = [x for x in allp if x["expert"] == ex]
                inner = sub["optimizer"]
                members = _groups_members(mine, inner["param_groups"])
                for gi, (g, mem) in enumerate(zip(inner["param_groups"], members)):
                    assert len(g["params"]) == len(mem), (d, gi, len(g["params"]), len(mem))
                    for k, (pid, x) in enumerate(zip(g["params"], mem)):
                        s = inner["state"][pid]
                        steps.add(_scalar(s["step"]) if "step" in s else g["step"])
                        _put(frags, "fp32", x, (r, e), sub["fp32_from_fp16_params"][gi][k])
                        _put(frags, "exp_avg", x, (r, e), s["exp_avg"])
                        _put(frags, "exp_avg_sq", x, (r, e), s["exp_avg_sq"])
    return args, lay, frags, weights, tied, steps


def _scalar(t):
    return t.item() if torch.is_tensor(t) else t


def _put(frags, state, x, key, t):
    if x["tied"]:
        frags["tied_" + state][x["atomic"]][key] = t
    else:
        frags[state][x["atomic"]][key] = t


def merge_grouped(pieces, kind, etp, ep, E, H, gated):
    """GroupedMLP weight1 / weight2 from every (ETP, EP) rank, the way Megatron itself reshards
    them (core_v0.16.1 GroupedMLP.sharded_state_dict): each local tensor is viewed as
    real_shape (weight1 [nle, H, X], weight2 [nle, X, H]) and transposed to per-expert linear
    weights; gated fc1 rows are chunked into w (tp_rank of 2t) and v (t + tp_rank of 2t) along
    the row axis; fc2 columns at tp_rank of t; experts at ep_rank * nle. Returns the TP = EP = 1
    tensor that sh_ten_merge_fn builds from the global one (transpose(-1, -2).reshape), and the
    global [E, rows, cols] tensor (dist-ckpt experts.linear_fc{1,2}.weight)."""
    nle = E // ep
    any_t = next(iter(pieces.values()))
    X = any_t.numel() // (nle * H)
    if kind == "gmm1":
        n = 2 if gated else 1
        glob = torch.full((E, X * etp, H), float("nan"), dtype=any_t.dtype)
        for (r, e), t in pieces.items():
            assert t.shape == (H, nle * X), (t.shape, H, nle, X)
            loc = t.view(nle, H, X).transpose(-1, -2)
            for k, part in enumerate(torch.chunk(loc, n, -2)):
                slot, w = k * etp + r, X // n
                glob[e * nle:(e + 1) * nle, slot * w:(slot + 1) * w] = part
        return glob.transpose(-1, -2).reshape(H, -1), glob
    glob = torch.full((E, H, X * etp), float("nan"), dtype=any_t.dtype)
    for (r, e), t in pieces.items():
        assert t.shape == (nle * X, H), (t.shape, H, nle, X)
        glob[e * nle:(e + 1) * nle, :, r * X:(r + 1) * X] = t.view(nle, X, H).transpose(-1, -2)
    return glob.transpose(-1, -2).reshape(-1, H), glob


def merge(pieces, kind, size, is_expert):
    """pieces: {(tp, ep): tensor}. TP (ETP for experts) shards merge by kind; other copies
    (EP replicas of dense params, TP replicas) must be equal."""
    by_rank = defaultdict(list)
    for (r, e), t in pieces.items():
        by_rank[r % size].append(t)
    reps = []
    for r in range(size):
        ts = by_rank[r]
        for t in ts[1:]:
            assert torch.equal(t, ts[0]), "replicas differ"
        reps.append(ts[0])
    if size == 1 or kind == "rep":
        for t in reps[1:]:
            assert torch.equal(t, reps[0]), "replicated param differs across TP ranks"
        return reps[0]
    if kind in ("vocab", "col", "qkv"):
        return torch.cat(reps, 0)
    if kind == "row":
        return torch.cat(reps, 1)
    if kind == "swiglu":
        ws = [t.chunk(2, 0)[0] for t in reps]
        vs = [t.chunk(2, 0)[1] for t in reps]
        return torch.cat(ws + vs, 0)
    raise ValueError(kind)


def check_case(case_dir):
    errs = []
    truth = _load(os.path.join(case_dir, "truth.pt"))
    args, lay, frags, weights, tied, steps = read_checkpoint(os.path.join(case_dir, "checkpoint"))
    V = getattr(args, "vocab_size", None)
    if V is None:
        V = args.padded_vocab_size
    if V != truth["vocab_size"]:
        errs.append(f"vocab size {V} != truth {truth['vocab_size']}")
    names = sorted(frags["fp32"])
    if names != sorted(truth["param_names"]):
        errs.append(f"param names differ: extra {sorted(set(names) - set(truth['param_names']))} "
                    f"missing {sorted(set(truth['param_names']) - set(names))}")
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        for n in names:
            kind = _split_kind(n, args)
            ex = _is_expert(n)
            size = lay.etp if ex else lay.tp
            try:
                if kind in ("gmm1", "gmm2"):
                    t, glob = merge_grouped(frags[state][n], kind, size, lay.ep, lay.E,
                                            args.hidden_size, args.swiglu)
                    if len(frags[state][n]) != size * lay.ep:
                        errs.append(f"{state} {n}: {len(frags[state][n])} pieces, not ETP x EP")
                    parts = truth.get("expert_parts", {})
                    if state == "fp32" and not torch.equal(glob, parts.get(n, torch.zeros(0))):
                        errs.append(f"{n}: per-expert weights differ from truth['expert_parts']")
                else:
                    t = merge(frags[state][n], kind, size, ex)
            except AssertionError as e:
                errs.append(f"{state} {n}: {e}")
                continue
            if kind == "vocab":
                if t.shape[0] != args.padded_vocab_size:
                    errs.append(f"{n}: padded rows {t.shape[0]} != {args.padded_vocab_size}")
                t = t[:V]
            want = truth[state].get(n)
            if want is None or t.shape != want.shape or not torch.equal(t, want):
                errs.append(f"{state} {n}: mismatch (shape {tuple(t.shape)} vs "
                            f"{None if want is None else tuple(want.shape)})")
            if state == "fp32":
                copies = len(frags[state][n])
                pat = _pattern(kind, size, copies, lay.ep)
                if pat != truth["patterns"][n]:
                    errs.append(f"{n}: pattern {pat} != truth {truth['patterns'][n]}")
                if kind in ("gmm1", "gmm2"):
                    w, _ = merge_grouped(weights[n], kind, size, lay.ep, lay.E, args.hidden_size,
                                         args.swiglu)
                else:
                    w = merge(weights[n], kind, size, ex)
                if kind == "vocab":
                    w = w[:V]
                if not torch.equal(w, want.to(w.dtype)):
                    errs.append(f"{n}: model weight != truth fp32 rounded to {w.dtype}")
    # tied copies must equal the embedding (weights and optimizer state)
    for atom, key, val in tied:
        full = merge({k: v for k, v in weights[atom].items() if k[1] == key[1]}, "vocab", lay.tp, False)
        if not torch.equal(val, full.chunk(lay.tp, 0)[key[0]]):
            errs.append(f"tied copy of {atom} at {key} differs")
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        for atom, pieces in frags.get("tied_" + state, {}).items():
            for key, t in pieces.items():
                if not torch.equal(t, frags[state][atom][key]):
                    errs.append(f"tied {state} of {atom} at {key} differs from the embedding's")
    if len(steps) != 1:
        errs.append(f"steps disagree: {steps}")
    else:
        s = steps.pop()
        ts = _scalar(truth["step"])
        if s != ts or type(s) is not type(ts):
            errs.append(f"step {s!r} != truth {ts!r}")
    return errs


def _pattern(kind, size, copies, ep=1):
    if kind in ("gmm1", "gmm2"):
        # several experts x (gate, up) slices per rank at ETP > 1; whole experts at ETP 1
        return "Shard-NC" if size > 1 else ("Shard-V" if ep > 1 else "Unique")
    if size > 1:
        if kind in ("vocab", "col", "qkv"):
            return "Shard-V"
        if kind == "row":
            return "Shard-H"
        if kind == "swiglu":
            return "Shard-NC"
    return "Replicate" if copies > 1 else "Unique"


def compare_truths(a, b):
    ta, tb = _load(os.path.join(a, "truth.pt")), _load(os.path.join(b, "truth.pt"))
    errs = []
    if ta["param_names"] != tb["param_names"]:
        errs.append("param names differ")
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        for n in ta["param_names"]:
            if not torch.equal(ta[state][n], tb[state].get(n, torch.zeros(0))):
                errs.append(f"{state} {n} differs")
    if _scalar(ta["step"]) != _scalar(tb["step"]):
        errs.append(f"step {ta['step']} != {tb['step']}")
    return errs
