// Package convert runs a conversion into an atomic checkpoint: it checks
// the paths, indexes the source, plans, writes through the reducers and
// finishes the checkpoint, alone or as one node of several (the multi-node
// protocol: per-node completion records, the finalize lock, the manifest
// written once). cmd/ucp gives it the flags and prints what it returns.
package convert

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/formats"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/report"
)

// Options configure a conversion.
type Options struct {
	From, Tag     string // source format ("" detects it) and tag or iteration
	Workers       int
	VocabSize     int64
	ModelConfig   string // --model-config: a transformers config.json for a source that records no model
	Node, Nodes   int    // this node's rank and the node count
	Memory        int64  // the reducers' memory budget in bytes
	ChunkElems    int64
	DSVersion     string // --deepspeed-version: the state-file layout (bareStates)
	Force         bool
	Finalize      bool // only write the manifest of a multi-node conversion
	NoSync        bool
	Resume        bool
	CheckReplicas bool
	Report        string // --report: per-worker timings to this JSON file
	NoLatest      bool   // leave the latest_universal pointer beside DST alone
	Tool          string // the manifest's tool string
	// AfterPhase, when set, is called after each phase (the kill tests'
	// hook): indexed, created, converted, node-done, finalize-locked, and
	// the writer's own phases.
	AfterPhase func(phase string)
	// Progress, when set, is given the bytes this node will move before
	// the reducers start; it returns the function they report to and the
	// one called when they stop.
	Progress func(total int64) (add func(read, written int64), finish func())
}

func (o *Options) after(phase string) {
	if o.AfterPhase != nil {
		o.AfterPhase(phase)
	}
}

// IndexError is a failure to index the source (not the coverage check):
// cmd/ucp adds its hints about the source to it.
type IndexError struct{ Err error }

func (e *IndexError) Error() string { return e.Err.Error() }
func (e *IndexError) Unwrap() error { return e.Err }

// CheckSource is the path check before indexing: DST and its work folders
// must not overlap SRC. A DST inside SRC is decided after indexing (Plan
// with deferred true), once the folder actually read is known.
func CheckSource(src, dst string) (deferred bool, err error) {
	return checkSourceOverlap(src, dst)
}

// Job is an indexed and planned conversion.
type Job struct {
	Src, Dst string
	Table    *fragment.Table
	Plan     *mapreduce.Plan
	Start    time.Time     // when indexing began
	Indexed  time.Duration // indexing and planning
	o        Options
}

// Close releases the source files the table holds open.
func (j *Job) Close() error { return j.Table.Close() }

// Plan indexes SRC and plans the conversion into DST. deferred is
// CheckSource's answer.
func Plan(ctx context.Context, src, dst string, deferred bool, o Options) (*Job, error) {
	start := time.Now()
	t, err := formats.Index(ctx, src, o.From, formats.Options{Tag: o.Tag, Workers: o.Workers, VocabSize: o.VocabSize, Memory: o.Memory, ModelConfig: o.ModelConfig})
	if ce := (*formats.CoverageError)(nil); errors.As(err, &ce) {
		return nil, fmt.Errorf("%s: coverage check failed, nothing written: %w", src, ce.Err)
	}
	if err != nil {
		return nil, &IndexError{err}
	}
	if deferred {
		if err := checkReadOverlap(src, dst, t.Source); err != nil {
			t.Close()
			return nil, err
		}
	}
	bare, err := bareStates(t, o.DSVersion)
	if err != nil {
		t.Close()
		return nil, err
	}
	plan, err := mapreduce.NewPlan(t, mapreduce.PlanOptions{Nodes: o.Nodes, Cores: o.Workers, Memory: o.Memory, ChunkElems: o.ChunkElems,
		BareStates: bare})
	if err != nil {
		t.Close()
		return nil, err
	}
	j := &Job{Src: src, Dst: dst, Table: t, Plan: plan, Start: start, Indexed: time.Since(start), o: o}
	o.after("indexed")
	return j, nil
}

// Result is what a node's Run did. Run fills it as far as it got, also
// when it returns an error.
type Result struct {
	Writer *atomic.Writer // its Warnings are problems that left DST complete
	Stats  *mapreduce.Stats
	// NodeDone: this node's share is written and its record left (several
	// nodes only).
	NodeDone bool
	// AllDone: every node's record was present when this one finished.
	AllDone bool
	// OtherFinalizing: another live node holds the finalize lock and
	// writes the manifest.
	OtherFinalizing bool
	// Manifest is set when this process wrote it (one node, the last node
	// to finish, or Options.Finalize).
	Manifest *atomic.Manifest
}

// Run writes this node's share of the atomic checkpoint and, when this
// node is the only one or the last to finish (or with Options.Finalize),
// the manifest.
func (j *Job) Run(ctx context.Context) (*Result, error) {
	o, plan, dst := &j.o, j.Plan, j.Dst
	res := &Result{}
	if !o.Finalize {
		if err := checkOutputs(dst, plan); err != nil {
			return res, err
		}
		if err := checkSpace(dst, plan, o.Node, o.Nodes == 1); err != nil {
			return res, err
		}
	}
	var sources []fsutil.FileID
	if !o.Finalize {
		// What the journal records of the input, for --resume to compare.
		files, err := j.Table.SourceFiles()
		if err == nil {
			sources, err = fsutil.Identify(files)
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", j.Table.Source, err)
		}
	}
	w, err := mapreduce.Create(dst, plan, atomic.Options{Force: o.Force, Tool: o.Tool, Node: o.Node, Nodes: o.Nodes,
		FinalizeOnly: o.Finalize, NoSync: o.NoSync, Resume: o.Resume, Sources: sources, AfterPhase: o.AfterPhase, NoLatest: o.NoLatest})
	if err != nil {
		return res, err
	}
	res.Writer = w
	o.after("created")
	if o.Finalize {
		return res, j.finalize(res)
	}
	var progress func(read, written int64)
	finish := func() {}
	if o.Progress != nil {
		progress, finish = o.Progress(progressTotal(plan, o.Node, w))
	}
	stats, err := mapreduce.Run(ctx, plan, w, mapreduce.Options{Node: o.Node, Workers: o.Workers, CheckReplicas: o.CheckReplicas,
		Progress: progress})
	finish()
	res.Stats = stats
	if o.Report != "" && stats != nil {
		if rerr := report.Write(o.Report, report.Meta{Node: o.Node, Nodes: plan.Nodes,
			PlanID: plan.ID(), ChunkElems: plan.ChunkElems, NodeBytes: plan.NodeBytes, Index: j.Indexed}, stats); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		if o.Nodes == 1 {
			w.Abort()
		}
		return res, err
	}
	o.after("converted")
	all, err := w.FinishNode()
	if err != nil {
		return res, err
	}
	o.after("node-done")
	if o.Nodes == 1 {
		m, err := mapreduce.Finalize(plan, w)
		if err != nil {
			w.Abort()
			return res, err
		}
		res.Manifest = m
		return res, nil
	}
	res.NodeDone, res.AllDone = true, all
	if !all {
		return res, nil
	}
	if err := w.Lock(); err != nil {
		if errors.Is(err, atomic.ErrFinalizing) {
			// Another node finished at the same moment and finalizes.
			res.OtherFinalizing = true
			return res, nil
		}
		return res, err
	}
	o.after("finalize-locked")
	return res, j.finalize(res)
}

// finalize writes the manifest of a checkpoint whose nodes have all
// finished.
func (j *Job) finalize(res *Result) error {
	m, err := mapreduce.Finalize(j.Plan, res.Writer)
	if err != nil {
		return err
	}
	res.Manifest = m
	return nil
}

// LinkLatest answers --resume when DST is already complete (the killed
// run got as far as the rename): nothing to convert, but the
// latest_universal pointer beside DST may still be missing.
func LinkLatest(dst string, noSync bool) (atomic.Pointer, error) {
	return atomic.WritePointer(atomic.LatestUniversalOf(dst), filepath.Base(filepath.Clean(dst)), dst, noSync)
}

// progressTotal is what convert's bar counts to: the source bytes this
// node's tasks read, the figure inspect ("to read"), --dry-run and the
// summary ("read") give, less the files a resumed run reuses (w may be
// nil). Reads are reported as each range is read, so the bar moves evenly
// to the end (counting a task's writes, reported in one lump when it
// ends, made it sit at 99%).
func progressTotal(plan *mapreduce.Plan, node int, w *atomic.Writer) int64 {
	var n int64
	for _, tk := range plan.Tasks {
		if tk.Node != node {
			continue
		}
		if w != nil {
			if _, done := w.Done(plan.Outputs[tk.Output].Path); done {
				continue
			}
		}
		r, _ := plan.IO(tk)
		n += r
	}
	return n
}

// ProgressCounter turns the reducers' progress reports into the bar's
// count: the bytes read.
func ProgressCounter(add func(int64)) func(read, written int64) {
	return func(read, _ int64) { add(read) }
}
