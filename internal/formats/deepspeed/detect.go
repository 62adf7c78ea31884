// Package deepspeed reads and writes DeepSpeed checkpoints. Index reads
// ZeRO-1/2 (and BF16_Optimizer) checkpoints, including Megatron-DeepSpeed
// tensor and pipeline parallelism, and IndexZero3 reads ZeRO-3 ones
// (including AutoTP grids), into a fragment table; both parse pickles
// only, no tensor bytes are read. What the two readers share is here too:
// the tag folder and its rank files (files.go), param_shapes and the ZeRO
// stage (layout.go), the universal_checkpoint_info rules that say how
// tensor-parallel shards join (uci.go) and the check that all rank files
// come from one run (Ranks, ranks.go). Reshard writes an atomic checkpoint
// back as a native DeepSpeed checkpoint of another parallelism. FORMAT.md
// documents ZeRO-1/2 in both directions, ZERO3.md ZeRO-3, NOTES.md the
// differences between DeepSpeed releases.
package deepspeed

// Detect reports whether path looks like a DeepSpeed ZeRO-0/1/2 checkpoint
// (a save folder with 'latest' or a tag folder with mp_rank model states).
func (s *Scan) Detect(path string) bool {
	f, err := s.Files(path, "")
	return err == nil && len(f.Model) > 0
}
