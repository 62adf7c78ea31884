package main

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
)

// smallModel is the parameter count up to which inspect lists every
// parameter without --all.
const smallModel = 24

// inspectHelp explains the columns of a checkpoint listing.
const inspectHelp = `
Patterns (how ranks hold a parameter):
  Unique     one rank holds the whole tensor
  Replicate  every rank holds an identical copy (checked equal when converting)
  Partial    every rank holds a copy updated on its own; the atomic value is
             the mean of the copies (averaged copies)
  Shard-V    split along dim 0, or a flattened tensor split in ranges (ZeRO)
  Shard-H    split along one other dim (tensor parallel rows)
  Shard-Hy   split along several dims
  Shard-NC   each rank holds several non-contiguous blocks (fused QKV, SwiGLU)

Columns:
  SHARDS   local tensors a state is assembled from: one per tensor-parallel or
           expert rank, DCP chunk or replica
  FRAGS    runs of stored elements read to assemble it: a shard cut over
           data-parallel ranks (ZeRO partitions) counts once per rank
  PADDING  stored elements no fragment reads (alignment or vocabulary padding)
  DTYPE    training dtype / master (fp32 state) dtype
  SPLIT    the dims the shards split ("flat": ZeRO's flattened ranges)

The summary comes first: per pattern, per state and per layer kind (layer
numbers collapsed), then the parameters: all of them for models of up to 24
parameters or with --all, those matching --filter REGEX, or one line per layer
kind with --layers.`

// layerDigits finds the layer numbers in a parameter name.
var layerDigits = regexp.MustCompile(`(^|\.)[0-9]+(\.|$)`)

// layerKind collapses the layer numbers of a name: blocks.3.fc1.weight ->
// blocks.*.fc1.weight.
func layerKind(name string) string {
	for {
		n := layerDigits.ReplaceAllString(name, "$1*$2")
		if n == name {
			return n
		}
		name = n
	}
}

type paramRow struct {
	p        *fragment.Param
	pattern  string
	split    string
	src, out int64
}

func describe(t *fragment.Table, p *fragment.Param) paramRow {
	kind, dims := fragment.Classify(p)
	r := paramRow{p: p, pattern: kind.String(), split: "-"}
	if len(dims) > 0 {
		parts := make([]string, len(dims))
		for i, d := range dims {
			parts[i] = fmt.Sprint(d)
			if d < 0 {
				parts[i] = "flat"
			}
		}
		r.split = strings.Join(parts, ",")
	}
	for _, s := range p.States {
		r.src += p.SrcBytes(s)
		r.out += stateOutBytes(p, s)
	}
	return r
}

// stateOutBytes is the size of a state's atomic tensor: float32, or a frozen
// parameter's or buffer's own dtype.
func stateOutBytes(p *fragment.Param, s *fragment.State) int64 {
	size := 4
	if dt, err := mapreduce.StateDType(p, s); err == nil {
		size = dt.Size()
	}
	return int64(size) * p.Numel()
}

// dtypes is "training/master": the table's training dtype (when the source
// tells it) and the stored dtype of the fp32 state.
func dtypes(t *fragment.Table, p *fragment.Param) string {
	master := "-"
	st := p.State(fragment.FP32)
	if st == nil && len(p.States) > 0 {
		st = p.States[0]
	}
	if st != nil && len(st.Frags) > 0 {
		master = st.Frags[0].Src.DType().String()
	}
	train := t.DType
	if train == "" || p.Frozen {
		return master
	}
	return train + "/" + master
}

// printCheckpointView prints the header, the summary, the legend and the
// parameters the options select.
func printCheckpointView(out io.Writer, t *fragment.Table, opts inspectOptions) error {
	var re *regexp.Regexp
	if opts.Filter != "" {
		var err error
		if re, err = regexp.Compile(opts.Filter); err != nil {
			return fmt.Errorf("--filter: %w", err)
		}
	}
	var rows []paramRow
	for _, p := range t.Params {
		if re == nil || re.MatchString(p.Name) {
			rows = append(rows, describe(t, p))
		}
	}
	d := t.Degrees
	fmt.Fprintf(out, "%s: %s checkpoint", escapeControl(t.Source), t.Format)
	if t.Tag != "" {
		fmt.Fprintf(out, " (tag %s)", escapeControl(t.Tag))
	}
	fmt.Fprintf(out, "\nTP %d  PP %d  DP %d", d.TP, d.PP, d.DP)
	if d.EP > 1 {
		fmt.Fprintf(out, "  EP %d", d.EP)
	}
	if d.VPP > 1 {
		fmt.Fprintf(out, "  VPP %d", d.VPP)
	}
	if d.ZeRO > 0 {
		fmt.Fprintf(out, "  ZeRO-%d", d.ZeRO)
	}
	if t.DType != "" {
		fmt.Fprintf(out, "  trained in %s", t.DType)
	}
	var src, dst int64
	for _, r := range rows {
		src, dst = src+r.src, dst+r.out
	}
	what := fmt.Sprintf("%d parameters", len(t.Params))
	if re != nil {
		what = fmt.Sprintf("%d of %d parameters match /%s/", len(rows), len(t.Params), opts.Filter)
	}
	copied := ""
	if re == nil && len(t.CopyFiles) > 0 {
		var c int64
		for _, f := range t.CopyFiles {
			c += f.Size
		}
		src, dst = src+c, dst+c
		copied = fmt.Sprintf(", %s in %d copied file(s)", humanBytes(c), len(t.CopyFiles))
	}
	fmt.Fprintf(out, "\n%s: %s to read, %s to write (float32 states%s)\n\n", what, humanBytes(src), humanBytes(dst), copied)
	if err := printSummary(out, rows); err != nil {
		return err
	}
	// The DTYPE column is in the parameter listing only: the legend
	// explains it there.
	legend := "\nlegend: Partial = averaged copies, Replicate = identical copies, Shard-* = split (see ucp inspect --help)"
	listed := opts.Layers || opts.All || re != nil || len(rows) <= smallModel
	if listed {
		legend += "; DTYPE = training/master (the dtype the model trained in / the optimizer's master weights)"
	}
	fmt.Fprintln(out, legend)
	switch {
	case opts.Layers:
		fmt.Fprintln(out)
		if err := printLayers(out, t, rows); err != nil {
			return err
		}
	case opts.All || re != nil || len(rows) <= smallModel:
		fmt.Fprintln(out)
		if err := printParams(out, t, rows); err != nil {
			return err
		}
	default:
		fmt.Fprintf(out, "\n%d parameters not listed: --all lists them, --filter REGEX selects some, --layers shows one line per layer kind\n", len(rows))
	}
	for _, n := range t.Notes {
		fmt.Fprintln(out, "note:", escapeControl(n))
	}
	return nil
}

type bucket struct {
	params, tensors int
	elems, src, out int64
}

func printSummary(out io.Writer, rows []paramRow) error {
	byPattern, byState, byKind := map[string]*bucket{}, map[string]*bucket{}, map[string]*bucket{}
	var patternOrder, stateOrder, kindOrder []string
	get := func(m map[string]*bucket, order *[]string, k string) *bucket {
		b := m[k]
		if b == nil {
			b = &bucket{}
			m[k] = b
			*order = append(*order, k)
		}
		return b
	}
	for _, r := range rows {
		b := get(byPattern, &patternOrder, r.pattern)
		b.params++
		b.elems += r.p.Numel()
		b.src += r.src
		b.out += r.out
		k := get(byKind, &kindOrder, layerKind(r.p.Name))
		k.params++
		k.elems += r.p.Numel()
		k.src += r.src
		k.out += r.out
		for _, s := range r.p.States {
			sb := get(byState, &stateOrder, s.Name)
			sb.tensors++
			sb.elems += r.p.Numel()
			sb.src += r.p.SrcBytes(s)
			sb.out += stateOutBytes(r.p, s)
		}
	}
	sort.Strings(patternOrder)
	fragment.StateOrder(stateOrder)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PATTERN\tPARAMETERS\tELEMENTS\tTO READ\tTO WRITE")
	for _, k := range patternOrder {
		b := byPattern[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", k, b.params, b.elems, humanBytes(b.src), humanBytes(b.out))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tTENSORS\tELEMENTS\tTO READ\tTO WRITE")
	for _, k := range stateOrder {
		b := byState[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", escapeControl(k), b.tensors, b.elems, humanBytes(b.src), humanBytes(b.out))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LAYER KIND\tPARAMETERS\tELEMENTS\tTO READ\tTO WRITE")
	for _, k := range kindOrder {
		b := byKind[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", escapeControl(k), b.params, b.elems, humanBytes(b.src), humanBytes(b.out))
	}
	return tw.Flush()
}

func printParams(out io.Writer, t *fragment.Table, rows []paramRow) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARAMETER\tPATTERN\tSHAPE\tDTYPE\tSPLIT\tSHARDS\tFRAGS\tPADDING\tSTATES")
	for _, r := range rows {
		p := r.p
		name := escapeControl(p.Name)
		if p.Frozen {
			name += " (frozen)"
		}
		var shards, frags int
		var padding int64
		if len(p.States) > 0 {
			st := p.States[0]
			shards, frags, padding = len(st.Shards), len(st.Frags), fragment.PaddingElems(st)+p.Info.Padding
		}
		states := make([]string, 0, len(p.States)+1)
		for _, s := range p.States {
			states = append(states, escapeControl(s.Name))
		}
		if p.Step != nil {
			states = append(states, fragment.StepState)
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%d\t%d\t%d\t%s\n", name, r.pattern, p.Shape, dtypes(t, p), r.split, shards, frags, padding,
			strings.Join(states, ","))
	}
	return tw.Flush()
}

// printLayers prints one line per layer kind: the layers it spans, and the
// pattern, shape and dtype when all its parameters share them.
func printLayers(out io.Writer, t *fragment.Table, rows []paramRow) error {
	type group struct {
		kind                  string
		n                     int
		layers                []string
		pattern, shape, dtype string
		src                   int64
	}
	var order []*group
	groups := map[string]*group{}
	for _, r := range rows {
		k := layerKind(r.p.Name)
		g := groups[k]
		shape, dt := fmt.Sprint(r.p.Shape), dtypes(t, r.p)
		if g == nil {
			g = &group{kind: k, pattern: r.pattern, shape: shape, dtype: dt}
			groups[k] = g
			order = append(order, g)
		}
		g.n++
		g.src += r.src
		if nums := layerNumbers(r.p.Name); nums != "" {
			g.layers = append(g.layers, nums)
		}
		if g.pattern != r.pattern {
			g.pattern = "mixed"
		}
		if g.shape != shape {
			g.shape = "mixed"
		}
		if g.dtype != dt {
			g.dtype = "mixed"
		}
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LAYER KIND\tCOUNT\tLAYERS\tPATTERN\tSHAPE\tDTYPE\tTO READ")
	for _, g := range order {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", escapeControl(g.kind), g.n, collapseRanges(g.layers), g.pattern, g.shape, g.dtype, humanBytes(g.src))
	}
	return tw.Flush()
}

var numberRun = regexp.MustCompile(`(?:^|\.)([0-9]+)(?:\.|$)`)

// layerNumbers returns the numbers in a name joined by '.' ("3", "3.1").
func layerNumbers(name string) string {
	var nums []string
	for _, m := range numberRun.FindAllStringSubmatch(strings.ReplaceAll(name, ".", ".."), -1) {
		nums = append(nums, m[1])
	}
	return strings.Join(nums, ".")
}

// collapseRanges writes single-number layers as ranges: 0-11,14.
func collapseRanges(layers []string) string {
	if len(layers) == 0 {
		return "-"
	}
	var ints []int
	for _, l := range layers {
		var n int
		if _, err := fmt.Sscanf(l, "%d", &n); err != nil || fmt.Sprint(n) != l {
			return strings.Join(layers, ",") // nested numbers: listed as they are
		}
		ints = append(ints, n)
	}
	sort.Ints(ints)
	var parts []string
	for i := 0; i < len(ints); {
		j := i
		for j+1 < len(ints) && ints[j+1] <= ints[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(ints[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ints[i], ints[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
