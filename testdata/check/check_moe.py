"""MoE families against the real consumers (make check-moe MEGATRON_SRC=... TRANSFORMERS_SRC=...).

Run by scripts/check-moe.sh inside the torch 2.6 chroot, in a work folder holding megatron-core's `megatron/`
package (src/), transformers' package (hf/transformers), the import shims (shims/) and
testdata/gen/megatron_dist_fixtures.py (its CPU shims for megatron-core). Phases, per case:

  megatron CASE   real megatron-core builds a small MoE GPTModel on CPU (local spec: SequentialMLP experts,
                  SwiGLU, top-k routing with no capacity factor, no token dropping, no aux loss) from a Megatron
                  command line parsed by Megatron's own parse_args and core_transformer_config_from_args, sets
                  distinct weights, computes fp32 logits of a fixed batch, and saves a torch_dist checkpoint the
                  way Megatron's save_checkpoint lays it out ({'args', 'checkpoint_version', 'iteration',
                  'model': sharded_state_dict} under iter_0000001). Then, before ucp is trusted, this script's
                  own mapping of the Megatron state dict to the transformers names loads into the real
                  XForCausalLM, whose logits must equal Megatron's: the routing is the same.
  export CASE     transformers loads ucp's export (ucp convert + ucp export --to hf) with no missing, unexpected
                  or mismatched keys; logits equal Megatron's (fp32, max |diff| <= 1e-4, same argmax).
  hfsave CASE     real transformers writes its own random model (save_pretrained) and its logits.
  hfback CASE     that folder after ucp convert --from hf + ucp export --to hf: the same logits.
  import CASE DIR TP EP ETP DP [SAVE]
                  the other way: that folder after ucp convert --from hf + ucp reshard --to megatron at TP x EP x
                  expert-TP with DP data-parallel ranks (legacy torch format, local spec) in out/CASE/DIR; real
                  megatron-core builds the model at those degrees in TP x DP processes (gloo), each rank opens
                  the file Megatron's own get_checkpoint_name names for it, checks the model arguments ucp wrote
                  against Megatron's parse_args of the same command line, loads it with a strict
                  load_state_dict and computes the logits: equal to transformers' (fp32, <= 1e-4, same argmax).
                  With SAVE, Megatron's own save_checkpoint then writes that model as a legacy torch checkpoint
                  in out/CASE/SAVE (weights only, no rng): a real Megatron checkpoint at those degrees.
                  When DIR is a --ckpt-format torch_dist save (release/metadata.json), every rank takes the args
                  from the common state (dist_checkpointing.load_common_state_dict, checked as above) and loads
                  the model as load_checkpoint's torch_dist path does: dist_checkpointing.load({'model':
                  model.sharded_state_dict()}, release, strict='raise_all': no key missing, none unexpected), then
                  a strict load_state_dict; same logits check.
  samehf CASE DIR the safetensors in out/CASE/DIR hold exactly hf_src's tensors (names, dtypes, bytes).
"""
import json
import os
import sys

import torch

CASES = {
    # name: megatron arguments beyond the common ones, transformers class
    "mixtral": (["--moe-router-topk", "2"], "MixtralForCausalLM"),
    "qwen3_moe": (["--qk-layernorm", "--moe-router-pre-softmax", "--moe-router-topk", "2", "--kv-channels", "12"],
                  "Qwen3MoeForCausalLM"),
    "qwen2_moe": (["--add-qkv-bias", "--moe-shared-expert-intermediate-size", "40", "--moe-shared-expert-gate",
                   "--moe-router-topk", "3"], "Qwen2MoeForCausalLM"),
    # Multi-latent attention (local spec: q/kv norms as modules, column-parallel down projections), layer 0
    # dense, two MoE layers with two shared experts, the sigmoid router with its expert bias, a scaling factor
    # and group-limited routing (2 groups, 1 chosen: Megatron scores a group by its top topk/group_topk = 2
    # experts, as transformers always does); no GQA (MLA refuses it).
    "deepseek_v3": (["--num-layers", "3", "--multi-latent-attention", "--q-lora-rank", "24", "--kv-lora-rank", "16",
                     "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8", "--qk-layernorm",
                     "--rope-type", "rope", "--moe-layer-freq", "[0]+[1]*2", "--moe-shared-expert-intermediate-size", "48",
                     "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                     "--moe-router-topk-scaling-factor", "2.5", "--moe-router-num-groups", "2",
                     "--moe-router-group-topk", "1", "--moe-router-topk", "2"], "DeepseekV3ForCausalLM"),
}
VOCAB, SEQ, BATCH = 96, 16, 2
COMMON = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--group-query-attention",
          "--num-query-groups", "2", "--ffn-hidden-size", "48", "--num-experts", "4", "--moe-ffn-hidden-size", "24",
          "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--normalization", "RMSNorm",
          "--norm-epsilon", "1e-6", "--swiglu", "--position-embedding-type", "rope", "--rotary-base", "10000",
          "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--moe-router-load-balancing-type", "none",
          "--moe-aux-loss-coeff", "0", "--moe-token-dispatcher-type", "allgather", "--hidden-dropout", "0",
          "--attention-dropout", "0", "--micro-batch-size", "1", "--make-vocab-size-divisible-by", "32",
          "--use-cpu-initialization", "--no-gradient-accumulation-fusion", "--transformer-impl", "local",
          "--vocab-size", str(VOCAB), "--no-rope-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion",
          "--no-masked-softmax-fusion", "--no-persist-layer-norm"]


def argv(case):
    """The pretrain_gpt.py command line of a case."""
    common = COMMON
    if case == "deepseek_v3":
        i = common.index("--group-query-attention")
        common = common[:i] + common[i + 3:]
    return ["pretrain_gpt.py"] + common + CASES[case][0]


def layer_spec(case, args, cfg):
    """The local spec: one layer spec for every layer, or (deepseek_v3's dense and MoE layers) the block spec
    megatron-core builds from moe_layer_freq."""
    if case == "deepseek_v3":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
        block = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=args.normalization)
        for spec in block.layer_specs:
            spec.submodules.self_attention.submodules.core_attention = MLACoreAttention
        return block
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    return get_gpt_layer_local_spec(args.num_experts, False, args.qk_layernorm, normalization=args.normalization)


class MLACoreAttention(torch.nn.Module):
    """Causal softmax attention with MLA's key and value widths, for the local spec on CPU.

    megatron-core 0.19's local spec cannot build MLA: MLASelfAttention passes k_channels and v_channels to its
    core attention, which only Transformer Engine's DotProductAttention takes (the local DotProductAttention
    refuses them). This stands in for that kernel alone: softmax(q k^T * softmax_scale) v over the causal mask,
    with MLA's own softmax_scale (yarn mscale included); every projection, norm and RoPE is Megatron's.
    """

    def __init__(self, softmax_scale=None, **kwargs):  # Attention builds it once before MLA rebuilds it
        super().__init__()
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        assert packed_seq_params is None and attention_bias is None
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [s, b, n, d] -> [b, n, s, d]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)  # [s, b, n * v_head_dim]



def batch():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def compare(what, got, want):
    d = (got.float() - want.float()).abs().max().item()
    same = torch.equal(got.argmax(-1), want.argmax(-1))
    ok = d <= 1e-4 and same
    print(f"{'ok  ' if ok else 'FAIL'} {what}: max |diff| {d:.3g}, argmax {'equal' if same else 'differs'}", flush=True)
    return ok


# ---------------------------------------------------------------- Megatron

def megatron(case, out):
    sys.path.insert(0, "src")
    sys.path.insert(0, ".")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    import megatron_dist_fixtures as mdf
    mdf.install_shims()
    import megatron.core.tensor_parallel.random as mrandom
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()  # the RNG tracker's fork, on CPU
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    from megatron.core import parallel_state as ps
    from megatron.core import dist_checkpointing
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.training.arguments import parse_args, validate_args, core_transformer_config_from_args
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    sys.argv = argv(case)
    args = parse_args()
    args.rank, args.world_size = 0, 1
    validate_args(args, {})
    args.padded_vocab_size = VOCAB
    cfg = core_transformer_config_from_args(args)
    spec = layer_spec(case, args, cfg)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                     pre_process=True, post_process=True, share_embeddings_and_output_weights=False,
                     position_embedding_type="rope", rotary_percent=1.0, rotary_base=args.rotary_base)
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for n, p in model.named_parameters():
            norm = "layernorm" in n or n.endswith("norm.weight")
            scale = 1.0 if "router" in n else 0.2  # a clear routing margin
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if norm else scale) + (1.0 if norm else 0.0))
        for n, b in model.named_buffers():
            if n.endswith("router.expert_bias"):
                # Non-negative: sigmoid + bias stays positive, where transformers' group mask (0.0) and
                # Megatron's (-inf) choose alike.
                b.copy_(torch.rand(b.shape, generator=g) * 0.2)
    model.eval()
    ids = batch()
    pos = torch.arange(SEQ).unsqueeze(0).expand(BATCH, -1)
    with torch.no_grad():
        logits = model(ids, pos, None).float()
    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    torch.save({"ids": ids, "logits": logits, "state": sd}, os.path.join(out, "megatron.pt"))
    ck = os.path.join(out, "mcore")
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 1, "model": model.sharded_state_dict()}
    os.makedirs(os.path.join(ck, "iter_0000001"))
    dist_checkpointing.save(state, os.path.join(ck, "iter_0000001"))
    with open(os.path.join(ck, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("1")
    # Our own mapping first: the routing and the math must agree before ucp is trusted.
    hf = own_mapping(case, sd, args)
    m = hf_model(case, args)
    missing, unexpected = m.load_state_dict(hf, strict=False)
    if missing or unexpected:
        sys.exit(f"own mapping: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        got = m(ids).logits
    ok = compare(f"{case}: Megatron -> this script's own mapping -> transformers {CASES[case][1]}", got, logits)
    sys.exit(0 if ok else 1)


def hf_config(case, args):
    import transformers
    common = dict(vocab_size=VOCAB, hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
                  num_attention_heads=args.num_attention_heads, num_key_value_heads=args.num_query_groups,
                  max_position_embeddings=SEQ, rms_norm_eps=args.layernorm_epsilon, rope_theta=args.rotary_base,
                  tie_word_embeddings=False, num_experts_per_tok=args.moe_router_topk)
    if case == "deepseek_v3":
        common["num_key_value_heads"] = args.num_attention_heads
        return transformers.DeepseekV3Config(
            intermediate_size=args.ffn_hidden_size, moe_intermediate_size=args.moe_ffn_hidden_size,
            n_shared_experts=args.moe_shared_expert_intermediate_size // args.moe_ffn_hidden_size,
            n_routed_experts=args.num_experts, routed_scaling_factor=args.moe_router_topk_scaling_factor,
            kv_lora_rank=args.kv_lora_rank, q_lora_rank=args.q_lora_rank, qk_rope_head_dim=args.qk_pos_emb_head_dim,
            v_head_dim=args.v_head_dim, qk_nope_head_dim=args.qk_head_dim, n_group=args.moe_router_num_groups,
            topk_group=args.moe_router_group_topk, first_k_dense_replace=args.moe_layer_freq.index(1),
            norm_topk_prob=True, rope_interleave=True, attention_bias=False, **common)
    if case == "mixtral":
        return transformers.MixtralConfig(intermediate_size=args.moe_ffn_hidden_size, num_local_experts=args.num_experts,
                                          **common)
    q = dict(num_experts=args.num_experts, moe_intermediate_size=args.moe_ffn_hidden_size,
             norm_topk_prob=not args.moe_router_pre_softmax, decoder_sparse_step=1, mlp_only_layers=[],
             intermediate_size=args.ffn_hidden_size, **common)
    if case == "qwen3_moe":
        return transformers.Qwen3MoeConfig(head_dim=args.kv_channels, attention_bias=False, **q)
    return transformers.Qwen2MoeConfig(shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
                                       qkv_bias=True, **q)


def hf_model(case, args):
    import transformers
    cls = getattr(transformers, CASES[case][1])
    torch.manual_seed(0)
    return cls(hf_config(case, args)).float().eval()


def own_mapping(case, sd, args):
    """Megatron-core local names -> transformers names, written here independently of ucp."""
    G, d = args.num_query_groups, args.kv_channels
    H = args.num_attention_heads
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"],
           "model.norm.weight": sd["decoder.final_layernorm.weight"], "lm_head.weight": sd["output_layer.weight"]}
    if case == "deepseek_v3":
        return own_mapping_deepseek(sd, args, out)
    moe = "block_sparse_moe" if case == "mixtral" else "mlp"
    names = ("w1", "w3", "w2") if case == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    for layer in range(args.num_layers):
        p, h = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        out[h + "input_layernorm.weight"] = sd[p + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = sd[p + "pre_mlp_layernorm.weight"]
        for w in ("weight", "bias"):
            if p + "self_attention.linear_qkv." + w not in sd:
                continue
            t = sd[p + "self_attention.linear_qkv." + w]
            t = t.view(G, (H // G + 2) * d, *t.shape[1:])
            q, k, v = torch.split(t, [H // G * d, d, d], dim=1)
            for n, x in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                out[h + f"self_attn.{n}.{w}"] = x.reshape(-1, *t.shape[2:])
        out[h + "self_attn.o_proj.weight"] = sd[p + "self_attention.linear_proj.weight"]
        if args.qk_layernorm:
            out[h + "self_attn.q_norm.weight"] = sd[p + "self_attention.q_layernorm.weight"]
            out[h + "self_attn.k_norm.weight"] = sd[p + "self_attention.k_layernorm.weight"]
        out[h + f"{moe}.gate.weight"] = sd[p + "mlp.router.weight"]
        for e in range(args.num_experts):
            fc1 = sd[p + f"mlp.experts.local_experts.{e}.linear_fc1.weight"]
            gate, up = torch.chunk(fc1, 2, dim=0)
            out[h + f"{moe}.experts.{e}.{names[0]}.weight"] = gate
            out[h + f"{moe}.experts.{e}.{names[1]}.weight"] = up
            out[h + f"{moe}.experts.{e}.{names[2]}.weight"] = sd[p + f"mlp.experts.local_experts.{e}.linear_fc2.weight"]
        if case == "qwen2_moe":
            gate, up = torch.chunk(sd[p + "mlp.shared_experts.linear_fc1.weight"], 2, dim=0)
            out[h + "mlp.shared_expert.gate_proj.weight"] = gate
            out[h + "mlp.shared_expert.up_proj.weight"] = up
            out[h + "mlp.shared_expert.down_proj.weight"] = sd[p + "mlp.shared_experts.linear_fc2.weight"]
            out[h + "mlp.shared_expert_gate.weight"] = sd[p + "mlp.shared_experts.gate_weight"]
    return out


def own_mapping_deepseek(sd, args, out):
    """megatron-core MLA local names -> DeepseekV3ForCausalLM names: one tensor each, no row permutation
    (both take the rotary dims in adjacent pairs: Megatron's mla_rotary_interleaved, transformers'
    rope_interleave)."""
    for layer in range(args.num_layers):
        p, h = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        a, m = p + "self_attention.", h + "self_attn."
        for hf, mc in (("q_a_proj", "linear_q_down_proj"), ("q_a_layernorm", "q_layernorm"), ("q_b_proj", "linear_q_up_proj"),
                       ("kv_a_proj_with_mqa", "linear_kv_down_proj"), ("kv_a_layernorm", "kv_layernorm"),
                       ("kv_b_proj", "linear_kv_up_proj"), ("o_proj", "linear_proj")):
            out[m + hf + ".weight"] = sd[a + mc + ".weight"]
        out[h + "input_layernorm.weight"] = sd[p + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = sd[p + "pre_mlp_layernorm.weight"]
        if args.moe_layer_freq[layer] == 0:
            gate, up = torch.chunk(sd[p + "mlp.linear_fc1.weight"], 2, dim=0)
            out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
            out[h + "mlp.down_proj.weight"] = sd[p + "mlp.linear_fc2.weight"]
            continue
        out[h + "mlp.gate.weight"] = sd[p + "mlp.router.weight"]
        out[h + "mlp.gate.e_score_correction_bias"] = sd[p + "mlp.router.expert_bias"]
        for e in range(args.num_experts):
            gate, up = torch.chunk(sd[p + f"mlp.experts.local_experts.{e}.linear_fc1.weight"], 2, dim=0)
            out[h + f"mlp.experts.{e}.gate_proj.weight"], out[h + f"mlp.experts.{e}.up_proj.weight"] = gate, up
            out[h + f"mlp.experts.{e}.down_proj.weight"] = sd[p + f"mlp.experts.local_experts.{e}.linear_fc2.weight"]
        gate, up = torch.chunk(sd[p + "mlp.shared_experts.linear_fc1.weight"], 2, dim=0)
        out[h + "mlp.shared_experts.gate_proj.weight"], out[h + "mlp.shared_experts.up_proj.weight"] = gate, up
        out[h + "mlp.shared_experts.down_proj.weight"] = sd[p + "mlp.shared_experts.linear_fc2.weight"]
    return out


# ---------------------------------------------------------------- transformers

def load_checked(case, path):
    import transformers
    cls = getattr(transformers, CASES[case][1])
    m, info = cls.from_pretrained(path, torch_dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        sys.exit(f"{path}: {bad}")
    return m.eval()


def same_logits(case, truth, folder, what):
    """Exits 0 when transformers on out/folder gives the logits saved in the truth file."""
    want = torch.load(truth)
    m = load_checked(case, folder)
    with torch.no_grad():
        got = m(want["ids"]).logits
    sys.exit(0 if compare(what, got, want["logits"]) else 1)


def export(case, out):
    same_logits(case, os.path.join(out, "megatron.pt"), os.path.join(out, "hf"),
                f"{case}: Megatron torch_dist -> ucp convert -> ucp export --to hf -> transformers {CASES[case][1]}")


def hfsave(case, out):
    sys.path.insert(0, "gen")
    import hf_family_fixtures  # noqa: F401  (gives the hub shim the shard-splitting contract, before transformers)
    import transformers
    a = json.load(open(os.path.join(out, "hf", "config.json")))
    cls = getattr(transformers, CASES[case][1])
    cfg = getattr(transformers, CASES[case][1].replace("ForCausalLM", "Config")).from_dict(a)
    torch.manual_seed(5)
    m = cls(cfg).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.add_(torch.randn(p.shape) * 0.05)
        for n, b in m.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.rand(b.shape) * 0.2)  # non-negative, as in the megatron phase
    ids = batch()
    with torch.no_grad():
        logits = m(ids).logits
    m.save_pretrained(os.path.join(out, "hf_src"), safe_serialization=True, max_shard_size="100KB")
    torch.save({"ids": ids, "logits": logits}, os.path.join(out, "hf_src.pt"))


def hfback(case, out):
    same_logits(case, os.path.join(out, "hf_src.pt"), os.path.join(out, "hf_back"),
                f"{case}: transformers save_pretrained -> ucp convert --from hf -> ucp export --to hf -> transformers")


# Model arguments ucp's args must give as Megatron parses them.
MODEL_ARGS = ["num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "num_experts",
              "moe_router_topk", "moe_ffn_hidden_size", "moe_router_pre_softmax", "moe_shared_expert_intermediate_size",
              "moe_shared_expert_gate", "qk_layernorm", "add_qkv_bias", "add_bias_linear", "swiglu", "normalization",
              "untie_embeddings_and_output_weights", "tensor_model_parallel_size", "expert_model_parallel_size",
              "expert_tensor_parallel_size", "position_embedding_type"]
MLA_ARGS = ["multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
            "rope_type", "moe_layer_freq", "moe_router_score_function", "moe_router_enable_expert_bias",
            "moe_router_topk_scaling_factor", "moe_router_num_groups", "moe_router_group_topk"]


def import_worker(rank, world, case, mg, tp, ep, etp, port, save):
    sys.path.insert(0, "src")
    sys.path.insert(0, ".")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo",
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    import megatron_dist_fixtures as mdf
    mdf.install_shims()
    import megatron.core.tensor_parallel.random as mrandom
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    import megatron.training.arguments as marguments
    from megatron.training.arguments import parse_args, validate_args, core_transformer_config_from_args
    from megatron.training.checkpointing import get_checkpoint_name
    marguments.get_device_arch_version = lambda: 9  # no GPU to ask: only picks which TP performance note applies
    ps.initialize_model_parallel(tp, 1, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    model_parallel_cuda_manual_seed(1234)
    deg = ["--tensor-model-parallel-size", str(tp), "--expert-model-parallel-size", str(ep),
           "--expert-tensor-parallel-size", str(etp)]
    # No --sequence-parallel: the local spec's torch norms refuse it, and MoELayer asks for it only in
    # training (moe_layer.py forward); evaluation computes the same logits without it.
    sys.argv = argv(case) + deg
    args = parse_args()
    args.rank, args.world_size = rank, world
    validate_args(args, {})
    release = os.path.join(mg, "release")
    torch_dist = os.path.exists(os.path.join(release, "metadata.json"))  # --ckpt-format torch_dist
    if torch_dist:
        from megatron.core import dist_checkpointing
        mdf.patch_dcp_load()
        path = release
        wa = dist_checkpointing.load_common_state_dict(release)["args"]
    else:
        # The file each rank loads, named by Megatron (tensor, expert ranks).
        path = get_checkpoint_name(mg, 0, release=True)
        sd = torch.load(path, weights_only=False)
        wa = sd["args"]
    keys = MODEL_ARGS + (MLA_ARGS if case == "deepseek_v3" else [])
    bad = {k: (getattr(wa, k, "absent"), getattr(args, k)) for k in keys if getattr(wa, k, "absent") != getattr(args, k)}
    if bad:
        sys.exit(f"{path}: args ucp wrote differ from Megatron's parse (written, parsed): {bad}")
    args.padded_vocab_size = wa.padded_vocab_size
    cfg = core_transformer_config_from_args(args)
    spec = layer_spec(case, args, cfg)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=wa.padded_vocab_size, max_sequence_length=SEQ,
                     pre_process=True, post_process=True, share_embeddings_and_output_weights=False,
                     position_embedding_type="rope", rotary_percent=1.0, rotary_base=args.rotary_base)
    if torch_dist:
        # Each rank reads its own tensors' chunks (its TP rank's boxes, its EP rank's experts cut at its
        # expert-TP rank) from whichever files hold them. raise_all: a key the model asks for and the
        # checkpoint lacks, or one the checkpoint has and no rank's model asks for, is an error.
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, release, strict="raise_all")
        model.load_state_dict(loaded["model"], strict=True)
    else:
        model.load_state_dict(sd["model"], strict=True)
    model.eval()
    ids = torch.load(os.path.join("out", case, "hf_src.pt"))["ids"]
    pos = torch.arange(SEQ).unsqueeze(0).expand(BATCH, -1)
    with torch.no_grad():
        out = model(ids, pos, None).float()  # [b, s, V/TP]
    g = ps.get_tensor_model_parallel_group()
    parts = [torch.empty_like(out) for _ in range(tp)]
    torch.distributed.all_gather(parts, out.contiguous(), group=g)
    if rank == 0:
        torch.save(torch.cat(parts, dim=-1)[..., :VOCAB], os.path.join(mg, "logits.pt"))
        what = "torch_dist files" if torch_dist else "rank files"
        print(f"  {what} loaded (strict): {sorted(os.listdir(release))}", flush=True)
    if save:
        # Megatron's own save_checkpoint writes the loaded model in the legacy torch format (the
        # files of its ranks at these degrees): a real Megatron checkpoint for ucp to read back.
        from megatron.training.global_vars import set_args
        from megatron.training.checkpointing import save_checkpoint
        args.save, args.ckpt_format, args.use_dist_ckpt, args.async_save = save, "torch", False, False
        args.no_save_optim, args.no_save_rng = True, True
        set_args(args)
        save_checkpoint(1, [model], None, None, 0)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def import_(case, out):
    d, tp, ep, etp, dp = sys.argv[3], *map(int, sys.argv[4:8])
    mg = os.path.join(out, d)
    save = os.path.abspath(os.path.join(out, sys.argv[8])) if len(sys.argv) > 8 else None
    import torch.multiprocessing as mp
    port = 29600 + os.getpid() % 300
    mp.spawn(import_worker, args=(tp * dp, case, mg, tp, ep, etp, port, save), nprocs=tp * dp, join=True)
    want = torch.load(os.path.join(out, "hf_src.pt"))["logits"]
    fmt = "--ckpt-format torch_dist " if os.path.exists(os.path.join(mg, "release", "metadata.json")) else ""
    ok = compare(f"{case}: transformers save_pretrained -> ucp convert --from hf -> ucp reshard --to megatron {fmt}"
                 f"--tp {tp} --ep {ep} --expert-tp {etp} --dp {dp} -> megatron-core ({tp * dp} ranks)",
                 torch.load(os.path.join(mg, "logits.pt")), want)
    sys.exit(0 if ok else 1)


def samehf(case, out):
    from safetensors.torch import load_file
    def tensors(d):
        got = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                got.update(load_file(os.path.join(d, f)))
        return got
    want, got = tensors(os.path.join(out, "hf_src")), tensors(os.path.join(out, sys.argv[3]))
    bad = sorted(set(want) ^ set(got)) + [n for n in want if n in got and (want[n].dtype != got[n].dtype or not torch.equal(want[n], got[n]))]
    ok = not bad
    print(f"{'ok  ' if ok else 'FAIL'} {case}: {sys.argv[3]} holds transformers' {len(want)} tensors bit for bit"
          + ("" if ok else f"; differ: {bad[:5]}"), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    torch.set_num_threads(1)
    phase, case = sys.argv[1], sys.argv[2]
    {"megatron": megatron, "export": export, "hfsave": hfsave, "hfback": hfback,
     "import": import_, "samehf": samehf}[phase](case, os.path.join("out", case))
