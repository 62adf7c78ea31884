"""Megatron itself checks a GroupedMLP torch_dist fixture's truth (scripts/megatron-grouped-fixtures.sh).

    python3 megatron_grouped_verify.py MEGATRON_SRC CASE_DIR CASE

One process (TP 1, EP 1) builds the case's model as megatron_grouped_fixtures.py does (same arguments, degrees
1), loads CASE_DIR/checkpoint with megatron-core's own dist_checkpointing.load (GroupedMLP's sharded_state_dict
and sh_ten_merge_fn turn the saved per-expert tensors back into the fused weight1 [H, E*G*F] / weight2 [E*F, H])
and load_state_dict(strict=True); every parameter must equal the truth's weight bit for bit (the truth's
per-expert tensors transposed and stacked as GroupedMLP stores them; vocabulary rows past the truth's cut).
"""

import os
import sys

import torch
import torch.distributed as dist


def main():
    src, case_dir, case = sys.argv[1], sys.argv[2], sys.argv[3]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.abspath(src))
    sys.path.insert(0, here)
    import megatron_grouped_fixtures as mgf

    c = dict(mgf.CASES[case], tp=1, ep=1, etp=1, dp=1)
    mgf.CASES[case] = c
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29791", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo")
    ddp, model, _ = mgf.build(case, 0, 1, "/nonexistent")
    from megatron.core import dist_checkpointing

    it = os.path.join(case_dir, "checkpoint", "iter_%07d" % mgf.STEPS)
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, it)
    model.load_state_dict(loaded["model"], strict=True)
    truth = torch.load(os.path.join(case_dir, "truth.pt"), weights_only=False)["weight"]
    H, E, F, G = c["H"], c["E"], c["F"], 2
    bad, n = [], 0
    for name, p in model.named_parameters():
        got = p.detach().float()
        layer = name.split(".")[2] if name.startswith("decoder.layers.") else None
        if name.endswith(".mlp.experts.weight1"):
            pre = f"decoder.layers.{layer}.mlp.experts.local_experts."
            want = torch.stack([truth[f"{pre}{g}.linear_fc1.weight"].t() for g in range(E)]).reshape(H, E * G * F)
        elif name.endswith(".mlp.experts.weight2"):
            pre = f"decoder.layers.{layer}.mlp.experts.local_experts."
            want = torch.stack([truth[f"{pre}{g}.linear_fc2.weight"].t() for g in range(E)]).reshape(E * F, H)
        else:
            want = truth[name]
            got = got[: want.shape[0]] if "word_embeddings" in name or name == "output_layer.weight" else got
        n += 1
        if got.shape != want.shape or not torch.equal(got, want):
            bad.append(name)
    print(f"{case}: megatron-core dist_checkpointing.load at TP 1 / EP 1: {n} parameters, {len(bad)} differ from the truth {bad}",
          flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
