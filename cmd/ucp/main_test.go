package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/testkit"
)

// The test binary doubles as the ucp command, so tests can run it as
// separate processes (nodes) without building anything else.
func TestMain(m *testing.M) {
	if os.Getenv("UCP_TEST_AS_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	if dir := os.Getenv("UCP_TEST_HOLD_LOCK"); dir != "" {
		holdLock(dir) // never returns
	}
	os.Exit(m.Run())
}

type result struct {
	stdout, stderr string
	code           int
}

func ucp(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return ucpWithin(t, 10*time.Minute, env, args...)
}

// ucpWithin runs ucp as a separate process and kills it after limit: a
// hang is a failure, not a stuck test.
func ucpWithin(t *testing.T, limit time.Duration, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "UCP_TEST_AS_MAIN=1"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("ucp %v still running after %s (hangs)", args, limit)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

// TestFourNodeProcesses runs the conversion as 4 processes sharing one
// output folder, as 4 nodes would, and compares with a 1-node run.
func TestFourNodeProcesses(t *testing.T) {
	src := testkit.Fixture("deepspeed", "megatron_tp2_pp2_bf16opt_dp2", "checkpoint")
	tmp := t.TempDir()
	ref := convertOneNode(t, src, tmp)
	dst := filepath.Join(tmp, "nodes", "atomic")
	var wg sync.WaitGroup
	results := make([]result, 4)
	for n := 0; n < 4; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Slurm's variables give the node rank and count.
			results[n] = ucp(t, []string{"SLURM_PROCID=" + string(rune('0'+n)), "SLURM_NTASKS=4"},
				"convert", "--workers", "2", "--chunk-elems", "11", src, dst)
		}()
	}
	wg.Wait()
	for n, r := range results {
		if r.code != 0 {
			t.Fatalf("node %d: %s%s", n, r.stdout, r.stderr)
		}
	}
	sameCheckpoint(t, ref, dst, "4 node processes")
}

// TestNodeRerunAndFinalize: nodes 0-2 finish, node 3 fails first; the
// checkpoint stays partial until node 3 is rerun alone and finalizes.
func TestNodeRerunAndFinalize(t *testing.T) {
	src := testkit.Fixture("deepspeed", "z2_bf16_dp4", "checkpoint")
	dst := filepath.Join(t.TempDir(), "atomic")
	args := func(n string) []string {
		return []string{"convert", "--num-nodes", "4", "--node-rank", n, "--workers", "1", "--chunk-elems", "5", src, dst}
	}
	for _, n := range []string{"0", "1", "2"} {
		if r := ucp(t, nil, args(n)...); r.code != 0 {
			t.Fatalf("node %s: %s", n, r.stderr)
		}
	}
	if r := ucp(t, nil, "convert", "--finalize", "--num-nodes", "4", "--node-rank", "0", "--workers", "1", "--chunk-elems", "5", src, dst); r.code == 0 ||
		!strings.Contains(r.stderr, "node 3 of 4 has not finished") {
		t.Fatalf("finalize before node 3: code %d, %s", r.code, r.stderr)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatal("the checkpoint appeared before every node finished")
	}
	r := ucp(t, nil, args("3")...)
	if r.code != 0 || !strings.Contains(r.stdout, "finalized") {
		t.Fatalf("node 3: %s %s", r.stdout, r.stderr)
	}
	testkit.Check(t, dst, testkit.Fixture("deepspeed", "z2_bf16_dp4", "truth.pt"))
}

// TestDamagedNodeRecord: a block CRC-32 damaged in the record of a node
// that filled part of a shared file fails the finalizing node, naming the
// record; no checkpoint appears, and a rerun of the damaged node finishes
// it with the block CRC-32s of a 1-node run.
func TestDamagedNodeRecord(t *testing.T) {
	src := testkit.Fixture("deepspeed", "z2_bf16_dp4", "checkpoint")
	tmp := t.TempDir()
	ref := convertOneNode(t, src, tmp)
	dst := filepath.Join(tmp, "nodes", "atomic")
	args := func(n string) []string {
		return []string{"convert", "--num-nodes", "2", "--node-rank", n, "--workers", "1", "--chunk-elems", "5", src, dst}
	}
	if r := ucp(t, nil, args("0")...); r.code != 0 {
		t.Fatalf("node 0: %s", r.stderr)
	}
	record := filepath.Join(dst+atomic.PartialSuffix, ".ucp-nodes", "node-0.json")
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	// Another first base64 character: the first block CRC-32 of node 0's
	// first shared piece changes.
	key := []byte(`"block_crc32": "`)
	i, j := bytes.Index(b, []byte(`"shared"`)), -1
	if i >= 0 {
		j = bytes.Index(b[i:], key)
	}
	if j < 0 {
		t.Fatalf("node 0 recorded no block CRC-32s of shared files:\n%s", b)
	}
	i += j + len(key)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	if err := os.WriteFile(record, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := ucp(t, nil, args("1")...); r.code == 0 || !strings.Contains(r.stderr, record) || !strings.Contains(r.stderr, "rerun node 0") {
		t.Fatalf("node 1 with node 0's record damaged: code %d, %s", r.code, r.stderr)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatal("the checkpoint appeared from a damaged record")
	}
	if r := ucp(t, nil, args("0")...); r.code != 0 || !strings.Contains(r.stdout, "finalized") {
		t.Fatalf("rerun of node 0: %s %s", r.stdout, r.stderr)
	}
	sameCheckpoint(t, ref, dst, "node 0 rerun after its record was damaged")
}

func TestBadInputGivesCleanError(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pt")
	if err := os.WriteFile(bad, []byte("PK\x03\x04 this is not a zip archive at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"inspect", bad},
		{"inspect", filepath.Join(dir, "missing.pt")},
		{"convert", dir, filepath.Join(dir, "out")},
		{"convert", "--from", "nosuchformat", dir, filepath.Join(dir, "out")},
	} {
		r := ucp(t, nil, args...)
		if r.code == 0 {
			t.Errorf("%v: exit code 0", args)
		}
		if !strings.HasPrefix(r.stderr, "ucp: ") || strings.Contains(r.stderr, "goroutine") {
			t.Errorf("%v: stderr %q", args, r.stderr)
		}
	}
}

func TestInspectCheckpointJSON(t *testing.T) {
	rep := inspectJSON(t, testkit.Fixture("zero3", "paper_1024_dp3", "checkpoint"))
	if rep.Degrees.DP != 3 || rep.Degrees.ZeRO != 3 {
		t.Errorf("degrees %+v", rep.Degrees)
	}
	found := false
	for _, p := range rep.Params {
		if p.Shape[0]*max(1, int64(len(p.Shape))-0) > 0 && p.Padding == 2 && p.Fragments == 3 {
			found = true
		}
	}
	if !found {
		t.Errorf("no parameter with 2 padding elements in 3 fragments: %+v", rep.Params)
	}
}

func TestNodePlace(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	tests := []struct {
		rank, count int
		env         map[string]string
		want        [2]int
		err         bool
	}{
		{-1, 0, nil, [2]int{0, 1}, false},
		{-1, 0, map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}, [2]int{2, 4}, false},
		{-1, 0, map[string]string{"RANK": "1", "WORLD_SIZE": "2"}, [2]int{1, 2}, false},
		{-1, 0, map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8"}, [2]int{3, 8}, false},
		{-1, 5, map[string]string{"JOB_COMPLETION_INDEX": "4"}, [2]int{4, 5}, false},
		{-1, 0, map[string]string{"JOB_COMPLETION_INDEX": "1", "UCP_NUM_NODES": "3"}, [2]int{1, 3}, false},
		{1, 2, map[string]string{"SLURM_PROCID": "7", "SLURM_NTASKS": "8"}, [2]int{1, 2}, false},
		// mpirun and torchrun inside a Slurm job step: their own ranks win.
		{-1, 0, map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}, [2]int{2, 3}, false},
		{-1, 0, map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "RANK": "1", "WORLD_SIZE": "3"}, [2]int{1, 3}, false},
		{-1, 0, map[string]string{"SLURM_PROCID": "x", "SLURM_NTASKS": "4"}, [2]int{}, true},
		{3, 2, nil, [2]int{}, true},
	}
	for i, tc := range tests {
		r, c, _, err := nodePlace(tc.rank, tc.count, env(tc.env))
		if (err != nil) != tc.err || (!tc.err && [2]int{r, c} != tc.want) {
			t.Errorf("case %d: %d %d %v, want %v (error %v)", i, r, c, err, tc.want, tc.err)
		}
	}
}

func TestVerify(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "atomic")
	if r := ucp(t, nil, "convert", "--quiet", testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint"), dst); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := ucp(t, nil, "verify", dst); r.code != 0 || !strings.Contains(r.stdout, "all match the manifest") {
		t.Fatalf("verify of a fresh checkpoint: %d %s %s", r.code, r.stdout, r.stderr)
	}
	// inspect reads the manifest of an atomic checkpoint.
	r := ucp(t, nil, "inspect", dst)
	if r.code != 0 || !strings.Contains(r.stdout, "atomic checkpoint") || !strings.Contains(r.stdout, "head.weight") ||
		!strings.Contains(r.stdout, "converted from deepspeed") {
		t.Fatalf("inspect of an atomic checkpoint: %d %s %s", r.code, r.stdout, r.stderr)
	}
	// Flip one byte of one tensor: verify names that file.
	victim := filepath.Join(dst, "zero", "head.weight", "exp_avg.pt")
	b, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(victim, b, 0o644); err != nil {
		t.Fatal(err)
	}
	r = ucp(t, nil, "verify", dst)
	if r.code == 0 || !strings.Contains(r.stdout, "head.weight/exp_avg.pt") || !strings.Contains(r.stderr, "1 of") {
		t.Fatalf("verify of a corrupt checkpoint: %d %s %s", r.code, r.stdout, r.stderr)
	}
}

func TestReport(t *testing.T) {
	dir := t.TempDir()
	rep := filepath.Join(dir, "run.json")
	r := ucp(t, nil, "convert", "--workers", "2", "--report", rep,
		testkit.Fixture("deepspeed", "z2_bf16_dp4", "checkpoint"), filepath.Join(dir, "atomic"))
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	// The terminal summary names the straggler and the slowest tasks.
	if !regexp.MustCompile(`(?m)^  stragglers: worker [01] finished last at .*, the median worker at `).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^  slowest tasks: (copy )?\S+ \S+ \(\d.*, worker [01]\), `).MatchString(r.stdout) {
		t.Errorf("no straggler summary:\n%s", r.stdout)
	}
	b, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Index int64 `json:"index_ns"`
		Stats struct {
			Tasks   int `json:"tasks"`
			Workers []struct {
				Tasks int   `json:"tasks"`
				Read  int64 `json:"read_ns"`
				Write int64 `json:"write_ns"`
				Spans []any `json:"spans"`
			} `json:"workers"`
		} `json:"stats"`
		PeakRSS int64 `json:"peak_rss_bytes"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	tasks := 0
	for _, w := range got.Stats.Workers {
		tasks += w.Tasks
		if len(w.Spans) != w.Tasks {
			t.Errorf("a worker ran %d tasks but shows %d spans", w.Tasks, len(w.Spans))
		}
	}
	if got.Index <= 0 || len(got.Stats.Workers) != 2 || tasks != got.Stats.Tasks || tasks == 0 || got.PeakRSS <= 0 {
		t.Errorf("report %s", b)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "run.svg"))
	if err != nil || !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("worker 1")) ||
		!bytes.Contains(svg, []byte("write: writing the output")) {
		t.Errorf("timeline: %v", err)
	}
}
