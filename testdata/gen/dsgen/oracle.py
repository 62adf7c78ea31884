#!/usr/bin/python3
"""Cross-check the fixtures with DeepSpeed's own converters, when a DeepSpeed source tree is at hand.

    /usr/bin/python3 testdata/gen/dsgen/oracle.py --ds-src /path/to/DeepSpeed [--fixtures DIR] [--case NAME]

Only deepspeed/checkpoint/ (ds_to_universal and its helpers) and deepspeed/utils/zero_to_fp32.py
are imported from the tree, under a bare `deepspeed` package so that DeepSpeed's heavy
__init__ (accelerators, CUDA ops, pydantic config) is never run; tqdm is replaced by a no-op
when missing. For every case:
  * ds_to_universal (--inject_missing_state for checkpoints without universal_checkpoint_info)
    runs into a temporary folder; every zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt must equal the
    truth bit for bit and carry exactly truth['universal'][param] besides 'param'; step.pt must
    be the raw step; optimizer_state.pt must have truth['optimizer_state_keys'] and param_groups.
  * zero_to_fp32 (TP = PP = 1 only) must return buffers, frozen params, trainable params and
    aliases in that order with the truth's values.
Expected failures are reported as such: BF16_Optimizer files are not ZeRO checkpoints for
zero_to_fp32, ds_to_universal's padding strip goes negative on bf16opt_tiny_dp4 (pitfall P9), and a
converter without UCI 0.4 support (no sub_param_shard_widths, e.g. DeepSpeed 0.16.5) cannot merge
the uneven GQA case.
Nothing from DeepSpeed is copied into this repository.
"""
import argparse
import logging
import os
import shutil
import sys
import tempfile
import types

import torch

sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "fixtures", "deepspeed"))
EXPECTED_D2U_FAILURES = {"bf16opt_tiny_dp4"}


def _import_deepspeed(src):
    pkg = os.path.join(src, "deepspeed")
    if not os.path.isfile(os.path.join(pkg, "checkpoint", "ds_to_universal.py")):
        sys.exit(f"{src}: no deepspeed/checkpoint/ds_to_universal.py there")
    ds = types.ModuleType("deepspeed")
    ds.__path__ = [pkg]
    sys.modules["deepspeed"] = ds
    utils = types.ModuleType("deepspeed.utils")
    utils.__path__ = [os.path.join(pkg, "utils")]
    utils.logger = logging.getLogger("deepspeed")
    sys.modules["deepspeed.utils"] = utils
    ds.utils = utils
    try:
        import tqdm  # noqa: F401
    except ImportError:
        tq = types.ModuleType("tqdm")
        tq.tqdm = lambda x, *a, **k: x
        sys.modules["tqdm"] = tq
    import deepspeed.checkpoint  # noqa: F401
    from deepspeed.checkpoint import ds_to_universal
    load = torch.load
    if "mmap" not in load.__code__.co_varnames:  # torch < 2.1: zero_to_fp32 passes mmap=True
        torch.load = lambda *a, mmap=None, **k: load(*a, **k)
    from deepspeed.utils import zero_to_fp32
    sys.path.insert(0, os.path.dirname(HERE))
    from dsgen import stubs
    stubs.register()  # DeepSpeed's real classes where the tree defines them are kept
    return ds_to_universal, zero_to_fp32


def _same_step(a, b):
    if isinstance(b, int):
        return type(a) is int and a == b
    return torch.is_tensor(a) and torch.equal(a, b)


def check_d2u(d2u, case_dir, work):
    truth = torch.load(os.path.join(case_dir, "truth.pt"))
    tag = open(os.path.join(case_dir, "checkpoint", "latest")).read().strip()
    out = os.path.join(work, os.path.basename(case_dir))
    argv = ["ds_to_universal", "--input_folder", os.path.join(case_dir, "checkpoint", tag), "--output_folder", out,
            "--num_extract_workers", "1", "--num_merge_workers", "1"]
    if not truth["meta"]["has_universal_checkpoint_info"]:
        argv.append("--inject_missing_state")
    sys.argv = argv
    d2u.main(d2u.parse_arguments())
    bad = []
    zero = os.path.join(out, "zero")
    want = sorted(truth["param_names"] + ["optimizer_state.pt"])
    if sorted(os.listdir(zero)) != want:
        bad.append(f"folders differ: {sorted(set(os.listdir(zero)) ^ set(want))}")
    for n in truth["param_names"]:
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            d = torch.load(os.path.join(zero, n, k + ".pt"))
            extra = {kk: v for kk, v in d.items() if kk != "param"}
            if "sub_param_shape" in extra:
                s = extra["sub_param_shape"]
                extra["sub_param_shape"] = {"patterns": s.patterns, "shape": s.shape, "partition_dim": s.partition_dim}
            ref = truth["universal"][n]
            if extra != dict(ref) or list(extra) != list(ref):
                bad.append(f"{n}/{k}: keys {extra} vs truth {dict(ref)}")
            if not torch.equal(d["param"], truth[k][n]):
                bad.append(f"{n}/{k}: values differ")
        if not _same_step(torch.load(os.path.join(zero, n, "step.pt")), truth["step"]):
            bad.append(f"{n}: step.pt")
    osd = torch.load(os.path.join(zero, "optimizer_state.pt"))
    if list(osd) != truth["optimizer_state_keys"]:
        bad.append(f"optimizer_state.pt keys {list(osd)}")
    if osd.get("param_groups") != truth["param_groups"]:
        bad.append("optimizer_state.pt param_groups")
    return bad


def check_z2f(z2f, case_dir):
    truth = torch.load(os.path.join(case_dir, "truth.pt"))
    sd = z2f.get_fp32_state_dict_from_zero_checkpoint(os.path.join(case_dir, "checkpoint"))
    bad = []
    want = list(truth["buffers"]) + list(truth["frozen"]) + truth["param_names"] + list(truth["shared_params"])
    if list(sd) != want:
        bad.append(f"keys {list(sd)} vs {want}")
    for n in truth["param_names"]:
        if not torch.equal(sd[n], truth["fp32"][n]):
            bad.append(f"{n} differs")
    for n, v in truth["frozen"].items():
        if not torch.equal(sd[n], v):
            bad.append(f"frozen {n} differs")
    for n, v in truth["buffers"].items():
        if not torch.equal(sd[n], v.float()):
            bad.append(f"buffer {n} differs")
    for a, s in truth["shared_params"].items():
        if sd[a] is not sd[s]:
            bad.append(f"alias {a} is not {s}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ds-src", required=True, help="root of a DeepSpeed source tree (holding deepspeed/)")
    ap.add_argument("--fixtures", default=DEFAULT_FIXTURES)
    ap.add_argument("--case", action="append")
    a = ap.parse_args()
    d2u, z2f = _import_deepspeed(a.ds_src)
    # converters that predate UCI 0.4 split sub-params evenly and cannot merge uneven widths
    with open(d2u.__file__) as f:
        supports_uci04 = "SUB_PARAM_SHARD_WIDTHS" in f.read()
    logging.disable(logging.WARNING)
    cases = sorted(c for c in os.listdir(a.fixtures) if os.path.isfile(os.path.join(a.fixtures, c, "truth.pt")))
    if a.case:
        cases = [c for c in cases if c in a.case]
    work = tempfile.mkdtemp(prefix="ds_oracle_")
    failed = passed = 0
    try:
        for c in cases:
            d = os.path.join(a.fixtures, c)
            meta = torch.load(os.path.join(d, "truth.pt"))["meta"]
            results = []
            try:
                bad = check_d2u(d2u, d, work)
                results.append(("ds_to_universal", bad, None))
            except Exception as e:  # noqa: BLE001 - reported below
                results.append(("ds_to_universal", None, e))
            if meta["tp"] == 1 and meta["pp"] == 1:
                try:
                    results.append(("zero_to_fp32", check_z2f(z2f, d), None))
                except Exception as e:  # noqa: BLE001
                    results.append(("zero_to_fp32", None, e))
            for tool, bad, err in results:
                expected = (tool == "ds_to_universal" and c in EXPECTED_D2U_FAILURES) or \
                           (tool == "ds_to_universal" and meta["model"].get("uneven_heads") and not supports_uci04) or \
                           (tool == "zero_to_fp32" and meta["optimizer"] == "BF16_Optimizer")
                if err is not None:
                    status = "expected failure" if expected else "FAIL"
                    print(f"{status:16s} {c} {tool}: {err!r}"[:300])
                    failed += not expected
                    passed += expected
                elif bad:
                    status = "expected failure" if expected else "FAIL"
                    print(f"{status:16s} {c} {tool}: {bad[:5]}")
                    failed += not expected
                    passed += expected
                else:
                    print(f"{'ok':16s} {c} {tool}")
                    passed += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
