#!/usr/bin/python3
"""Loads files that ucp's Go writer produced with real torch.load and
compares them with what the writer meant to write.

usage: /usr/bin/python3 testdata/gen/check_roundtrip.py DIR

DIR/manifest.json (written by torchfile's TestRoundTripTorch):
  {"files": [{"file": "a.pt", "prefix": "a", "weights_only": true,
              "root": <typed value>}]}
with the typed value encoding of torch_fixtures.py; tensors are
  {"t":"tensor","dtype":..,"shape":[..],"hex":..,"requires_grad":..,"group":n}
where tensors of one group must share one storage and different groups
must not. Every file is also checked with Python's zipfile (CRC-32 of
every member). Exits 1 listing every mismatch, 0 when all files match.
"""

import collections
import json
import os
import struct
import sys
import zipfile

import torch

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool,
    "complex64": torch.complex64, "complex128": torch.complex128,
}


def tensor_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


class Checker:
    def __init__(self, name):
        self.name = name
        self.errors = []
        self.groups = {}    # group -> storage id
        self.storages = {}  # storage id -> group

    def err(self, path, msg):
        self.errors.append("%s: %s: %s" % (self.name, path or "root", msg))

    def check(self, path, want, got):
        t = want["t"]
        if t == "none":
            if got is not None:
                self.err(path, "got %r, want None" % (got,))
        elif t == "bool":
            if type(got) is not bool or got != want["v"]:
                self.err(path, "got %r, want %r" % (got, want["v"]))
        elif t == "int":
            if type(got) is not int or got != int(want["v"]):
                self.err(path, "got %r, want int %s" % (got, want["v"]))
        elif t == "float":
            if type(got) is not float or struct.pack(">d", got).hex() != want["bits"]:
                self.err(path, "got %r, want float bits %s" % (got, want["bits"]))
        elif t == "str":
            if type(got) is not str or got != want["v"]:
                self.err(path, "got %r, want %r" % (got, want["v"]))
        elif t == "bytes":
            if type(got) is not bytes or got.hex() != want["hex"]:
                self.err(path, "got %r, want bytes %s" % (got, want["hex"]))
        elif t == "size":
            if type(got) is not torch.Size or list(got) != want["v"]:
                self.err(path, "got %r, want torch.Size(%r)" % (got, want["v"]))
        elif t == "dtype":
            if got is not DTYPES[want["v"]]:
                self.err(path, "got %r, want torch.%s" % (got, want["v"]))
        elif t in ("list", "tuple"):
            typ = list if t == "list" else tuple
            if type(got) is not typ or len(got) != len(want["items"]):
                self.err(path, "got %s, want %s of %d" % (type(got).__name__, t, len(want["items"])))
                return
            for i, (w, g) in enumerate(zip(want["items"], got)):
                self.check("%s[%d]" % (path, i), w, g)
        elif t == "set":
            typ = frozenset if want["frozen"] else set
            if type(got) is not typ or len(got) != len(want["items"]):
                self.err(path, "got %r, want %s of %d" % (got, typ.__name__, len(want["items"])))
                return
            rest = list(got)
            for i, w in enumerate(want["items"]):
                for j, g in enumerate(rest):
                    sub = Checker(self.name)
                    sub.check("", w, g)
                    if not sub.errors:
                        del rest[j]
                        break
                else:
                    self.err(path, "set item %d (%s) missing" % (i, json.dumps(w)))
        elif t == "dict":
            typ = collections.OrderedDict if want["kind"] == "OrderedDict" else dict
            if type(got) is not typ or len(got) != len(want["items"]):
                self.err(path, "got %s of %d, want %s of %d" % (
                    type(got).__name__, len(got) if isinstance(got, dict) else -1,
                    want["kind"], len(want["items"])))
                return
            for i, ((wk, wv), (gk, gv)) in enumerate(zip(want["items"], got.items())):
                self.check("%s<key %d>" % (path, i), wk, gk)
                self.check("%s[%r]" % (path, gk), wv, gv)
            attrs = dict(vars(got)) if hasattr(got, "__dict__") else {}
            if "attrs" in want:
                self.check(path + ".__dict__", want["attrs"], attrs)
            elif attrs:
                self.err(path, "unexpected attributes %r" % (attrs,))
        elif t == "object":
            cls = type(got)
            name = cls.__module__ + "." + cls.__qualname__
            if name != want["class"]:
                self.err(path, "got %s, want %s" % (name, want["class"]))
                return
            if "state" in want:
                self.check(path + ".__dict__", want["state"], dict(vars(got)))
        elif t == "tensor":
            self.tensor(path, want, got)
        else:
            self.err(path, "unknown manifest type %r" % t)

    def tensor(self, path, want, got):
        if type(got) is not torch.Tensor:
            self.err(path, "got %s, want torch.Tensor" % type(got).__name__)
            return
        if got.dtype is not DTYPES[want["dtype"]] or list(got.shape) != want["shape"]:
            self.err(path, "got %s%s, want %s%s" % (got.dtype, list(got.shape), want["dtype"], want["shape"]))
            return
        if got.requires_grad != want["requires_grad"]:
            self.err(path, "requires_grad %s, want %s" % (got.requires_grad, want["requires_grad"]))
        if not got.is_contiguous() or got.storage_offset() != 0:
            self.err(path, "not a plain contiguous tensor (stride %s, offset %d)" % (got.stride(), got.storage_offset()))
        data = tensor_bytes(got)
        if data.hex() != want["hex"]:
            n = next((i for i in range(min(len(data), len(want["hex"]) // 2))
                      if data[i] != int(want["hex"][2 * i:2 * i + 2], 16)), None)
            self.err(path, "bytes differ (%d vs %d bytes, first difference at byte %s)" % (
                len(data), len(want["hex"]) // 2, n))
        sid = got.storage()._cdata
        g = want["group"]
        if self.groups.setdefault(g, sid) != sid:
            self.err(path, "tensor group %d does not share one storage" % g)
        if self.storages.setdefault(sid, g) != g:
            self.err(path, "groups %d and %d share a storage" % (self.storages[sid], g))


def check_zip(path, prefix, errors):
    name = os.path.basename(path)
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()  # reads every member and checks its CRC-32
        if bad is not None:
            errors.append("%s: zipfile CRC check failed on %s" % (name, bad))
        names = z.namelist()
        if not names or any(n.split("/", 1)[0] != prefix for n in names):
            errors.append("%s: records %s are not all under %s/" % (name, names, prefix))
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                errors.append("%s: %s is compressed" % (name, info.filename))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    with open(os.path.join(root, "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    errors = []
    for entry in manifest["files"]:
        path = os.path.join(root, entry["file"])
        check_zip(path, entry["prefix"], errors)
        try:
            got = torch.load(path, weights_only=entry["weights_only"])
        except Exception as e:  # report every file, not only the first failure
            errors.append("%s: torch.load(weights_only=%s) failed: %s" % (entry["file"], entry["weights_only"], e))
            continue
        c = Checker(entry["file"])
        c.check("", entry["root"], got)
        errors.extend(c.errors)
    if not manifest["files"]:
        errors.append("manifest lists no files")
    for e in errors:
        print(e)
    if errors:
        sys.exit(1)
    print("ok: %d files match (torch %s)" % (len(manifest["files"]), torch.__version__))


if __name__ == "__main__":
    main()
