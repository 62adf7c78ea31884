"""The fixture cases (testdata/fixtures/deepspeed/<name>/) and the on-demand large case."""
from . import models
from .build import Case


def all_cases():
    m = models
    return [
        Case("z1_fp32_dp2", "ZeRO-1, fp32 (no mixed precision), D=2, TinyLM", m.tinylm(), stage=1, dp=2, dtype="fp32"),
        Case("z2_fp16_dp3", "ZeRO-2, fp16 with DynamicLossScaler, D=3", m.tinylm(), stage=2, dp=3, dtype="fp16"),
        Case("z2_bf16_dp4", "ZeRO-2, bf16 via DeepSpeedZeroOptimizer (bf16_zero_pp_rank_* files), D=4",
             m.tinylm(), stage=2, dp=4, dtype="bf16"),
        Case("z1_fp16_dp1_tag", "ZeRO-1, fp16, D=1 (one partition still padded to 2), custom tag 'best'",
             m.tinylm(), stage=1, dp=1, dtype="fp16", tag="best", loss_scale_power=12),
        Case("bf16opt_z1_dp3", "BF16_Optimizer (ZeRO-1, bf16, grad_accum_dtype fp32): fp32 partitions not "
             "stripped, padding charged to the last rank, no zero_stage key, D=3",
             m.tinylm(), stage=1, dp=3, dtype="bf16", opt="bf16opt"),
        Case("z1_tiny_dp4_padonly", "ZeRO-1 fp32, 5 elements at D=4: S=2, rank 2 holds 1 element + 1 pad, "
             "rank 3 owns only padding (empty slice mappings, 0-length fp32 view of a 2-element storage)",
             m.tiny(), stage=1, dp=4, dtype="fp32"),
        Case("bf16opt_tiny_dp4", "BF16_Optimizer, 5 elements at D=4: group_paddings=[0,0,0,3] although rank 2 "
             "holds 1 padding element and rank 3's partition is only 2 long (pitfall P9)",
             m.tiny(), stage=1, dp=4, dtype="bf16", opt="bf16opt"),
        Case("z1_twogroups_dp3", "ZeRO-1 fp32, two optimizer param groups (weight decay 0.1 for 2-D weights, "
             "0.0 for biases/norms), each flattened and padded on its own, D=3",
             m.tinylm(two_groups=True), stage=1, dp=3, dtype="fp32"),
        Case("z2_frozen_buffers_dp2", "ZeRO-2 bf16, frozen params (frozen_param_shapes / frozen_param_fragments), "
             "persistent buffers (int64 root buffer, bf16 block buffer) in module + buffer_names, head.weight "
             "tied to embed.weight (alias in module, shared_params), D=2",
             m.tinylm(frozen=("pos.weight", "blocks.1.ln.weight", "blocks.1.ln.bias"), buffers=True,
                      tie_head=True), stage=2, dp=2, dtype="bf16"),
        Case("hf_z2_bf16_nouci_dp2", "Hugging Face Trainer style: Llama naming, ZeRO-2 bf16, tied lm_head, no "
             "universal_checkpoint_info anywhere (ds_to_universal needs --inject_missing_state), D=2",
             m.hf_llama(), stage=2, dp=2, dtype="bf16", uci="none", lr=2e-05, weight_decay=0.0,
             betas=(0.9, 0.999)),
        Case("z1_fp16_fusedadam_intstep_dp3", "ZeRO-1 fp16, DeepSpeed FusedAdam: step is a Python int in the "
             "state and param_groups carry 'step': 0, bias_correction; 5 steps, D=3",
             m.tinylm(), stage=1, dp=3, dtype="fp16", base="fused", steps=5, loss_scale_power=16),
        Case("megatron_tp2_bf16opt_dp2", "Megatron-DeepSpeed GPTModel (no pipeline), TP=2, BF16_Optimizer, D=2: "
             "vocab-parallel embedding and untied output layer (43 -> 48 rows), GQA fused QKV (q=8,k=4,v=4 rows, hidden 9) "
             "via parameter_with_sub_params + sub_param_shard_widths (UCI 0.4), SwiGLU dense_h_to_4h, row-parallel "
             "dense / dense_4h_to_h, TP-replicated norms / row biases / position embeddings, final_layernorm.bias "
             "averaged (slices differ), nested Megatron module dict, args/rng_state client state",
             m.megatron_gpt(tp=2, untie=True, average_final_ln_bias=True), stage=1, dp=2, dtype="bf16",
             opt="bf16opt", tp=2, uci="megatron", lr=3e-4, weight_decay=0.1),
        Case("megatron_tp2_unevengqa_z2_bf16_dp3", "Megatron-DeepSpeed naming, TP=2, ZeRO-2 bf16 "
             "(DeepSpeedZeroOptimizer), D=3, GQA with 6 query / 3 KV heads split unevenly (AutoTP's "
             "KV-head-aligned split; Megatron itself needs kv_heads % T == 0): QKV shard widths "
             "[[8,4],[4,2],[4,2]] in sub_param_shard_widths (UCI 0.4), self_attention.dense split [8,4] on dim 1. "
             "torch.chunk-based (pre-0.4) merging gets it wrong",
             m.megatron_gpt(tp=2, heads=6, kv_heads=3, uneven_heads=True), stage=2, dp=3, dtype="bf16",
             tp=2, uci="megatron", lr=3e-4, weight_decay=0.1,
             notes=["synthetic layout: not producible by Megatron-DeepSpeed itself"]),
        Case("megatron_pp2_fp16_dp3", "Megatron-DeepSpeed GPTModelPipe, PP=2, TP=1, ZeRO-1 fp16 "
             "(DeepSpeedZeroOptimizer, torch Adam), D=3: layer files, module=None, tied embeddings on both "
             "stages (position embeddings differ on stage 1: only stage 0 counts)",
             m.megatron_gpt(tp=1, pipe=True, pp=2, swiglu=False, kv_heads=4, ffn=14), stage=1, dp=3, dtype="fp16",
             base="adam", pp=2, uci="megatron", lr=3e-4, weight_decay=0.1, loss_scale_power=12),
        Case("megatron_tp2_pp2_bf16opt_dp2", "Megatron-DeepSpeed GPTModelPipe, TP=2 x PP=2, BF16_Optimizer with "
             "DeepSpeed FusedAdam (int step), D=2, newer DeepSpeed model-state layout "
             "(checkpoint_parallel_dimensions, no sparse_tensor_module_names), saved with --no-save-rng",
             m.megatron_gpt(tp=2, pipe=True, pp=2, swiglu=False, kv_heads=4, ffn=14), stage=1, dp=2, dtype="bf16",
             opt="bf16opt", base="fused", tp=2, pp=2, uci="megatron", lr=3e-4, weight_decay=0.1,
             ds_version="0.19.6", new_layout=True, save_rng=False, notes=["--no-save-rng: no rng_state"]),
        Case("megatron_llama_tp2_z1_bf16_dp4", "Megatron-DeepSpeed GPTModel in its Llama set-up (RMSNorm, no "
             "biases, RoPE without position embeddings, SwiGLU, untied output layer: the llama model family), "
             "TP=2, ZeRO-1 bf16 (DeepSpeedZeroOptimizer, torch AdamW), D=4, GQA 4 query / 2 KV heads ([Q; K; V] "
             "sub-params, UCI 0.4)",
             m.megatron_gpt(tp=2, untie=True, llama=True), stage=1, dp=4, dtype="bf16", tp=2, uci="megatron",
             lr=3e-4, weight_decay=0.1),
    ]


def large_case(mb=200):
    """A plain ZeRO-2 bf16 D=4 checkpoint of about `mb` MB (12 bytes per element in the optimizer
    files + 2 in the model file), for throughput measurements. Not committed."""
    hidden, ffn, vocab, seq = 512, 2048, 8003, 1024
    elems = mb * 1e6 / 14
    fixed = 2 * vocab * hidden + seq * hidden + vocab + 3 * hidden + 1
    per_layer = 2 * hidden * ffn + ffn + 3 * hidden
    layers = max(1, round((elems - fixed) / per_layer))
    model = models.tinylm(vocab=vocab, hidden=hidden, ffn=ffn, seq=seq, layers=layers)
    return Case("large_z2_bf16_dp4", f"large throughput case (~{mb} MB): TinyLM hidden {hidden}, ffn {ffn}, "
                f"vocab {vocab}, {layers} layers, ZeRO-2 bf16, D=4", model, stage=2, dp=4, dtype="bf16", large=True)
