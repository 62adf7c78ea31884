package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"time"

	"github.com/spf13/pflag"

	"github.com/ucp-project/ucp/atomic"
	"github.com/ucp-project/ucp/dtype"
	"github.com/ucp-project/ucp/formats/hf"
	"github.com/ucp-project/ucp/internal/fsutil"
)

// hfOptions are the flags of export --to hf / --to torch.
type hfOptions struct {
	MaxShard string
	Arch     string
	Params   string
	Memory   string
	DTypeSet bool // --dtype was given (else: the training dtype)
}

func addHFFlags(f *pflag.FlagSet, o *hfOptions) {
	f.StringVar(&o.MaxShard, "max-shard-size", "5GB", "hf, torch: largest file, as Hugging Face parses it (5GB = 5e9 bytes, 5GiB = 5*2^30)")
	f.StringVar(&o.Arch, "arch", "", "hf, torch: map names to a transformers model (llama)")
	f.StringVar(&o.Params, "params", "", "hf, torch: export only the parameters whose atomic name matches this regexp")
	f.StringVar(&o.Memory, "memory", "", "hf, torch: memory budget of the writers, like 1GiB (default: a quarter of RAM, at most 1GiB)")
}

func runExportHF(ctx context.Context, out io.Writer, src, dst string, opts exportOptions) error {
	if opts.Workers <= 0 {
		return fmt.Errorf("--workers must be at least 1")
	}
	o := hf.Options{Torch: opts.To == "torch", Arch: opts.Arch, Force: opts.Force, Workers: opts.Workers}
	var err error
	if opts.DTypeSet {
		if o.DType, err = dtype.Parse(opts.DType); err != nil {
			return fmt.Errorf("--dtype: %w", err)
		}
	}
	if o.MaxShard, err = hf.ParseSize(opts.MaxShard); err != nil {
		return fmt.Errorf("--max-shard-size: %w", err)
	}
	if opts.Params != "" {
		if o.Params, err = regexp.Compile(opts.Params); err != nil {
			return fmt.Errorf("--params: %w", err)
		}
	}
	o.Memory = min(defaultMemory(), 1<<30)
	if opts.Memory != "" {
		if o.Memory, err = parseBytes(opts.Memory); err != nil {
			return fmt.Errorf("--memory: %w", err)
		}
	}
	debug.SetMemoryLimit(o.Memory + 100<<20)
	start := time.Now()
	if err := atomicCheck(src); err != nil {
		return err
	}
	if err := fsutil.CheckOverlap(src, dst, atomic.PartialSuffix); err != nil {
		return err
	}
	r, err := atomic.OpenReader(src, atomic.ReaderOptions{Verify: opts.Verify})
	if err != nil {
		return err
	}
	var bar *progress
	o.Progress = func(total, read, written int64) {
		if bar == nil {
			bar = newProgress(os.Stderr, "exporting", total, opts.Quiet)
			return
		}
		bar.add(read, written)
	}
	st, err := hf.Export(ctx, r, dst, o)
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		return err
	}
	if opts.Quiet {
		return nil
	}
	fmt.Fprintf(out, "exported %s -> %s (%s, %v)\n", src, dst, opts.To, st.DType)
	fmt.Fprintf(out, "  %d tensors in %d files, %s of tensors, %s written in %s\n",
		st.Tensors, st.Files, humanBytes(st.TensorBytes), humanBytes(st.Bytes), fmtDuration(time.Since(start)))
	for _, n := range st.Notes {
		fmt.Fprintln(out, "  note:", n)
	}
	return nil
}
