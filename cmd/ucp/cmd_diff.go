package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ucp-project/ucp/internal/diff"
	"github.com/ucp-project/ucp/internal/formats"
	"github.com/ucp-project/ucp/internal/fragment"
)

type diffOptions struct {
	From    string
	Tag     string
	RTol    float64
	ATol    float64
	Workers int
	All     bool
	Memory  string
	Vocab   int64
}

func newDiffCommand() *cobra.Command {
	var opts diffOptions
	cmd := &cobra.Command{
		Use:   "diff A B",
		Short: "Compare two checkpoints parameter by parameter and state by state",
		Long: `Compare the checkpoints A and B: every parameter's states (fp32,
exp_avg, exp_avg_sq, ...) and step, matched by name.

A and B may be any checkpoint ucp reads: a source checkpoint folder (DeepSpeed,
ZeRO-3, Megatron-LM, PyTorch DCP, also ucp's DCP exports), an atomic checkpoint
written by ucp convert, or a universal checkpoint written by DeepSpeed's
ds_to_universal.py (its ZeRO-3 flat tensors take their shapes from the
model-state files beside them).

Values are compared as float32, as convert writes them (a bfloat16 tensor
equals its exact float32 widening; DTYPE shows both stored dtypes). By default
the comparison is exact: bit patterns must be equal, so -0 differs from +0 and
NaNs must carry the same payload. With --rtol or --atol, a matches b when
|a-b| <= atol + rtol*|b|, any NaN matches any NaN and infinities match only
themselves.

The listing shows the states that are not equal (all of them with --all): shape
and dtype of each side, the number of differing elements, the largest absolute
and relative difference and the first differing element (row-major index).
The exit status is 0 when A and B are equal, 1 when they differ and 2 when one
of them cannot be read. Both sides are read in parallel chunks of byte ranges,
like convert: memory stays within --memory whatever the checkpoint's size.`,
		Example: `  ucp diff ckpt/global_step3_universal ckpt_ucp/          # ucp against ds_to_universal
  ucp diff --rtol 1e-6 run1/checkpoint run2/checkpoint   # two runs, with a tolerance
  ucp diff --all ckpt/ out/atomic                       # list every state, equal ones too`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDiff(cmd.Context(), cmd.OutOrStdout(), args[0], args[1], opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.From, "from", "", "source format of both folders when detection is not wanted (one of "+strings.Join(formats.Names(), ", ")+")")
	f.StringVar(&opts.Tag, "tag", "", "checkpoint tag or iteration of source folders (default: the latest)")
	f.Float64Var(&opts.RTol, "rtol", 0, "relative tolerance (default: exact)")
	f.Float64Var(&opts.ATol, "atol", 0, "absolute tolerance (default: exact)")
	f.IntVar(&opts.Workers, "workers", runtime.NumCPU(), "chunks compared at once")
	f.BoolVar(&opts.All, "all", false, "list every state, equal ones too")
	f.StringVar(&opts.Memory, "memory", "", "memory budget of the comparers, like 2GiB (default: a quarter of RAM)")
	f.Int64Var(&opts.Vocab, "vocab-size", 0, "true vocabulary size of Megatron-LM source folders that do not record it (as for convert)")
	return cmd
}

// exitError carries an exit status other than 1 (diff: 1 differ, 2 trouble).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func runDiff(ctx context.Context, out io.Writer, a, b string, opts diffOptions) error {
	if opts.Workers <= 0 {
		return &exitError{2, fmt.Errorf("--workers must be at least 1")}
	}
	if opts.RTol < 0 || opts.ATol < 0 || math.IsNaN(opts.RTol) || math.IsNaN(opts.ATol) {
		return &exitError{2, fmt.Errorf("--rtol and --atol must be non-negative numbers")}
	}
	memory := defaultMemory()
	if opts.Memory != "" {
		var err error
		if memory, err = parseBytes(opts.Memory); err != nil {
			return &exitError{2, fmt.Errorf("--memory: %w", err)}
		}
	}
	ta, err := diffSide(ctx, a, opts)
	if err != nil {
		return &exitError{2, err}
	}
	defer ta.Close()
	tb, err := diffSide(ctx, b, opts)
	if err != nil {
		return &exitError{2, err}
	}
	defer tb.Close()
	res, err := diff.Compare(ctx, ta, tb, diff.Options{RTol: opts.RTol, ATol: opts.ATol, Workers: opts.Workers, Memory: memory})
	if err != nil {
		return &exitError{2, err}
	}
	if err := printDiff(out, ta, tb, res, opts); err != nil {
		return &exitError{2, err}
	}
	if !res.Equal() {
		return fmt.Errorf("%s and %s differ", a, b)
	}
	return nil
}

// diffSide indexes one side: a universal folder (ucp's or
// ds_to_universal's) or any source format.
func diffSide(ctx context.Context, path string, opts diffOptions) (*fragment.Table, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	if opts.From == "" && diff.IsUniversal(path) {
		return diff.IndexUniversal(ctx, path, opts.Workers)
	}
	return formats.Index(ctx, path, opts.From, formats.Options{Tag: opts.Tag, Workers: opts.Workers, VocabSize: opts.Vocab})
}

func printDiff(out io.Writer, ta, tb *fragment.Table, res *diff.Result, opts diffOptions) error {
	for _, s := range []struct {
		side string
		t    *fragment.Table
	}{{"A", ta}, {"B", tb}} {
		fmt.Fprintf(out, "%s: %s (%s", s.side, s.t.Source, s.t.Format)
		if s.t.Tag != "" {
			fmt.Fprintf(out, ", tag %s", s.t.Tag)
		}
		fmt.Fprintf(out, ", %d parameters)\n", len(s.t.Params))
		for _, n := range s.t.Notes {
			fmt.Fprintf(out, "   note: %s\n", escapeControl(n))
		}
	}
	listed := 0
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, e := range res.Entries {
		if e.Equal() && !opts.All {
			continue
		}
		if listed == 0 {
			fmt.Fprintln(out)
			fmt.Fprintln(tw, "PARAMETER\tSTATE\tSHAPE\tDTYPE\tRESULT\tDIFFER\tMAX ABS\tMAX REL\tFIRST")
		}
		listed++
		differ, maxAbs, maxRel, first := "-", "-", "-", "-"
		if e.InA && e.InB && e.Elems > 0 {
			differ = fmt.Sprint(e.Differ)
			if e.NaN > 0 {
				differ += fmt.Sprintf(" (%d NaN)", e.NaN)
			}
			maxAbs, maxRel = fmtFloat(e.MaxAbs), fmtFloat(e.MaxRel)
			if e.First >= 0 {
				first = fmt.Sprint(e.First)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", escapeControl(e.Param), escapeControl(e.State),
			sideBySide(shapeString(e.InA, e.ShapeA), shapeString(e.InB, e.ShapeB)), sideBySide(orDash(e.DTypeA), orDash(e.DTypeB)),
			e.Status(), differ, maxAbs, maxRel, first)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	counts := res.Counts()
	var parts []string
	for _, s := range []struct{ status, say string }{{"equal", "equal"}, {"differs", "with other values"},
		{"shape differs", "with other shapes"}, {"only in A", "only in A"}, {"only in B", "only in B"}} {
		if counts[s.status] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s.status], s.say))
		}
	}
	mode := "exact"
	if opts.RTol != 0 || opts.ATol != 0 {
		mode = fmt.Sprintf("rtol %g, atol %g", opts.RTol, opts.ATol)
	}
	verdict := "equal"
	if !res.Equal() {
		verdict = "differ"
	}
	fmt.Fprintf(out, "\n%d states compared (%s): %s; %s read. A and B %s.\n", len(res.Entries), mode, strings.Join(parts, ", "),
		humanBytes(res.BytesRead), verdict)
	return nil
}

func fmtFloat(f float64) string {
	if f == 0 {
		return "0"
	}
	return fmt.Sprintf("%.3g", f)
}

func shapeString(in bool, s []int64) string {
	if !in {
		return "-"
	}
	return fmt.Sprint(s)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// sideBySide shows one value when both sides agree, else "a | b".
func sideBySide(a, b string) string {
	if a == b {
		return a
	}
	return a + " | " + b
}
