// Package formats is the registry of checkpoint formats, both ways: the
// readers (All: each detects its checkpoints and indexes them into a
// fragment table, which Index returns only once its coverage is proven)
// and the writers (Targets: each writes an atomic checkpoint as it is,
// for 'ucp export --to', or at a new parallelism, for 'ucp reshard --to').
// Both are tables built on each call, not globals; a format added later is
// one row.
package formats

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/formats/hf"
	"github.com/ucp-project/ucp/internal/formats/megatron"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/multinode"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Options are the reading options every format understands.
type Options struct {
	Tag       string // DeepSpeed tag / Megatron iteration to read
	Workers   int    // files decoded at once
	VocabSize int64  // true vocabulary size, when the checkpoint does not record it
	// Memory, when > 0, bounds the pickle decoders: each of the Workers
	// files decoded at once may take at most its share (below the budget
	// its size gives, torchfile.Options.MaxBudget).
	Memory int64
	// ModelConfig is a transformers config.json describing the model of a
	// checkpoint that records none (torchtitan): its family and config.
	ModelConfig string
}

// decode returns the torchfile options of o's decoders.
func (o Options) decode() torchfile.Options {
	if o.Memory <= 0 {
		return torchfile.Options{}
	}
	w := o.Workers
	if w <= 0 {
		w = runtime.NumCPU()
	}
	return torchfile.Options{MaxBudget: o.Memory / int64(w)}
}

// Format is one source format.
type Format struct {
	Name   string
	Help   string
	Detect func(path string) bool
	Index  func(ctx context.Context, path string, o Options) (*fragment.Table, error)
}

// All returns the known formats in detection order.
func All() []Format { return all(nil) }

// all is All with the DeepSpeed formats listing folders through s: one
// Index call lists the tag folder once for every Detect and the reader.
func all(s *deepspeed.Scan) []Format {
	return []Format{
		{
			Name:   "deepspeed",
			Help:   "DeepSpeed ZeRO-1/2 and BF16_Optimizer, with Megatron-DeepSpeed TP/PP",
			Detect: s.Detect,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return deepspeed.Index(ctx, path, deepspeed.Options{Tag: o.Tag, Workers: o.Workers, Scan: s, Decode: o.decode()})
			},
		},
		{
			Name:   "zero3",
			Help:   "DeepSpeed ZeRO-3, including AutoTP grids",
			Detect: s.DetectZero3,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return deepspeed.IndexZero3(ctx, path, deepspeed.Zero3Options{Tag: o.Tag, Workers: o.Workers, Scan: s, Decode: o.decode()})
			},
		},
		{
			Name:   "megatron",
			Help:   "Megatron-LM --ckpt-format torch (mp_rank_* folders, distrib_optim.pt), TP/PP/VPP/EP",
			Detect: megatron.Detect,
			Index: func(ctx context.Context, path string, o Options) (*fragment.Table, error) {
				return megatron.Index(ctx, path, megatron.Options{Tag: o.Tag, Workers: o.Workers, VocabSize: o.VocabSize, Decode: o.decode()})
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
func Lookup(name string) (Format, error) { return lookup(All(), name) }

func lookup(all []Format, name string) (Format, error) {
	for _, f := range all {
		if f.Name == name {
			return f, nil
		}
	}
	return Format{}, fmt.Errorf("unknown format %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Detect returns the format of the checkpoint at path.
func Detect(path string) (Format, error) { return detect(All(), path) }

func detect(all []Format, path string) (Format, error) {
	for _, f := range all {
		if f.Detect(path) {
			return f, nil
		}
	}
	return Format{}, fmt.Errorf("%s: not a checkpoint ucp recognises (formats: %s); use --from to name one", path, strings.Join(Names(), ", "))
}

// CoverageError is the error of a table that fails the coverage check.
type CoverageError struct {
	Path string
	Err  error
}

func (e *CoverageError) Error() string {
	return fmt.Sprintf("%s: coverage check failed: %v", e.Path, e.Err)
}
func (e *CoverageError) Unwrap() error { return e.Err }

// Index detects (or looks up, when name is set) the format, indexes path
// and proves the table's coverage (fragment.Table.Validate: every element
// of every state covered exactly once): only a validated table leaves it,
// so every consumer (plan, run, inspect, diff) gets the proof.
func Index(ctx context.Context, path, name string, o Options) (*fragment.Table, error) {
	t, err := index(ctx, path, name, o)
	if err != nil {
		return nil, err
	}
	if o.ModelConfig != "" {
		if err := dcp.ApplyModelConfig(t, o.ModelConfig); err != nil {
			t.Close()
			return nil, fmt.Errorf("--model-config: %w", err)
		}
	}
	detectFamily(t)
	return validated(path, t)
}

// detectFamily sets the table's model family from its training
// arguments when the reader did not set it. A model no family describes
// is left without one, silently: exports say why (from the recorded
// args) when they need the family.
func detectFamily(t *fragment.Table) {
	if t.Model != nil || t.Args == nil {
		return
	}
	var ps []family.Param
	for _, p := range t.Params {
		ps = append(ps, family.Param{Name: p.Name, Shape: p.Shape})
	}
	if c, err := family.Detect(t.Args, ps, t.Format); err == nil {
		t.Model = c
	}
}

// validated returns t when its coverage is proven, else closes it.
func validated(path string, t *fragment.Table) (*fragment.Table, error) {
	if err := t.Validate(); err != nil {
		t.Close()
		return nil, &CoverageError{Path: path, Err: err}
	}
	return t, nil
}

func index(ctx context.Context, path, name string, o Options) (*fragment.Table, error) {
	s := &deepspeed.Scan{}
	formats := all(s)
	var f Format
	var err error
	if name != "" {
		f, err = lookup(formats, name)
	} else {
		f, err = detect(formats, path)
		if err != nil {
			// A folder one format's files are partly there for gets that
			// format's precise reason, as --from would give it.
			if c := partlyClaimed(s, path); len(c) == 1 {
				if f, err = lookup(formats, c[0]); err != nil {
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
func partlyClaimed(s *deepspeed.Scan, path string) []string {
	var out []string
	has := func(pattern string) bool {
		m, err := filepath.Glob(filepath.Join(path, pattern))
		return err == nil && len(m) > 0
	}
	if dir, tag, err := s.ResolveTag(path, ""); err == nil {
		if f, err := s.ListFiles(dir, tag); err == nil && len(f.Zero3) > 0 && len(f.Model) == 0 {
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
	EP, ETP         int         // Megatron expert parallel and expert tensor parallel sizes (0: 1 and TP)
	Zero            int         // DeepSpeed ZeRO stage
	DType           dtype.DType // training dtype (Invalid: the source's)
	BF16Optimizer   bool        // DeepSpeed BF16_Optimizer
	DistOptimizer   bool        // Megatron distributed optimizer
	// Megatron: the loading run's Adam ("adamw", "fused"; "": the
	// source's) and an uneven pipeline split (0: not set).
	MegatronOptimizer                 string
	FirstStageLayers, LastStageLayers int
	// Megatron: --ckpt-format ("torch" or "torch_dist"), and for
	// torch_dist the megatron-core layout and optimizer sharding type.
	CkptFormat, MegatronCore, DistOptimSharding string
	// MegatronSpec: the layer spec of a Megatron target written from a
	// non-Megatron source ("local" or "te"; "": te).
	MegatronSpec  string
	Force, NoSync bool
	NoLatest      bool // DeepSpeed: leave the 'latest' pointer beside DST alone
	// DSVersion is the DeepSpeed release the target runs (ds_version and
	// the keys that release writes); "": the source's.
	DSVersion string
	// Place is this process's share of a multi-node run (Nodes > 1): the
	// nodes write one folder together (multinode.Folder).
	Place multinode.Place
}

// ReshardStats tell what a writer wrote.
type ReshardStats struct {
	Files int
	Bytes int64
	Notes []string
	// Pointer is the pointer file beside DST written or found naming it
	// (DeepSpeed's 'latest'), nil when none.
	Pointer *atomic.Pointer
	// Node is what this node did in a multi-node run (nil for one process).
	Node *multinode.Result
}

// ExportOptions are the options every export writer understands; each
// uses those that apply to it.
type ExportOptions struct {
	DType    dtype.DType // Invalid: the writer's default
	Workers  int         // files written at once
	Force    bool        // replace DST
	Shards   int         // dcp: chunks per tensor along dim 0
	ModelKey string      // dcp: top-level key of the model state dict
	OptimKey string      // dcp: top-level key of the optimizer state ("": the writer's default)
	MaxShard int64       // hf, torch: largest file in tensor bytes
	Arch     string      // hf, torch: transformers model to name the tensors for
	Params   *regexp.Regexp
	Memory   int64 // hf, torch: the writers' memory budget
	// Progress, when set, is told the total bytes first, then bytes read
	// and written as they happen (writers that report progress).
	Progress func(total, read, written int64)
}

// ExportStats tell what an export wrote.
type ExportStats struct {
	DType       dtype.DType
	Files       int   // tensor files (rank files of dcp)
	Tensors     int   // tensors written
	Values      int   // non-tensor keys
	TensorBytes int64 // bytes of the tensors
	Bytes       int64 // bytes of every file written
	Notes       []string
}

// Target is a format ucp writes from an atomic checkpoint: as it is
// (Export, 'ucp export --to'), or as a native checkpoint at a chosen
// parallelism (Reshard, 'ucp reshard --to'). A target added later is one
// row of Targets.
type Target struct {
	Name    string
	Help    string
	Export  func(ctx context.Context, r *atomic.Reader, dst string, o ExportOptions) (*ExportStats, error)
	Reshard func(ctx context.Context, r *atomic.Reader, dst string, o ReshardOptions) (*ReshardStats, error)
	// Check refuses options an export cannot take before anything is
	// opened; Summary says what an export wrote (sizes through human).
	Check   func(o ExportOptions) error
	Summary func(st *ExportStats, human func(int64) string) (label, line string)
	// Memory says the export keeps within ExportOptions.Memory, so the
	// caller may bound the garbage collector by it as well.
	Memory bool
}

// Targets returns the formats 'ucp export --to' and 'ucp reshard --to'
// write.
func Targets() []Target {
	return []Target{
		{
			Name: "dcp",
			Help: "a PyTorch Distributed Checkpoint (.metadata and __<rank>_0.distcp), every tensor in --shards dim-0 chunks",
			Check: func(o ExportOptions) error {
				if o.Shards <= 0 {
					return fmt.Errorf("--shards must be at least 1")
				}
				return nil
			},
			Export: func(ctx context.Context, r *atomic.Reader, dst string, o ExportOptions) (*ExportStats, error) {
				dt := o.DType
				if dt == dtype.Invalid {
					dt = dtype.Float32
				}
				st, err := dcp.Export(ctx, r, dst, dcp.ExportOptions{Shards: o.Shards, DType: dt, ModelKey: o.ModelKey,
					OptimKey: o.OptimKey, Force: o.Force, Workers: o.Workers})
				if err != nil {
					return nil, err
				}
				return &ExportStats{DType: dt, Files: st.Files, Tensors: st.Tensors, Values: st.Values, Bytes: st.Bytes, Notes: st.Notes}, nil
			},
			Summary: func(st *ExportStats, human func(int64) string) (string, string) {
				return "dcp", fmt.Sprintf("%d tensors and %d values in %d rank files, %s", st.Tensors, st.Values, st.Files, human(st.Bytes))
			},
		},
		hfTarget("hf", "Hugging Face safetensors files (model.safetensors or shards and their index; config.json with --arch)", false),
		hfTarget("torch", "torch.save files (pytorch_model.bin or shards and their index) that torch.load(weights_only=True) reads", true),
		{
			Name: "deepspeed",
			Help: "a DeepSpeed " + deepspeed.WriteVersion + " tag folder (ZeRO-1/2/3, BF16_Optimizer) and 'latest' beside it",
			Reshard: func(ctx context.Context, r *atomic.Reader, dst string, o ReshardOptions) (*ReshardStats, error) {
				if o.PP > 1 || o.VPP > 0 || o.EP > 0 || o.ETP > 0 || o.DistOptimizer || o.MegatronOptimizer != "" || o.FirstStageLayers != 0 || o.LastStageLayers != 0 ||
					o.CkptFormat != "" || o.MegatronCore != "" || o.DistOptimSharding != "" {
					return nil, fmt.Errorf("--to deepspeed writes no pipeline or Megatron layouts (--pp, --vpp, --ep, --expert-tp, --distributed-optimizer, --megatron-optimizer, --decoder-first/last-pipeline-num-layers, --ckpt-format, --megatron-core, --dist-optim-sharding)")
				}
				st, err := deepspeed.Reshard(ctx, r, dst, deepspeed.ReshardOptions{DP: o.DP, TP: o.TP, Zero: o.Zero, DType: o.DType,
					BF16Optimizer: o.BF16Optimizer, Force: o.Force, NoSync: o.NoSync, NoLatest: o.NoLatest, Version: o.DSVersion, Place: o.Place})
				if err != nil {
					return nil, err
				}
				return &ReshardStats{Files: st.Files, Bytes: st.Bytes, Notes: st.Notes, Pointer: st.Pointer, Node: st.Node}, nil
			},
		},
		{
			Name: "megatron",
			Help: "a Megatron-LM --ckpt-format torch save folder (iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt, latest_checkpointed_iteration.txt), or with --ckpt-format torch_dist a dist_checkpointing folder",
			Reshard: func(ctx context.Context, r *atomic.Reader, dst string, o ReshardOptions) (*ReshardStats, error) {
				if o.Zero >= 0 || o.BF16Optimizer || o.DType != dtype.Invalid || o.DSVersion != "" {
					return nil, fmt.Errorf("--to megatron takes no DeepSpeed options (--zero, --bf16-optimizer, --deepspeed-version) and keeps the source's training dtype (--dtype)")
				}
				mo := megatron.ReshardOptions{TP: o.TP, PP: o.PP, VPP: o.VPP, DP: o.DP, EP: o.EP, ETP: o.ETP,
					DistOptimizer: o.DistOptimizer, Optimizer: o.MegatronOptimizer, FirstStageLayers: o.FirstStageLayers, Spec: o.MegatronSpec,
					LastStageLayers: o.LastStageLayers, Force: o.Force, NoSync: o.NoSync, Place: o.Place}
				var st *megatron.ReshardStats
				var err error
				switch o.CkptFormat {
				case "", "torch":
					if o.MegatronCore != "" || o.DistOptimSharding != "" {
						return nil, fmt.Errorf("--megatron-core and --dist-optim-sharding apply to --ckpt-format torch_dist")
					}
					st, err = megatron.Reshard(ctx, r, dst, mo)
				case megatron.DistFormat:
					st, err = megatron.ReshardDist(ctx, r, dst, megatron.DistOptions{ReshardOptions: mo, Core: o.MegatronCore, OptimSharding: o.DistOptimSharding})
				default:
					return nil, fmt.Errorf("--ckpt-format %q: give torch or torch_dist", o.CkptFormat)
				}
				if err != nil {
					return nil, err
				}
				return &ReshardStats{Files: st.Files, Bytes: st.Bytes, Notes: st.Notes, Node: st.Node}, nil
			},
		},
	}
}

func hfTarget(name, help string, torch bool) Target {
	return Target{
		Name:   name,
		Help:   help,
		Memory: true,
		Export: func(ctx context.Context, r *atomic.Reader, dst string, o ExportOptions) (*ExportStats, error) {
			st, err := hf.Export(ctx, r, dst, hf.Options{Torch: torch, DType: o.DType, MaxShard: o.MaxShard, Arch: o.Arch,
				Params: o.Params, Memory: o.Memory, Force: o.Force, Workers: o.Workers, Progress: o.Progress})
			if err != nil {
				return nil, err
			}
			return &ExportStats{DType: st.DType, Files: st.Files, Tensors: st.Tensors, TensorBytes: st.TensorBytes,
				Bytes: st.Bytes, Notes: st.Notes}, nil
		},
		Summary: func(st *ExportStats, human func(int64) string) (string, string) {
			return fmt.Sprintf("%s, %v", name, st.DType), fmt.Sprintf("%d tensors in %d files, %s of tensors, %s written",
				st.Tensors, st.Files, human(st.TensorBytes), human(st.Bytes))
		},
	}
}

// ExportTargets lists the names of the targets 'ucp export' writes.
func ExportTargets() []string { return targetNames(func(t Target) bool { return t.Export != nil }) }

// ReshardTargets lists the names of the targets 'ucp reshard' writes.
func ReshardTargets() []string { return targetNames(func(t Target) bool { return t.Reshard != nil }) }

func targetNames(has func(Target) bool) []string {
	var out []string
	for _, t := range Targets() {
		if has(t) {
			out = append(out, t.Name)
		}
	}
	return out
}

// LookupTarget returns the reshard writer of a target format.
func LookupTarget(name string) (Target, error) {
	return lookupTarget(name, ReshardTargets(), func(t Target) bool { return t.Reshard != nil })
}

// LookupExport returns the export writer of a target format.
func LookupExport(name string) (Target, error) {
	return lookupTarget(name, ExportTargets(), func(t Target) bool { return t.Export != nil })
}

func lookupTarget(name string, known []string, has func(Target) bool) (Target, error) {
	for _, t := range Targets() {
		if t.Name == name && has(t) {
			return t, nil
		}
	}
	return Target{}, fmt.Errorf("unknown target format %q (known: %s)", name, strings.Join(known, ", "))
}
