"""Check an atomic checkpoint written by ucp against a truth file, with real torch.

Usage: check_atomic.py ATOMIC_DIR TRUTH.pt [--universal DIR]
       check_atomic.py --batch CASES.json   (a list of {"name", "atomic", "truth", "universal"}:
                                             many checks for one import of torch)

Every zero/<param>/<state>.pt must load with torch.load(weights_only=True)
(except files holding a SubparamShape object), hold a float32 tensor of the
truth's shape, and equal the truth bit for bit. Frozen parameters and buffers
(the truth's "frozen" and "buffers") must be kept in their own dtype: their
fp32.pt holds the truth's dtype bit for bit, and ucp.json records that dtype. With --universal, the step
values and dict keys are compared with DeepSpeed's own ds_to_universal output.
Exits non-zero with one line per mismatch.
"""
import json
import os
import pickle
import sys
import types

import torch


def stub_modules():
    # Classes DeepSpeed pickles into optimizer and model-state files: enough
    # to unpickle them for comparison, never to run DeepSpeed code.
    import dataclasses
    import enum

    def mod(name):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            n = ".".join(parts[:i])
            if n not in sys.modules:
                sys.modules[n] = types.ModuleType(n)
        return sys.modules[name]

    m = mod("deepspeed.checkpoint.universal_checkpoint")

    @dataclasses.dataclass
    class SubparamShape:
        patterns: list
        shape: tuple
        partition_dim: int

    SubparamShape.__module__ = m.__name__
    m.SubparamShape = SubparamShape


def load(path, weights_only):
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except TypeError:
        return torch.load(path, map_location="cpu")


def bits(t):
    t = t.contiguous()
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16)
    return t


def main():
    args = sys.argv[1:]
    stub_modules()
    if args[:1] == ["--batch"]:
        failed = 0
        for case in json.load(open(args[1])):
            print("== " + case["name"], flush=True)
            errors = check(case["atomic"], case["truth"], case.get("universal"))
            failed += bool(errors)
            print("== result %s %d" % (case["name"], len(errors)), flush=True)
        sys.exit(1 if failed else 0)
    universal = None
    if "--universal" in args:
        i = args.index("--universal")
        universal = args[i + 1]
        del args[i : i + 2]
    atomic_dir, truth_path = args
    sys.exit(1 if check(atomic_dir, truth_path, universal) else 0)


def check(atomic_dir, truth_path, universal):
    truth = load(truth_path, False)
    manifest = json.load(open(os.path.join(atomic_dir, "ucp.json")))
    errors = []
    names = {p["name"] for p in manifest["params"]}
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        for name, want in truth.get(state, {}).items():
            path = os.path.join(atomic_dir, "zero", name, state + ".pt")
            if not os.path.exists(path):
                errors.append(f"{name}/{state}: missing {path}")
                continue
            try:
                d = load(path, True)
            except Exception as e:  # SubparamShape needs the full unpickler
                d = load(path, False)
                if "sub_param_shape" not in d:
                    errors.append(f"{name}/{state}: weights_only load failed: {e}")
                    continue
            got = d["param"] if isinstance(d, dict) else d
            want = want.float()
            if got.dtype != torch.float32:
                errors.append(f"{name}/{state}: dtype {got.dtype}")
            elif tuple(got.shape) != tuple(want.shape):
                errors.append(f"{name}/{state}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
            elif not torch.equal(bits(got), bits(want)):
                diff = (bits(got) != bits(want)).nonzero()
                errors.append(f"{name}/{state}: {len(diff)} elements differ, first at {diff[0].tolist()}")
            if universal is not None:
                up = os.path.join(universal, "zero", name, state + ".pt")
                if os.path.exists(up):
                    ud = load(up, False)
                    if isinstance(ud, dict):
                        uk = [k for k in ud.keys()]
                        gk = [k for k in d.keys()]
                        if uk != gk:
                            errors.append(f"{name}/{state}: keys {gk}, DeepSpeed wrote {uk}")
                        for k in uk:
                            if k != "param" and k in d and ud[k] != d[k]:
                                errors.append(f"{name}/{state}: {k}={d[k]!r}, DeepSpeed wrote {ud[k]!r}")
    for name, keys in (truth.get("universal") or {}).items():
        # The dict keys DeepSpeed's universal loader reads, besides 'param'.
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            path = os.path.join(atomic_dir, "zero", name, state + ".pt")
            if not os.path.exists(path):
                continue
            d = load(path, False)
            got = [(k, v) for k, v in d.items() if k != "param"]
            want = list(keys.items())
            if [k for k, _ in got] != [k for k, _ in want]:
                errors.append(f"{name}/{state}: keys {[k for k, _ in got]}, want {[k for k, _ in want]}")
                continue
            for (k, g), (_, w) in zip(got, want):
                if hasattr(g, "__dataclass_fields__"):
                    g = {f: getattr(g, f) for f in g.__dataclass_fields__}
                if g != w:
                    errors.append(f"{name}/{state}: {k}={g!r}, want {w!r}")
    dtypes = {p["name"]: p.get("dtype") for p in manifest["params"]}
    for key in ("frozen", "buffers"):
        for name, want in (truth.get(key) or {}).items():
            path = os.path.join(atomic_dir, "zero", name, "fp32.pt")
            if not os.path.exists(path):
                errors.append(f"{name} ({key}): missing {path}")
                continue
            d = load(path, True)
            got = d["param"] if isinstance(d, dict) else d
            wname = str(want.dtype).replace("torch.", "")
            if dtypes.get(name) != wname:
                errors.append(f"{name} ({key}): manifest dtype {dtypes.get(name)!r}, want {wname!r}")
            if got.dtype != want.dtype:
                errors.append(f"{name} ({key}): dtype {got.dtype}, want {want.dtype}")
            elif tuple(got.shape) != tuple(want.shape):
                errors.append(f"{name} ({key}): shape {tuple(got.shape)}, want {tuple(want.shape)}")
            elif not torch.equal(bits(got), bits(want)):
                errors.append(f"{name} ({key}): values differ")
    for name in truth.get("fp32", {}):
        if name not in names:
            errors.append(f"{name}: not in the manifest")
    step = truth.get("step", None)
    if step is not None:
        for name in truth.get("fp32", {}):
            path = os.path.join(atomic_dir, "zero", name, "step.pt")
            want = step[name] if isinstance(step, dict) else step
            if not os.path.exists(path):
                errors.append(f"{name}: no step.pt")
                continue
            try:
                got = load(path, True)
            except pickle.UnpicklingError:  # torch < 2: weights_only has no BINFLOAT (a float step)
                got = load(path, False)
            if type(got) != type(want) or (torch.is_tensor(got) and not (got.dtype == want.dtype and torch.equal(got, want))) or (
                not torch.is_tensor(got) and got != want
            ):
                errors.append(f"{name}/step: {got!r}, want {want!r}")
    for e in errors:
        print(e)
    print(f"checked {len(truth.get('fp32', {}))} parameters: {len(errors)} mismatches")
    return errors


if __name__ == "__main__":
    main()
