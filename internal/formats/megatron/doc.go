// Package megatron is ucp's one package for Megatron-LM checkpoints: it
// reads them into a fragment table and writes atomic checkpoints back as
// Megatron-LM checkpoints at new degrees.
//
// Reading parses pickles only, no tensor bytes. Index reads the legacy
// torch format (--ckpt-format torch: iter_*/mp_rank_*/model_optim_rng.pt
// and, with the distributed optimizer, distrib_optim.pt; legacy*.go,
// NOTES.md). IndexDist reads the torch_dist format (megatron-core
// dist_checkpointing on PyTorch DCP; dist.go, dist_flat.go,
// dist_optimizer.go, DISTFORMAT.md).
//
// Writing: Reshard writes an atomic checkpoint as a torch-format save
// folder (write.go; reshard_family.go for sources converted from another
// framework; RESHARD.md), ReshardDist as a torch_dist one (distwrite*.go,
// DISTWRITE.md).
//
// Shared by both directions: the saved args Namespace (args.go), the merge
// rules by parameter name (names.go), the tensor-parallel placements
// (placement.go), the optimizer's param-group flags (legacy_optim.go) and
// the DDP grad-buffer layout of the distributed optimizer (gradbuffer.go).
//
// Why one package and not megatron/{legacy,dist,write}: the readers and
// the writers use the same unexported types (Args, groupFlags, the name
// kinds of names.go, the bucket layout of gradbuffer.go), and the torch_dist
// writer builds on the torch writer's plan (rsPlan). Split, those would
// become the exported API of a fourth package that every other one
// imports, with no caller outside Megatron; files named by role (legacy*,
// dist*, write*, distwrite*) keep the rooms apart instead.
package megatron
