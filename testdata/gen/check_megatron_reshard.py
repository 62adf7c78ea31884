"""Check folders written by `ucp reshard --to megatron` with real torch and the independent reader.

Usage: check_megatron_reshard.py CASE_DIR...   (each CASE_DIR holds truth.pt and checkpoint/)

For every case, mgen/check.py (which uses only the files, the args in them and the layout rules
of formats/megatron/NOTES.md) loads every model_optim_rng.pt and distrib_optim.pt with
torch.load, rebuilds each atomic tensor (fp32 main, exp_avg, exp_avg_sq), the 16-bit model
weights, the tied copies and the step, and compares them with the source fixture's truth.pt.
Two of its checks do not apply to a resharded folder and are left out: the parallel patterns
(they follow the written TP, not the source's) and the step's Python type (the distributed
optimizer saves a torch Adam step tensor as a float; its value is still compared).
Exit 0 when every case passes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mgen.check import check_case  # noqa: E402


def main():
    failed = 0
    for case in sys.argv[1:]:
        errs = []
        for e in check_case(case):
            if ": pattern " in e:
                continue
            if e.startswith("step ") and "!=" in e:
                got, want = e[len("step "):].split(" != truth ")
                try:
                    if float(got) == float(want.replace("tensor(", "").rstrip(")")):
                        continue
                except ValueError:
                    pass
            errs.append(e)
        if errs:
            failed += 1
            print(f"FAIL {case}:")
            for e in errs:
                print("  " + e)
        else:
            print(f"ok   {case}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
