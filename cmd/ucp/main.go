// Command ucp converts distributed training checkpoints (DeepSpeed,
// Megatron-LM torch and torch_dist, PyTorch DCP and torchtitan, Hugging
// Face) into atomic checkpoints that any parallelism can load, and writes
// them back out. It holds flags, printing and exit codes only; the work is
// in internal/. Its commands:
//
//	convert SRC DST      a sharded checkpoint into an atomic one (one node or several)
//	inspect PATH         the tensors of a file or the parameters of a checkpoint
//	verify ATOMIC        every file of an atomic checkpoint against its manifest
//	diff A B             two checkpoints of any formats, state by state
//	export ATOMIC DST    an atomic checkpoint as dcp, hf or torch (--to)
//	reshard ATOMIC DST   an atomic checkpoint as a DeepSpeed or Megatron checkpoint of a new parallelism
//	version              the version of ucp
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopProfile, err := startProfile()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	root := newRootCommand()
	if err := root.ExecuteContext(ctx); err != nil {
		stopProfile()
		msg, code := exitMessage(ctx, err)
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(code)
	}
	stopProfile()
}
