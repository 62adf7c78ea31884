// Package dslayout holds what DeepSpeed's two checkpoint readers share
// (formats/deepspeed for ZeRO-1/2, formats/zero3 for ZeRO-3): the tag
// folder and the classification of its rank files, param_shapes, the ZeRO
// stage, the universal_checkpoint_info rules that say how tensor-parallel
// shards join, the flat optimizer states of a partition and the optimizer
// fields all ranks must agree on. The layout is described in
// formats/deepspeed/FORMAT.md.
package dslayout
