#!/usr/bin/python3
"""Generate DeepSpeed ZeRO-1/2 checkpoints (plain, Megatron-DeepSpeed TP/PP) with known truth.

Run with Debian's /usr/bin/python3 (torch 1.13):

    /usr/bin/python3 testdata/gen/deepspeed_fixtures.py                 # all cases -> testdata/fixtures/deepspeed/
    /usr/bin/python3 testdata/gen/deepspeed_fixtures.py --case z2_fp16_dp3
    /usr/bin/python3 testdata/gen/deepspeed_fixtures.py --verify        # regenerate, then check every case
    /usr/bin/python3 testdata/gen/deepspeed_fixtures.py --verify-only   # check the files already there
    /usr/bin/python3 testdata/gen/deepspeed_fixtures.py --large --out /tmp/dsbig [--large-mb 200]
    /usr/bin/python3 testdata/gen/deepspeed_fixtures.py --dump testdata/fixtures/deepspeed/z2_fp16_dp3
    /usr/bin/python3 testdata/gen/dsgen/oracle.py --ds-src /path/to/DeepSpeed   # DeepSpeed's own converters

Every case first creates the full fp32 tensors, Adam moments and step, then shards them the way
DeepSpeed and Megatron-DeepSpeed do and writes each file with torch.save (see dsgen/build.py).
DeepSpeed's own pickled classes are stand-ins registered under their real module paths
(dsgen/stubs.py). Output is deterministic: re-running gives identical bytes.
"""
import argparse
import os
import shutil
import sys

sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dsgen import cases, verify, writer  # noqa: E402

DEFAULT_OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "deepspeed"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: testdata/fixtures/deepspeed)")
    ap.add_argument("--case", action="append", help="only this case (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--verify", action="store_true", help="check the written cases against their truth")
    ap.add_argument("--verify-only", action="store_true", help="check existing cases without regenerating")
    ap.add_argument("--large", action="store_true", help="write only the large throughput case (into --out)")
    ap.add_argument("--large-mb", type=int, default=200, help="approximate size of the large case")
    ap.add_argument("--dump", metavar="PATH", nargs="+", help="print the structure of .pt files (or folders) and exit")
    args = ap.parse_args()
    if args.dump:
        from dsgen import dump
        dump.main(args.dump)
        return 0

    todo = [cases.large_case(args.large_mb)] if args.large else cases.all_cases()
    if args.list:
        for c in todo:
            print(f"{c.name}: {c.desc}")
        return 0
    if args.large and os.path.abspath(args.out) == DEFAULT_OUT:
        ap.error("--large needs --out: the large case is not committed")
    if args.case:
        known = {c.name for c in todo}
        unknown = [n for n in args.case if n not in known]
        if unknown:
            ap.error(f"unknown case(s) {unknown}; known: {sorted(known)}")
        todo = [c for c in todo if c.name in args.case]

    os.makedirs(args.out, exist_ok=True)
    failed = 0
    for c in todo:
        folder = os.path.join(args.out, c.name)
        if not args.verify_only:
            if os.path.isdir(folder):
                shutil.rmtree(folder)
            writer.write_case(c, args.out)
            print(f"wrote {folder}")
        if args.verify or args.verify_only:
            problems = verify.verify_case(folder, large=c.large)
            if problems:
                failed += 1
                print(f"FAIL {c.name}:")
                for p in problems:
                    print(f"    {p}")
            else:
                print(f"ok   {c.name}")
    if args.verify or args.verify_only:
        print(f"{len(todo) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
