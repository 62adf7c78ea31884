// Package formats is the registry of source formats: each one detects its
// checkpoints and indexes them into a fragment table.
package formats

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ucp-project/ucp/atomic"
	"github.com/ucp-project/ucp/dtype"
	"github.com/ucp-project/ucp/formats/dcp"
	"github.com/ucp-project/ucp/formats/deepspeed"
	"github.com/ucp-project/ucp/formats/megatron"
	"github.com/ucp-project/ucp/formats/zero3"
	"github.com/ucp-project/ucp/fragment"
)

// Options are the reading options every format understands.
type Options struct {
	Tag       string // DeepSpeed tag / Megatron iteration to read
	Workers   int    // files decoded at once
	VocabSize int64  // true vocabulary size, when the checkpoint does not record it
}

// Format is one source format.
type Format struct {
	Name   string
	Help   string
	Detect func(path string) bool
	Index  func(ctx context.Context, path string, o Options) (*fragment.Table, error)
}

// All returns the known formats in detection order.
func All() []Format {
	return []Format{
		{
			Name:   "deepspeed",
			Help:   "DeepSpeed ZeRO-1/2 and BF16_Optimizer, with Megatron-DeepSpeed TP/PP",
			Detect: deepspeed.Detect,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return deepspeed.Index(ctx, path, deepspeed.Options{Tag: o.Tag, Workers: o.Workers})
			},
		},
		{
			Name:   "zero3",
			Help:   "DeepSpeed ZeRO-3, including AutoTP grids",
			Detect: zero3.Detect,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return zero3.Index(ctx, path, zero3.Options{Tag: o.Tag, Workers: o.Workers})
			},
		},
		{
			Name:   "megatron",
			Help:   "Megatron-LM --ckpt-format torch (mp_rank_* folders, distrib_optim.pt), TP/PP/VPP/EP",
			Detect: megatron.Detect,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return megatron.Index(ctx, path, megatron.Options{Tag: o.Tag, Workers: o.Workers, VocabSize: o.VocabSize})
			},
		},
		{
			Name:   megatron.DistFormat,
			Help:   "Megatron-LM --ckpt-format torch_dist (megatron-core dist_checkpointing on DCP)",
			Detect: megatron.DetectDist,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return megatron.IndexDist(ctx, path, megatron.Options{Tag: o.Tag, Workers: o.Workers, VocabSize: o.VocabSize})
			},
		},
		{
			Name:   "dcp",
			Help:   "PyTorch Distributed Checkpoint (FSDP, DTensor, torchtitan)",
			Detect: dcp.Detect,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return dcp.Index(ctx, path, dcp.Options{Workers: o.Workers})
			},
		},
		{
			Name:   "hf",
			Help:   "safetensors folders of DCP's HuggingFaceStorageWriter: per-rank shard-R-model-K-of-N files, or model-K-of-N + model.safetensors.index.json",
			Detect: dcp.DetectHF,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return dcp.IndexHF(ctx, path, dcp.Options{Workers: o.Workers})
			},
		},
	}
}

// Names lists the format names.
func Names() []string {
	var out []string
	for _, f := range All() {
		out = append(out, f.Name)
	}
	return out
}

// Lookup returns the format with the given name.
func Lookup(name string) (Format, error) {
	for _, f := range All() {
		if f.Name == name {
			return f, nil
		}
	}
	return Format{}, fmt.Errorf("unknown format %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Detect returns the format of the checkpoint at path.
func Detect(path string) (Format, error) {
	for _, f := range All() {
		if f.Detect(path) {
			return f, nil
		}
	}
	return Format{}, fmt.Errorf("%s: not a checkpoint ucp recognises (formats: %s); use --from to name one", path, strings.Join(Names(), ", "))
}

// Index detects (or looks up, when name is set) the format and indexes path.
func Index(ctx context.Context, path, name string, o Options) (*fragment.Table, error) {
	var f Format
	var err error
	if name != "" {
		f, err = Lookup(name)
	} else {
		f, err = Detect(path)
		if err != nil {
			// A folder one format's files are partly there for gets that
			// format's precise reason, as --from would give it.
			if c := partlyClaimed(path); len(c) == 1 {
				if f, err = Lookup(c[0]); err != nil {
					return nil, err
				}
				t, ierr := f.Index(ctx, path, o)
				if ierr != nil {
					return nil, fmt.Errorf("%s looks like a %s checkpoint, but %w", path, f.Name, ierr)
				}
				return t, nil
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return f.Index(ctx, path, o)
}

// partlyClaimed names the formats some of whose files are in path, for a
// folder no format's Detect accepts: DeepSpeed rank files or a 'latest'
// tag file (ZeRO-3 when its per-rank model states are there), Megatron's
// iteration tracker or iter_*/mp_rank_* folders, DCP .distcp files or an
// unfinished .metadata.tmp.
func partlyClaimed(path string) []string {
	var out []string
	has := func(pattern string) bool {
		m, err := filepath.Glob(filepath.Join(path, pattern))
		return err == nil && len(m) > 0
	}
	if dir, tag, err := deepspeed.ResolveTag(path, ""); err == nil {
		if f, err := deepspeed.ListFiles(dir, tag); err == nil && len(f.Zero3) > 0 && len(f.Model) == 0 {
			out = append(out, "zero3")
		} else {
			out = append(out, "deepspeed")
		}
	} else if has("latest") {
		out = append(out, "deepspeed")
	}
	if has("latest_checkpointed_iteration.txt") || has("iter_[0-9]*") || has("mp_rank_[0-9]*") {
		out = append(out, "megatron")
	}
	if has("*.distcp") || has(".metadata.tmp") {
		out = append(out, "dcp")
	}
	return out
}

// ReshardOptions are the target layout every writer understands; each
// writer rejects what its framework cannot take.
type ReshardOptions struct {
	DP, TP, PP, VPP int
	Zero            int         // DeepSpeed ZeRO stage
	DType           dtype.DType // training dtype (Invalid: the source's)
	BF16Optimizer   bool        // DeepSpeed BF16_Optimizer
	DistOptimizer   bool        // Megatron distributed optimizer
	Force, NoSync   bool
}

// ReshardStats tell what a writer wrote.
type ReshardStats struct {
	Files int
	Bytes int64
	Notes []string
}

// Target is a format ucp writes native checkpoints of, at a chosen
// parallelism, from an atomic checkpoint.
type Target struct {
	Name    string
	Help    string
	Reshard func(ctx context.Context, r *atomic.Reader, dst string, o ReshardOptions) (*ReshardStats, error)
}

// Targets returns the formats 'ucp reshard --to' writes.
func Targets() []Target {
	return []Target{
		{
			Name: "deepspeed",
			Help: "a DeepSpeed " + deepspeed.WriteVersion + " tag folder (ZeRO-1/2/3, BF16_Optimizer) and 'latest' beside it",
			Reshard: func(ctx context.Context, r *atomic.Reader, dst string, o ReshardOptions) (*ReshardStats, error) {
				if o.PP > 1 || o.VPP > 0 || o.DistOptimizer {
					return nil, fmt.Errorf("--to deepspeed writes no pipeline or Megatron distributed-optimizer layouts (--pp, --vpp, --distributed-optimizer)")
				}
				st, err := deepspeed.Reshard(ctx, r, dst, deepspeed.ReshardOptions{DP: o.DP, TP: o.TP, Zero: o.Zero, DType: o.DType,
					BF16Optimizer: o.BF16Optimizer, Force: o.Force, NoSync: o.NoSync})
				if err != nil {
					return nil, err
				}
				return &ReshardStats{Files: st.Files, Bytes: st.Bytes, Notes: st.Notes}, nil
			},
		},
	}
}

// LookupTarget returns the writer of a target format.
func LookupTarget(name string) (Target, error) {
	var names []string
	for _, t := range Targets() {
		if t.Name == name {
			return t, nil
		}
		names = append(names, t.Name)
	}
	return Target{}, fmt.Errorf("unknown target format %q (known: %s)", name, strings.Join(names, ", "))
}
