package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/convert"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats"
	"github.com/ucp-project/ucp/internal/formats/hf"
	"github.com/ucp-project/ucp/internal/fsutil"
)

type exportOptions struct {
	To       string
	Shards   int
	DType    string
	ModelKey string
	OptimKey string
	Workers  int
	Force    bool
	Verify   bool
	Quiet    bool
	hfOptions
}

func newExportCommand() *cobra.Command {
	var opts exportOptions
	cmd := &cobra.Command{
		Use:   "export ATOMIC DST --to dcp|hf|torch",
		Short: "Write an atomic checkpoint in a training framework's format",
		Long: `Write the atomic checkpoint in ATOMIC (made by 'ucp convert') to DST in the
format named by --to.

--to dcp writes a PyTorch Distributed Checkpoint folder (.metadata and
__<rank>_0.distcp files) that torch.distributed.checkpoint.load reads into a
model and optimizer of the same shapes: <model-key>.<param> for the weights,
<optim-key>.state.<param>.{exp_avg,exp_avg_sq,step} for the optimizer state,
the extra state's values at their keys, and the param groups. Every tensor is
split in --shards chunks along dim 0 (torch.chunk sizes, as FSDP2 shards it),
chunk r of every tensor in __r_0.distcp. DST is written as DST.partial,
.metadata last, and renamed when complete.

--to hf writes a Hugging Face model folder: model.safetensors, or
model-0000i-of-0000n.safetensors shards (--max-shard-size, 5GB by default)
and model.safetensors.index.json. --to torch writes pytorch_model.bin (or
its shards and pytorch_model.bin.index.json) instead. The weights are the
fp32 master weights cast to --dtype (default: the training dtype the
manifest records, else float32); optimizer states are left out. --arch
auto (hf's default) names the tensors as the transformers class of the
model family the checkpoint records (Megatron and Megatron-DeepSpeed args,
a Hugging Face config.json: llama, mistral, qwen2, qwen3, mixtral,
qwen2_moe, qwen3_moe, deepseek_v3) and writes its config.json: fused QKV and fc1
split, interleaved RoPE rows reordered, layernorm-1p weights + 1, rope
scaling carried; a model no family computes
exactly is refused with the option's name. --arch FAMILY names the family,
--arch none keeps the source's names; --params REGEX exports a subset.`,
		Example: `  ucp export out/atomic out/dcp --to dcp
  ucp export --to dcp --shards 8 --dtype bfloat16 atomic/ dcp/
  ucp export --to hf --dtype bfloat16 atomic/ hf/`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("arch") && opts.To != "hf" {
				opts.Arch = hf.ArchNone // --to torch: plain state dicts unless asked
			}
			return runExport(cmd.Context(), cmd.OutOrStdout(), args[0], args[1], opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.To, "to", "", "target format ("+strings.Join(formats.ExportTargets(), ", ")+")")
	f.IntVar(&opts.Shards, "shards", 1, "chunks per tensor along dim 0, one rank file each")
	f.StringVar(&opts.DType, "dtype", "", "dtype of the written weights and optimizer states (float32, bfloat16, float16; default: float32 for dcp, the training dtype for hf and torch)")
	f.StringVar(&opts.ModelKey, "model-key", "model", "top-level key of the model state dict")
	f.StringVar(&opts.OptimKey, "optim-key", "", "top-level key of the optimizer state dict (default: a DCP source's own, else optim)")
	f.IntVar(&opts.Workers, "workers", runtime.NumCPU(), "rank files written at once")
	f.BoolVar(&opts.Force, "force", false, "replace DST if it exists")
	f.BoolVar(&opts.Verify, "verify", true, "check every atomic file's CRC-32 against the manifest before using it")
	f.BoolVar(&opts.Quiet, "quiet", false, "no summary")
	addHFFlags(f, &opts.hfOptions)
	return cmd
}

func runExport(ctx context.Context, out io.Writer, src, dst string, opts exportOptions) error {
	tg, err := lookupTo(opts.To, formats.ExportTargets(), formats.LookupExport)
	if err != nil {
		return err
	}
	o := formats.ExportOptions{Shards: opts.Shards, ModelKey: opts.ModelKey, OptimKey: opts.OptimKey, Arch: opts.Arch,
		Force: opts.Force, Workers: opts.Workers}
	if tg.Check != nil {
		if err := tg.Check(o); err != nil {
			return err
		}
	}
	if opts.Workers <= 0 {
		return fmt.Errorf("--workers must be at least 1")
	}
	if opts.DType != "" {
		if o.DType, err = dtype.Parse(opts.DType); err != nil {
			return fmt.Errorf("--dtype: %w", err)
		}
	}
	if opts.MaxShard != "" {
		if o.MaxShard, err = hf.ParseSize(opts.MaxShard); err != nil {
			return fmt.Errorf("--max-shard-size: %w", err)
		}
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
	if tg.Memory {
		debug.SetMemoryLimit(o.Memory + 100<<20)
	}
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
	// Up front, as convert: Hugging Face and torch files hold the weights
	// (at most their fp32 size), DCP the optimizer states too.
	if err := convert.CheckFree(dst, convert.AtomicBytes(r.Manifest, tg.Name != "dcp")+convert.SpaceMargin, "the export writes up to", true); err != nil {
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
	st, err := tg.Export(ctx, r, dst, o)
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		return err
	}
	if opts.Quiet {
		return nil
	}
	label, line := tg.Summary(st, humanBytes)
	fmt.Fprintf(out, "exported %s -> %s (%s)\n", src, dst, label)
	fmt.Fprintf(out, "  %s in %s\n", line, fmtDuration(time.Since(start)))
	printNotes(out, st.Notes)
	return nil
}
