"""A torchtitan llama3 checkpoint written by real torchtitan model code and real torch.distributed.checkpoint.

Usage (torch 2.6 chroot, torchtitan and transformers from source, offline):
  PYTHONPATH=SHIMS:TORCHTITAN:TRANSFORMERS/src python3 torchtitan_fixtures.py gen OUT_DIR
  PYTHONPATH=SHIMS:TORCHTITAN:TRANSFORMERS/src python3 torchtitan_fixtures.py check OUT_DIR HF_EXPORT_DIR

TORCHTITAN is a folder holding torchtitan/ of pytorch/torchtitan v0.2.0 (commit
29624e37fa6dd319fd671b009338651b5c665da2, `git archive v0.2.0 torchtitan`); SHIMS the transformers import shims
(../shared/tools/transformers-shims). Nothing of either is changed. torchtitan v0.2.0 targets torch 2.8+; on
torch 2.6 this script imports only the llama3 model files (the packages' __init__ import the trainer, MoE
kernels and datasets), gives three torch 2.8 names the model files import but never use a placeholder, and
stands inert modules in for tyro, torchdata and datasets (the config CLI and the data loader, imported at
module level by the files the model imports, never called for the model).

gen writes OUT_DIR/checkpoint: torchtitan's model-only save (CheckpointManager._save_last_step with
last_save_model_only: dcp.save of ModelWrapper.state_dict(), i.e. get_model_state_dict of the model, flat FQN
keys, fp32) of a small llama3 Transformer (TransformerModelArgs below; torchtitan's init_weights with a fixed
seed, norms then set to 1 + 0.1 N(0,1) so a swapped norm shows); OUT_DIR/config.json, the same model as a
transformers LlamaConfig (save_pretrained; torchtitan llama3 always applies its RoPEScalingArgs, which is
rope_scaling llama3 with factor 8, low 1, high 4, original 8192); and the truth from the live run:
OUT_DIR/hf_truth.safetensors (torchtitan's own Llama3StateDictAdapter.to_hf of the state dict: the q/k rows
permuted from the complex-RoPE layout to HF's rotate-half one) and OUT_DIR/logits.pt (the torchtitan model's
fp32 logits on OUT_DIR's fixed batch tokens).

check loads HF_EXPORT_DIR with real LlamaForCausalLM.from_pretrained (no missing, unexpected or mismatched
keys) and requires its fp32 logits on the batch to equal torchtitan's: max |diff| <= 1e-4, the same argmax.
"""
import importlib.util
import json
import os
import sys
import types

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.attention.flex_attention as _fa

sys.modules["torch.utils.tensorboard"] = types.SimpleNamespace(SummaryWriter=None)  # torchtitan's metrics; unused
for _n in ("HuggingFaceStorageReader", "HuggingFaceStorageWriter"):
    if not hasattr(dcp, _n):
        setattr(dcp, _n, type(_n, (), {}))  # torch 2.8+: imported by torchtitan's adapters, not used here
if not hasattr(_fa, "AuxOutput"):
    _fa.AuxOutput = type("AuxOutput", (), {})  # torch 2.8+ typing name; flex attention is off


class _Inert:
    """Stands for every name of a package torchtitan imports at module level but never calls for the model:
    attribute access, calls, subscripts and decorators give inert values."""

    def __getattr__(self, n):
        return _inert_attr(n)

    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else _Inert()

    def __getitem__(self, k):
        return _Inert()

    def __or__(self, o):
        return _Inert()

    def __mro_entries__(self, bases):  # used as a base class: no base
        return ()


def _inert_attr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert()


_inert = []
for _pkg, _subs in (("tyro", ("conf", "constructors")), ("torchdata", ("stateful_dataloader",)),
                    ("datasets", ("distributed",))):
    if importlib.util.find_spec(_pkg) is None:
        for _n in (_pkg,) + tuple(_pkg + "." + x for x in _subs):
            _mod = types.ModuleType(_n)
            _mod.__getattr__ = _inert_attr
            sys.modules[_n] = _mod
            _inert.append(_n)
_tt = os.path.dirname(importlib.util.find_spec("torchtitan").origin)
for _pkg in ("torchtitan", "torchtitan.models", "torchtitan.models.llama3", "torchtitan.models.llama3.model"):
    _m = types.ModuleType(_pkg)  # the package without its __init__
    _m.__path__ = [os.path.join(_tt, *_pkg.split(".")[1:])]
    sys.modules[_pkg] = _m

from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: E402
from torchtitan.models.llama3.model.args import TransformerModelArgs  # noqa: E402
from torchtitan.models.llama3.model.model import Transformer  # noqa: E402
from torchtitan.models.llama3.model.state_dict_adapter import Llama3StateDictAdapter  # noqa: E402

for _n in _inert:  # transformers probes for datasets: let it see the truth
    del sys.modules[_n]

ARGS = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, multiple_of=16, norm_eps=1e-5,
            rope_theta=500000.0, max_seq_len=64)
SEED = 3100


def gen(out):
    from safetensors.torch import save_file
    from transformers import LlamaConfig
    os.makedirs(out, exist_ok=True)
    args = TransformerModelArgs(**ARGS)
    torch.manual_seed(SEED)
    model = Transformer(args)
    model.init_weights()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.eval()
    tokens = torch.randint(0, args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(tokens)
    sd = get_model_state_dict(model)  # torchtitan ModelWrapper._get_state_dict, one model part
    dcp.save(sd, checkpoint_id=os.path.join(out, "checkpoint"))
    truth = Llama3StateDictAdapter(args, None).to_hf({k: v.detach().clone() for k, v in sd.items()})
    save_file({k: v.contiguous() for k, v in truth.items()}, os.path.join(out, "hf_truth.safetensors"))
    torch.save({"tokens": tokens, "logits": logits}, os.path.join(out, "logits.pt"))
    ffn = model.layers["0"].feed_forward.w1.weight.shape[0]
    rs = args.rope_scaling_args
    cfg = LlamaConfig(hidden_size=args.dim, intermediate_size=ffn, num_hidden_layers=args.n_layers,
                      num_attention_heads=args.n_heads, num_key_value_heads=args.n_kv_heads,
                      vocab_size=args.vocab_size, rms_norm_eps=args.norm_eps, rope_theta=args.rope_theta,
                      max_position_embeddings=131072, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "llama3", "factor": rs.scaling_factor,
                                    "low_freq_factor": rs.low_freq_factor, "high_freq_factor": rs.high_freq_factor,
                                    "original_max_position_embeddings": rs.original_max_position_embeddings})
    cfg.save_pretrained(out)
    import transformers
    with open(os.path.join(out, "case.json"), "w") as f:
        json.dump({"torchtitan": "v0.2.0 (29624e37fa6dd319fd671b009338651b5c665da2)", "torch": torch.__version__,
                   "transformers": transformers.__version__, "args": ARGS, "seed": SEED}, f, indent=1, sort_keys=True)


def check(out, export):
    from transformers import LlamaForCausalLM
    ref = torch.load(os.path.join(out, "logits.pt"))
    model, info = LlamaForCausalLM.from_pretrained(export, torch_dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    with torch.no_grad():
        got = model.eval()(ref["tokens"]).logits
    diff = (got - ref["logits"]).abs().max().item()
    same = bool((got.argmax(-1) == ref["logits"].argmax(-1)).all())
    ok = not bad and diff <= 1e-4 and same
    print("%s torchtitan llama3 -> ucp -> transformers: max |logits diff| %.3g, argmax %s%s" % (
        "PASS" if ok else "FAIL", diff, "equal" if same else "differs", ", loading info %s" % bad if bad else ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    {"gen": lambda: gen(sys.argv[2]), "check": lambda: check(sys.argv[2], sys.argv[3])}[sys.argv[1]]()
