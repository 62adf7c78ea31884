package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow/go/v17/arrow/ipc"

	"github.com/ucp-project/ucp/internal/testkit"
)

func TestInspectSummaryGolden(t *testing.T) {
	src := testkit.Fixture("deepspeed", "megatron_tp2_pp2_bf16opt_dp2", "checkpoint")
	cases := []struct {
		name string
		args []string
	}{
		{"summary", nil},
		{"filter", []string{"--filter", `\.mlp\.dense_h_to_4h`}},
		{"full", []string{"--all"}},
		{"layers", []string{"--layers"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := ucp(t, nil, append(append([]string{"inspect"}, c.args...), src)...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			golden(t, "inspect/"+c.name+".golden", r.stdout, src, "SRC")
		})
	}
	if r := ucp(t, nil, "inspect", "--filter", "(", src); r.code == 0 {
		t.Fatal("a bad --filter was accepted")
	}
}

func TestLayerNames(t *testing.T) {
	for _, c := range []struct{ in, kind, nums string }{
		{"blocks.3.fc1.weight", "blocks.*.fc1.weight", "3"},
		{"2.mlp.dense.bias", "*.mlp.dense.bias", "2"},
		{"layers.1.experts.12.w1", "layers.*.experts.*.w1", "1.12"},
		{"embed.weight", "embed.weight", ""},
		{"fc12a.weight", "fc12a.weight", ""},
	} {
		if k := layerKind(c.in); k != c.kind {
			t.Errorf("layerKind(%q) = %q, want %q", c.in, k, c.kind)
		}
		if n := layerNumbers(c.in); n != c.nums {
			t.Errorf("layerNumbers(%q) = %q, want %q", c.in, n, c.nums)
		}
	}
	if got := collapseRanges([]string{"3", "0", "1", "2", "7"}); got != "0-3,7" {
		t.Errorf("collapseRanges = %q", got)
	}
	if got := escapeControl("a\x1b[2Jb\n"); got != `a\x1b[2Jb\n` {
		t.Errorf("escapeControl = %q", got)
	}
}

// TestDryRunGolden pins the plan printout: binary units, the same read and
// written quantities as the run's summary, and what PARAMETERS counts.
func TestDryRunGolden(t *testing.T) {
	src := testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	r := ucp(t, nil, "convert", "--dry-run", "--workers", "2", "--memory", "1GiB", src, filepath.Join(t.TempDir(), "out"))
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	golden(t, "convert/dry-run.golden", r.stdout, src, "SRC")
	// The run reads and writes what the plan said.
	out := filepath.Join(t.TempDir(), "out")
	run := ucp(t, nil, "convert", "--workers", "2", src, out)
	if run.code != 0 {
		t.Fatalf("exit %d: %s", run.code, run.stderr)
	}
	first := strings.SplitN(r.stdout, "\n", 2)[0]
	amounts := first[strings.LastIndex(first, ": ")+2:] // "27.9 KiB to read, 27.9 KiB to write"
	want := strings.ReplaceAll(strings.ReplaceAll(amounts, " to read", " read"), " to write", " written")
	if !strings.Contains(run.stdout, want) || strings.Contains(run.stdout, "0.00") || strings.Contains(run.stdout, "GB") {
		t.Fatalf("the run's summary does not say %q in binary units:\n%s", want, run.stdout)
	}
	// A dry run onto the DST that now exists says what the real run would
	// do with it (issue 22, friction 4).
	for _, c := range []struct {
		name string
		args []string
	}{{"dry-run-exists", nil}, {"dry-run-exists-force", []string{"--force"}}} {
		r := ucp(t, nil, append(append([]string{"convert", "--dry-run", "--workers", "2", "--memory", "1GiB"}, c.args...), src, out)...)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		golden(t, "convert/"+c.name+".golden", r.stdout, src, "SRC", out, "OUT")
	}
	// The real run does refuse it.
	if r := ucp(t, nil, "convert", "--workers", "2", src, out); r.code == 0 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}

// TestArrowGolden: inspect --arrow and convert --dry-run --arrow say what
// they wrote, and the plan file holds the tasks the dry run printed
// (arrowtable's tests read the files with apache-arrow's JavaScript reader).
func TestArrowGolden(t *testing.T) {
	src := testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	tmp := t.TempDir()
	r := ucp(t, nil, "convert", "--dry-run", "--arrow", filepath.Join(tmp, "dry.arrow"), "--workers", "2", "--memory", "1GiB",
		src, filepath.Join(tmp, "out"))
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	golden(t, "convert/dry-run-arrow.golden", r.stdout, src, "SRC", tmp, "TMP")
	var tasks int
	if _, err := fmt.Sscanf(r.stdout, "plan: %d tasks", &tasks); err != nil {
		t.Fatal(err)
	}
	if n := arrowRows(t, filepath.Join(tmp, "dry.plan.arrow")); n != tasks {
		t.Errorf("the plan file has %d rows, the dry run printed %d tasks", n, tasks)
	}
	r = ucp(t, nil, "inspect", "--arrow", filepath.Join(tmp, "inspect.arrow"), "--workers", "2", src)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	golden(t, "inspect/arrow.golden", r.stdout, src, "SRC", tmp, "TMP")
	if n := arrowRows(t, filepath.Join(tmp, "inspect.arrow")); !strings.Contains(r.stdout, fmt.Sprintf("wrote %d fragments", n)) {
		t.Errorf("the fragment file has %d rows: %s", n, r.stdout)
	}
}

func arrowRows(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rd, err := ipc.NewFileReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	n := 0
	for i := 0; i < rd.NumRecords(); i++ {
		rec, err := rd.Record(i)
		if err != nil {
			t.Fatal(err)
		}
		n += int(rec.NumRows())
	}
	return n
}

// ucp inspect of a Megatron torch_dist folder (written by real megatron-core)
// shows its format, TP/PP/DP degrees and each parameter's pattern.
func TestInspectTorchDistGolden(t *testing.T) {
	src := testkit.Fixture("megatron_dist", "core0_19_tp2_pp2_tied_bf16_dprs", "checkpoint")
	r := ucp(t, nil, "inspect", "--all", src)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	golden(t, "inspect/torch_dist.golden", r.stdout, src, "SRC")
}

// ucp inspect --vocab-size of a torch_dist folder saved without args shows
// the true vocabulary of the embedding (cut from the padded rows), as convert
// reads it.
func TestInspectTorchDistVocab(t *testing.T) {
	src := testkit.Fixture("megatron_dist", "core0_19_tp2_pp2_tied_bf16_dprs", "checkpoint")
	r := ucp(t, nil, "inspect", "--all", "--vocab-size", "50", src)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	golden(t, "inspect/torch_dist_vocab.golden", r.stdout, src, "SRC")
	if r := ucp(t, nil, "inspect", "--vocab-size", "65", src); r.code == 0 || !strings.Contains(r.stderr, "65") {
		t.Errorf("--vocab-size beyond the padded rows: exit %d, %s", r.code, r.stderr)
	}
}
