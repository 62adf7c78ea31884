#!/usr/bin/env python3
"""Load DCP fixtures with real torch.distributed.checkpoint and compare them with truth.pt.

    python3 testdata/gen/check_dcp_load.py DIR [--truth FILE]

DIR is a case folder (holding checkpoint/ and truth.pt), a DCP folder (give --truth, or have
truth.pt beside it), or a folder of case folders such as testdata/fixtures/dcp. Every checkpoint is
loaded twice, both without a process group:

  1. torch.distributed.checkpoint.format_utils.dcp_to_torch_save, then torch.load of the result;
  2. dcp.load into a state dict built from truth.pt's paths (empty full-size plain tensors, None
     for non-tensor values).

Every flattened key of truth.pt ('tensors' and 'extra') must come back with the same dtype, shape
and values, and nothing else may. Needs torch >= 2.4; with an older torch it prints why it cannot
run and exits 2, or 0 when the environment has UCP_DCP_CHECK_ALLOW_SKIP=1.
"""

import argparse
import importlib
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree

import torch  # noqa: E402

from dcpgen.flatten import flatten_state_dict, set_element  # noqa: E402

SKIP_ENV = "UCP_DCP_CHECK_ALLOW_SKIP"
MISSING = object()


def unavailable_reason():
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    if not m or (int(m.group(1)), int(m.group(2))) < (2, 4):
        return f"torch {torch.__version__} is older than 2.4"
    try:
        importlib.import_module("torch.distributed.checkpoint")
        importlib.import_module("torch.distributed.checkpoint.format_utils")
    except Exception as e:
        return f"torch.distributed.checkpoint does not import: {e}"
    return None


def same_value(a, b):
    if hasattr(a, "getvalue") and hasattr(b, "getvalue"):
        return type(a) is type(b) and a.getvalue() == b.getvalue()
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same_value(x, y) for x, y in zip(a, b)))
    return type(a) is type(b) and a == b


def get_element(root, path):
    cur = root
    for part in path:
        if type(part) is int:
            if not isinstance(cur, list) or part >= len(cur):
                return MISSING
        elif not isinstance(cur, dict) or part not in cur:
            return MISSING
        cur = cur[part]
    return cur


def compare(label, nested, truth):
    """Problems found comparing a loaded nested state dict with truth."""
    problems = []
    want = dict(truth["extra"])
    want.update(truth["tensors"])
    for key, path in truth["paths"].items():
        got = get_element(nested, path)
        if got is MISSING:
            problems.append(f"{label}: {key} missing")
        elif not same_value(got, want[key]):
            problems.append(f"{label}: {key} differs: got {got!r:.120} want {want[key]!r:.120}")
    rule = truth["meta"]["flatten_rules"]
    flat, _ = flatten_state_dict(nested, lambda v: isinstance(v, torch.Tensor), rule)
    for key in sorted(set(flat) - set(truth["paths"])):
        problems.append(f"{label}: unexpected key {key}")
    return problems


def load_via_torch_save(ckpt):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "full.pt")
        dcp_to_torch_save(ckpt, out)
        return torch.load(out, weights_only=False)


def load_via_dcp_load(ckpt, truth):
    import torch.distributed.checkpoint as dcp
    template = {}
    for key, path in truth["paths"].items():
        t = truth["tensors"].get(key)
        set_element(template, path, torch.empty_like(t) if t is not None else None)
    dcp.load(template, checkpoint_id=ckpt)
    return template


def targets(directory, truth):
    if truth:
        return [(directory, truth)]
    if os.path.exists(os.path.join(directory, ".metadata")):
        beside = os.path.join(os.path.dirname(os.path.abspath(directory)), "truth.pt")
        if not os.path.exists(beside):
            raise SystemExit(f"{directory}: no truth.pt beside it; pass --truth")
        return [(directory, beside)]
    if os.path.exists(os.path.join(directory, "checkpoint", ".metadata")):
        return [(os.path.join(directory, "checkpoint"), os.path.join(directory, "truth.pt"))]
    found = []
    for name in sorted(os.listdir(directory)):
        case = os.path.join(directory, name)
        if os.path.exists(os.path.join(case, "checkpoint", ".metadata")):
            found.append((os.path.join(case, "checkpoint"), os.path.join(case, "truth.pt")))
    if not found:
        raise SystemExit(f"{directory}: no DCP checkpoint found")
    return found


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--truth", help="truth.pt for a bare DCP folder")
    args = ap.parse_args(argv)

    reason = unavailable_reason()
    if reason:
        print(f"check_dcp_load: cannot run: {reason}; real torch.distributed.checkpoint is needed")
        if os.environ.get(SKIP_ENV) == "1":
            print(f"check_dcp_load: skipped ({SKIP_ENV}=1)")
            return 0
        return 2

    failed = 0
    for ckpt, truth_path in targets(args.dir, args.truth):
        truth = torch.load(truth_path, weights_only=False)
        name = truth["meta"]["case"]
        problems = []
        for label, load in (("dcp_to_torch_save", lambda: load_via_torch_save(ckpt)),
                            ("dcp.load", lambda: load_via_dcp_load(ckpt, truth))):
            try:
                problems += compare(label, load(), truth)
            except Exception as e:  # a load that fails is a finding, not a crash
                problems.append(f"{label}: {type(e).__name__}: {e}")
        if problems:
            failed += 1
            print(f"FAIL {name} ({truth['meta']['producer']}, layout {truth['meta']['layout']})")
            for p in problems:
                print(f"  {p}")
        else:
            print(f"ok   {name} ({truth['meta']['producer']}, layout {truth['meta']['layout']}): "
                  f"{len(truth['paths'])} keys")
    print(f"check_dcp_load: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
