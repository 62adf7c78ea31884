// Command ucp converts distributed training checkpoints (DeepSpeed,
// Megatron-LM, PyTorch DCP) into atomic checkpoints that any parallelism
// can load, and inspects checkpoints and torch files.
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
	root := newRootCommand()
	if err := root.ExecuteContext(ctx); err != nil {
		msg, code := exitMessage(ctx, err)
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(code)
	}
}
