#!/usr/bin/env python3
"""Generate PyTorch Distributed Checkpoint (DCP, FileSystemWriter) fixtures with known contents.

    /usr/bin/python3 testdata/gen/dcp_fixtures.py [--out DIR] [--case NAME ...] [--path MODE]

For every case the full tensors (model parameters, Adam exp_avg / exp_avg_sq, a 0-dim float32 step)
are made first, deterministically; then each rank's state dict is built with them sharded as the
framework shards them, and saved. Output per case, under DIR/<case>/:

    checkpoint/   the DCP folder: .metadata and __<rank>_<n>.distcp
    truth.pt      the full values (see testdata/fixtures/dcp/README.md)
    layout.txt    where every chunk and bytes item landed, as read back by an independent reader

Two ways to write a case:
  standin  pickles stand-in classes registered under DCP's module paths and writes each item with
           torch.save, re-enacting dcp.save's planning, dedup and FileSystemWriter (works on the
           Debian torch 1.13, which cannot import torch.distributed.checkpoint);
  real     runs torch.distributed.checkpoint itself: gloo, one process per rank, DTensors (needs
           torch >= 2.4).
--path auto (the default) takes real where it can run and the case's layout is not an older
torch's, else standin. truth.pt's meta says which one produced the case.
"""

import argparse
import difflib
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree

import torch  # noqa: E402

from dcpgen import cases as cases_mod  # noqa: E402
from dcpgen import engine, reader, real  # noqa: E402
from dcpgen import truth as truth_mod  # noqa: E402
from dcpgen.reader import EnumMember  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(REPO, "testdata", "fixtures", "dcp")

FIELDS = {
    "v2.2": ["state_dict_metadata", "planner_data", "storage_data"],
    "v2.3": ["state_dict_metadata", "planner_data", "storage_data"],
    "v2.4": ["state_dict_metadata", "planner_data", "storage_data", "storage_meta"],
    "v2.7": ["state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"],
}
PROPS_MODULE = {
    "v2.2": "torch.distributed._shard.sharded_tensor.metadata",
    "v2.3": "torch.distributed.checkpoint.metadata",
    "v2.4": "torch.distributed.checkpoint.metadata",
    "v2.7": "torch.distributed.checkpoint.metadata",
}


def choose_path(case, mode):
    reason = real.unavailable_reason()
    if mode == "standin":
        return "standin"
    if mode == "real":
        if reason:
            raise SystemExit(f"--path real: {reason}")
        return "real"
    if reason:
        return "standin"
    if case.pinned and case.layout != real.native_layout():
        return "standin"
    return "real"


def write_standin(case, states, ckpt):
    engine.save(case.layout, [sd for sd, _ in states], ckpt, case.checkpoint_id, case.save_id,
                thread_count=case.thread_count, loader=case.loader)
    return (f"stand-in .metadata pickled by Python {sys.version.split()[0]}; items are "
            f"torch.save streams from torch {torch.__version__}")


def _fail(case, msg):
    raise SystemExit(f"{case.name}: verification failed: {msg}")


def verify(case, ckpt, truth, producer):
    """Read the checkpoint back independently and compare with truth; check layout rules."""
    res = reader.read_checkpoint(ckpt)
    flat = res["flat"]
    want = set(truth["tensors"]) | set(truth["extra"])
    if set(flat) != want:
        _fail(case, f"keys differ: extra {sorted(set(flat) - want)}, "
                    f"missing {sorted(want - set(flat))}")
    for k, t in truth["tensors"].items():
        if not truth_mod.same_value(flat[k], t):
            _fail(case, f"{k}: tensor differs")
    for k, v in truth["extra"].items():
        if not truth_mod.same_value(flat[k], v):
            _fail(case, f"{k}: value {flat[k]!r} != {v!r}")
    md = res["metadata"]
    planner_data = md.get("planner_data") or {}
    for k, path in planner_data.items():
        if ".".join(map(str, path)) != k:
            _fail(case, f"planner_data[{k!r}] = {path!r} does not join to the key")
    for k, path in truth["paths"].items():
        if planner_data.get(k) != path:
            _fail(case, f"planner_data[{k!r}] = {planner_data.get(k)!r}, want {path!r}")

    # the files: names, and items tiling each file with no gap
    spans = {}
    for info in res["storage"].values():
        spans.setdefault(info.get("relative_path"), []).append(
            (info.get("offset"), info.get("length")))
    for name in os.listdir(ckpt):
        if name == ".metadata":
            continue
        if not re.fullmatch(r"__\d+_\d+\.distcp", name):
            _fail(case, f"unexpected file {name}")
        pos = 0
        for off, length in sorted(spans.get(name, [])):
            if off != pos:
                _fail(case, f"{name}: gap or overlap at {pos}")
            pos = off + length
        if pos != os.path.getsize(os.path.join(ckpt, name)):
            _fail(case, f"{name}: items end at {pos}, file is longer")
    missing = set(spans) - set(os.listdir(ckpt))
    if missing:
        _fail(case, f"storage_data names missing files {missing}")

    if res["raw"][:2] != b"\x80\x04":
        _fail(case, f".metadata is not pickle protocol 4: {res['raw'][:2]!r}")
    if producer == "standin":
        fields = list(md.state)
        if fields != FIELDS[case.layout]:
            _fail(case, f"Metadata fields {fields} != {FIELDS[case.layout]}")
        for entry in md.get("state_dict_metadata").values():
            if entry.name != "TensorStorageMetadata":
                continue
            props = entry.get("properties")
            enc = props.state[3]
            if props.module != PROPS_MODULE[case.layout]:
                _fail(case, f"TensorProperties from {props.module}")
            want_by = "value" if case.layout == "v2.2" else "name"
            if not isinstance(enc, EnumMember) or enc.by != want_by:
                _fail(case, f"memory-format enum pickled {enc!r}, want by {want_by}")
        sm = md.get("storage_meta")
        if sm is not None:
            want_sm = ["checkpoint_id", "save_id", "load_id"] + (
                ["modules"] if case.layout == "v2.7" else [])
            if list(sm.state) != want_sm:
                _fail(case, f"StorageMeta fields {list(sm.state)}")

    # patterns against the chunks
    for k, pattern in truth["patterns"].items():
        entry = md.get("state_dict_metadata")[k]
        chunks = entry.get("chunks")
        size = tuple(entry.get("size"))
        boxes = [(tuple(c.get("offsets")), tuple(c.get("sizes"))) for c in chunks]
        if pattern in ("Replicate", "Unique"):
            if boxes != [(tuple(0 for _ in size), size)]:
                _fail(case, f"{k}: {pattern} but chunks {boxes}")
        elif truth_mod.classify(size, boxes, 1) != pattern:
            _fail(case, f"{k}: chunks {boxes} do not show {pattern}")
    return res


def generate(case, out_root, mode, compare_standin=False):
    path = choose_path(case, mode)
    dest = os.path.join(out_root, case.name)
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    ckpt = os.path.join(tmp, "checkpoint")
    states = truth_mod.fake_states(case)
    if path == "standin":
        note = write_standin(case, states, ckpt)
        producer = "standin"
    else:
        note = real.run_case(case, ckpt)
        producer = "real-dcp"
    truth = truth_mod.build_truth(case, states, producer, note)
    verify(case, ckpt, truth, producer)
    torch.save(truth, os.path.join(tmp, "truth.pt"))
    title = f"{case.name} ({producer}, layout {case.layout}): {case.about}"
    with open(os.path.join(tmp, "layout.txt"), "w") as f:
        f.write(reader.layout_text(ckpt, title))
    if compare_standin and producer == "real-dcp":
        compare_with_standin(case, states, ckpt)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(dest) for f in fs)
    files = sorted(os.listdir(os.path.join(dest, "checkpoint")))
    print(f"{case.name:<18} {producer:<8} {size:>8} bytes  {' '.join(files)}")


def compare_with_standin(case, states, real_ckpt):
    """On a torch 2.x machine: how far are the stand-ins from real DCP's bytes?"""
    with tempfile.TemporaryDirectory() as d:
        mine = os.path.join(d, "checkpoint")
        write_standin(case, states, mine)
        names = sorted(set(os.listdir(mine)) | set(os.listdir(real_ckpt)))
        for name in names:
            a, b = os.path.join(real_ckpt, name), os.path.join(mine, name)
            if not (os.path.exists(a) and os.path.exists(b)):
                print(f"  compare {case.name}: {name} only in {'real' if os.path.exists(a) else 'standin'}")
                continue
            with open(a, "rb") as fa, open(b, "rb") as fb:
                same = fa.read() == fb.read()
            print(f"  compare {case.name}: {name}: {'identical' if same else 'DIFFERENT'}")
        la = reader.layout_text(real_ckpt, "real").splitlines()
        lb = reader.layout_text(mine, "standin").splitlines()
        for line in difflib.unified_diff(la, lb, "real", "standin", lineterm="", n=0):
            print("    " + line)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    ap.add_argument("--case", action="append", help="case name (repeatable; default: all)")
    ap.add_argument("--path", choices=("auto", "standin", "real"), default="auto")
    ap.add_argument("--compare-standin", action="store_true",
                    help="with real DCP: also write the stand-in version and diff the two")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)

    if args.list:
        for c in cases_mod.CASES:
            print(f"{c.name:<18} {c.layout}  {c.about}")
        return 0
    selected = cases_mod.CASES
    if args.case:
        try:
            selected = [cases_mod.get(n) for n in args.case]
        except KeyError as e:
            raise SystemExit(f"unknown case {e}; --list shows them")
    reason = real.unavailable_reason()
    print(f"torch {torch.__version__}; real DCP: {'available' if reason is None else reason}")
    os.makedirs(args.out, exist_ok=True)
    for case in selected:
        generate(case, args.out, args.path, args.compare_standin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
