package report

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"

	"github.com/ucp-project/ucp/internal/mapreduce"
)

// Phase is one colour of the timeline and its legend entry.
type Phase struct{ Name, Meaning, Colour string }

// Phases are the timeline's colours, in the order a task's box shows them.
// Light fills keep the dark task labels readable on every phase.
var Phases = []Phase{
	{"read", "reading the source", "#7fb2e5"},
	{"convert", "dtype cast, placing, averaging", "#f7b36b"},
	{"write", "writing the output", "#8fca7c"},
	{"wait", "no task left", "#e4e4e4"},
}

const (
	left   = 150 // worker names and busy shares
	plotW  = 960 // the time axis
	right  = 24
	top    = 96 // title, subtitle and legend above the rows
	rowH   = 30
	charW  = 6.4 // the width of an average 11px sans-serif character, a little over
	legW   = 6.8 // the same at 12px, for the legend
	labelW = 60  // the narrowest box that gets a label inside (8 characters)
	nTop   = 5   // slowest tasks listed under the axis
)

// Timeline renders the run as SVG: one row per worker over a time axis,
// each task a box split into its read, convert and write time, the time
// without a task grey. Boxes wide enough carry their task's name, the
// slowest tasks are listed under the axis, and every box's tooltip gives
// its details.
func Timeline(st *mapreduce.Stats, m Meta) string {
	total := float64(max(st.Elapsed.Nanoseconds(), 1))
	x := func(ns float64) float64 { return left + ns/total*plotW }
	rowsEnd := top + rowH*len(st.Workers)
	s := Summarize(st, nTop)
	h := rowsEnd + 56 + 18*len(s.Slowest) + 10
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		left+plotW+right, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="8" y="24" font-size="16" font-weight="bold">ucp convert, node %d of %d: %d tasks on %d workers, the run took %s%s</text>`+"\n",
		m.Node, max(m.Nodes, 1), st.Tasks, len(st.Workers), dur(st.Elapsed), lastNote(st, s))
	fmt.Fprintf(&b, `<text x="8" y="44" fill="#444">%s read, %s written; before the run, indexing took %s (convert's summary counts it and the manifest too). White lines separate tasks; hover a box for its task.</text>`+"\n",
		size(st.BytesRead), size(st.BytesWritten), dur(m.Index))
	lx := 8.0
	for _, p := range Phases {
		fmt.Fprintf(&b, `<rect x="%.0f" y="58" width="14" height="14" fill="%s" stroke="#888" stroke-width="0.5"/>`, lx, p.Colour)
		t := p.Name + ": " + p.Meaning
		fmt.Fprintf(&b, `<text x="%.0f" y="70">%s</text>`+"\n", lx+19, t)
		lx += 19 + float64(len(t))*legW + 18
	}
	step := tickStep(st.Elapsed)
	for t := time.Duration(0); t <= st.Elapsed; t += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ccc"/>`+"\n", x(float64(t)), top-4, x(float64(t)), rowsEnd)
	}
	for i, w := range st.Workers {
		y := top + i*rowH
		busy := w.Busy()
		// The worker that finished last is named so, not coloured as an
		// alarm: being busy all the time is what a worker should be.
		weight := ""
		if len(st.Workers) > 1 && i == s.Last {
			weight = ` font-weight="bold"`
		}
		fmt.Fprintf(&b, `<text x="8" y="%d"%s>worker %d</text>`, y+19, weight, i)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#444">busy %.0f%%</text>`+"\n", left-8, y+19,
			100*busy.Seconds()/max(st.Elapsed.Seconds(), 1e-9))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>worker %d: read %s, convert %s, write %s, wait %s</title></rect>`+"\n",
			left, y+3, plotW, rowH-6, Phases[3].Colour, i, dur(w.Read), dur(w.Convert), dur(w.Write), dur(w.Wait))
		for _, sp := range w.Spans {
			task(&b, sp, x, y)
		}
	}
	ay := rowsEnd + 4
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", left, ay, left+plotW, ay)
	for t := time.Duration(0); t <= st.Elapsed; t += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x(float64(t)), ay, x(float64(t)), ay+5, x(float64(t)), ay+19, tick(t, step))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#444">time since start</text>`+"\n", left-8, ay+19)
	ly := ay + 44
	if len(s.Slowest) > 0 {
		fmt.Fprintf(&b, `<text x="8" y="%d" font-weight="bold">slowest tasks</text>`+"\n", ly)
	}
	for k, tk := range s.Slowest {
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s  (%s, %s, worker %d)</text>`+"\n", left, ly+18*k, html.EscapeString(tk.Label),
			dur(tk.Duration), size(tk.Bytes), tk.Worker)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// lastNote names the worker that finished last (in bold in its row).
func lastNote(st *mapreduce.Stats, s Stragglers) string {
	if len(st.Workers) < 2 {
		return ""
	}
	return fmt.Sprintf("; worker %d (in bold) finished last", s.Last)
}

// task draws one task's box: its phases side by side in proportion, a
// white edge, its label when the box is wide enough, and a tooltip.
func task(b *strings.Builder, sp mapreduce.Span, x func(float64) float64, y int) {
	x0, x1 := x(float64(sp.Start)), x(float64(sp.End))
	w := max(x1-x0, 0.5)
	label := html.EscapeString(sp.Label)
	fmt.Fprintf(b, `<g><title>%s: %s (read %s, convert %s, write %s), %s</title>`, label, dur(time.Duration(sp.End-sp.Start)),
		dur(sp.Read), dur(sp.Convert), dur(sp.Write), size(sp.Bytes))
	phases := []time.Duration{sp.Read, sp.Convert, sp.Write}
	all := float64(sp.Busy())
	at := x0
	for k, d := range phases {
		if all <= 0 || d <= 0 {
			continue
		}
		pw := w * float64(d) / all
		fmt.Fprintf(b, `<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"/>`, at, y+3, pw, rowH-6, Phases[k].Colour)
		at += pw
	}
	if all <= 0 {
		fmt.Fprintf(b, `<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"/>`, x0, y+3, w, rowH-6, Phases[1].Colour)
	}
	if w >= 3 {
		fmt.Fprintf(b, `<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="none" stroke="white" stroke-width="1"/>`, x0, y+3, w, rowH-6)
	}
	if l := fit(sp.Label, int((w-6)/charW)); w >= labelW && l != "" {
		fmt.Fprintf(b, `<text x="%.2f" y="%d" font-size="11" fill="#111">%s</text>`, x0+3, y+19, html.EscapeString(l))
	}
	b.WriteString("</g>\n")
}

// fit shortens a task label ("name/state [chunk]") to n characters by
// dropping whole leading components of the parameter name, marking the cut
// ("…mlp.dense_h_to_4h.weight/exp_avg [1/4]"); a box too narrow for the
// last component and the state gets no label ("" ), its tooltip says it.
func fit(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	name, suffix := s, ""
	if i := strings.LastIndex(s, "/"); i >= 0 {
		name, suffix = s[:i], s[i:]
	}
	comps := strings.Split(name, ".")
	for k := 1; k < len(comps); k++ {
		if l := "…" + strings.Join(comps[k:], ".") + suffix; len([]rune(l)) <= n {
			return l
		}
	}
	return ""
}

// tickStep picks 1, 2 or 5 times a power of ten giving 5 to 10 ticks.
func tickStep(total time.Duration) time.Duration {
	if total <= 0 {
		return time.Nanosecond
	}
	raw := float64(total) / 8
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, f := range []float64{1, 2, 5, 10} {
		if f*mag >= raw {
			return max(time.Duration(f*mag), 1)
		}
	}
	return time.Duration(10 * mag)
}

// tick labels a tick in the largest unit the step is at least a tenth
// of, with the decimals the step needs and no more.
func tick(t, step time.Duration) string {
	unit, name := time.Second, "s"
	switch {
	case step < 100*time.Nanosecond:
		unit, name = time.Nanosecond, "ns"
	case step < 100*time.Microsecond:
		unit, name = time.Microsecond, "µs"
	case step < 100*time.Millisecond:
		unit, name = time.Millisecond, "ms"
	}
	if t == 0 {
		return "0"
	}
	dec := max(0, int(math.Ceil(-math.Log10(float64(step)/float64(unit))-1e-9)))
	return fmt.Sprintf("%.*f%s", dec, float64(t)/float64(unit), name)
}

// dur prints a duration with about three significant digits.
func dur(d time.Duration) string {
	ms := float64(d) / 1e6
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", ms)
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1fms", ms)
	case d < time.Second:
		return fmt.Sprintf("%.0fms", ms)
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d < 100*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return fmt.Sprintf("%.0fs", d.Seconds())
}

// size prints bytes in binary units.
func size(n int64) string {
	v, u := float64(n), 0
	for v >= 1024 && u < 4 {
		v, u = v/1024, u+1
	}
	if u == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGT"[u-1])
}
