"""Optional cross-check: run DeepSpeed's own zero_to_fp32.py and ds_to_universal.py on the fixtures.

DeepSpeed is not installed; its two scripts are read at run time from a git mirror of
github.com/microsoft/DeepSpeed (`git show HEAD:<path>`), with small shims for what torch 1.13 and
this machine lack (torch.load(mmap=...), tqdm, the deepspeed package itself). Nothing is copied
into the repository. Prints, per case, whether DeepSpeed's result equals truth.pt.
"""
import contextlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import types

import torch

from . import stubs


def _source(git_dir, path):
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def _shim(git_dir):
    stubs.register()
    if not getattr(torch.load, "_z3_shim", False):
        orig = torch.load

        def load(*a, **k):
            k.pop("mmap", None)
            k.pop("weights_only", None)
            return orig(*a, **k)
        load._z3_shim = True
        torch.load = load
    tq = types.ModuleType("tqdm")
    tq.tqdm = lambda it, **k: it
    sys.modules.setdefault("tqdm", tq)
    consts = types.ModuleType("deepspeed.checkpoint")
    exec(_source(git_dir, "deepspeed/checkpoint/constants.py"), consts.__dict__)
    consts.DeepSpeedCheckpoint = consts.SubparamShape = object  # only the ZeRO <= 2 paths use them
    sys.modules["deepspeed.checkpoint"] = sys.modules["deepspeed.checkpoint.constants"] = consts
    utils = types.ModuleType("deepspeed.utils")
    utils.logger = logging.getLogger("deepspeed")
    sys.modules["deepspeed.utils"] = utils


def _module(git_dir, path, name):
    mod = types.ModuleType(name)
    mod.__file__ = path
    exec(compile(_source(git_dir, path), path, "exec"), mod.__dict__)
    return mod


def run(out_root, git_dir):
    _shim(git_dir)
    z2f = _module(git_dir, "deepspeed/utils/zero_to_fp32.py", "ds_zero_to_fp32")
    d2u = _module(git_dir, "deepspeed/checkpoint/ds_to_universal.py", "ds_to_universal")
    for case in sorted(os.listdir(out_root)):
        cdir = os.path.join(out_root, case)
        if not os.path.isfile(os.path.join(cdir, "truth.pt")):
            continue
        t = torch.load(os.path.join(cdir, "truth.pt"))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                sd = z2f.get_fp32_state_dict_from_zero_checkpoint(os.path.join(cdir, "checkpoint"))
            bad = [n for n in t["param_names"] if not torch.equal(sd[n].float(), t["fp32"][n])]
            bad += [n for n in t["frozen"] if not torch.equal(sd[n], t["frozen"][n])]
            bad += [n for n in t["buffers"] if not torch.equal(sd[n], t["buffers"][n].float())]
            bad += [a for a, s in t["shared_params"].items() if not torch.equal(sd[a], t["fp32"][s])]
            z = "ok" if not bad else f"WRONG {bad}"
        except Exception as e:  # noqa: BLE001 - report DeepSpeed's failure
            z = f"raises {type(e).__name__}: {str(e)[:90]}"
        tmp = tempfile.mkdtemp()
        try:
            args = types.SimpleNamespace(input_folder=os.path.join(cdir, "checkpoint", t["meta"]["tag"]),
                                         output_folder=os.path.join(tmp, "u"), num_extract_workers=1,
                                         num_merge_workers=1, keep_temp_folder=False, strict=True,
                                         inject_missing_state=True)
            with contextlib.redirect_stdout(io.StringIO()):
                d2u.main(args)
            bad = []
            for n in t["param_names"]:
                for k in ("fp32", "exp_avg", "exp_avg_sq"):
                    x = torch.load(os.path.join(tmp, "u", "zero", n, k + ".pt"))
                    x = x["param"] if isinstance(x, dict) else x
                    if x.numel() != t[k][n].numel() or not torch.equal(x.reshape(-1), t[k][n].reshape(-1)):
                        bad.append(f"{n}/{k} ({x.numel()} elements, truth {t[k][n].numel()})")
            u = "ok" if not bad else f"WRONG {bad[:3]}{' ...' if len(bad) > 3 else ''}"
        except Exception as e:  # noqa: BLE001
            u = f"raises {type(e).__name__}: {str(e)[:90]}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"{case}:\n  zero_to_fp32: {z}\n  ds_to_universal: {u}")
