#!/usr/bin/python3
"""Generate the safetensors fixtures under testdata/fixtures/safetensors/.

Run with Debian's /usr/bin/python3 (torch 1.13). The safetensors package is
not available here, so files are built byte by byte following the reference
writer (huggingface/safetensors `prepare` + `serialize`): tensors sorted by
dtype in descending order of the Rust enum, then by name; offsets assigned
back to back; compact serde_json header with __metadata__ first and fields
dtype, shape, data_offsets; padded with spaces to a multiple of 8. Tensor
bytes and expected float32 values come from real torch tensors.

Two files deliberately deviate from that writer and must still be read: one
written as older writers did (sorted by name only, unpadded, unaligned) and
one with a hand-written pretty header (keys out of offset order, escapes, an
unknown field, __metadata__ last).

The output is deterministic: re-running gives identical bytes.
"""
import json
import os
import struct
import sys

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "safetensors")

# Rust enum order of safetensors::Dtype; the writer sorts by it, descending.
RANK = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
        "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
        "F64", "I64", "U64"]

ST_NAME = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: take the bits
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def json_str(s):
    """Quote s as serde_json does (compact writer)."""
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\r":
            out.append("\\r")
        elif c < 0x20:
            out.append("\\u%04x" % c)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def layout(tensors, order):
    """Return [(name, tensor, dtype name, begin, end)] in file order."""
    items = [(n, t, ST_NAME[t.dtype]) for n, t in tensors.items()]
    if order == "reference":
        # Python str order is code point order, which is UTF-8 byte order.
        items.sort(key=lambda x: x[0])
        items.sort(key=lambda x: RANK.index(x[2]), reverse=True)  # stable
    elif order == "name":
        items.sort(key=lambda x: x[0])
    else:
        raise ValueError(order)
    out, at = [], 0
    for n, t, d in items:
        b = tensor_bytes(t)
        out.append((n, t, d, at, at + len(b), b))
        at += len(b)
    return out


def compact_header(entries, metadata):
    parts = []
    if metadata is not None:
        kv = ",".join(json_str(k) + ":" + json_str(metadata[k]) for k in sorted(metadata))
        parts.append('"__metadata__":{' + kv + "}")
    for n, t, d, b, e, _ in entries:
        shape = ",".join(str(x) for x in t.shape)
        parts.append('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}' % (json_str(n), d, shape, b, e))
    return ("{" + ",".join(parts) + "}").encode("utf-8")


def assemble(header, entries, pad=True):
    if pad:
        header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + b"".join(x[5] for x in entries)


def expected(data, entries, metadata):
    n = struct.unpack("<Q", data[:8])[0]
    ts = []
    for name, t, d, b, e, raw in entries:
        ts.append({
            "name": name,
            "dtype": d,
            "shape": list(t.shape),
            "offset": 8 + n + b,
            "nbytes": e - b,
            "hex": raw.hex(),
            "f32_hex": tensor_bytes(t.to(torch.float32)).hex(),
        })
    return {"size": len(data), "header_len": n, "metadata": metadata, "tensors": ts}


def canonical(tensors, metadata):
    entries = layout(tensors, "reference")
    data = assemble(compact_header(entries, metadata), entries)
    return data, expected(data, entries, metadata)


def fixtures():
    nan, inf = float("nan"), float("inf")
    files = {}

    files["all_dtypes"] = canonical({
        "f64": torch.tensor([[0.0, -0.0, 1.5], [-2.25, 1e300, 5e-324], [inf, -inf, nan]], dtype=torch.float64),
        "f32": torch.tensor([[0.1, -3.5, 1e-45], [3.4028234663852886e38, -inf, nan]], dtype=torch.float32),
        "f32_3d": (torch.arange(24, dtype=torch.float32) * 0.5 - 3).reshape(2, 3, 4),
        "f16": torch.tensor([[1.0, -2.0, 65504.0, 5.960464477539063e-08], [inf, nan, 0.1, -0.0]], dtype=torch.float16),
        "bf16": torch.tensor([1.0, -2.5, 3.3895313892515355e38, 9.183549615799121e-41, inf, nan, 0.1], dtype=torch.bfloat16),
        "i64": torch.tensor([0, -1, 2**63 - 1, -2**63, 2**53 + 1, 16777217], dtype=torch.int64),
        "i32": torch.tensor([0, -1, 2**31 - 1, -2**31, 16777217], dtype=torch.int32),
        "i16": torch.tensor([[0, -1], [32767, -32768]], dtype=torch.int16),
        "i8": torch.tensor([0, -1, 127, -128, 5], dtype=torch.int8),
        "u8": torch.tensor([0, 1, 128, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True], dtype=torch.bool),
    }, {"format": "pt"})

    files["scalar_empty"] = canonical({
        "step": torch.tensor(7, dtype=torch.int64),
        "lr": torch.tensor(0.25, dtype=torch.float32),
        "flag": torch.tensor(True),
        "empty_f32": torch.zeros((0, 3), dtype=torch.float32),
        "empty_bf16": torch.zeros((3, 0, 2), dtype=torch.bfloat16),
        "empty_u8": torch.zeros((0,), dtype=torch.uint8),
        "vec": torch.tensor([1.0, 2.0], dtype=torch.float16),
    }, None)

    files["names"] = canonical({
        "model.layers.0.self_attn.q_proj.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "model/embed_tokens/weight": torch.tensor([[1, 2], [3, 4]], dtype=torch.bfloat16),
        "émbed.ünicode.重み": torch.tensor([3.0], dtype=torch.float16),
        "quote\"back\\slash": torch.tensor([1], dtype=torch.int8),
        "tab\tnew\nline\x01\x1f\x7f": torch.tensor([2], dtype=torch.int8),
        "with space": torch.tensor([3], dtype=torch.int8),
        "": torch.tensor([4], dtype=torch.int8),
        "lm_head.weight": torch.tensor([[0.5, -0.5]], dtype=torch.float32),
    }, {"format": "pt", "description": "héllo \"world\"\n\ttab", "empty": "",
        "DCP_SHARDING_INFO": '{"w": {"saved_offsets": [0, 0]}}'})

    files["metadata_only"] = canonical({}, {"format": "pt", "note": "no tensors"})

    # The two worked examples of the spec (sections 7 and 8).
    files["spec_example1"] = canonical({
        "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
    }, {"format": "pt"})
    files["spec_example2"] = canonical({
        "step": torch.tensor(10, dtype=torch.int64),
        "e": torch.zeros((0, 4), dtype=torch.float16),
        "m": torch.tensor([1, 2, 3], dtype=torch.uint8),
    }, None)

    # As older writers did: sorted by name only, header not padded, so
    # payloads sit at unaligned offsets.
    old = {
        "a_u8": torch.tensor([9, 8, 7], dtype=torch.uint8),
        "b_f32": torch.tensor([1.25, -7.5], dtype=torch.float32),
        "c_i64": torch.tensor([-5, 1 << 40], dtype=torch.int64),
        "d_bf16": torch.tensor([0.5, -1.0, 2.0], dtype=torch.bfloat16),
    }
    entries = layout(old, "name")
    header = compact_header(entries, {"format": "pt"})
    if len(header) % 8 == 0:
        header += b" "
    data = assemble(header, entries, pad=False)
    files["unaligned"] = (data, expected(data, entries, {"format": "pt"}))

    # Hand-written header: pretty-printed, keys not in offset order,
    # escapes (\u00e9, \/), an unknown field, __metadata__ last, CR/LF.
    t = {
        "x/y": torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64),
        "é": torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
        "z": torch.zeros((0,), dtype=torch.float32),
    }
    entries = layout(t, "reference")  # x/y [0,24), z [24,24), é [24,40)
    by = {e[0]: e for e in entries}
    header = ("{\r\n"
              '  "z" : {"data_offsets": [%d, %d], "shape": [0], "dtype": "F32"},\n'
              '  "\\u00e9": {"shape": [2, 2], "dtype": "I32", "data_offsets": [%d, %d],\n'
              '          "extra": {"nested": [1, 2.5e-3, null, true, false, "s"]}},\n'
              '  "x\\/y": {"dtype": "F64", "shape": [3], "data_offsets": [%d, %d]},\n'
              '  "__metadata__": {"format": "pt", "k\\n": "v\\u0041"}\n'
              "}\t  ") % (by["z"][3], by["z"][4], by["é"][3], by["é"][4], by["x/y"][3], by["x/y"][4])
    data = assemble(header.encode("utf-8"), entries, pad=False)
    files["pretty"] = (data, expected(data, entries, {"format": "pt", "k\n": "vA"}))
    return files


def main():
    os.makedirs(OUT, exist_ok=True)
    want = {}
    for name, (data, exp) in sorted(fixtures().items()):
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(data)
        want[name + ".safetensors"] = exp
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"torch_version": torch.__version__, "files": want}, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    print("wrote %d fixtures to %s" % (len(want), os.path.normpath(OUT)), file=sys.stderr)


if __name__ == "__main__":
    main()
