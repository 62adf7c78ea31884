"""Read a torch_dist folder written by `ucp reshard --to megatron --ckpt-format torch_dist` with real
torch.distributed.checkpoint (torch 2.6: DCP's _load_state_dict(no_dist=True), the call Megatron's
loader makes on torch < 2.7) and compare it with the source fixture's live truth.

Usage: check_megatron_dist_dcp.py CASE...   (each CASE holds checkpoint/ and truth.pt of a
testdata/fixtures/megatron_dist fixture, and a file tp with the written TP)

Every tensor key is loaded into a tensor of its metadata's size and dtype, every bytes item into a
BytesIO (the planner's load_bytes replaces it with torch.load of the item). Then: optimizer.state.{param,exp_avg,exp_avg_sq}.<key> equal truth fp32/exp_avg/exp_avg_sq
bit for bit (stacked keys layer by layer; vocabulary rows past the true vocabulary zero), the model
keys equal the truth's fp32 main parameters cast to the saved dtype, every _extra_state item is
[None], and the common state (common_state item or common.pt) names the written TP in its args.
Prints "ok CASE" per case; exits 1 on the first difference.
"""

import glob
import io
import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

import _megatron_stub  # testdata/check/_megatron_stub.py: megatron.* without its source


_megatron_stub.install()


def fail(case, msg):
    print(f"FAIL {case}: {msg}")
    sys.exit(1)


def truth_of(truth, state, key):
    """Per-layer truth tensors of a (possibly stacked) key: {index: tensor}."""
    t = truth[state]
    if key in t:
        return {None: t[key]}
    if key.startswith("decoder.layers."):
        rest = key[len("decoder.layers."):]
        out = {}
        l = 0
        while f"decoder.layers.{l}.{rest}" in t:
            out[l] = t[f"decoder.layers.{l}.{rest}"]
            l += 1
        return out
    return {}


def same(case, what, got, want):
    if got.shape[0] > want.shape[0] and got.dim() == want.dim() and got.shape[1:] == want.shape[1:]:
        pad = got[want.shape[0]:]
        if torch.count_nonzero(pad) != 0:
            fail(case, f"{what}: vocabulary padding rows are not zero")
        got = got[: want.shape[0]]
    if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
        fail(case, f"{what}: {got.dtype}{list(got.shape)} differs from the truth {want.dtype}{list(want.shape)}")


def check(case):
    it = sorted(glob.glob(os.path.join(case, "checkpoint", "iter_*")))[-1]
    tp = int(open(os.path.join(case, "tp")).read())
    reader = dcp.FileSystemReader(it)
    md = reader.read_metadata()
    sd = {}
    for k, m in md.state_dict_metadata.items():
        sd[k] = io.BytesIO() if isinstance(m, BytesStorageMetadata) else torch.full(tuple(m.size), float("nan"), dtype=m.properties.dtype)
    _load_state_dict(sd, storage_reader=reader, no_dist=True)
    truth = torch.load(os.path.join(case, "truth.pt"), weights_only=False)
    n = 0
    for k, v in sd.items():
        if isinstance(md.state_dict_metadata[k], BytesStorageMetadata):
            # DefaultLoadPlanner.load_bytes puts torch.load of the item in its place.
            obj = v if not isinstance(v, io.BytesIO) else torch.load(io.BytesIO(v.getvalue()), weights_only=False)
            if "._extra_state/" in k and obj != [None]:
                fail(case, f"{k} holds {obj!r}")
            if k.startswith("common_state/"):
                common = obj[0]
            continue
        state, key = "weight", k
        for prefix, st in (("optimizer.state.param.", "fp32"), ("optimizer.state.exp_avg.", "exp_avg"), ("optimizer.state.exp_avg_sq.", "exp_avg_sq")):
            if k.startswith(prefix):
                state, key = st, k[len(prefix):]
        want = truth_of(truth, "fp32" if state == "weight" else state, key)
        if not want:  # truth named as the local spec's module (input_layernorm, pre_mlp_layernorm)
            local = key.replace("self_attention.linear_qkv.layer_norm_", "input_layernorm.").replace("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm.")
            want = truth_of(truth, "fp32" if state == "weight" else state, local)
        if not want:
            fail(case, f"{k}: no truth for it")
        for idx, w in want.items():
            got = v if idx is None else v[idx]
            if state == "weight":
                w = w.to(got.dtype)
            same(case, f"{k}[{idx}]", got, w)
            n += 1
    if os.path.exists(os.path.join(it, "common.pt")):
        common = torch.load(os.path.join(it, "common.pt"), weights_only=False)
    if common["args"].tensor_model_parallel_size != tp:
        fail(case, f"args.tensor_model_parallel_size {common['args'].tensor_model_parallel_size} != {tp}")
    print(f"ok {case} ({n} tensors)")


if __name__ == "__main__":
    for c in sys.argv[1:]:
        check(c)
