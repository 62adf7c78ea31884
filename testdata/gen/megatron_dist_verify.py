"""Proves a torch_dist fixture's truth with Megatron itself: loads the checkpoint
back with megatron-core's own dist_checkpointing.load into a TP 1 / PP 1 / EP 1
model (another parallelism than the save's) and compares every parameter with
truth.pt's weights, bit for bit.

    python3 megatron_dist_verify.py MEGATRON_SRC CASE_DIR CASE

CASE is the generator's case name (without the core<major>_<minor>_ prefix).
Run by scripts/megatron-fixtures.sh after generating, in the same chroot.
"""
import os
import sys

src, case_dir, case = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, src)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import torch.distributed as dist

import megatron_dist_fixtures as gen
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611", RANK="0", WORLD_SIZE="1", USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo")
gen.install_shims()
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import dist_checkpointing
gen.patch_dcp_load()
c = dict(gen.CASES[case]); c.update(tp=1, pp=1, dp=1, ep=1)
cfg, ddp, model, opt = gen.build(c, 0, 1)
sd = model.sharded_state_dict()
it = os.path.join(case_dir, "checkpoint", "iter_0000002")
loaded = dist_checkpointing.load(sd, it)
model.load_state_dict(loaded, strict=False)
truth = torch.load(os.path.join(case_dir, "truth.pt"), weights_only=False)
bad = 0
n = 0
for name, p in model.named_parameters():
    g = gen.global_name(model, name, not c.get("impl"))
    if g not in truth["weight"]:
        continue
    w = p.detach().float()
    if "word_embeddings" in g or g == "output_layer.weight":
        w = w[: truth["vocab_size"]]
    n += 1
    if not torch.equal(w, truth["weight"][g]):
        bad += 1
        print("DIFF", g)
print(f"{case}: {n} parameters loaded by Megatron at TP 1 / PP 1, {bad} differ from the truth")
sys.exit(1 if bad or n == 0 else 0)
