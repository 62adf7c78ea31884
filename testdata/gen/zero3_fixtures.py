#!/usr/bin/python3
"""Generate synthetic DeepSpeed ZeRO-3 checkpoints from known full tensors.

Each case under testdata/fixtures/zero3/<case>/ holds checkpoint/ (latest + global_step3/*.pt, laid out
and pickled as DeepSpeed's ZeRO-3 engine writes them) and truth.pt (the full unsharded state).
Deterministic: running it twice gives identical bytes.

  /usr/bin/python3 testdata/gen/zero3_fixtures.py [--out DIR] [--case NAME ...] [--check] [--compare-real]

--check re-reads every written case and rebuilds the full tensors with an independent reader
(z3gen/check.py); --compare-real also compares tinylm_dp2 with DeepSpeed's own
testdata/fixtures/deepspeed-real/z3_dp2_fp32 (they must agree bit for bit, data.pkl included, except
for the fp32 padding garbage); --oracle GIT_DIR runs DeepSpeed's own zero_to_fp32.py and
ds_to_universal.py, read from a DeepSpeed git mirror, on the output (z3gen/oracle.py).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from z3gen import cases, check, oracle, writer  # noqa: E402

DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "fixtures", "zero3"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: testdata/fixtures/zero3)")
    ap.add_argument("--case", action="append", choices=sorted(cases.BY_NAME), help="only this case (repeatable)")
    ap.add_argument("--check", action="store_true", help="verify the written cases against truth.pt")
    ap.add_argument("--compare-real", action="store_true",
                    help="compare tinylm_dp2 with deepspeed-real/z3_dp2_fp32")
    ap.add_argument("--oracle", metavar="GIT_DIR",
                    help="run DeepSpeed's zero_to_fp32/ds_to_universal from this DeepSpeed git mirror")
    ap.add_argument("--no-write", action="store_true", help="only run the checks on existing output")
    args = ap.parse_args(argv)
    selected = [cases.BY_NAME[n] for n in args.case] if args.case else cases.CASES
    for case in selected:
        if not args.no_write:
            files = writer.write_case(case, args.out)
            print(f"{case.name}: {len(files)} files")
        if args.check:
            check.check_case(case, args.out)
            print(f"{case.name}: check ok")
    if args.compare_real:
        check.compare_real(args.out)
        print("tinylm_dp2 matches deepspeed-real/z3_dp2_fp32")
    if args.oracle:
        oracle.run(args.out, args.oracle)


if __name__ == "__main__":
    main()
