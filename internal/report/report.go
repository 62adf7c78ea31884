// Package report turns a conversion's statistics into what people read:
// the --report JSON file, its SVG timeline (one row per worker, the read,
// convert, write and wait phases as colours) and the straggler summary
// convert prints at the end. It only reads the run's Stats; nothing in the
// conversion depends on it.
package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/mapreduce"
)

// Meta is what the report says about the run besides its statistics.
type Meta struct {
	Node, Nodes int
	PlanID      string
	ChunkElems  int64
	NodeBytes   []int64 // planned weight per node
	// Index is the map phase: decoding the source's pickles, building and
	// checking the fragment table, planning.
	Index time.Duration
}

// File is the JSON document --report writes.
type File struct {
	Node        int              `json:"node"`
	Nodes       int              `json:"nodes"`
	Workers     int              `json:"workers"`
	PlanID      string           `json:"plan"`
	ChunkElems  int64            `json:"chunk_elems"`
	NodeBytes   []int64          `json:"node_bytes"`
	Index       time.Duration    `json:"index_ns"`
	Stats       *mapreduce.Stats `json:"stats"`
	PeakRSS     int64            `json:"peak_rss_bytes,omitempty"` // absent where the system does not say
	GBPerSecond float64          `json:"gb_per_s"`                 // (read + written) / elapsed, 1e9 bytes
	Written     time.Time        `json:"written"`
}

// Write writes path (JSON) and the same name with .svg (Timeline).
func Write(path string, m Meta, st *mapreduce.Stats) error {
	f := File{Node: m.Node, Nodes: m.Nodes, Workers: len(st.Workers), PlanID: m.PlanID, ChunkElems: m.ChunkElems,
		NodeBytes: m.NodeBytes, Index: m.Index, Stats: st, Written: time.Now().UTC()}
	if rss, ok := PeakRSS(); ok {
		f.PeakRSS = rss
	}
	if s := st.Elapsed.Seconds(); s > 0 {
		f.GBPerSecond = float64(st.BytesRead+st.BytesWritten) / s / 1e9
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	// Through a temporary name and a rename: never followed if a link,
	// never half-written.
	if err := fsutil.WriteFileAtomic(path, append(b, '\n'), true); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(SVGPath(path), []byte(Timeline(st, m)), true)
}

// SVGPath is where Write puts the timeline of the report at path.
func SVGPath(path string) string {
	return strings.TrimSuffix(path, filepath.Ext(path)) + ".svg"
}

// Task is one task of the run, for the straggler summary.
type Task struct {
	Worker   int
	Label    string
	Duration time.Duration
	Bytes    int64
}

// Stragglers says which worker held the run up and by how much, and which
// tasks took longest.
type Stragglers struct {
	Workers int
	// Last is the worker whose last task ended last; LastEnd is when, and
	// MedianEnd when the median worker's ended.
	Last               int
	LastEnd, MedianEnd time.Duration
	// LastBusy and MedianBusy are time spent in tasks (not waiting).
	LastBusy, MedianBusy time.Duration
	Slowest              []Task // longest first, at most the number asked
}

// Summarize finds the stragglers of a run and its n longest tasks.
func Summarize(st *mapreduce.Stats, n int) Stragglers {
	s := Stragglers{Workers: len(st.Workers)}
	var ends, busy []time.Duration
	var tasks []Task
	for i, w := range st.Workers {
		var end int64
		for _, sp := range w.Spans {
			end = max(end, sp.End)
			tasks = append(tasks, Task{Worker: i, Label: sp.Label, Duration: time.Duration(sp.End - sp.Start), Bytes: sp.Bytes})
		}
		b := w.Busy()
		if time.Duration(end) > s.LastEnd || i == 0 {
			s.Last, s.LastEnd, s.LastBusy = i, time.Duration(end), b
		}
		ends, busy = append(ends, time.Duration(end)), append(busy, b)
	}
	s.MedianEnd, s.MedianBusy = median(ends), median(busy)
	slices.SortStableFunc(tasks, func(a, b Task) int { return cmp.Compare(b.Duration, a.Duration) })
	s.Slowest = tasks[:min(n, len(tasks))]
	return s
}

// median is the lower median (a worker's own value, not an average of two).
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[(len(d)-1)/2]
}

// HumanBytes prints a size in binary units (KiB, MiB, GiB, ...) with one
// decimal, or in bytes below 1 KiB: every size ucp prints.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
