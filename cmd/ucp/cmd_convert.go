package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ucp-project/ucp/internal/arrowtable"
	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/convert"
	"github.com/ucp-project/ucp/internal/formats"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/report"
)

type convertOptions struct {
	From          string
	Tag           string
	Workers       int
	Force         bool
	DryRun        bool
	CheckReplicas bool
	Quiet         bool
	VocabSize     int64
	ModelConfig   string
	NumNodes      int
	NodeRank      int
	Finalize      bool
	Memory        string
	Report        string
	Arrow         string
	ChunkElems    int64
	NoSync        bool
	DSVersion     string
	Resume        bool
	NoLatest      bool
}

func newConvertCommand() *cobra.Command {
	var opts convertOptions
	cmd := &cobra.Command{
		Use:   "convert SRC DST",
		Short: "Convert a sharded checkpoint into an atomic checkpoint",
		Long: `Convert the checkpoint in SRC into an atomic checkpoint in DST.

SRC is a checkpoint folder: a DeepSpeed save folder with 'latest' or a tag
folder (ZeRO-1/2, BF16_Optimizer, ZeRO-3, Megatron-DeepSpeed TP/PP), a
Megatron-LM save folder or iter_* folder, or a PyTorch Distributed Checkpoint
folder with .metadata (FSDP, DTensor, torchtitan). The format is detected;
--from names it.

ucp indexes the source (pickles only), checks that every element of every
state is covered exactly once, then reads exactly the byte ranges it needs,
converts them to float32 and writes
DST/zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt, DST/zero/optimizer_state.pt,
the model-state files, and DST/ucp.json last.
DST appears only when it is complete; a 'latest_universal' file naming it is
written beside it, as DeepSpeed's ds_to_universal does.

Several machines can share the work: run one ucp per node with the same
arguments and --num-nodes N --node-rank I (taken by default from Slurm,
torchrun, Open MPI, PMI or a Kubernetes Indexed Job). Every node computes the
same plan, writes its share into DST.partial on a shared filesystem and leaves a
completion record; the node that finds all records present writes the manifest
(or run 'ucp convert --finalize' with the same arguments). A failed node can be
rerun alone.`,
		Example: `  ucp convert checkpoints/ checkpoints/global_step1000_universal
  ucp convert --workers 8 --from deepspeed ckpt/global_step3 out/
  ucp convert --dry-run ckpt/ out/      # print the plan only
  srun -N4 --ntasks-per-node=1 ucp convert /shared/ckpt /shared/out   # 4 nodes under Slurm
  ucp convert --report run.json ckpt/ out/   # per-worker timings, and a timeline in run.svg`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runConvert(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], args[1], opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.From, "from", "", "source format (default: detect; one of "+strings.Join(formats.Names(), ", ")+")")
	f.StringVar(&opts.Tag, "tag", "", "checkpoint tag or iteration to convert (default: the latest)")
	f.IntVar(&opts.Workers, "workers", runtime.NumCPU(), "concurrent reducers")
	f.BoolVar(&opts.Force, "force", false, "replace DST if it exists")
	f.BoolVar(&opts.DryRun, "dry-run", false, "print the plan (per worker: parameters, bytes, share) and stop")
	f.BoolVar(&opts.CheckReplicas, "check-replicas", true, "require replicated copies to be identical")
	f.BoolVar(&opts.Quiet, "quiet", false, "no progress bar and no summary")
	f.Int64Var(&opts.VocabSize, "vocab-size", 0, "true vocabulary size, for checkpoints that do not record it")
	f.StringVar(&opts.ModelConfig, "model-config", "", "a transformers config.json naming the model family and config of a checkpoint that records none (torchtitan DCP)")
	f.IntVar(&opts.NumNodes, "num-nodes", 0, "nodes sharing the conversion (default: from the launcher's environment, else 1)")
	f.IntVar(&opts.NodeRank, "node-rank", -1, "this node's rank, 0-based (default: from the launcher's environment, else 0)")
	f.Lookup("node-rank").DefValue = "0" // -1 means "not given"; the usage says the default
	f.BoolVar(&opts.Finalize, "finalize", false, "only write the manifest of a multi-node conversion whose nodes have all finished")
	f.StringVar(&opts.Memory, "memory", "", "memory budget of the reducers, like 8GiB (default: a quarter of RAM)")
	f.StringVar(&opts.Report, "report", "", "write per-worker phase timings to this JSON file and a timeline next to it (.svg)")
	f.StringVar(&opts.Arrow, "arrow", "", "with --dry-run: write the fragment table to this Arrow IPC file and the plan next to it (NAME.plan.arrow)")
	f.StringVar(&opts.DSVersion, "deepspeed-version", "", "write the universal state files as this DeepSpeed release's loaders read them (e.g. 0.14: bare tensors for ZeRO-3 sources before 0.19.3)")
	f.Int64Var(&opts.ChunkElems, "chunk-elems", 0, "largest task in elements (default: from the memory budget and the balance)")
	f.MarkHidden("chunk-elems")
	f.BoolVar(&opts.NoSync, "no-sync", false, "do not sync the output to disk before writing the manifest")
	f.BoolVar(&opts.NoLatest, "no-latest", false, "do not write or change the latest_universal pointer file beside DST")
	f.BoolVar(&opts.Resume, "resume", false, "reuse the files a killed or failed run completed in DST.partial (checked against their CRC-32) and do only the rest")
	return cmd
}

func runConvert(ctx context.Context, out, errOut io.Writer, src, dst string, opts convertOptions) error {
	if opts.Workers <= 0 {
		return fmt.Errorf("--workers must be at least 1")
	}
	if opts.Arrow != "" && !opts.DryRun {
		return fmt.Errorf("--arrow writes the plan of a --dry-run: add --dry-run (a conversion writes its report with --report)")
	}
	if err := sourceCheck(src, opts.From); err != nil {
		return err
	}
	deferred, err := convert.CheckSource(src, dst)
	if err != nil {
		return err
	}
	if err := checkSideFiles(opts.Force, []string{src, dst, dst + atomic.PartialSuffix}, reportFiles(opts.Report), arrowFiles(opts.Arrow)); err != nil {
		return err
	}
	if opts.Resume && !opts.Force && isAtomic(dst) {
		if _, err := os.Stat(dst + atomic.PartialSuffix); os.IsNotExist(err) {
			return resumeComplete(out, dst, opts)
		}
	}
	node, nodes, from, err := nodePlace(opts.NodeRank, opts.NumNodes, os.Getenv)
	if err != nil {
		return err
	}
	memory := defaultMemory()
	if opts.Memory != "" {
		if memory, err = parseBytes(opts.Memory); err != nil {
			return fmt.Errorf("--memory: %w", err)
		}
	}
	// Keep the garbage collector within the budget as well.
	debug.SetMemoryLimit(memory + 100<<20)
	co := convert.Options{From: opts.From, Tag: opts.Tag, Workers: opts.Workers, VocabSize: opts.VocabSize, ModelConfig: opts.ModelConfig, Node: node, Nodes: nodes,
		Memory: memory, ChunkElems: opts.ChunkElems, DSVersion: opts.DSVersion, Force: opts.Force, Finalize: opts.Finalize,
		NoSync: opts.NoSync, Resume: opts.Resume, CheckReplicas: opts.CheckReplicas, Report: opts.Report, Tool: versionString(),
		AfterPhase: stopAfter, NoLatest: opts.NoLatest,
		Progress: func(total int64) (func(read, written int64), func()) {
			bar := newProgress(errOut, "converting", total, opts.Quiet)
			return convert.ProgressCounter(bar.addBytes), bar.finish
		}}
	job, err := convert.Plan(ctx, src, dst, deferred, co)
	if ie := (*convert.IndexError)(nil); errors.As(err, &ie) {
		return sourceError(src, opts.Tag, ie.Err)
	}
	if err != nil {
		return err
	}
	defer job.Close()
	if opts.DryRun {
		if err := printPlan(out, job.Table, job.Plan, dst, opts); err != nil || opts.Arrow == "" {
			return err
		}
		return writeArrow(out, opts.Arrow, job.Table, job.Plan)
	}
	res, err := job.Run(ctx)
	if res.NodeDone && !opts.Quiet {
		fmt.Fprintf(out, "node %d of %d (from %s) done: %s\n", node, nodes, from,
			transferLine(res.Stats.BytesRead, res.Stats.BytesWritten, time.Since(job.Start), job.Indexed))
		stragglers(out, res.Stats)
	}
	switch {
	case err != nil:
		return err
	case nodes == 1 && !opts.Finalize:
		warn(errOut, res.Writer)
		summary(out, opts, job.Table, src, dst, res.Manifest, res.Stats, res.Writer, job.Start, job.Indexed)
	case res.Manifest != nil:
		warn(errOut, res.Writer)
		if !opts.Quiet {
			fmt.Fprintf(out, "finalized %s: %d parameters, manifest written in %s\n", res.Writer.Dst, len(res.Manifest.Params),
				fmtDuration(time.Since(job.Start)))
			printPointer(out, res.Writer.Pointer)
		}
	case !res.AllDone:
		if !opts.Quiet {
			fmt.Fprintln(out, "other nodes are still running; the last one to finish writes the manifest (or run with --finalize)")
		}
	case res.OtherFinalizing:
		if !opts.Quiet {
			fmt.Fprintln(out, "another node (a live process) is writing the manifest")
		}
	}
	return nil
}

// resumeComplete answers --resume when DST is already complete (the
// killed run got as far as the rename): nothing to convert, but the
// latest_universal pointer may still be missing.
func resumeComplete(out io.Writer, dst string, opts convertOptions) error {
	var p *atomic.Pointer
	if !opts.NoLatest {
		pt, err := convert.LinkLatest(dst, opts.NoSync)
		if err != nil {
			return err
		}
		p = &pt
	}
	if !opts.Quiet {
		fmt.Fprintf(out, "%s is already complete (it has %s): nothing to resume; 'ucp verify %s' checks it\n", dst, atomic.ManifestName, dst)
		printPointer(out, p)
	}
	return nil
}

// printPointer says which pointer file beside DST was written or changed.
func printPointer(out io.Writer, p *atomic.Pointer) {
	if p != nil {
		fmt.Fprintf(out, "  %s (--no-latest leaves it alone)\n", p)
	}
}

// printNotes prints a writer's notes, one a line.
func printNotes(out io.Writer, notes []string) {
	for _, n := range notes {
		fmt.Fprintln(out, "  note:", n)
	}
}

// lookupTo is the target --to names among names, the targets of the
// command, which lookup finds.
func lookupTo(to string, names []string, lookup func(string) (formats.Target, error)) (formats.Target, error) {
	if to == "" {
		return formats.Target{}, fmt.Errorf("--to is required (one of: %s)", strings.Join(names, ", "))
	}
	return lookup(to)
}

// warn prints the writer's warnings: problems that left DST complete.
func warn(errOut io.Writer, w *atomic.Writer) {
	for _, m := range w.Warnings {
		fmt.Fprintln(errOut, "ucp: warning:", m)
	}
}

func summary(out io.Writer, opts convertOptions, t *fragment.Table, src, dst string, m *atomic.Manifest, stats *mapreduce.Stats, w *atomic.Writer, start time.Time, indexed time.Duration) {
	if opts.Quiet {
		return
	}
	fmt.Fprintf(out, "converted %s checkpoint %s -> %s\n", t.Format, src, dst)
	// "written" counts the tensor and copied bytes; the files also hold
	// torch-file framing, small pickled values and the manifest, so the
	// folder's size (what ls and du see) is given apart.
	var listed int64
	for _, f := range m.AllFiles() {
		listed += f.Bytes
	}
	fmt.Fprintf(out, "  %d parameters; tensor data and copied files: %s\n", len(m.Params),
		transferLine(stats.BytesRead, stats.BytesWritten, time.Since(start), indexed))
	fmt.Fprintf(out, "  %s: %s\n", dst, filesLine(dst, len(m.AllFiles()), listed))
	if n, b := w.Reused(); opts.Resume {
		fmt.Fprintf(out, "  resumed: %d files (%s) reused from %s%s, the rest converted this time\n", n, humanBytes(b), filepath.Base(dst), atomic.PartialSuffix)
	}
	printPointer(out, w.Pointer)
	stragglers(out, stats)
	printNotes(out, t.Notes)
}

// writeArrow writes the fragment table and plan as Arrow IPC files and
// says where.
func writeArrow(out io.Writer, path string, t *fragment.Table, plan *mapreduce.Plan) error {
	frags, tasks, err := arrowtable.Write(path, t, plan)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %d fragments to %s and %d tasks to %s (Arrow IPC files)\n", frags, path, tasks, arrowtable.PlanPath(path))
	return nil
}

// stragglers prints which worker held the run up and the slowest tasks, so
// a skewed plan shows without --report.
func stragglers(out io.Writer, stats *mapreduce.Stats) {
	s := report.Summarize(stats, 3)
	if len(s.Slowest) == 0 {
		return
	}
	if s.Workers > 1 {
		fmt.Fprintf(out, "  stragglers: worker %d finished last at %s, the median worker at %s; busy %s, the median worker %s\n",
			s.Last, fmtDuration(s.LastEnd), fmtDuration(s.MedianEnd), fmtDuration(s.LastBusy), fmtDuration(s.MedianBusy))
	}
	var tasks []string
	for _, tk := range s.Slowest {
		tasks = append(tasks, fmt.Sprintf("%s %s (%s, worker %d)", tk.Label, fmtDuration(tk.Duration), humanBytes(tk.Bytes), tk.Worker))
	}
	fmt.Fprintf(out, "  slowest tasks: %s\n", strings.Join(tasks, ", "))
}

func printPlan(out io.Writer, t *fragment.Table, plan *mapreduce.Plan, dst string, opts convertOptions) error {
	var total int64
	for _, tk := range plan.Tasks {
		r, w := plan.IO(tk)
		total += r + w
	}
	// The totals from the table, exact: what the run's summary will say.
	read, written := t.Bytes()
	for _, f := range t.CopyFiles {
		read, written = read+f.Size, written+f.Size
	}
	fmt.Fprintf(out, "plan: %d tasks over %d node(s) x %d worker(s), chunks of at most %d elements: %s to read, %s to write\n",
		len(plan.Tasks), plan.Nodes, plan.Cores, plan.ChunkElems, humanBytes(read), humanBytes(written))
	fmt.Fprintf(out, "Each node's tasks are fixed by the plan. Within a node the workers take its tasks from one queue, each\n"+
		"the next task when it is free, so which worker does which task depends on timing: the WORKER rows are a\n"+
		"simulation by bytes, what to expect, not an assignment (--report FILE.json records what each worker did).\n"+
		"PARAMETERS counts the parameters (of %d) a worker touches: a parameter split in chunks over\n"+
		"several workers is counted by each of them. SHARE is the worker's part of the bytes read and written.\n\n", len(t.Params))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tWORKER\tTASKS\tPARAMETERS\tREAD\tWRITE\tSHARE")
	for n := 0; n < plan.Nodes; n++ {
		for wi, share := range plan.WorkerShares(n) {
			var r, w int64
			params := map[int]bool{}
			for _, tk := range share {
				tr, tw := plan.IO(tk)
				r, w = r+tr, w+tw
				if pi := plan.Outputs[tk.Output].Param; pi >= 0 {
					params[pi] = true
				}
			}
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\t%.1f%%\n", n, wi, len(share), len(params), humanBytes(r), humanBytes(w),
				100*float64(r+w)/float64(max(total, 1)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// What the real run would do with DST as it is now.
	if _, err := os.Stat(dst); err == nil {
		switch {
		case opts.Force:
			fmt.Fprintf(out, "\nnote: %s exists: the real run (--force) replaces it once the new checkpoint is complete\n", dst)
		case opts.Resume && isAtomic(dst):
			fmt.Fprintf(out, "\nnote: %s is complete: the real run (--resume) has nothing to do\n", dst)
		default:
			fmt.Fprintf(out, "\nnote: %s exists: the real run will refuse it (--force replaces it)\n", dst)
		}
	}
	return nil
}

// progress shows a bar on a terminal and nothing otherwise.
type progress struct {
	bar interface {
		Add64(int64) error
		Finish() error
	}
}

// label says what the bar counts (converting, exporting).
func newProgress(w io.Writer, label string, total int64, quiet bool) *progress {
	if quiet || !isTerminal(w) {
		return &progress{}
	}
	return &progress{bar: newBar(w, label, total)}
}

// add counts bytes read and written (export's bar counts both).
func (p *progress) add(read, written int64) { p.addBytes(read + written) }

func (p *progress) addBytes(n int64) {
	if p.bar != nil && n != 0 {
		p.bar.Add64(n)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
