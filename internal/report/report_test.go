package report

import (
	"bytes"
	"encoding/json"
	"flag"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const ms = int64(time.Millisecond)

// sample is a three-worker run: worker 2 straggles on one big task, worker
// 1 has many small ones, and one label needs escaping.
func sample() *mapreduce.Stats {
	span := func(start, end int64, label string, bytes int64, r, c int64) mapreduce.Span {
		return mapreduce.Span{Start: start * ms, End: end * ms, Label: label, Bytes: bytes, Phases: mapreduce.Phases{
			Read: time.Duration(r * ms), Convert: time.Duration(c * ms), Write: time.Duration((end - start - r - c) * ms)}}
	}
	st := &mapreduce.Stats{Elapsed: 1250 * time.Millisecond, BytesRead: 3 << 30, BytesWritten: 5 << 30}
	w0 := mapreduce.WorkerStats{Spans: []mapreduce.Span{
		span(0, 400, "language_model.embedding.word_embeddings.weight/fp32", 512<<20, 250, 100),
		span(400, 700, "layers.0.attention.dense.weight/exp_avg", 256<<20, 200, 50),
	}}
	w1 := mapreduce.WorkerStats{}
	for i := int64(0); i < 30; i++ {
		w1.Spans = append(w1.Spans, span(i*20, i*20+18, "layers.1.mlp.bias/fp32", 1<<20, 10, 4))
	}
	w1.Spans = append(w1.Spans, span(600, 650, "x<y>&z/exp_avg_sq", 4<<20, 20, 10))
	w2 := mapreduce.WorkerStats{Spans: []mapreduce.Span{
		span(0, 100, "copy latest", 1024, 0, 0),
		span(100, 1250, "language_model.output_layer.weight/exp_avg_sq [2/3]", 1<<30, 700, 150),
	}}
	st.Workers = []mapreduce.WorkerStats{w0, w1, w2}
	for i := range st.Workers {
		w := &st.Workers[i]
		for _, sp := range w.Spans {
			w.Tasks++
			w.Read += sp.Read
			w.Convert += sp.Convert
			w.Write += sp.Write
		}
		w.Wait = st.Elapsed - w.Busy()
		st.Tasks += w.Tasks
	}
	return st
}

var sampleMeta = Meta{Node: 0, Nodes: 1, Index: 42 * time.Millisecond}

// TestTimeline compares the SVG with testdata/timeline.svg and checks what
// a reader needs is in it: the legend, labels drawn on the big tasks (not
// only tooltips), escaped names, the time axis and the slowest tasks.
func TestTimeline(t *testing.T) {
	svg := Timeline(sample(), sampleMeta)
	golden := filepath.Join("testdata", "timeline.svg")
	if *update {
		if err := os.WriteFile(golden, []byte(svg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if svg != string(want) {
		t.Errorf("timeline differs from %s (go test ./report -update rewrites it)", golden)
	}
	for _, p := range Phases {
		if !strings.Contains(svg, ">"+p.Name+": "+p.Meaning+"</text>") {
			t.Errorf("no legend entry for %s", p.Name)
		}
	}
	for _, want := range []string{
		`fill="#111">language_model.output_layer.weight/exp_avg_sq [2/3]</text>`, // a big task's label, drawn
		`fill="#111">…embedding.word_embeddings.weight/fp32</text>`,              // cut to its box by whole components
		`x&lt;y&gt;&amp;z/exp_avg_sq`,                                            // escaped
		`font-weight="bold">worker 2</text>`, `fill="#444">busy 100%</text>`,     // the straggler in bold, not alarming
		`the run took 1.25s; worker 2 (in bold) finished last</text>`,
		`convert's summary counts it and the manifest too`,
		`>0</text>`, `>0.2s</text>`, `>1.2s</text>`, // ticks
		`>language_model.output_layer.weight/exp_avg_sq [2/3]  (1.15s, 1.0 GiB, worker 2)</text>`,
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("timeline lacks %s", want)
		}
	}
	if strings.Contains(svg, `fill="#111">layers.1.mlp.bias`) || strings.Contains(svg, `_sq</text>`) || strings.Contains(svg, "#b00") {
		t.Error("a task too narrow for its name is labelled, or a busy worker is marked in red")
	}
}

// TestFit (issue 22, friction 8): a label is cut by whole components of
// the parameter name, never inside one ("…_avg [1/4]"); too narrow, none.
func TestFit(t *testing.T) {
	const l = "language_model.encoder.layers.0.mlp.dense_h_to_4h.weight/exp_avg [1/4]"
	for _, c := range []struct {
		n    int
		want string
	}{
		{100, l},
		{45, "…0.mlp.dense_h_to_4h.weight/exp_avg [1/4]"},
		{40, "…mlp.dense_h_to_4h.weight/exp_avg [1/4]"},
		{36, "…dense_h_to_4h.weight/exp_avg [1/4]"},
		{30, "…weight/exp_avg [1/4]"},
		{12, ""},
	} {
		if got := fit(l, c.n); got != c.want {
			t.Errorf("fit(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

// TestTimelinePNG renders the timeline with rsvg-convert: the SVG must be
// valid enough for a real renderer to produce an image of its size.
func TestTimelinePNG(t *testing.T) {
	rsvg := testkit.Tool(t, "rsvg-convert", "rendering the timeline")
	dir := t.TempDir()
	if err := Write(filepath.Join(dir, "run.json"), sampleMeta, sample()); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "run.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(svg, []byte("read: reading the source")) || !bytes.Contains(svg, []byte("wait: no task left")) {
		t.Fatal("the SVG has no legend")
	}
	out := filepath.Join(dir, "run.png")
	if b, err := exec.Command(rsvg, "-o", out, filepath.Join(dir, "run.svg")).CombinedOutput(); err != nil {
		t.Fatalf("rsvg-convert: %v\n%s", err, b)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("rsvg-convert wrote no PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != left+plotW+right || b.Dy() < top+3*rowH {
		t.Errorf("PNG is %v", b)
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.json")
	if err := Write(path, Meta{Node: 1, Nodes: 2, PlanID: "p", NodeBytes: []int64{5, 6}, Index: time.Second}, sample()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	_, hasRSS := got["peak_rss_bytes"]
	if wantRSS := runtime.GOOS == "linux" || runtime.GOOS == "darwin"; hasRSS != wantRSS {
		t.Errorf("peak_rss_bytes present %v on %s", hasRSS, runtime.GOOS)
	}
	if got["node"] != 1.0 || got["plan"] != "p" || got["index_ns"] != 1e9 || got["workers"] != 3.0 {
		t.Errorf("report %s", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "r.svg")); err != nil {
		t.Error(err)
	}
}

func TestSummarize(t *testing.T) {
	s := Summarize(sample(), 2)
	if s.Workers != 3 || s.Last != 2 || s.LastEnd != 1250*time.Millisecond || s.MedianEnd != 700*time.Millisecond ||
		s.LastBusy != 1250*time.Millisecond || s.MedianBusy != 700*time.Millisecond {
		t.Errorf("%+v", s)
	}
	if len(s.Slowest) != 2 || s.Slowest[0].Worker != 2 || s.Slowest[0].Duration != 1150*time.Millisecond ||
		s.Slowest[1].Label != "language_model.embedding.word_embeddings.weight/fp32" {
		t.Errorf("slowest %+v", s.Slowest)
	}
	if s := Summarize(&mapreduce.Stats{}, 3); s.Workers != 0 || len(s.Slowest) != 0 {
		t.Errorf("empty run: %+v", s)
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		total time.Duration
		step  time.Duration
		at    time.Duration
		label string
	}{
		{1250 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, "0.4s"},
		{9 * time.Second, 2 * time.Second, 4 * time.Second, "4s"},
		{80 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, "30ms"},
		{12 * time.Millisecond, 2 * time.Millisecond, 6 * time.Millisecond, "6ms"},
		{3 * time.Second, 500 * time.Millisecond, 1500 * time.Millisecond, "1.5s"},
		{25 * time.Second, 5 * time.Second, 25 * time.Second, "25s"},
		{600 * time.Microsecond, 100 * time.Microsecond, 300 * time.Microsecond, "0.3ms"},
		{0, time.Nanosecond, 0, "0"},
	} {
		step := tickStep(tc.total)
		if step != tc.step || tick(tc.at, step) != tc.label {
			t.Errorf("%v: step %v label %q, want %v %q", tc.total, step, tick(tc.at, step), tc.step, tc.label)
		}
	}
}
