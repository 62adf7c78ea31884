#!/usr/bin/python3
"""Writes testdata/fixtures/torch/: small files saved by real torch.save and,
beside each NAME.pt, NAME.json with what torch itself reads back from it.

Run with Debian's torch 1.13:  /usr/bin/python3 testdata/gen/torch_fixtures.py

Everything is deterministic: tensors come from arange/bit patterns and a
seeded numpy generator, and the storage keys of legacy files (which torch
derives from memory addresses) are replaced by fixed fake addresses while
torch writes the file, so a re-run gives identical bytes.

JSON value encoding (typed, because JSON cannot tell int/float/tuple apart):
  {"t":"none"} {"t":"bool","v":true} {"t":"int","v":"123"} (decimal string)
  {"t":"float","bits":"3ff0000000000000"} (IEEE-754 bits, big-endian hex)
  {"t":"str","v":"..."} {"t":"bytes","hex":"..."}
  {"t":"list"|"tuple","items":[...]} {"t":"set","frozen":false,"items":[...]}
  {"t":"dict","kind":"dict"|"OrderedDict","items":[[k,v],...],"attrs":{...}?}
  {"t":"size","v":[2,3]} {"t":"dtype","v":"float16"}
  {"t":"enum","class":"mod.Name","name":"RED"}
  {"t":"object","class":"mod.Name","via":"newobj"|"reduce","args":[...],"state":...?}
  {"t":"tensor","dtype":"float32","shape":[..],"stride":[..],"offset":n,
   "key":"0","storage_numel":n,"requires_grad":false,"parameter":false,
   "hex":"<elements in row-major order, little-endian>",
   "float32_hex":"<torch's t.float() bytes>"}   (float32_hex only for
   fp16/bf16/fp64/int64 tensors)
Per file: {"file","format","prefix","root","storages":{key:{dtype,numel,hex}}}.

convert.json + convert_*.bin check dtype.ToFloat32 against torch's .float();
cast.json checks dtype.FromFloat32 against torch's .to(bfloat16/float16);
pickle_protoN.pkl + pickles.json check pyobj's unpickler against CPython's
pickle at protocols 0-5. Consumers: internal/torchfile/fixtures_test.go,
internal/dtype/torch_test.go, internal/pyobj/unpickle_test.go; testdata/corrupt/ is derived
from these files by internal/torchfile/corrupt_test.go (-update-corrupt).
"""

import argparse
import collections
import copyreg
import dataclasses
import enum
import hashlib
import io
import json
import math
import os
import pickle
import struct
import sys
import types
import zlib

# Set iteration order (and so the pickled bytes) depends on string hashing.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))

import numpy as np
import torch

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "fixtures", "torch"))

# Custom classes live in a named module so that pickles say
# "ucp_fixture_types.Color" rather than "__main__.Color".
MOD = types.ModuleType("ucp_fixture_types")
sys.modules[MOD.__name__] = MOD


class Color(enum.Enum):
    RED = 1
    GREEN = "g"


@dataclasses.dataclass
class Point:
    x: int
    y: float
    label: str


for _cls in (Color, Point):
    _cls.__module__ = MOD.__name__
    setattr(MOD, _cls.__name__, _cls)

DTYPE_NAMES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int8: "int8", torch.int16: "int16",
    torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8",
    torch.bool: "bool", torch.complex64: "complex64", torch.complex128: "complex128",
}
CONVERTED = (torch.float16, torch.bfloat16, torch.float64, torch.int64)


# ---------------------------------------------------------------- objects


def f16(bits):
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.float16)


def bf16(bits):
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def f32(bits):
    return torch.tensor(np.array(bits, dtype=np.uint32).view(np.int32)).view(torch.float32)


def f64(bits):
    return torch.tensor(np.array(bits, dtype=np.uint64).view(np.int64)).view(torch.float64)


def obj_dtypes():
    d = collections.OrderedDict()
    d["f32"] = torch.arange(-3, 3, dtype=torch.float32).reshape(2, 3) * 0.5
    d["f16"] = (torch.arange(8, dtype=torch.float32) * 0.3 - 1).to(torch.float16)
    d["f64"] = torch.linspace(-1, 1, 5, dtype=torch.float64) / 3
    d["bf16"] = (torch.arange(6, dtype=torch.float32) * 1.7 - 3).to(torch.bfloat16).reshape(3, 2)
    d["i8"] = torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8)
    d["i16"] = torch.tensor([-32768, -2, 0, 3, 32767], dtype=torch.int16)
    d["i32"] = torch.tensor([-2**31, -5, 0, 7, 2**31 - 1], dtype=torch.int32)
    d["i64"] = torch.tensor([-2**63, -9, 0, 11, 2**63 - 1, 2**60 + 2**36 + 1], dtype=torch.int64)
    d["u8"] = torch.tensor([0, 1, 128, 255], dtype=torch.uint8)
    d["bool"] = torch.tensor([[True, False, True], [False, False, True]], dtype=torch.bool)
    d["c64"] = torch.tensor([1 + 2j, -3.5 + 0.25j], dtype=torch.complex64)
    d["c128"] = torch.tensor([1 + 2j, 1e300 - 1e-300j], dtype=torch.complex128)
    return d


def obj_views():
    base = torch.arange(12, dtype=torch.float32)
    flat = torch.arange(20, dtype=torch.float32).to(torch.float16) - 7  # a ZeRO-style flat buffer
    m = torch.arange(24, dtype=torch.int64).reshape(4, 6) * 1000 - 5000
    bm = (torch.arange(12, dtype=torch.float32) / 8 - 0.7).to(torch.bfloat16).reshape(3, 4)
    d = collections.OrderedDict()
    d["base"] = base
    d["view"] = base[4:10].view(2, 3)
    d["t"] = base.view(3, 4).t()
    d["every2"] = base.view(3, 4)[:, ::2]
    d["step3"] = base[1::3]
    d["row"] = base.view(3, 4)[1]
    d["col"] = base.view(3, 4)[:, 2]
    d["elem"] = base[5]
    # The flat buffer itself is not saved: only views at different offsets.
    d["p0"] = flat[0:6].view(2, 3)
    d["p1"] = flat[6:10]
    d["p2"] = flat[10:20].view(5, 2)
    d["p2t"] = flat[10:20].view(5, 2).t()
    d["strided2d"] = m[::2, 1::2]
    d["strided_rev_dims"] = m.t()[1:5:2, ::3]
    d["perm"] = torch.arange(24, dtype=torch.int32).reshape(2, 3, 4).permute(2, 0, 1)
    d["bf_t"] = bm.t()[1:]
    d["list_of_views"] = [base[0:2], base[2:4], flat[3:5]]
    d["expanded"] = torch.arange(3, dtype=torch.int16).view(3, 1).expand(3, 4)  # stride (1, 0)
    d["expanded_scalar"] = torch.tensor(7, dtype=torch.int8).expand(2, 3)     # stride (0, 0)
    return d


def obj_values():
    shared = [1, "shared"]
    d = collections.OrderedDict()
    d["ints"] = [0, 1, 255, 256, 65535, 65536, -1, -256, 2**31 - 1, -2**31, 2**31,
                 -2**31 - 1, 2**40, -2**40, 2**63 - 1, -2**63, 2**63, 2**64,
                 2**70, -2**70, 2**2400 + 12345, -(2**2400)]
    d["floats"] = [0.0, -0.0, 1e-3, 1.5, -2.25, math.inf, -math.inf, math.nan,
                   5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1 / 3]
    d["strs"] = ["", "ascii", "héllo wörld", "日本語", "🚀 emoji", "tab\tnewline\n", "nul\x00byte",
                 "x" * 300]
    d["consts"] = [None, True, False]
    d["nested"] = {"a": {"b": {"c": [1, (2, 3), {"d": [4, [5, [6, (7,)]]]}]}}}
    d["empty"] = [{}, [], (), collections.OrderedDict()]
    d["tuples"] = [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4, 5), ((), ((),))]
    d["ordered"] = collections.OrderedDict([("z", 1), ("a", 2), ("m", 3)])
    d["int_keys"] = {1: "one", -5: "neg", 2**40: "big", 0: "zero"}
    d["mixed_keys"] = {(1, "a"): "tuple key", None: "none key", True: "bool key", 2.5: "float key"}
    d["big_list"] = list(range(1001))
    d["big_dict"] = {"k%d" % i: i for i in range(1001)}
    d["size"] = torch.Size([2, 3, 4])
    d["size0"] = torch.Size([])
    d["dtype"] = torch.float16
    d["dtype_bf16"] = torch.bfloat16
    d["dtypes"] = [torch.float32, torch.int64, torch.bool, torch.uint8]
    d["bytes"] = b"\x00\x01\xffabc"
    d["empty_bytes"] = b""
    d["set"] = {3, 1, 2}
    d["frozenset"] = frozenset(["only"])
    d["shared_a"] = shared
    d["shared_b"] = shared
    return d


def obj_objects():
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4)
        lin.bias.copy_(torch.tensor([-1.0, 1.0]))
    d = collections.OrderedDict()
    d["args"] = argparse.Namespace(lr=0.001, layers=4, name="gpt", flags=[1, 2], sub=None)
    d["color"] = Color.RED
    d["color_g"] = Color.GREEN
    d["point"] = Point(1, 2.5, "p")
    d["param"] = torch.nn.Parameter(torch.arange(4, dtype=torch.float32))
    d["param_frozen"] = torch.nn.Parameter(torch.ones(2, dtype=torch.float16), requires_grad=False)
    d["grad_tensor"] = torch.ones(2, requires_grad=True)
    d["state_dict"] = lin.state_dict()  # an OrderedDict with a _metadata attribute
    d["device"] = torch.device("cpu")
    return d


def obj_empty():
    d = collections.OrderedDict()
    d["e_f32"] = torch.empty(0)
    d["e_3x0"] = torch.zeros(3, 0, dtype=torch.float16)
    d["e_0x4"] = torch.zeros(0, 4, dtype=torch.int64)
    d["e_bool"] = torch.zeros(0, dtype=torch.bool)
    d["e_view_end"] = torch.arange(6, dtype=torch.float32)[6:]
    d["s_f32"] = torch.tensor(3.5)
    d["s_i64"] = torch.tensor(-7)
    d["s_bf16"] = torch.tensor(1.25, dtype=torch.bfloat16)
    d["s_bool"] = torch.tensor(True)
    d["s_f64"] = torch.tensor(-0.0, dtype=torch.float64)
    return d


F16_SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
               0x7E00, 0xFE00, 0x7C01, 0x7D55, 0xFE01, 0x7FFF, 0x3C00, 0x3555, 0x0200]
BF16_SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80,
                0x7FC0, 0xFFC0, 0x7F81, 0x7FA5, 0xFFC1, 0x7FFF, 0x3F80, 0x3EAB, 0x0040]
F32_SPECIAL = [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000,
               0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
               0x7F800001, 0x7FA5A5A5, 0xFFC00123, 0x7FFFFFFF, 0x3F800000, 0x3EAAAAAB]
F64_SPECIAL = [
    0x0000000000000000, 0x8000000000000000, 0x0000000000000001, 0x800FFFFFFFFFFFFF,
    0x0010000000000000, 0x7FEFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000,
    0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF4000000000000,
    0x7FF8000000000123, 0xFFF80000DEADBEEF, 0x7FFFFFFFFFFFFFFF, 0x3FF0000000000000,
    0x3FF0000010000000,  # 1 + 2^-24: a tie, rounds to even (1.0)
    0x3FF0000030000000,  # 1 + 3*2^-24: a tie, rounds up
    0x3FF0000010000001,  # just above the tie: rounds up
    0x3FEFFFFFF0000000,  # 1 - 2^-25: tie below 1.0
    0x47EFFFFFE0000000,  # fp32 max + half ulp: tie, rounds to inf
    0x47EFFFFFDFFFFFFF,  # just below that: fp32 max
    0x36A0000000000000,  # 2^-149: fp32 min subnormal
    0x3690000000000000,  # 2^-150: tie between 0 and min subnormal -> 0
    0x3690000000000001,  # just above: min subnormal
    0x36A8000000000000,  # 1.5 * 2^-149: tie -> 2 * 2^-149
    0x380FFFFFF0000000,  # rounds up into the fp32 normal range
    0x3FD5555555555555,  # 1/3
]


def obj_special():
    d = collections.OrderedDict()
    d["f16"] = f16(F16_SPECIAL)
    d["bf16"] = bf16(BF16_SPECIAL)
    d["f32"] = f32(F32_SPECIAL)
    d["f64"] = f64(F64_SPECIAL)
    return d


# ---------------------------------------------------------------- saving

FAKE_ADDR = 140000000000000  # legacy keys: equal-length decimal "addresses"


class _KeyMap:
    """Maps torch's address-derived legacy storage keys to fixed ones."""

    def __init__(self):
        self.map = {}

    def key(self, real):
        if real not in self.map:
            self.map[real] = str(FAKE_ADDR + 64 * len(self.map))
        return self.map[real]


def legacy_save(obj, f):
    """torch.save(..., _use_new_zipfile_serialization=False) with stable keys.

    torch writes every byte; we only rename the keys on their way into the
    pickles and make the storage order follow the renamed keys."""
    km = _KeyMap()

    class Pickler(pickle._Pickler):
        @property
        def persistent_id(self):
            inner = self.__dict__["_pid"]

            def pid(o):
                r = inner(o)
                if r is not None and r[0] == "storage":
                    r = r[:2] + (km.key(r[2]),) + r[3:]
                return r
            return pid

        @persistent_id.setter
        def persistent_id(self, fn):
            self.__dict__["_pid"] = fn

    def dump(o, fh, protocol):
        if isinstance(o, list) and all(isinstance(k, str) for k in o):
            o = [km.key(k) for k in o]  # the sorted key list
        return pickle.dump(o, fh, protocol=protocol)

    mod = types.SimpleNamespace(Pickler=Pickler, dump=dump, __name__="pickle")
    ser = torch.serialization
    had = "sorted" in ser.__dict__
    ser.sorted = lambda keys: sorted(keys, key=km.key)
    try:
        torch.save(obj, f, pickle_module=mod, _use_new_zipfile_serialization=False)
    finally:
        if not had:
            del ser.sorted


def recording_load(path):
    """torch.load(weights_only=False) that also returns {key: storage}."""
    seen = {}

    class Unpickler(pickle._Unpickler):
        @property
        def persistent_load(self):
            inner = self.__dict__["_pl"]

            def pl(pid):
                s = inner(pid)
                seen[pid[2]] = s
                return s
            return pl

        @persistent_load.setter
        def persistent_load(self, fn):
            self.__dict__["_pl"] = fn

    # torch 1.13 (Debian) replaces any pickle_module argument of torch.load
    # by its module global `pickle` when weights_only=False: swap that.
    mod = types.ModuleType("pickle")
    mod.__dict__.update(pickle.__dict__)
    mod.Unpickler = Unpickler
    ser = torch.serialization
    real = ser.pickle
    ser.pickle = mod
    try:
        obj = torch.load(path)
    finally:
        ser.pickle = real
    return obj, seen


# ---------------------------------------------------------------- encoding


def tensor_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


class Encoder:
    def __init__(self, storages):
        # _cdata identifies the storage behind a TypedStorage wrapper.
        self.keys = {s._cdata: k for k, s in storages.items()}

    def tensor(self, t, parameter):
        st = t.storage()
        e = {
            "t": "tensor", "dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
            "stride": list(t.stride()), "offset": t.storage_offset(),
            "key": self.keys[st._cdata], "storage_numel": st.size(),
            "requires_grad": t.requires_grad, "parameter": parameter,
            "hex": tensor_bytes(t).hex(),
        }
        if t.dtype in CONVERTED:
            e["float32_hex"] = tensor_bytes(t.detach().float()).hex()
        return e

    def enc(self, v):
        if isinstance(v, torch.nn.Parameter):
            return self.tensor(v, True)
        if isinstance(v, torch.Tensor):
            return self.tensor(v, False)
        if v is None:
            return {"t": "none"}
        if isinstance(v, bool):
            return {"t": "bool", "v": v}
        if isinstance(v, int) and not isinstance(v, enum.Enum):
            return {"t": "int", "v": str(v)}
        if isinstance(v, float):
            return {"t": "float", "bits": struct.pack(">d", v).hex()}
        if isinstance(v, str):
            return {"t": "str", "v": v}
        if isinstance(v, (bytes, bytearray)):
            return {"t": "bytes", "hex": bytes(v).hex()}
        if isinstance(v, torch.Size):
            return {"t": "size", "v": list(v)}
        if isinstance(v, tuple):
            return {"t": "tuple", "items": [self.enc(x) for x in v]}
        if isinstance(v, list):
            return {"t": "list", "items": [self.enc(x) for x in v]}
        if isinstance(v, dict):
            e = {"t": "dict", "kind": "OrderedDict" if isinstance(v, collections.OrderedDict) else "dict",
                 "items": [[self.enc(k), self.enc(x)] for k, x in v.items()]}
            if getattr(v, "__dict__", None):
                e["attrs"] = self.enc(dict(v.__dict__))
            return e
        if isinstance(v, (set, frozenset)):
            return {"t": "set", "frozen": isinstance(v, frozenset), "items": [self.enc(x) for x in v]}
        if isinstance(v, torch.dtype):
            return {"t": "dtype", "v": DTYPE_NAMES[v]}
        if isinstance(v, enum.Enum):
            return {"t": "enum", "class": type(v).__module__ + "." + type(v).__qualname__, "name": v.name}
        r = v.__reduce_ex__(2)
        if r[0] is copyreg.__newobj__:
            cls, args, via = r[1][0], r[1][1:], "newobj"
        else:
            cls, args, via = r[0], r[1], "reduce"
        e = {"t": "object", "class": cls.__module__ + "." + cls.__qualname__, "via": via,
             "args": [self.enc(a) for a in args]}
        if len(r) > 2 and r[2] is not None:
            e["state"] = self.enc(r[2])
        return e


def describe(path, name, fmt, prefix):
    obj, storages = recording_load(path)
    enc = Encoder(storages)
    return {
        "file": name, "format": fmt, "prefix": prefix, "root": enc.enc(obj),
        "storages": {k: {"dtype": DTYPE_NAMES[s.dtype], "numel": s.size(),
                         "hex": bytes(s.untyped().tolist()).hex()}
                     for k, s in sorted(storages.items())},
    }


def write_json(path, doc):
    with open(path, "w", encoding="utf-8") as fh:
        # Compact: the value trees are large; `python3 -m json.tool` shows them.
        json.dump(doc, fh, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
        fh.write("\n")


def save_fixture(name, obj, legacy=False, via_bytesio=False):
    path = os.path.join(OUT, name)
    if legacy:
        with open(path, "wb") as fh:
            legacy_save(obj, fh)
        fmt, prefix = "torch-legacy", ""
    elif via_bytesio:
        buf = io.BytesIO()
        torch.save(obj, buf)
        with open(path, "wb") as fh:
            fh.write(buf.getvalue())
        fmt, prefix = "torch-zip", "archive"
    else:
        torch.save(obj, path)
        fmt, prefix = "torch-zip", name[: name.rindex(".")]
    write_json(path[: -len(".pt")] + ".json", describe(path, name, fmt, prefix))


# ---------------------------------------------------------------- conversions


def convert_fixture():
    """dtype.ToFloat32 vs torch .float(): exhaustive fp16/bf16, random and
    edge-case fp64/int64. Inputs that the Go test cannot generate itself
    are raw little-endian .bin files; outputs are SHA-256 of torch's
    float32 bytes plus CRC-32 per 4096-element chunk to locate a mismatch."""
    rng = np.random.default_rng(20240601)
    doc = {"note": "expected = torch %s Tensor.float() on this machine" % torch.__version__}

    def expect(t):
        out = tensor_bytes(t.float())
        crcs = ["%08x" % zlib.crc32(out[i:i + 4 * 4096]) for i in range(0, len(out), 4 * 4096)]
        return {"n": t.numel(), "sha256": hashlib.sha256(out).hexdigest(), "chunk_crc32": crcs}

    allbits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    doc["float16_all"] = expect(allbits.view(torch.float16))
    doc["bfloat16_all"] = expect(allbits.view(torch.bfloat16))

    f64bits = rng.integers(0, 2**64, size=4096, dtype=np.uint64, endpoint=False)
    # Half of them near the fp32 range so that rounding (not only overflow) is exercised.
    exp = rng.integers(1023 - 140, 1023 + 130, size=2048, dtype=np.uint64)
    f64bits[:2048] = (f64bits[:2048] & np.uint64(0x800FFFFFFFFFFFFF)) | (exp << np.uint64(52))
    f64bits = np.concatenate([np.array(F64_SPECIAL, dtype=np.uint64), f64bits])
    with open(os.path.join(OUT, "convert_float64.bin"), "wb") as fh:
        fh.write(f64bits.astype("<u8").tobytes())
    doc["float64_bin"] = expect(torch.from_numpy(f64bits.view(np.int64).copy()).view(torch.float64))

    i64 = rng.integers(-2**63, 2**63, size=4096, dtype=np.int64, endpoint=False)
    shifts = rng.integers(0, 63, size=4096).astype(np.int64)
    i64 = i64 >> shifts  # all magnitudes
    cases = np.array([0, 1, -1, 2**24, 2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**53 + 1, 2**60 + 2**36 + 1,
                      2**60 + 2**36, 2**60 + 3 * 2**36, -(2**60 + 2**36 + 1), 2**63 - 1, -2**63,
                      2**62 + 2**38 + 2**37, 2**62 + 2**38 + 2**37 + 1], dtype=np.int64)
    i64 = np.concatenate([cases, i64])
    with open(os.path.join(OUT, "convert_int64.bin"), "wb") as fh:
        fh.write(i64.astype("<i8").tobytes())
    doc["int64_bin"] = expect(torch.from_numpy(i64.copy()))

    # A few explicit cases for readable failures.
    explicit = []
    for name, t in (("float16", f16(F16_SPECIAL)), ("bfloat16", bf16(BF16_SPECIAL)),
                    ("float64", f64(F64_SPECIAL)), ("int64", torch.from_numpy(cases.copy()))):
        explicit.append({"dtype": name, "in": tensor_bytes(t).hex(), "out": tensor_bytes(t.float()).hex()})
    doc["explicit"] = explicit
    write_json(os.path.join(OUT, "convert.json"), doc)


# Low halves of the float32 inputs of cast.json: every high half (sign,
# exponent, top 7 mantissa bits) with each of these covers the bfloat16
# ties (0x8000) and the float16 ties (bit 12) with odd and even neighbours.
CAST_LOWS = [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x0FFF, 0x1000, 0x1001,
             0x2000, 0x3000, 0x5000, 0xE000]


def cast_inputs():
    """The float32 bit patterns of cast.json, high half major; dtype/round_test.go
    builds the same list."""
    hi = torch.arange(65536, dtype=torch.int64).repeat_interleave(len(CAST_LOWS))
    lo = torch.tensor(CAST_LOWS, dtype=torch.int64).repeat(65536)
    return (hi << 16) | lo


def cast_fixture():
    """dtype.FromFloat32 vs torch's Tensor.to(bfloat16 / float16): SHA-256 of
    torch's output bytes plus CRC-32 per 4096-element chunk. float16 leaves
    NaN inputs out (torch 1.13 and 2.x round NaN payloads differently)."""
    bits = cast_inputs()
    doc = {"note": "expected = torch %s Tensor.to(dtype) on this machine" % torch.__version__,
           "lows": CAST_LOWS}

    def expect(u):
        f = torch.from_numpy(u.numpy().astype(np.uint32).view(np.float32).copy())
        out = {}
        for name, dt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
            x = f
            if dt == torch.float16:
                x = f[~torch.isnan(f)]
            b = tensor_bytes(x.to(dt))
            crcs = ["%08x" % zlib.crc32(b[i:i + 2 * 4096]) for i in range(0, len(b), 2 * 4096)]
            out[name] = {"n": x.numel(), "sha256": hashlib.sha256(b).hexdigest(), "chunk_crc32": crcs}
        return out

    doc.update(expect(bits))
    write_json(os.path.join(OUT, "cast.json"), doc)


def pickle_fixture():
    """pickle_protoN.pkl: plain Python values pickled by CPython at protocols
    0-5 (no torch), and pickles.json with the value CPython reads back from
    each, to test pyobj's VM on every opcode family: text opcodes, framing,
    memoize, sets, bytes."""
    shared = ["shared", 1]
    value = collections.OrderedDict()
    value["ints"] = [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1, 2**31, 2**63 - 1, -2**63,
                     2**64, -2**70, 2**2100, -(2**2100) + 7, True, False]
    value["floats"] = [0.0, -0.0, 1.5, -2.25e-300, 1e300, math.inf, -math.inf, math.nan, 5e-324, 1 / 3]
    value["strs"] = ["", "ascii", "quote ' \" back\\slash", "nl\ncr\rnul\x00sub\x1a", "latin \xe9\xff",
                     "日本語 \u20ac", "🚀", "\\u0041 not an escape"]
    value["bytes"] = [b"", b"\x00\x01\xff\x80abc", bytearray(b"ba\x00"), bytearray()]
    value["none"] = None
    value["tuples"] = [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((), ((),))]
    value["dict"] = {"a": 1, 2: "b", (1, 2): [3], None: None, 2.5: "f"}
    value["big_list"] = list(range(1001))  # two APPENDS batches
    value["big_dict"] = {i: -i for i in range(1001)}
    value["set"] = {1, 2, 3, "x"}
    value["frozenset"] = frozenset([5, 6])
    value["nested"] = [[[[[]]]], {"x": {"y": {}}}]
    value["shared1"] = shared
    value["shared2"] = shared
    value["od"] = collections.OrderedDict([("b", 1), ("a", 2)])
    value["ns"] = argparse.Namespace(x=1, y="two")
    value["point"] = Point(3, 0.5, "q")
    value["color"] = Color.GREEN
    value["long_str"] = "L" * 300
    out, want = [], None
    for proto in range(6):
        data = pickle.dumps(value, protocol=proto)
        back = Encoder({}).enc(pickle.loads(data))
        if want is None:
            want = back
        elif back != want:
            raise RuntimeError("protocol %d reads back differently" % proto)
        name = "pickle_proto%d.pkl" % proto
        with open(os.path.join(OUT, name), "wb") as fh:
            fh.write(data)
        out.append({"proto": proto, "file": name})
    write_json(os.path.join(OUT, "pickles.json"), {"pickles": out, "value": want})


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, make in (("dtypes", obj_dtypes), ("views", obj_views), ("values", obj_values),
                       ("objects", obj_objects), ("empty", obj_empty), ("special", obj_special)):
        save_fixture(name + ".pt", make())
        save_fixture("legacy_" + name + ".pt", make(), legacy=True)
    save_fixture("bytesio.pt", obj_views(), via_bytesio=True)
    save_fixture("many.v1.pt", collections.OrderedDict(w=torch.arange(3, dtype=torch.float32)))
    convert_fixture()
    cast_fixture()
    pickle_fixture()


if __name__ == "__main__":
    main()
