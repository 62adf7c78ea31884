package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ucp-project/ucp/internal/formats"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/report"
	"github.com/ucp-project/ucp/internal/torchfile"
)

type inspectOptions struct {
	JSON    bool
	From    string
	Tag     string
	Workers int
	Values  bool
	Filter  string
	Layers  bool
	All     bool
	Arrow   string
	Force   bool
	Vocab   int64
}

func newInspectCommand() *cobra.Command {
	var opts inspectOptions
	cmd := &cobra.Command{
		Use:   "inspect PATH",
		Short: "Show the tensors of a file or the parameters of a checkpoint",
		Long: `Inspect a single torch.save file (.pt, .bin) or safetensors file, or a
checkpoint folder.

For a file it prints the tree of keys with each tensor's dtype, shape, size and
where its bytes lie; no tensor data is read. For a checkpoint folder it detects
the format and prints the parallel degrees and, per parameter, its sharding
pattern, full shape, source dtype, split dims, fragments and padding. For an
atomic checkpoint written by ucp convert it prints its manifest.
` + inspectHelp,
		Example: `  ucp inspect checkpoint/global_step3/mp_rank_00_model_states.pt
  ucp inspect model.safetensors --json
  ucp inspect checkpoint/            # a DeepSpeed save folder with 'latest'
  ucp inspect checkpoint_universal/  # an atomic checkpoint`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runInspect(cmd.Context(), cmd.OutOrStdout(), args[0], opts)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&opts.JSON, "json", false, "print one JSON object instead of a table")
	f.StringVar(&opts.From, "from", "", "checkpoint format of a folder (default: detect; one of "+strings.Join(formats.Names(), ", ")+")")
	f.StringVar(&opts.Tag, "tag", "", "checkpoint tag or iteration to read (default: the latest)")
	f.IntVar(&opts.Workers, "workers", 0, "files decoded at once (default: all cores)")
	f.BoolVar(&opts.Values, "values", false, "also list non-tensor values of a file")
	f.StringVar(&opts.Filter, "filter", "", "list only the parameters whose name matches this regular expression")
	f.BoolVar(&opts.Layers, "layers", false, "list one line per layer kind (layer numbers collapsed) instead of every parameter")
	f.BoolVar(&opts.All, "all", false, "list every parameter, however many")
	f.Int64Var(&opts.Vocab, "vocab-size", 0, "true vocabulary size of a Megatron-LM folder that does not record it (as for convert)")
	f.StringVar(&opts.Arrow, "arrow", "", "write the fragment table to this Arrow IPC file and the plan of a one-node convert\n"+
		"with --workers next to it (NAME.plan.arrow), instead of printing")
	f.BoolVar(&opts.Force, "force", false, "replace existing --arrow files")
	return cmd
}

func runInspect(ctx context.Context, out io.Writer, path string, opts inspectOptions) error {
	if err := checkPath(path); err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		if err := fileCheck(path); err != nil {
			return err
		}
	}
	if opts.Arrow != "" && (!st.IsDir() || opts.From == "" && isAtomic(path)) {
		return fmt.Errorf("%s: --arrow writes the fragment table of a source checkpoint folder (DeepSpeed, Megatron-LM, DCP); "+
			"this is %s", path, map[bool]string{true: "an atomic checkpoint (one file per state, no fragments: ucp inspect lists it)",
			false: "a file: give its checkpoint folder"}[st.IsDir()])
	}
	if err := checkSideFiles(opts.Force, []string{path}, arrowFiles(opts.Arrow)); err != nil {
		return err
	}
	if st.IsDir() && opts.From == "" && isAtomic(path) {
		return inspectAtomic(out, path, opts.JSON)
	}
	if st.IsDir() {
		t, err := formats.Index(ctx, path, opts.From, formats.Options{Tag: opts.Tag, Workers: opts.Workers, VocabSize: opts.Vocab})
		if err != nil {
			return sourceError(path, opts.Tag, err)
		}
		defer t.Close()
		if opts.Arrow != "" {
			return inspectArrow(out, t, opts)
		}
		if opts.JSON {
			return writeJSON(out, checkpointReport(t))
		}
		return printCheckpointView(out, t, opts)
	}
	return inspectFile(out, path, opts)
}

// inspectArrow writes the table and the plan a one-node convert with
// --workers reducers (default: all cores) and the default memory budget
// would make.
func inspectArrow(out io.Writer, t *fragment.Table, opts inspectOptions) error {
	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	plan, err := mapreduce.NewPlan(t, mapreduce.PlanOptions{Nodes: 1, Cores: workers, Memory: defaultMemory()})
	if err != nil {
		return err
	}
	return writeArrow(out, opts.Arrow, t, plan)
}

// fileReport is the --json output for one file.
type fileReport struct {
	File    string          `json:"file"`
	Format  string          `json:"format"`
	Prefix  string          `json:"prefix,omitempty"`
	Tensors []tensorReport  `json:"tensors"`
	Values  []valueReport   `json:"values,omitempty"`
	Meta    json.RawMessage `json:"metadata,omitempty"`
	// Unexpected globals are outside the allowlist: decoded as inert
	// objects, never executed.
	Unexpected []string `json:"unexpected_globals,omitempty"`
}

type tensorReport struct {
	Key           []any   `json:"key"`
	DType         string  `json:"dtype"`
	Shape         []int64 `json:"shape"`
	Stride        []int64 `json:"stride,omitempty"`
	StorageOffset int64   `json:"storage_offset"`
	NBytes        int64   `json:"nbytes"`
	Storage       string  `json:"storage,omitempty"`
	DataOffset    int64   `json:"data_offset"` // file offset of the tensor's first element
}

type valueReport struct {
	Key   []any  `json:"key"`
	Type  string `json:"type"`
	Value string `json:"value"`
}

func jsonKey(path []pyobj.Value) []any {
	out := make([]any, len(path))
	for i, k := range path {
		switch x := k.(type) {
		case string, int64, bool, nil, float64:
			out[i] = x
		default:
			out[i] = pyobj.Repr(x)
		}
	}
	return out
}

func inspectFile(out io.Writer, path string, opts inspectOptions) error {
	rep, err := fileTensors(path, opts.Values)
	if err != nil {
		return err
	}
	if opts.JSON {
		return writeJSON(out, rep)
	}
	fmt.Fprintf(out, "%s: %s", escapeControl(rep.File), rep.Format)
	if rep.Prefix != "" {
		fmt.Fprintf(out, " (archive folder %s/)", rep.Prefix)
	}
	var total int64
	for _, t := range rep.Tensors {
		total += t.NBytes
	}
	fmt.Fprintf(out, ", %d tensors, %s\n\n", len(rep.Tensors), humanBytes(total))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tDTYPE\tSHAPE\tBYTES\tSTORAGE")
	for _, t := range rep.Tensors {
		where := fmt.Sprintf("@%d", t.DataOffset)
		if t.Storage != "" {
			where = fmt.Sprintf("data/%s+%d %s", t.Storage, t.StorageOffset, where)
		}
		if t.Stride != nil {
			where += fmt.Sprintf(" stride %v", t.Stride)
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%s\n", keyString(t.Key), t.DType, t.Shape, t.NBytes, where)
	}
	for _, v := range rep.Values {
		fmt.Fprintf(tw, "%s\t%s\t\t\t%s\n", keyString(v.Key), v.Type, escapeControl(fmt.Sprint(v.Value)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Unexpected) > 0 {
		fmt.Fprintf(out, "\nglobals outside the allowlist (kept as inert objects, never executed): %s\n", escapeControl(strings.Join(rep.Unexpected, ", ")))
	}
	return nil
}

func keyString(k []any) string {
	if len(k) == 0 {
		return "(root)"
	}
	var b strings.Builder
	for i, e := range k {
		if i > 0 {
			b.WriteByte('.')
		}
		fmt.Fprint(&b, e)
	}
	return escapeControl(b.String())
}

// fileTensors lists a torch.save or safetensors file's tensors.
func fileTensors(path string, values bool) (*fileReport, error) {
	if isSafetensors(path) {
		return safetensorsReport(path)
	}
	f, err := torchfile.Decode(path)
	if err != nil {
		return nil, err
	}
	rep := &fileReport{File: path, Format: string(f.Format), Prefix: f.Prefix, Tensors: []tensorReport{}, Unexpected: f.Unexpected}
	err = pyobj.Walk(f.Root, pyobj.DefaultLimits(), func(p []pyobj.Value, v pyobj.Value) error {
		switch x := v.(type) {
		case *torchfile.Tensor:
			tr := tensorReport{Key: jsonKey(p), DType: x.DType.String(), Shape: nonNil(x.Shape), StorageOffset: x.StorageOffset,
				NBytes: x.NBytes(), Storage: x.Storage.Key, DataOffset: x.FileOffset()}
			if !x.IsContiguous() {
				tr.Stride = x.Stride
			}
			rep.Tensors = append(rep.Tensors, tr)
			return pyobj.ErrSkip
		case *pyobj.Dict, *pyobj.List, pyobj.Tuple, *pyobj.Object:
			return nil
		}
		if values {
			rep.Values = append(rep.Values, valueReport{Key: jsonKey(p), Type: pyobj.TypeName(v), Value: pyobj.Repr(v)})
		}
		return nil
	})
	return rep, err
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

// checkpointReport is the --json output for a checkpoint folder.
type checkpointJSON struct {
	Format  string           `json:"format"`
	Source  string           `json:"source"`
	Tag     string           `json:"tag,omitempty"`
	Degrees fragment.Degrees `json:"degrees"`
	Params  []paramReport    `json:"params"`
	Notes   []string         `json:"notes,omitempty"`
}

type paramReport struct {
	Name      string   `json:"name"`
	Pattern   string   `json:"pattern"`
	Shape     []int64  `json:"shape"`
	DType     string   `json:"dtype"`
	SplitDims []int    `json:"split_dims,omitempty"`
	Shards    int      `json:"shards"`
	Fragments int      `json:"fragments"`
	Padding   int64    `json:"padding_elements"`
	States    []string `json:"states"`
	Frozen    bool     `json:"frozen,omitempty"`
	VocabSize int64    `json:"vocab_size,omitempty"`
}

func checkpointReport(t *fragment.Table) checkpointJSON {
	rep := checkpointJSON{Format: t.Format, Source: t.Source, Tag: t.Tag, Degrees: t.Degrees, Notes: t.Notes}
	for _, p := range t.Params {
		kind, dims := fragment.Classify(p)
		pr := paramReport{Name: p.Name, Pattern: kind.String(), Shape: nonNil(p.Shape), SplitDims: dims, Frozen: p.Frozen,
			VocabSize: p.Info.VocabSize}
		if len(p.States) > 0 {
			st := p.States[0]
			pr.Shards, pr.Fragments = len(st.Shards), len(st.Frags)
			pr.Padding = fragment.PaddingElems(st) + p.Info.Padding
			if len(st.Frags) > 0 {
				pr.DType = st.Frags[0].Src.DType().String()
			}
		}
		for _, s := range p.States {
			pr.States = append(pr.States, s.Name)
		}
		if p.Step != nil {
			pr.States = append(pr.States, fragment.StepState)
		}
		rep.Params = append(rep.Params, pr)
	}
	return rep
}

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// humanBytes prints a size in binary units (report.HumanBytes).
func humanBytes(n int64) string { return report.HumanBytes(n) }
