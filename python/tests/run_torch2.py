"""Runs test_ucp.py's single-process tests under torch 2.x (the chroot of scripts/torch2-chroot.sh), from the
folder capi's TestPython prepares: pkg/ucp (with libucp.so), pkg/tests, meg, meg_truth.pt, ds, ds_truth.pt, frozen,
frozen_truth.pt."""
import os
import subprocess
import sys

import torch

print("torch", torch.__version__, flush=True)
r = subprocess.run([sys.executable, "pkg/tests/test_ucp.py", "meg", "meg_truth.pt", "ds", "ds_truth.pt", "--quick",
                    "--frozen", "frozen", "frozen_truth.pt"],
                   env=dict(os.environ, UCP_LIBRARY="pkg/ucp/libucp.so"))
sys.exit(r.returncode)
