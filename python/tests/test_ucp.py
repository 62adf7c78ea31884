"""Tests of the ucp Python package against real torch and the fixtures' truth files.

Run by capi's Go test (TestPython), which builds libucp.so and converts the fixtures first:

    python3 python/tests/test_ucp.py MEGATRON_ATOMIC MEGATRON_TRUTH DS_ATOMIC DS_TRUTH [--quick] [--frozen ATOMIC TRUTH]

--frozen names a conversion whose truth has frozen parameters and buffers ("frozen", "buffers"), kept in
their own dtype by the atomic checkpoint.

Every expected tensor is derived here from the truth file with torch alone, following the target framework's
own rules (Megatron's tensor-parallel sharding, DeepSpeed's ZeRO partitioning, torch.chunk for FSDP, torch's
AdamW step), never from ucp's metadata.
"""

import ctypes
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import ucp  # noqa: E402

MEG, MEG_TRUTH, DS, DS_TRUTH = (sys.argv[1:5] if len(sys.argv) >= 5 else [None] * 4)
QUICK = "--quick" in sys.argv  # torch 2.x run in the chroot: no multi-process tests
FROZEN = FROZEN_TRUTH = None
if "--frozen" in sys.argv:
    FROZEN, FROZEN_TRUTH = sys.argv[sys.argv.index("--frozen") + 1:][:2]


def bits_equal(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.float32:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def load_truth(path):
    return torch.load(path, map_location="cpu")


# ---- Megatron-LM's own tensor-parallel sharding, from the truth (megatron/core/tensor_parallel/layers.py,
# transformer/attention.py: fused QKV is laid out per query group [q_g; k_g; v_g], a rank holds ng/T groups).
def megatron_shard(truth, state, name, T, r):
    full = truth[state][name]
    if ".linear_qkv." in name and name.endswith("weight") and name in truth.get("qkv_parts", {}):
        parts = truth["qkv_parts"][name]
        if state == "fp32":  # the moments have no separate parts: their rows are grouped alike
            return megatron_qkv(parts["q"], parts["k"], parts["v"], truth["meta"]["num_query_groups"], T, r)
        return full.chunk(T, 0)[r].contiguous()  # grouped layout: a rank's query groups are contiguous rows
    if name.endswith("word_embeddings.weight") or name.startswith("output_layer"):
        vocab = full.shape[0]
        mult = truth["meta"]["vocab_divisor"] * T
        padded = (vocab + mult - 1) // mult * mult
        full = torch.cat([full, torch.zeros(padded - vocab, *full.shape[1:])])
        return full.chunk(T, 0)[r].contiguous()
    if ".linear_fc1.weight" in name and truth["meta"]["splits"].get(name) == "swiglu":
        w, v = full.chunk(2, 0)
        return torch.cat([w.chunk(T, 0)[r], v.chunk(T, 0)[r]]).contiguous()
    if ".linear_qkv.weight" in name or ".linear_fc1.weight" in name:
        return full.chunk(T, 0)[r].contiguous()
    if ".linear_proj.weight" in name or ".linear_fc2.weight" in name:
        return full.chunk(T, 1)[r].contiguous()
    return full


def megatron_qkv(q, k, v, ng, T, r):
    """Megatron's fused QKV rows on rank r of T, built from separate q, k, v projections."""
    qg, kg, vg = q.chunk(ng, 0), k.chunk(ng, 0), v.chunk(ng, 0)
    per = ng // T
    return torch.cat([torch.cat([qg[g], kg[g], vg[g]]) for g in range(r * per, (r + 1) * per)]).contiguous()


class Megatron(unittest.TestCase):
    """A converted Megatron TP2 x PP2 GQA (8 heads, 2 query groups) + SwiGLU checkpoint loaded back at TP 2
    and TP 1, compared with Megatron's sharding of the truth."""

    @classmethod
    def setUpClass(cls):
        cls.truth = load_truth(MEG_TRUTH)
        meta = cls.truth["meta"]
        ck = ucp.open(MEG)
        # Geometry the test's Megatron rules need, checked against the fixture's own description.
        meta["heads"], meta["num_query_groups"] = 8, 2
        meta["vocab_divisor"] = meta["padded_vocab_size"] // meta["tp"]
        assert ck.model == {"megatron": True, "heads": 8, "query_groups": 2, "vocab_divisor": 64}, ck.model
        ck.close()

    def test_open(self):
        with ucp.open(MEG) as ck:
            self.assertEqual(ck.names, list(self.truth["param_names"]))
            for n in ck.names:
                self.assertEqual(list(ck.params[n].shape), list(self.truth["shapes"][n]))
                self.assertEqual(ck.params[n].pattern, self.truth["patterns"][n])
            self.assertEqual(ck.degrees["tp"], 2)
            self.assertEqual(ck.degrees["pp"], 2)
            self.assertIn("exp_avg", ck.params[ck.names[0]].states)

    def check_tp(self, T, states=("fp32", "exp_avg", "exp_avg_sq")):
        n = 0
        for r in range(T):
            sd = ucp.load_state_dict(MEG, tp=T, tp_rank=r, states=states)
            for s in states:
                self.assertEqual(list(sd[s]), list(self.truth["param_names"]))
                for name, got in sd[s].items():
                    want = megatron_shard(self.truth, s, name, T, r)
                    self.assertTrue(bits_equal(got, want), f"TP {T} rank {r} {s} {name}: {tuple(got.shape)} vs {tuple(want.shape)}")
                    n += 1
        return n

    def test_tp2(self):
        self.assertEqual(self.check_tp(2), 2 * 3 * 15)

    def test_tp1(self):
        self.check_tp(1)

    def test_ucp_transport_alone(self):
        # transport="ucp" without a group: a ring of one in Go, into the same tensors as the plain reader.
        states = ("fp32", "exp_avg")
        want = ucp.load_state_dict(MEG, tp=2, tp_rank=1, states=states, dtype=torch.bfloat16)
        got = ucp.load_state_dict(MEG, tp=2, tp_rank=1, states=states, dtype=torch.bfloat16, transport="ucp",
                                  device="cpu")
        self.assertEqual(ucp.last_load_stats()["transport"], "ucp")
        for s in states:
            for n in want[s]:
                self.assertTrue(bits_equal(got[s][n], want[s][n]), (s, n))
        with self.assertRaises(ucp.UCPError) as cm:
            ucp.load_state_dict(MEG, transport="nccl")
        self.assertIn("transport='nccl'", str(cm.exception))
        if not torch.cuda.is_available():
            with self.assertRaises(ucp.UCPError):  # no CUDA here: a clear error, not a crash
                ucp.load_state_dict(MEG, transport="ucp", device="cuda:0")

    def test_qkv_groups_from_parts(self):
        # The fp32 QKV at TP 2 equals Megatron's per-group [q_g; k_g; v_g] built from separate projections.
        name = "decoder.layers.1.self_attention.linear_qkv.weight"
        parts = self.truth["qkv_parts"][name]
        for r in range(2):
            got = ucp.load_state_dict(MEG, tp=2, tp_rank=r, params=[name])["fp32"][name]
            self.assertTrue(bits_equal(got, megatron_qkv(parts["q"], parts["k"], parts["v"], 2, 2, r)))

    def test_dtype_casts_as_torch(self):
        for dt in (torch.bfloat16, torch.float16):
            sd = ucp.load_state_dict(MEG, tp=2, tp_rank=1, dtype=dt)
            for name, got in sd["fp32"].items():
                want = megatron_shard(self.truth, "fp32", name, 2, 1).to(dt)
                self.assertTrue(bits_equal(got, want), f"{dt} {name}")

    def test_step(self):
        sd = ucp.load_state_dict(MEG, states=("step",))
        want = self.truth["step"]
        for v in sd["step"].values():
            self.assertEqual(float(v), float(want))

    def test_padded_vocab(self):
        # padded_vocab_size re-pads to the given rows: at TP 2 of 200 rows, rank 1 holds only zero padding.
        name = "output_layer.weight"
        for r in range(2):
            t = ucp.load_state_dict(MEG, tp=2, tp_rank=r, params=[name], padded_vocab_size=200)["fp32"][name]
            want = self.truth["fp32"][name] if r == 0 else torch.zeros(100, 8)
            self.assertTrue(bits_equal(t, want))

    def test_states_string(self):
        # One state given as a string is that state, not its letters.
        one = ucp.load_state_dict(MEG, tp=2, tp_rank=1, states="fp32")
        two = ucp.load_state_dict(MEG, tp=2, tp_rank=1, states=("fp32",))
        self.assertEqual(list(one), ["fp32"])
        for n, t in two["fp32"].items():
            self.assertTrue(bits_equal(one["fp32"][n], t), n)

    def test_bad_input(self):
        cases = [
            (lambda: ucp.open(os.path.dirname(MEG)), "is not an atomic checkpoint"),
            (lambda: ucp.open(os.path.join(MEG, "ucp.json")), "is not an atomic checkpoint"),
            (lambda: ucp.load_state_dict(MEG, tp=4), "does not divide the 2 query groups"),
            (lambda: ucp.load_state_dict(MEG, tp=3), "does not divide the 8 attention heads"),
            (lambda: ucp.load_state_dict(MEG, tp=4, padded_vocab_size=130, params=["output_layer.weight"]),
             "does not divide the padded vocabulary of 130"),
            (lambda: ucp.load_state_dict(MEG, tp=2, padded_vocab_size=64, params=["output_layer.weight"]),
             "smaller than the checkpoint's 100"),
            (lambda: ucp.load_state_dict(MEG, states=("fp32", "momentum")), "has no state 'momentum'"),
            (lambda: ucp.load_state_dict(MEG, params=["nope.weight"]), "no parameter 'nope.weight'"),
            (lambda: ucp.load_state_dict(MEG, tp=2, tp_rank=2),
             "load_state_dict: tp_rank=2 is out of range for tp=2: ranks are 0 to 1"),
            (lambda: ucp.load_state_dict(MEG, tp=0),
             "load_state_dict: tp=0: the number of ranks must be at least 1"),
            (lambda: ucp.load_state_dict(MEG, tp="2"), "load_state_dict: tp='2' must be an integer"),
            (lambda: ucp.load_state_dict(MEG, states=None), "states=None: give a state name or a sequence"),
            (lambda: ucp.load_state_dict(MEG, states=("fp32", 1)), "1 is not a state name"),
            (lambda: ucp.load_fsdp_chunk(MEG, rank=-1, world=2),
             "load_fsdp_chunk: rank=-1 is out of range for world=2: ranks are 0 to 1"),
            (lambda: ucp.load_zero_partition(MEG, 2, 0, 4, ["output_layer.weight"]),
             "stage=4: ZeRO stage 4 is not 1, 2 or 3"),
            (lambda: ucp.load_zero_partition(MEG, 2, 5, 1, ["output_layer.weight"]),
             "load_zero_partition: dp_rank=5 is out of range for dp=2: ranks are 0 to 1"),
            (lambda: ucp.load_zero_partition(MEG, 0, 0, 1, ["output_layer.weight"]),
             "load_zero_partition: dp=0: the number of ranks must be at least 1"),
        ]
        for fn, msg in cases:
            with self.assertRaises(ucp.UCPError, msg=msg) as cm:
                fn()
            self.assertIn(msg, str(cm.exception))
        # A closed or forged handle: the Go side recovers cgo.Handle's panic into an error.
        ck = ucp.open(MEG)
        h = ck._h.h
        ck.close()
        for bad in (h, 987654321):
            with self.assertRaises(ucp.UCPError) as cm:
                ucp._lib.check(ucp._lib.lib().ucp_info(bad, ctypes.byref(ctypes.c_void_p())))
            self.assertIn("invalid", str(cm.exception))

    def test_corrupt_manifest(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "ucp.json"), "w") as f:
                f.write('{"format": "ucp-atomic", "version": 1, "params": [{"name": "../x"}]')
            with self.assertRaises(ucp.UCPError) as cm:
                ucp.open(d)
            self.assertIn("ucp.json", str(cm.exception))


# ---- DeepSpeed ZeRO partitioning rules (deepspeed/runtime/zero/stage_1_and_2.py, partition_parameters.py).
def zero12_partition(tensors, dp, r):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    align = 2 * dp
    total = (flat.numel() + align - 1) // align * align
    flat = torch.cat([flat, torch.zeros(total - flat.numel())])
    return flat.chunk(dp)[r]


def zero3_partition(tensors, dp, r):
    out = []
    for t in tensors:
        n = t.numel()
        per = (n + dp - 1) // dp
        padded = torch.cat([t.reshape(-1), torch.zeros(per * dp - n)])
        out.append(padded[r * per:(r + 1) * per])
    return torch.cat(out)


class TinyLM(torch.nn.Module):
    """The model the real DeepSpeed fixture trained (names as in its checkpoint)."""

    def __init__(self, vocab=37, hidden=11, ffn=29, seq=7, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(seq, hidden)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.ln, b.fc1, b.fc2 = torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)
            self.blocks.append(b)
        self.ln_f = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        h = self.embed(x) + self.pos(torch.arange(x.shape[1]))
        for b in self.blocks:
            h = h + b.fc2(torch.nn.functional.gelu(b.fc1(b.ln(h))))
        return self.head(self.ln_f(h))


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)


class DeepSpeed(unittest.TestCase):
    """The real DeepSpeed ZeRO-1 dp 2 checkpoint, converted: ZeRO partitions at new dp, FSDP chunks, and a
    plain torch resume whose next AdamW step equals the uninterrupted run's."""

    @classmethod
    def setUpClass(cls):
        cls.truth = load_truth(DS_TRUTH)
        cls.names = list(cls.truth["param_names"])

    def test_zero_partitions_new_dp(self):
        for stage, rule in ((1, zero12_partition), (2, zero12_partition), (3, zero3_partition)):
            for dp in (3, 4):
                for r in range(dp):
                    got = ucp.load_zero_partition(DS, dp=dp, dp_rank=r, stage=stage, param_order=self.names)
                    for s in ("fp32", "exp_avg", "exp_avg_sq"):
                        want = rule([self.truth[s][n] for n in self.names], dp, r)
                        self.assertTrue(bits_equal(got[s], want), f"stage {stage} dp {dp} rank {r} {s}")

    def test_fsdp_chunks(self):
        for world in (2, 3):
            for r in range(world):
                got = ucp.load_fsdp_chunk(DS, rank=r, world=world, states=("fp32", "exp_avg"))
                for s in ("fp32", "exp_avg"):
                    for n in self.names:
                        chunks = self.truth[s][n].chunk(world, 0)
                        want = chunks[r] if r < len(chunks) else self.truth[s][n][:0]
                        self.assertTrue(bits_equal(got[s][n], want.contiguous()), f"{world} {r} {s} {n}")

    def batch(self):
        g = torch.Generator().manual_seed(7)
        x = torch.randint(0, 37, (2, 7), generator=g)
        y = torch.randint(0, 37, (2, 7), generator=g)
        return x, y

    def step(self, model, opt):
        x, y = self.batch()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    def test_resume_next_step_bit_exact(self):
        torch.manual_seed(0)
        # The uninterrupted run: the live state DeepSpeed's engine held after step 3 (truth.pt).
        ref = TinyLM()
        with torch.no_grad():
            for n, p in ref.named_parameters():
                p.copy_(self.truth["fp32"][n])
        ref_opt = adamw(ref.parameters())
        step = float(self.truth["base_optimizer_step"][0])
        for n, p in ref.named_parameters():
            ref_opt.state[p] = {"step": torch.tensor(step), "exp_avg": self.truth["exp_avg"][n].clone(),
                                "exp_avg_sq": self.truth["exp_avg_sq"][n].clone()}
        # The resumed run: a fresh model and optimizer, loaded from the converted checkpoint.
        torch.manual_seed(1)
        model = TinyLM()
        opt = adamw(model.parameters())
        res = ucp.load_into(model, opt, path=DS)
        self.assertEqual(res, ucp.LoadResult([], []))
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            self.assertTrue(bits_equal(p.data, q.data), n)
            self.assertEqual(float(opt.state[p]["step"]), step)
        l1, l2 = self.step(ref, ref_opt), self.step(model, opt)
        self.assertEqual(l1, l2)
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            self.assertTrue(bits_equal(p.data, q.data), f"after the step: {n}")
            for s in ("exp_avg", "exp_avg_sq", "step"):
                self.assertTrue(torch.equal(opt.state[p][s], ref_opt.state[q][s]), f"{n} {s}")
        self.assertEqual(ucp.last_load_stats()["bytes_read"], 3 * 4 * sum(t.numel() for t in self.truth["fp32"].values()))

    def test_load_into_bf16_model(self):
        model = TinyLM().to(torch.bfloat16)
        ucp.load_into(model, path=DS)
        for n, p in model.named_parameters():
            self.assertTrue(bits_equal(p.data, self.truth["fp32"][n].to(torch.bfloat16)), n)

    def test_load_into_bad_input(self):
        class Other(TinyLM):
            def __init__(self):
                super().__init__()
                self.extra = torch.nn.Linear(2, 2)
        with self.assertRaises(ucp.UCPError) as cm:
            ucp.load_into(Other(), path=DS)
        self.assertIn("do not match", str(cm.exception))
        self.assertIn("extra.weight", str(cm.exception))
        res = ucp.load_into(Other(), path=DS, strict=False)
        self.assertEqual(res.missing_keys, ["extra.weight", "extra.bias"])
        with self.assertRaises(ucp.UCPError) as cm:
            ucp.load_into(TinyLM(ffn=30), path=DS)
        self.assertIn("has shape", str(cm.exception))
        m = TinyLM()
        with self.assertRaises(ucp.UCPError) as cm:
            ucp.load_into(m, torch.optim.SGD(m.parameters(), lr=1), path=DS)
        self.assertIn("Adam or AdamW", str(cm.exception))
        with self.assertRaises(ucp.UCPError) as cm:
            ucp.load_into(m, torch.optim.AdamW(m.parameters(), amsgrad=True), path=DS)
        self.assertIn("max_exp_avg_sq", str(cm.exception))


# ---- Hostile sizes and files (reliability round 3: faults 5, 8 and 10).
BAD_SIZES = r"""
import sys
sys.path.insert(0, sys.argv[1])
import ucp
ck = sys.argv[2]
calls = {
    "fsdp world 2**31-1": lambda: ucp.load_fsdp_chunk(ck, rank=5, world=2**31 - 1),
    "tp 2**30": lambda: ucp.load_state_dict(ck, tp=2**30, tp_rank=3),
    "tp 2**32+2": lambda: ucp.load_state_dict(ck, tp=2**32 + 2, tp_rank=1),
    "tp 2**70": lambda: ucp.load_state_dict(ck, tp=2**70, tp_rank=1),
    "zero dp 2**40": lambda: ucp.load_zero_partition(ck, dp=2**40, dp_rank=1, stage=3, param_order=None),
    "padded vocab -1": lambda: ucp.load_state_dict(ck, padded_vocab_size=-1),
    "timeout nan": lambda: ucp.load_state_dict(ck, timeout=float("nan")),
}
for what, fn in calls.items():
    try:
        fn()
        print("LOADED", what, flush=True)
    except ucp.UCPError as e:
        print("UCPERROR", what, "|", e, flush=True)
    except BaseException as e:
        print("OTHER", what, "|", type(e).__name__, e, flush=True)
"""


class Hostile(unittest.TestCase):
    """Sizes and files an operator or a broken job could pass: the training process sees UCPError only."""

    def test_bad_sizes(self):
        # Under an address-space limit: ucp must refuse before allocating, not abort the process.
        import resource
        lim = 6 << 30
        r = subprocess.run([sys.executable, "-c", BAD_SIZES, os.path.join(os.path.dirname(ucp.__file__), ".."), DS],
                           capture_output=True, text=True, timeout=300,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (lim, lim)))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 7, r.stdout + r.stderr)
        for l in lines:
            self.assertTrue(l.startswith("UCPERROR"), l)
        self.assertIn("world=2147483647", lines[0])
        self.assertIn("tp=4294967298", lines[2])

    def test_abi_sizes(self):
        L, i64 = ucp._lib.lib(), ctypes.c_int64
        out = ctypes.c_void_p()
        for numels, msg in (([10, -5], "numel -5"), ([1 << 62, 1 << 62], "numel"), ([(1 << 49), (1 << 49), 1 << 49], "add up")):
            arr = (i64 * len(numels))(*numels)
            with self.assertRaises(ucp.UCPError) as cm:
                ucp._lib.check(L.ucp_zero_pieces(2, 2, 0, arr, len(numels), ctypes.byref(out)))
            self.assertIn(msg, str(cm.exception))
        arr = (i64 * 1)(4)
        for count, dp, rank in ((-1, 2, 0), (1 << 40, 2, 0), (1, 1 << 40, 0), (1, 2, -1)):
            with self.assertRaises(ucp.UCPError):
                ucp._lib.check(L.ucp_zero_pieces(2, dp, rank, arr, count, ctypes.byref(out)))
        with ucp.open(DS) as ck:
            name = ck.names[0]
            for n, rank in ((1 << 32 | 2, 1), (-1, 0), (2, 2), (1 << 40, 3)):
                with self.assertRaises(ucp.UCPError):
                    ck._h.shard_shape(name, "fp32", ucp._lib.LAYOUT_CHUNK, n, rank, 0)
            buf = torch.zeros(4)
            with self.assertRaises(ucp.UCPError):  # more elements than the shard holds
                ck._h.read(name, "fp32", 0, 1, 0, 0, 0, 1 << 60, 0, buf.data_ptr(), 16)

    def copy_ds(self, d):
        import shutil
        dst = os.path.join(d, "ck")
        shutil.copytree(DS, dst)
        return dst

    def state_file(self, ck, name, state="fp32"):
        import json
        with open(os.path.join(ck, "ucp.json")) as f:
            m = json.load(f)
        p = next(p for p in m["params"] if p["name"] == name)
        return os.path.join(ck, next(f["path"] for f in p["files"] if f["state"] == state))

    def test_load_into_atomic(self):
        with tempfile.TemporaryDirectory() as d:
            ck = self.copy_ds(d)
            names = [n for n, _ in TinyLM().named_parameters()]
            path = self.state_file(ck, names[-1])
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) - 64)
            for stage in (True, False):
                m = TinyLM()
                with torch.no_grad():
                    for p in m.parameters():
                        p.fill_(7.0)
                opt = adamw(m.parameters())
                with self.assertRaises(ucp.UCPError) as cm:
                    ucp.load_into(m, opt, path=ck, stage=stage)
                self.assertIn(os.path.basename(os.path.dirname(path)), str(cm.exception))
                for n, p in m.named_parameters():
                    self.assertTrue(bool((p == 7.0).all()), f"stage={stage}: {n} was overwritten by a failed load")
                self.assertEqual(len(opt.state), 0, f"stage={stage}: optimizer state set by a failed load")
            # An intact checkpoint loads with either.
            for stage in (True, False):
                m = TinyLM()
                ucp.load_into(m, adamw(m.parameters()), path=DS, stage=stage)
                for n, p in m.named_parameters():
                    self.assertTrue(bits_equal(p.data, load_truth(DS_TRUTH)["fp32"][n]), n)

    def test_state_link_outside(self):
        import shutil
        with tempfile.TemporaryDirectory() as d:
            ck = self.copy_ds(d)
            name = TinyLM().named_parameters().__next__()[0]
            path = self.state_file(ck, name)
            outside = os.path.join(d, "elsewhere.pt")
            shutil.copy(path, outside)
            os.remove(path)
            os.symlink(outside, path)
            for verify in (True, False):
                with ucp.open(ck, verify=verify) as c:
                    with self.assertRaises(ucp.UCPError) as cm:
                        ucp.load_state_dict(c, params=[name])
                    self.assertIn("outside the checkpoint", str(cm.exception))


# ---- Several processes loading as one torch.distributed group (gloo).
TENSOR_COPIES = ("copy_", "cat", "to", "clone", "contiguous", "cpu", "empty_like", "narrow", "view")


def tensor_calls(fn):
    """Runs fn under cProfile; returns the number of calls of each torch.Tensor / torch method that copies or
    builds tensor data (TENSOR_COPIES) it made."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    counts = {}
    for (_, _, name), row in pstats.Stats(prof).stats.items():
        for op in TENSOR_COPIES:
            if f"'{op}' of" in name or name == f"<built-in method {op}>" or name == f"<built-in method torch.{op}>":
                counts[op] = counts.get(op, 0) + row[1]
    return counts


def group_worker(rank, world, init):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    W = dist.group.WORLD
    states = ("fp32", "exp_avg", "exp_avg_sq")
    alone = ucp.load_state_dict(MEG, tp=2, tp_rank=1, states=states)
    total = ucp.last_load_stats()["bytes_read"]  # vocabulary padding is not read
    sizes = [t.numel() * 4 for s in states for t in alone[s].values()]
    transports = ("ucp",) if QUICK else ("torch", "ucp")
    for transport in transports:
        grouped = ucp.load_state_dict(MEG, tp=2, tp_rank=1, states=states, group=W, transport=transport)
        st = ucp.last_load_stats()
        assert st["transport"] == transport and st["ranks"] == world, st
        for s in states:
            for n in alone[s]:
                assert bits_equal(alone[s][n], grouped[s][n]), (transport, rank, s, n)
        # The same tensors on every rank: gather a checksum of each.
        sums = torch.tensor([float(t.double().sum()) for s in states for t in grouped[s].values()], dtype=torch.float64)
        gathered = [torch.zeros_like(sums) for _ in range(world)]
        dist.all_gather(gathered, sums)
        assert all(torch.equal(g, sums) for g in gathered)
        print(f"RANK {transport} {rank} {st['bytes_read']} {st['bytes_received']} {total} {max(sizes)} {st['bytes_sent']}",
              flush=True)
        zalone = ucp.load_zero_partition(DS, dp=3, dp_rank=1, stage=2, param_order=None)
        zgroup = ucp.load_zero_partition(DS, dp=3, dp_rank=1, stage=2, param_order=None, group=W, transport=transport)
        assert all(bits_equal(zalone[s], zgroup[s]) for s in zalone), transport
        falone = ucp.load_fsdp_chunk(DS, rank=1, world=3, states=("fp32", "exp_avg"), dtype=torch.bfloat16)
        fgroup = ucp.load_fsdp_chunk(DS, rank=1, world=3, states=("fp32", "exp_avg"), dtype=torch.bfloat16, group=W,
                                     transport=transport)
        assert all(bits_equal(falone[s][n], fgroup[s][n]) for s in falone for n in falone[s]), transport
        torch.manual_seed(3)
        m, ref = TinyLM(), TinyLM()
        opt = adamw(m.parameters())
        ucp.load_into(m, opt, path=DS, group=W, transport=transport)
        ucp.load_into(ref, path=DS)
        assert all(bits_equal(p.data, q.data) for p, q in zip(m.parameters(), ref.parameters())), transport
        assert all(torch.equal(opt.state[p]["exp_avg"], DS_TRUTH_T["exp_avg"][n])
                   for n, p in m.named_parameters()), transport
    # The Python side of transport="ucp" makes no per-tensor copies: count the tensor-copying calls of a load
    # of every tensor and of a load of one; only the bootstrap's all_gather_object makes some, the same number
    # both times (with "torch" the count grows with the tensors).
    for transport in transports:
        calls = tensor_calls(lambda: ucp.load_state_dict(MEG, tp=2, tp_rank=1, states=states, group=W,
                                                         transport=transport))
        one = tensor_calls(lambda: ucp.load_state_dict(MEG, tp=2, tp_rank=1, states=states[:1], group=W,
                                                       params=[next(iter(alone["fp32"]))], transport=transport))
        print(f"COPIES {transport} {rank} {sum(calls.values()) - sum(one.values())} {calls} {one} "
              f"{sum(len(alone[s]) for s in states)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def mismatch_worker(rank, world, init):
    """Ranks asking for different tensors (tp_rank=rank, or params per rank) all raise, naming the ranks."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    W = dist.group.WORLD
    for transport in ("torch", "ucp"):
        for kw, arg in ((dict(tp=2, tp_rank=rank % 2), "tp_rank"),
                        (dict(params=[list(load_truth(MEG_TRUTH)["param_names"])[rank]]), "params")):
            try:
                ucp.load_state_dict(MEG, group=W, transport=transport, **kw)
            except ucp.UCPError as e:
                msg = str(e)
                assert "ranks [1" in msg and arg in msg and "differ" in msg, msg
                print(f"MISMATCH {transport} {arg} {rank} raised", flush=True)
            else:
                print(f"MISMATCH {transport} {arg} {rank} loaded", flush=True)
        dist.barrier()
    dist.destroy_process_group()


def dying_worker(rank, world, init):
    """The last rank dies (SIGKILL) once the group agreed, as the load starts; the others must raise UCPError
    within the timeout."""
    import signal
    import time
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    if rank == world - 1:
        ucp._lib.group_load = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    t = time.monotonic()
    try:
        ucp.load_state_dict(MEG, tp=2, tp_rank=1, group=dist.group.WORLD, transport="ucp", timeout=3)
    except ucp.UCPError as e:
        print(f"DIED {rank} raised after {time.monotonic() - t:.2f} s: {e}", flush=True)
        os._exit(0)  # the process group cannot be torn down with a dead peer
    print(f"DIED {rank} loaded", flush=True)
    os._exit(1)


def spawn(mode, world, timeout=300):
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "store")
        extra = ["--quick"] if QUICK else []
        procs = [subprocess.Popen([sys.executable, __file__, MEG, MEG_TRUTH, DS, DS_TRUTH, mode, str(r), str(world),
                                   init] + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for r in range(world)]
        outs = [p.communicate(timeout=timeout)[0].decode() for p in procs]
    return procs, outs


class Group(unittest.TestCase):
    """2 and 4 processes loading as one group, through torch.distributed and through ucp's own ring: tensors
    bit-identical to a plain load, each rank reading at most 1/N of the bytes plus one tensor."""

    def run_group(self, world):
        procs, outs = spawn("--worker", world)
        for p, o in zip(procs, outs):
            self.assertEqual(p.returncode, 0, o)
        res = {}
        for transport in (("ucp",) if QUICK else ("torch", "ucp")):
            rows = [next(l for l in o.splitlines() if l.startswith(f"RANK {transport} ")).split()[2:] for o in outs]
            read = [int(r[1]) for r in rows]
            recv = [int(r[2]) for r in rows]
            sent = [int(r[5]) for r in rows]
            total, biggest = int(rows[0][3]), int(rows[0][4])
            self.assertEqual(sum(read), total, transport)
            for k in range(world):
                self.assertLessEqual(read[k], total / world + biggest, f"{transport}: rank {k} read {read[k]} of {total}")
                self.assertGreater(read[k], 0)
                self.assertGreaterEqual(read[k] + recv[k], total)  # received includes padding rows
            if transport == "ucp":  # a ring: what one sends the next receives (broadcasts count once)
                self.assertEqual(sum(sent), sum(recv), transport)
            copies = [int(next(l for l in o.splitlines() if l.startswith(f"COPIES {transport} ")).split()[3])
                      for o in outs]
            if transport == "ucp":
                self.assertEqual(copies, [0] * world, "transport='ucp' copied tensors in Python")
            else:
                self.assertTrue(all(c > 0 for c in copies), copies)  # the count sees torch's copies
            res[transport] = read, total
        return res

    def test_two(self):
        res = self.run_group(2)
        print(f"\n2 ranks: bytes read {res}", file=sys.stderr)

    @unittest.skipIf(QUICK, "4 processes only under Debian's torch")
    def test_four(self):
        res = self.run_group(4)
        print(f"\n4 ranks: bytes read {res}", file=sys.stderr)

    @unittest.skipIf(QUICK, "multi-process run only under Debian's torch")
    def test_mismatch(self):
        procs, outs = spawn("--mismatch", 2)
        for p, o in zip(procs, outs):
            self.assertEqual(p.returncode, 0, o)
            for transport in ("torch", "ucp"):
                for arg in ("tp_rank", "params"):
                    self.assertIn(f"MISMATCH {transport} {arg}", o)
                    self.assertNotIn(f"MISMATCH {transport} {arg} loaded", o, o)

    def test_dead_rank(self):
        procs, outs = spawn("--dying", 3, timeout=60)
        for k in range(2):
            line = next((l for l in outs[k].splitlines() if l.startswith("DIED")), "")
            self.assertIn("raised after", line, outs[k])
            self.assertLess(float(line.split("after ")[1].split()[0]), 3 + 7, line)  # the timeout, plus slack for a loaded machine
            self.assertEqual(procs[k].returncode, 0, outs[k])
        self.assertNotEqual(procs[2].returncode, 0)


@unittest.skipIf(FROZEN is None, "needs --frozen ATOMIC TRUTH")
class TestKeptDTypes(unittest.TestCase):
    """Frozen parameters and buffers: integer ones load in their own dtype bit for bit, floating ones cast like
    the weights (exactly when widened, bit for bit in their own dtype)."""

    def kept(self):
        truth = load_truth(FROZEN_TRUTH)
        kept = dict(truth["frozen"])
        kept.update(truth["buffers"])
        self.assertTrue(any(not t.is_floating_point() for t in kept.values()), "fixture has no integer buffer")
        return kept

    def test_manifest_dtypes(self):
        with ucp.open(FROZEN) as ck:
            for n, want in self.kept().items():
                self.assertEqual(ck.params[n].dtype, str(want.dtype).replace("torch.", ""), n)

    def test_load_state_dict(self):
        kept = self.kept()
        for dtype in (None, torch.float16, torch.float64):
            sd = ucp.load_state_dict(FROZEN, dtype=dtype)["fp32"]
            for n, want in kept.items():
                got = sd[n]
                if not want.is_floating_point():
                    self.assertEqual(got.dtype, want.dtype, (n, dtype))
                    self.assertTrue(torch.equal(got, want), (n, dtype))
                    continue
                self.assertEqual(got.dtype, dtype or torch.float32, (n, dtype))
                if dtype == want.dtype:
                    self.assertTrue(torch.equal(got.view(torch.int16), want.view(torch.int16)), (n, dtype))
                else:
                    self.assertTrue(torch.equal(got, want.to(got.dtype)), (n, dtype))

    def test_fsdp_chunks(self):
        kept = self.kept()
        parts = [ucp.load_fsdp_chunk(FROZEN, rank=r, world=2)["fp32"] for r in range(2)]
        for n, want in kept.items():
            if want.dim() == 0 or want.is_floating_point():
                continue
            got = torch.cat([p[n] for p in parts])
            self.assertEqual(got.dtype, want.dtype, n)
            self.assertTrue(torch.equal(got, want), n)


if __name__ == "__main__":
    for mode, fn in (("--worker", group_worker), ("--mismatch", mismatch_worker), ("--dying", dying_worker)):
        if mode in sys.argv:
            i = sys.argv.index(mode)
            DS_TRUTH_T = load_truth(DS_TRUTH)
            fn(int(sys.argv[i + 1]), int(sys.argv[i + 2]), sys.argv[i + 3])
            sys.exit(0)
    if MEG is None:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    unittest.main(argv=[sys.argv[0], "-v"])
