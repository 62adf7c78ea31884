// Package deepspeed is ucp's one package for DeepSpeed checkpoints: it
// reads them into a fragment table and writes atomic checkpoints back as
// native DeepSpeed checkpoints of another parallelism.
//
// Index reads ZeRO-1/2 (and BF16_Optimizer) checkpoints, including
// Megatron-DeepSpeed tensor and pipeline parallelism and DeepSpeed-MoE
// (moe.go), and IndexZero3 reads ZeRO-3 ones (including AutoTP grids);
// both parse pickles only, no tensor bytes are read. What the two readers
// share is here too: the tag folder and its rank files, listed once per
// conversion (Scan, files.go), param_shapes and the ZeRO stage (layout.go),
// the universal_checkpoint_info rules that say how tensor-parallel shards
// join (uci.go) and the check that all rank files come from one run
// (Ranks, ranks.go; agree*.go). Reshard writes an atomic checkpoint back
// as DeepSpeed's engine would save it (reshard*.go). FORMAT.md documents
// ZeRO-1/2 in both directions, ZERO3.md ZeRO-3, NOTES.md the differences
// between DeepSpeed releases.
package deepspeed
