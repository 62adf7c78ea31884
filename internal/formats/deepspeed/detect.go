// Package deepspeed indexes DeepSpeed ZeRO-1/2 (and BF16_Optimizer)
// checkpoints, including Megatron-DeepSpeed tensor and pipeline
// parallelism, into a fragment table. It parses pickles only; no tensor
// bytes are read. Reshard writes an atomic checkpoint back as a native
// DeepSpeed checkpoint of another parallelism. FORMAT.md documents both
// directions; NOTES.md the differences between DeepSpeed releases.
package deepspeed

import "github.com/ucp-project/ucp/internal/formats/dslayout"

// Detect reports whether path looks like a DeepSpeed ZeRO-0/1/2 checkpoint
// (a save folder with 'latest' or a tag folder with mp_rank model states).
func Detect(path string) bool {
	dir, tag, err := dslayout.ResolveTag(path, "")
	if err != nil {
		return false
	}
	f, err := dslayout.ListFiles(dir, tag)
	return err == nil && len(f.Model) > 0
}
