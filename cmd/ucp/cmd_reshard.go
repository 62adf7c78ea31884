package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/convert"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats"
	"github.com/ucp-project/ucp/internal/multinode"
)

type reshardOptions struct {
	To       string
	DType    string
	Verify   bool
	Quiet    bool
	NumNodes int
	NodeRank int
	Finalize bool
	formats.ReshardOptions
}

func newReshardCommand() *cobra.Command {
	var opts reshardOptions
	cmd := &cobra.Command{
		Use:   "reshard ATOMIC DST --to deepspeed --dp N --zero 1|2|3 [--tp N] | --to megatron --tp N --pp N [--vpp N] [--dp N --distributed-optimizer]",
		Short: "Write an atomic checkpoint as a native checkpoint of another parallelism",
		Long: `Write the atomic checkpoint in ATOMIC (made by 'ucp convert') as a native
training checkpoint for a new parallelism, the way the framework itself would
have saved that model at those degrees, so that a plain resume loads it.

--to deepspeed writes DST as a DeepSpeed ` + "v0.14.5" + ` tag folder and 'latest' (naming
DST) beside it: mp_rank_XX_model_states.pt per tensor-parallel rank (module in
the training dtype, param_shapes, frozen parameters, counters, scheduler and
client state from the source) and one [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt
per rank with DeepSpeed's flat fp32 partitions, Adam moments, step, paddings and
slice mappings; with --zero 3, zero_pp_rank_D_mp_rank_00_model_states.pt and the
per-parameter partitions of DeepSpeed's ZeRO-3 optimizer instead (--tp 1). DeepSpeed's engine loads it with engine.load_checkpoint(DIR, tag)
when its config has the same --dp, --tp, ZeRO stage and dtype, the same
parameters in the same param groups (the source's, in order) and the optimizer
the source used. A source converted from DeepSpeed gives the module layout,
parameter order and param groups; any other source of a known model family
takes them from the family: Megatron-LM sources Megatron-DeepSpeed's GPTModel
(with the optimizer state), Hugging Face and other sources the family's
Hugging Face module (weights only, TP 1); the summary says which
(formats/deepspeed/FORMAT.md, "Other sources").

--to megatron writes DST as a Megatron-LM --ckpt-format torch save folder:
iter_XXXXXXX (the source's iteration) with mp_rank_TT[_PPP]/model_optim_rng.pt
per tensor x pipeline rank (MCore state dicts in the training dtype, layers
renumbered per stage and virtual chunk, the vocabulary re-padded to
make_vocab_size_divisible_by x TP, fused QKV cut per query group, SwiGLU fc1
as [gate_r; up_r]; the non-distributed optimizer with fp32 main parameters and
Adam moments, or with --distributed-optimizer the param groups there and
distrib_optim.pt beside it in Megatron's DDP bucket layout; args at the new
degrees) and latest_checkpointed_iteration.txt.
With --ckpt-format torch_dist, DST gets iter_XXXXXXX as megatron-core's
dist_checkpointing.save writes it (metadata.json, .metadata, __R_0.distcp per
model-parallel rank, the common state; --megatron-core 0.15|0.18|0.19) with the
distributed optimizer's fully_reshardable state (formats/megatron/DISTWRITE.md).
The step goes where the loading run's Adam keeps it (--megatron-optimizer);
--decoder-first/last-pipeline-num-layers write Megatron's uneven pipeline split.
No rng_state is written: resume with --no-load-rng. ATOMIC converted from a
Megatron-LM checkpoint (torch or torch_dist) keeps its own layout; from any
other source of a known model family (Hugging Face, DCP: weights only, as a
'release' to load with --finetune --no-load-optim; DeepSpeed/Megatron-DeepSpeed:
with the fp32 main parameters, Adam moments, step and scheduler) it is written
from the family's names (formats/megatron/RESHARD.md).

Everything is checked before anything is written: a --tp the model cannot
take, a --dp DeepSpeed cannot save, an unknown stage are errors. DST is
written as DST.partial and renamed when complete.

Several machines can share the work: run one ucp per node with the same
arguments and --num-nodes N --node-rank I (taken by default from Slurm,
torchrun, Open MPI, PMI or a Kubernetes Indexed Job). Every node computes the
same plan, writes its share of the files (DeepSpeed files, Megatron mp_rank
folders, torch_dist __R_0.distcp files) into the one folder's .partial on a
shared filesystem and leaves a completion record; the node that finds all
records present writes what comes last (torch_dist's metadata.json, common
state and .metadata), renames the folder and writes 'latest' or
latest_checkpointed_iteration.txt (or run 'ucp reshard --finalize' with the
same arguments). A failed node can be rerun alone.`,
		Example: `  ucp reshard out/atomic ckpt/global_step100 --to deepspeed --dp 3 --zero 2
  ucp reshard --to deepspeed --dp 8 --zero 1 --tp 1 --dtype bfloat16 --bf16-optimizer atomic/ ckpt/step100
  ucp reshard out/atomic megatron_ckpt --to megatron --tp 2 --pp 4 --vpp 2 --dp 8
  srun -N4 --ntasks-per-node=1 ucp reshard /shared/atomic /shared/mckpt --to megatron --ckpt-format torch_dist --tp 8 --pp 4`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runReshard(cmd.Context(), cmd.OutOrStdout(), args[0], args[1], opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.To, "to", "", "target format (deepspeed, megatron)")
	f.IntVar(&opts.DP, "dp", 0, "data-parallel size of the target run (megatron: default 1)")
	f.IntVar(&opts.TP, "tp", 1, "tensor-parallel size of the target run")
	f.IntVar(&opts.PP, "pp", 1, "pipeline-parallel size of the target run (megatron)")
	f.IntVar(&opts.VPP, "vpp", 0, "model chunks per pipeline stage, virtual pipeline parallelism (megatron; 0: none)")
	f.IntVar(&opts.EP, "ep", 0, "megatron: expert-parallel size of a mixture-of-experts target (--expert-model-parallel-size; default 1)")
	f.IntVar(&opts.ETP, "expert-tp", 0, "megatron: expert tensor-parallel size (--expert-tensor-parallel-size; default --tp)")
	f.BoolVar(&opts.DistOptimizer, "distributed-optimizer", false, "Megatron distributed optimizer files (distrib_optim.pt)")
	f.StringVar(&opts.MegatronSpec, "megatron-spec", "", "--to megatron from a non-Megatron source (Hugging Face, DeepSpeed, DCP) of a known model family: the layer spec of the loading run, te (Transformer Engine, the default) or local")
	f.StringVar(&opts.MegatronOptimizer, "megatron-optimizer", "", "the Adam of the loading Megatron run, which decides where the step is written: adamw (torch.optim.AdamW, Megatron without TE/Apex) or fused (TE/Apex FusedAdam); default: the source's")
	f.IntVar(&opts.FirstStageLayers, "decoder-first-pipeline-num-layers", 0, "megatron: layers on the first pipeline stage (Megatron's uneven split; 0: even)")
	f.IntVar(&opts.LastStageLayers, "decoder-last-pipeline-num-layers", 0, "megatron: layers on the last pipeline stage (Megatron's uneven split; 0: even)")
	f.StringVar(&opts.CkptFormat, "ckpt-format", "", "megatron: torch (default; mp_rank_* files) or torch_dist (dist_checkpointing, Megatron's default)")
	f.StringVar(&opts.MegatronCore, "megatron-core", "", "megatron --ckpt-format torch_dist: the megatron-core layout, 0.15, 0.18 or 0.19 (default 0.19)")
	f.StringVar(&opts.DistOptimSharding, "dist-optim-sharding", "", "megatron --ckpt-format torch_dist: fully_reshardable (default; loads at any degree) or dp_reshardable (DDP buckets at the target DP; loads at these TP/PP only)")
	f.IntVar(&opts.Zero, "zero", -1, "DeepSpeed ZeRO stage (1, 2 or 3)")
	f.StringVar(&opts.DType, "dtype", "", "training dtype of the target (float32, bfloat16, float16; default: the source's)")
	f.BoolVar(&opts.BF16Optimizer, "bf16-optimizer", false, "DeepSpeed BF16_Optimizer files (bf16, ZeRO stage 1, fp32 gradient accumulation)")
	f.StringVar(&opts.DSVersion, "deepspeed-version", "", "--to deepspeed: the DeepSpeed release the target runs, written as ds_version (default: the source's); 0.19.5 and later also get checkpoint_parallel_dimensions")
	f.BoolVar(&opts.Force, "force", false, "replace DST if it exists")
	f.BoolVar(&opts.NoSync, "no-sync", false, "do not sync the written files to disk")
	f.BoolVar(&opts.NoLatest, "no-latest", false, "--to deepspeed: do not write or change the 'latest' pointer file beside DST")
	f.BoolVar(&opts.Verify, "verify", true, "check every atomic file's CRC-32 against the manifest before using it")
	f.BoolVar(&opts.Quiet, "quiet", false, "no summary")
	f.IntVar(&opts.NumNodes, "num-nodes", 0, "nodes sharing the reshard (default: from the launcher's environment, else 1)")
	f.IntVar(&opts.NodeRank, "node-rank", -1, "this node's rank, 0-based (default: from the launcher's environment, else 0)")
	f.Lookup("node-rank").DefValue = "0" // -1 means "not given"; the usage says the default
	f.BoolVar(&opts.Finalize, "finalize", false, "only finish a multi-node reshard whose nodes have all finished")
	return cmd
}

func runReshard(ctx context.Context, out io.Writer, src, dst string, opts reshardOptions) error {
	tg, err := lookupTo(opts.To, formats.ReshardTargets(), formats.LookupTarget)
	if err != nil {
		return err
	}
	if tg.Name == "megatron" {
		if opts.DP == 0 {
			opts.DP = 1
		}
	} else {
		if opts.DP <= 0 {
			return fmt.Errorf("--dp is required: the data-parallel size of the target run")
		}
		if opts.Zero < 0 {
			return fmt.Errorf("--zero is required: the ZeRO stage of the target run")
		}
	}
	if opts.DType != "" {
		dt, err := dtype.Parse(opts.DType)
		if err != nil {
			return fmt.Errorf("--dtype: %w", err)
		}
		opts.ReshardOptions.DType = dt
	}
	if err := atomicCheck(src); err != nil {
		return err
	}
	node, nodes, from, err := nodePlace(opts.NodeRank, opts.NumNodes, os.Getenv)
	if err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	if opts.Finalize && nodes == 1 {
		return fmt.Errorf("%s: --finalize finishes a multi-node reshard: give the --num-nodes its nodes ran with", dst)
	}
	opts.Place = multinode.Place{Node: node, Nodes: nodes, Finalize: opts.Finalize, AfterPhase: stopAfter}
	start := time.Now()
	r, err := atomic.OpenReader(src, atomic.ReaderOptions{Verify: opts.Verify})
	if err != nil {
		return err
	}
	// Up front, as convert: the target holds every state once (ZeRO and
	// tensor-parallel partitions) and the weights again in the training
	// dtype (at most their fp32 size).
	if err := convert.CheckFree(dst, convert.AtomicBytes(r.Manifest, false)+convert.AtomicBytes(r.Manifest, true)+convert.SpaceMargin, "the reshard writes up to", true); err != nil {
		return err
	}
	st, err := tg.Reshard(ctx, r, dst, opts.ReshardOptions)
	if err != nil {
		return err
	}
	switch {
	case opts.Quiet:
		return nil
	case st.Node != nil:
		if reshardNode(out, dst, node, nodes, from, st, opts, start) {
			return nil
		}
	case tg.Name == "megatron":
		fmt.Fprintf(out, "resharded %s -> %s (%s: TP %d, PP %d, VPP %d, DP %d%s)\n", src, dst, tg.Name, opts.TP, opts.PP, opts.VPP, opts.DP, expertDegrees(opts.ReshardOptions))
		fmt.Fprintf(out, "  %d files, %s in %s\n", st.Files, humanBytes(st.Bytes), fmtDuration(time.Since(start)))
	default:
		fmt.Fprintf(out, "resharded %s -> %s (%s: DP %d, TP %d, ZeRO-%d)\n", src, dst, tg.Name, opts.DP, opts.TP, opts.Zero)
		fmt.Fprintf(out, "  %d files, %s in %s\n", st.Files, humanBytes(st.Bytes), fmtDuration(time.Since(start)))
	}
	printPointer(out, st.Pointer)
	printNotes(out, st.Notes)
	return nil
}

// expertDegrees describes the expert layout asked for ("" when none).
func expertDegrees(o formats.ReshardOptions) string {
	if o.EP == 0 && o.ETP == 0 {
		return ""
	}
	etp := o.ETP
	if etp == 0 {
		etp = o.TP
	}
	return fmt.Sprintf(", EP %d, expert TP %d", max(o.EP, 1), etp)
}

// reshardNode says what this node of a multi-node reshard did; done
// when the folder is not complete yet (nothing more to say).
func reshardNode(out io.Writer, dst string, node, nodes int, from string, st *formats.ReshardStats, opts reshardOptions, start time.Time) (done bool) {
	res := st.Node
	if res.NodeDone {
		fmt.Fprintf(out, "node %d of %d (from %s) done: %d of the %d parts, %d files, %s in %s\n", node, nodes, from, len(res.Units),
			res.Total, st.Files, humanBytes(st.Bytes), fmtDuration(time.Since(start)))
	}
	switch {
	case res.Finalized:
		fmt.Fprintf(out, "finalized %s: the nodes' files checked against their records, the folder complete\n", dst)
	case !res.AllDone && !opts.Finalize:
		fmt.Fprintln(out, "other nodes are still running; the last one to finish completes the folder (or run with --finalize)")
	case res.OtherFinalizing:
		fmt.Fprintln(out, "another node (a live process) is completing the folder")
	}
	return !res.Finalized
}
