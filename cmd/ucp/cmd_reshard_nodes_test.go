//go:build unix

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/testkit"
)

// reshardNodeCases are multi-node reshards of every target: fixture (kind,
// name) converted once, the reshard flags, the node count, and the folder
// the nodes share (relative to the save root given as DST).
var reshardNodeCases = []struct {
	name    string
	fixture [2]string
	args    []string
	nodes   int
	folder  string
}{
	{"deepspeed zero2 tp2", [2]string{"deepspeed", "megatron_tp2_bf16opt_dp2"}, []string{"--to", "deepspeed", "--dp", "3", "--zero", "2", "--tp", "2"}, 3, "step3"},
	{"deepspeed zero3", [2]string{"deepspeed", "megatron_tp2_bf16opt_dp2"}, []string{"--to", "deepspeed", "--dp", "4", "--zero", "3"}, 2, "step3"},
	{"megatron torch", [2]string{"megatron", "pp2_vpp2_distopt"}, []string{"--to", "megatron", "--tp", "2", "--pp", "2", "--dp", "2", "--distributed-optimizer"}, 4, "iter_0000010"},
	{"megatron torch_dist", [2]string{"megatron", "pp2_vpp2_distopt"}, []string{"--to", "megatron", "--ckpt-format", "torch_dist", "--tp", "2", "--pp", "2", "--dp", "2"}, 4, "iter_0000010"},
	// 2 rank files over 3 nodes: one node writes nothing but its record.
	{"megatron torch_dist dp_reshardable core 0.18", [2]string{"megatron", "pp2_vpp2_distopt"}, []string{"--to", "megatron", "--ckpt-format", "torch_dist", "--pp", "2", "--dp", "2",
		"--dist-optim-sharding", "dp_reshardable", "--megatron-core", "0.18"}, 3, "iter_0000010"},
}

// atomicOf converts a fixture once per test into dir and returns the atomic checkpoint.
func atomicOf(t *testing.T, dir string, fixture [2]string) string {
	t.Helper()
	a := filepath.Join(dir, "atomic-"+fixture[1])
	if _, err := os.Stat(a); err == nil {
		return a
	}
	if r := ucp(t, nil, "convert", "--quiet", testkit.Fixture(fixture[0], fixture[1], "checkpoint"), a); r.code != 0 {
		t.Fatal(r.stderr)
	}
	return a
}

// saveArgs are the reshard arguments writing save (the DeepSpeed tag
// folder inside it, or the Megatron save folder itself).
func saveArgs(src, save, folder string, args []string, extra ...string) []string {
	dst := save
	if strings.HasPrefix(folder, "step") {
		dst = filepath.Join(save, folder)
	}
	return append(append([]string{"reshard", "--no-sync", src, dst}, args...), extra...)
}

// oneNodeRef converts the fixture (once) and reshards it with one process
// into <oneRoot>/save; the nodes' run goes to <allRoot>/save (as long, since
// torch_dist's .metadata names the folder).
func oneNodeRef(t *testing.T, dir string, i int, fixture [2]string, folder string, args []string) (src, oneRoot, allRoot string) {
	t.Helper()
	src = atomicOf(t, dir, fixture)
	oneRoot, allRoot = filepath.Join(dir, fmt.Sprintf("%02d-one", i)), filepath.Join(dir, fmt.Sprintf("%02d-all", i))
	if r := ucp(t, nil, saveArgs(src, filepath.Join(oneRoot, "save"), folder, args)...); r.code != 0 {
		t.Fatalf("1 node: %s", r.stderr)
	}
	return src, oneRoot, allRoot
}

var uuidRe = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// sameSave fails unless the save folder got has the files of ref byte for
// byte, but for what torch's .metadata holds of one save: its random
// save_id (masked) and its folder (refRoot read as gotRoot, paths of equal length).
func sameSave(t *testing.T, ref, got, refRoot, gotRoot, what string) {
	t.Helper()
	a, b := testkit.ReadTree(t, ref), testkit.ReadTree(t, got)
	if len(a) != len(b) {
		t.Errorf("%s: %d files, the 1-node run wrote %d", what, len(b), len(a))
	}
	for k, v := range a {
		w, ok := b[k]
		if filepath.Base(k) == ".metadata" {
			v = uuidRe.ReplaceAll(bytes.ReplaceAll(v, []byte(refRoot), []byte(gotRoot)), []byte("UUID"))
			w = uuidRe.ReplaceAll(w, []byte("UUID"))
		}
		if !ok || !bytes.Equal(v, w) {
			t.Errorf("%s: %s differs from the 1-node run", what, k)
		}
	}
}

// TestReshardNodes: N node processes (started together, their places
// from Slurm's variables or from the flags) write one folder that equals
// the 1-node reshard byte for byte, for every target.
func TestReshardNodes(t *testing.T) {
	dir := t.TempDir()
	for i, c := range reshardNodeCases {
		t.Run(c.name, func(t *testing.T) {
			src, oneRoot, allRoot := oneNodeRef(t, dir, i, c.fixture, c.folder, c.args)
			ref, got := filepath.Join(oneRoot, "save"), filepath.Join(allRoot, "save")
			results := make([]result, c.nodes)
			var wg sync.WaitGroup
			for n := 0; n < c.nodes; n++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if i%2 == 0 {
						results[n] = ucp(t, []string{"SLURM_PROCID=" + strconv.Itoa(n), "SLURM_NTASKS=" + strconv.Itoa(c.nodes)}, saveArgs(src, got, c.folder, c.args)...)
					} else {
						results[n] = ucp(t, nil, saveArgs(src, got, c.folder, c.args, "--num-nodes", strconv.Itoa(c.nodes), "--node-rank", strconv.Itoa(n))...)
					}
				}()
			}
			wg.Wait()
			finalized := 0
			for n, r := range results {
				if r.code != 0 {
					t.Fatalf("node %d: %s%s", n, r.stdout, r.stderr)
				}
				if !strings.Contains(r.stdout, fmt.Sprintf("node %d of %d", n, c.nodes)) {
					t.Errorf("node %d says %q", n, r.stdout)
				}
				finalized += strings.Count(r.stdout, "finalized")
			}
			if finalized != 1 {
				t.Errorf("%d nodes finalized, want 1", finalized)
			}
			sameSave(t, ref, got, oneRoot, allRoot, c.name)
			if _, err := os.Stat(filepath.Join(got, c.folder+fsutil.PartialSuffix)); !os.IsNotExist(err) {
				t.Errorf("%s.partial is left", c.folder)
			}
		})
	}
}

// TestReshardNodeKilledRerun: node 1 of 3 is killed after writing its
// files but before its record; the others finish and the folder does not
// appear (nor 'latest' / the tracker); --finalize refuses naming node 1;
// node 1 rerun alone finishes the job, stray files of the killed run
// removed, byte-identical to the 1-node run. The finalizer killed after
// writing what comes last is replaced by --finalize.
func TestReshardNodeKilledRerun(t *testing.T) {
	dir := t.TempDir()
	for i, c := range reshardNodeCases[:4] {
		t.Run(c.name, func(t *testing.T) {
			src, oneRoot, allRoot := oneNodeRef(t, dir, i, c.fixture, c.folder, c.args)
			ref, got := filepath.Join(oneRoot, "save"), filepath.Join(allRoot, "save")
			node := func(n int, extra ...string) []string {
				return saveArgs(src, got, c.folder, c.args, append([]string{"--num-nodes", "3", "--node-rank", strconv.Itoa(n)}, extra...)...)
			}
			stopped(t, "node-wrote", node(1)...)()
			for _, n := range []int{0, 2} {
				if r := ucp(t, nil, node(n)...); r.code != 0 || !strings.Contains(r.stdout, "other nodes are still running") {
					t.Fatalf("node %d: %d %s%s", n, r.code, r.stdout, r.stderr)
				}
			}
			partial := filepath.Join(got, c.folder+fsutil.PartialSuffix)
			for _, p := range []string{filepath.Join(got, c.folder), filepath.Join(got, "latest"), filepath.Join(got, "latest_checkpointed_iteration.txt")} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Fatalf("%s exists with node 1 killed", p)
				}
			}
			writeFile(t, filepath.Join(partial, ".junk.pt.tmp-123456"), []byte("a write the kill cut short"))
			if r := ucp(t, nil, node(0, "--finalize")...); r.code == 0 || !strings.Contains(r.stderr, "node 1 of 3 has not finished") {
				t.Fatalf("--finalize before node 1: %d %s", r.code, r.stderr)
			}
			if i == 3 {
				// The finalizer dies after writing .metadata; --finalize completes.
				stopped(t, "last-written", node(1)...)()
				if r := ucp(t, nil, node(2, "--finalize")...); r.code != 0 || !strings.Contains(r.stdout, "finalized") {
					t.Fatalf("--finalize: %d %s%s", r.code, r.stdout, r.stderr)
				}
			} else if r := ucp(t, nil, node(1)...); r.code != 0 || !strings.Contains(r.stdout, "finalized") {
				t.Fatalf("rerun of node 1: %d %s%s", r.code, r.stdout, r.stderr)
			}
			sameSave(t, ref, got, oneRoot, allRoot, c.name+", node 1 killed and rerun")
		})
	}
}

// TestReshardNodesBadInput: nodes that disagree on the plan are refused
// before they write, naming the folder; so are a rank out of range and
// --finalize of a one-node run.
func TestReshardNodesBadInput(t *testing.T) {
	dir := t.TempDir()
	src := atomicOf(t, dir, [2]string{"megatron", "pp2_vpp2_distopt"})
	save := filepath.Join(dir, "save")
	base := []string{"reshard", "--no-sync", src, save, "--to", "megatron", "--ckpt-format", "torch_dist", "--tp", "2"}
	args := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	if r := ucp(t, nil, args("--num-nodes", "2", "--node-rank", "0")...); r.code != 0 {
		t.Fatalf("node 0: %s", r.stderr)
	}
	partial := filepath.Join(save, "iter_0000010"+fsutil.PartialSuffix)
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"other node count", args("--num-nodes", "3", "--node-rank", "1"), []string{partial, "was started by nodes of another plan (2 nodes", "node 1 of 3"}},
		{"other options", args("--num-nodes", "2", "--node-rank", "1", "--dp", "2"), []string{partial, "was started by nodes of another plan", "remove " + partial}},
		{"rank out of range", args("--num-nodes", "2", "--node-rank", "2"), []string{save, "node rank 2 is not below the node count 2"}},
		{"rank from the launcher out of range", args(), []string{save, "node rank 5 is not below the node count 2 (from SLURM_PROCID/SLURM_NTASKS)"}},
		{"finalize one node", args("--finalize"), []string{save, "--finalize finishes a multi-node reshard"}},
		{"finalize early", args("--num-nodes", "2", "--node-rank", "0", "--finalize"), []string{"node 1 of 2 has not finished"}},
	} {
		var env []string
		if c.name == "rank from the launcher out of range" {
			env = []string{"SLURM_PROCID=5", "SLURM_NTASKS=2"}
		}
		r := ucp(t, env, c.args...)
		if r.code == 0 || !strings.HasPrefix(r.stderr, "ucp: ") || strings.Contains(r.stderr, "goroutine") {
			t.Errorf("%s: exit %d, stderr %q", c.name, r.code, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr %q does not say %q", c.name, r.stderr, w)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(save, "iter_0000010")); !os.IsNotExist(err) {
		t.Error("the folder appeared although node 1 never ran")
	}
	// The right node 1 still completes the job the refused ones left alone.
	if r := ucp(t, nil, args("--num-nodes", "2", "--node-rank", "1")...); r.code != 0 || !strings.Contains(r.stdout, "finalized") {
		t.Fatalf("node 1: %d %s%s", r.code, r.stdout, r.stderr)
	}
}
