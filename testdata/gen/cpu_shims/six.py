"""Stand-in for the `six` package, which the torch 2.6 chroot does not ship: megatron-core 0.15's
megatron/training/tokenizer/bert_tokenization.py imports it at module level (reached through
megatron.training's __init__) and reads only six.PY2 / six.PY3 (in tokenizer code the fixtures never call)."""

PY2 = False
PY3 = True
