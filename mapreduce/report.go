package mapreduce

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"html"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Report is what --report writes: the plan's shape, this node's share and
// the per-worker phase timings.
type Report struct {
	Node       int     `json:"node"`
	Nodes      int     `json:"nodes"`
	Workers    int     `json:"workers"`
	PlanID     string  `json:"plan"`
	ChunkElems int64   `json:"chunk_elems"`
	NodeBytes  []int64 `json:"node_bytes"` // planned weight per node
	// Index is the map phase: decoding the source's pickles, building
	// and checking the fragment table, planning.
	Index       time.Duration `json:"index_ns"`
	Stats       *Stats        `json:"stats"`
	PeakRSS     int64         `json:"peak_rss_bytes"`
	GBPerSecond float64       `json:"gb_per_s"` // (read + written) / elapsed
	Written     time.Time     `json:"written"`
}

// PeakRSS returns the process's peak resident set size in bytes.
func PeakRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Maxrss * 1024 // kilobytes on Linux
}

// WriteReport writes path (JSON) and the same name with .svg: a timeline
// with one row per worker and one box per task, so stragglers show.
func WriteReport(path string, plan *Plan, node int, index time.Duration, st *Stats) error {
	r := Report{Node: node, Nodes: plan.Nodes, Workers: len(st.Workers), PlanID: plan.ID(), ChunkElems: plan.ChunkElems,
		NodeBytes: plan.NodeBytes, Index: index, Stats: st, PeakRSS: PeakRSS(), Written: time.Now().UTC()}
	if s := st.Elapsed.Seconds(); s > 0 {
		r.GBPerSecond = float64(st.BytesRead+st.BytesWritten) / s / 1e9
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	svg := strings.TrimSuffix(path, filepath.Ext(path)) + ".svg"
	return os.WriteFile(svg, []byte(Timeline(st, fmt.Sprintf("node %d of %d, index %.2fs", node, plan.Nodes, index.Seconds()))), 0o644)
}

// Timeline renders the workers' spans as SVG. Each task is a box whose
// colour follows its parameter; hovering shows its label and duration.
func Timeline(st *Stats, title string) string {
	const (
		left, top, rowH, width = 110, 40, 26, 900
	)
	total := float64(st.Elapsed.Nanoseconds())
	if total <= 0 {
		total = 1
	}
	h := top + rowH*len(st.Workers) + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", left+width+20, h)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">ucp convert, %s: %d tasks in %.2fs, %d workers</text>`+"\n",
		left, html.EscapeString(title), st.Tasks, st.Elapsed.Seconds(), len(st.Workers))
	for i, w := range st.Workers {
		y := top + i*rowH
		busy := w.Read + w.Convert + w.Write
		fmt.Fprintf(&b, `<text x="4" y="%d">worker %d</text>`, y+17, i)
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="#f2f2f2"/>`+"\n", left, y+2, width, rowH-4)
		for _, sp := range w.Spans {
			x := float64(left) + float64(sp.Start)/total*width
			wd := max(float64(sp.End-sp.Start)/total*width, 0.5)
			fmt.Fprintf(&b, `<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s: %.3fs, %d bytes</title></rect>`+"\n",
				x, y+3, wd, rowH-6, colour(sp.Label), html.EscapeString(sp.Label), float64(sp.End-sp.Start)/1e9, sp.Bytes)
		}
		fmt.Fprintf(&b, `<title>read %.2fs, convert %.2fs, write %.2fs, wait %.2fs</title>`+"\n",
			w.Read.Seconds(), w.Convert.Seconds(), w.Write.Seconds(), max(st.Elapsed-busy, 0).Seconds())
	}
	axis := top + rowH*len(st.Workers) + 16
	for k := 0; k <= 10; k++ {
		x := left + k*width/10
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/><text x="%d" y="%d" text-anchor="middle">%.2fs</text>`+"\n",
			x, top, x, axis-10, x, axis+4, st.Elapsed.Seconds()*float64(k)/10)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// colour picks a stable hue per parameter (the label up to its state).
func colour(label string) string {
	name := label
	if i := strings.LastIndexByte(label, '/'); i > 0 {
		name = label[:i]
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("hsl(%d,60%%,55%%)", h.Sum32()%360)
}
