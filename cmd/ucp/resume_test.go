//go:build unix

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/report"
	"github.com/ucp-project/ucp/internal/testkit"
)

// stopped starts ucp with UCP_STOP_AFTER=phase and returns once it has
// stopped itself there; kill it with kill().
func stopped(t *testing.T, phase string, args ...string) (kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "UCP_TEST_AS_MAIN=1", "UCP_STOP_AFTER="+phase)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	var said []string
	for sc.Scan() {
		said = append(said, sc.Text())
		if strings.Contains(sc.Text(), "stopped after "+phase) {
			return func() {
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
			}
		}
	}
	cmd.Wait()
	t.Fatalf("ucp %v never reached %s: %s", args, phase, strings.Join(said, "\n"))
	return nil
}

// TestExclusiveDestination (fault 2): while one conversion writes DST, a
// second one into the same DST is refused (the first holds a lock on
// DST.partial); once the first is killed, a rerun works without cleanup.
func TestExclusiveDestination(t *testing.T) {
	src := testkit.Fixture("deepspeed-real", "z1_dp2_fp32", "checkpoint")
	dst := filepath.Join(t.TempDir(), "atomic")
	for _, phase := range []string{"created", "converted"} {
		t.Run(phase, func(t *testing.T) {
			kill := stopped(t, phase, "convert", "--quiet", src, dst)
			r := ucp(t, nil, "convert", "--quiet", src, dst)
			if r.code == 0 || !strings.Contains(r.stderr, "another ucp run (convert, reshard or export) is writing") {
				kill()
				t.Fatalf("second conversion into a DST being written: exit %d, %s", r.code, r.stderr)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Fatal("DST appeared")
			}
			kill()
			if r := ucp(t, nil, "convert", "--quiet", src, dst); r.code != 0 {
				t.Fatalf("rerun after the kill: %s", r.stderr)
			}
			if r := ucp(t, nil, "verify", dst); r.code != 0 {
				t.Fatal(r.stdout)
			}
			os.RemoveAll(dst)
		})
	}
}

// TestForceReplaceNeverHalf (fault 3): kill -9 at any moment of a --force
// replacement never leaves a folder named DST that is not a complete
// checkpoint: the old DST is renamed aside and removed only after the new
// one is in place. The old DST holds many extra files so that removing it
// takes a while, as a big checkpoint's would.
func TestForceReplaceNeverHalf(t *testing.T) {
	src := testkit.Fixture("deepspeed-real", "z1_dp2_fp32", "checkpoint")
	root := t.TempDir()
	dst := filepath.Join(root, "atomic")
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 12 {
		if _, err := os.Stat(filepath.Join(dst, atomic.ManifestName)); err != nil {
			os.RemoveAll(dst)
			if r := ucp(t, nil, "convert", "--quiet", "--no-sync", src, dst); r.code != 0 {
				t.Fatal(r.stderr)
			}
		}
		bulk := filepath.Join(dst, "zero", "embed.weight", "bulk")
		if err := os.MkdirAll(bulk, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range 3000 {
			writeFile(t, filepath.Join(bulk, fmt.Sprint(j)), nil)
		}
		cmd := exec.Command(os.Args[0], "convert", "--quiet", "--no-sync", "--force", src, dst)
		cmd.Env = append(os.Environ(), "UCP_TEST_AS_MAIN=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if _, err := os.Stat(dst); os.IsNotExist(err) {
			continue // between the two renames: no DST at all is allowed
		}
		m, err := atomic.ReadManifest(dst)
		if err != nil {
			t.Fatalf("attempt %d: a folder named DST without a manifest: %v", i, err)
		}
		for _, f := range m.AllFiles() {
			if err := atomic.VerifyFile(filepath.Join(dst, filepath.FromSlash(f.Path)), f); err != nil {
				t.Fatalf("attempt %d: DST is half-deleted: %v", i, err)
			}
		}
	}
}

// nodeZeroDone runs node 0 of a 2-node conversion and returns DST and the
// arguments of node n.
func nodeZeroDone(t *testing.T) (string, func(n string) []string) {
	t.Helper()
	src := testkit.Fixture("deepspeed", "z2_bf16_dp4", "checkpoint")
	dst := filepath.Join(t.TempDir(), "atomic")
	args := func(n string) []string {
		return []string{"convert", "--quiet", "--num-nodes", "2", "--node-rank", n, "--workers", "1", src, dst}
	}
	if r := ucp(t, nil, args("0")...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	return dst, args
}

// TestStaleFinalizeLock (fault 11): a finalize.lock left by a finalizing
// node that died no longer blocks: the rerun takes the lock (a flock held
// by no live process) and writes DST.
func TestStaleFinalizeLock(t *testing.T) {
	dst, args := nodeZeroDone(t)
	// Node 1 takes the finalize lock and dies there.
	stopped(t, "finalize-locked", args("1")...)()
	if _, err := os.Stat(filepath.Join(dst+atomic.PartialSuffix, ".ucp-nodes", "finalize.lock")); err != nil {
		t.Fatalf("no finalize.lock after the finalizer died: %v", err)
	}
	r := ucp(t, nil, args("1")...)
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := ucp(t, nil, "verify", dst); r.code != 0 {
		t.Fatalf("the rerun did not finish the job: %s %s", r.stdout, r.stderr)
	}
	testkit.Check(t, dst, testkit.Fixture("deepspeed", "z2_bf16_dp4", "truth.pt"))
}

// TestStaleFinalizeLockFile (fault 11): the same with the lock file as a
// dead process leaves it, written by hand: the file exists, nobody holds it.
func TestStaleFinalizeLockFile(t *testing.T) {
	dst, args := nodeZeroDone(t)
	writeFile(t, filepath.Join(dst+atomic.PartialSuffix, ".ucp-nodes", "finalize.lock"), []byte("node 1\n"))
	if r := ucp(t, nil, args("1")...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := ucp(t, nil, "verify", dst); r.code != 0 {
		t.Fatalf("a stale finalize.lock kept DST from appearing: %s %s", r.stdout, r.stderr)
	}
}

// TestResume: a conversion killed after its files were written is resumed
// with --resume: the completed files are reused (their CRC-32 checked:
// a damaged or truncated one is redone), the output is byte-identical to
// a clean run, and the summary and --report say what this run did.
func TestResume(t *testing.T) {
	src := testkit.Fixture("deepspeed-real", "z2_dp2_bf16", "checkpoint")
	dir := t.TempDir()
	clean := filepath.Join(dir, "clean", "atomic")
	if r := ucp(t, nil, "convert", "--quiet", src, clean); r.code != 0 {
		t.Fatal(r.stderr)
	}
	want := treeHashes(t, clean)
	dst := filepath.Join(dir, "out", "atomic")
	tests := []struct {
		phase  string
		damage bool
	}{{"created", false}, {"converted", false}, {"converted", true}, {"node-done", false}, {"synced", false},
		{"manifest", false}, {"renamed", false}}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s damage=%v", tc.phase, tc.damage), func(t *testing.T) {
			os.RemoveAll(filepath.Dir(dst))
			os.MkdirAll(filepath.Dir(dst), 0o755)
			stopped(t, tc.phase, "convert", "--quiet", src, dst)()
			redo := 0
			if tc.damage {
				a := filepath.Join(dst+atomic.PartialSuffix, "zero", "head.weight", "exp_avg.pt")
				b := filepath.Join(dst+atomic.PartialSuffix, "zero", "embed.weight", "fp32.pt")
				data, err := os.ReadFile(a)
				if err != nil {
					t.Fatal(err)
				}
				data[len(data)/2] ^= 0x40
				writeFile(t, a, data)
				if err := os.Truncate(b, 100); err != nil {
					t.Fatal(err)
				}
				redo = 2
			}
			rep := filepath.Join(dir, "run.json")
			os.Remove(rep) // the last case's, and its timeline: replaced only with --force
			os.Remove(report.SVGPath(rep))
			r := ucp(t, nil, "convert", "--resume", "--report", rep, src, dst)
			if r.code != 0 {
				t.Fatal(r.stderr)
			}
			got := treeHashes(t, dst)
			for k, h := range want {
				if got[k] != h {
					t.Errorf("%s differs from the clean run", k)
				}
			}
			if len(got) != len(want) {
				t.Errorf("%d files, the clean run has %d", len(got), len(want))
			}
			if tc.phase == "renamed" {
				if !strings.Contains(r.stdout, "already complete") {
					t.Errorf("stdout %q", r.stdout)
				}
				return
			}
			var rp struct {
				Stats struct {
					Written int64 `json:"bytes_written"`
					Files   int   `json:"reused_files"`
				} `json:"stats"`
			}
			b, err := os.ReadFile(rep)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &rp); err != nil {
				t.Fatal(err)
			}
			all := len(want) - 1 // the manifest is written when finalizing; optimizer_state.pt by its task
			switch tc.phase {
			case "created":
				if rp.Stats.Files != 0 {
					t.Errorf("reused %d files of a run killed before converting", rp.Stats.Files)
				}
			default:
				if rp.Stats.Files != all-redo {
					t.Errorf("reused %d files, want %d", rp.Stats.Files, all-redo)
				}
				if !strings.Contains(r.stdout, fmt.Sprintf("resumed: %d files", all-redo)) {
					t.Errorf("summary %q", r.stdout)
				}
				if redo == 0 && rp.Stats.Written != 0 {
					t.Errorf("wrote %d bytes though every file was reused", rp.Stats.Written)
				}
			}
		})
	}
	// Without --resume a leftover DST.partial is replaced as before.
	os.RemoveAll(filepath.Dir(dst))
	os.MkdirAll(filepath.Dir(dst), 0o755)
	stopped(t, "converted", "convert", "--quiet", src, dst)()
	if r := ucp(t, nil, "convert", src, dst); r.code != 0 || strings.Contains(r.stdout, "resumed") {
		t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	// --resume of another plan (other options) is refused.
	os.RemoveAll(filepath.Dir(dst))
	os.MkdirAll(filepath.Dir(dst), 0o755)
	stopped(t, "converted", "convert", "--quiet", src, dst)()
	if r := ucp(t, nil, "convert", "--resume", "--chunk-elems", "64", src, dst); r.code == 0 || !strings.Contains(r.stderr, "another plan") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}

// TestTwoConversionsAtOnce (fault 2, without test hooks): two conversions
// into one DST started a few milliseconds apart. Whatever the timing,
// a run that exits 0 leaves a DST that verifies, and the other is
// refused (the lock, or DST already exists).
func TestTwoConversionsAtOnce(t *testing.T) {
	src := testkit.Fixture("deepspeed", "megatron_tp2_pp2_bf16opt_dp2", "checkpoint")
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range 12 {
		dst := filepath.Join(t.TempDir(), "atomic")
		var cmds [2]*exec.Cmd
		var errs [2]error
		done := make(chan int, 2)
		for k := range cmds {
			cmds[k] = exec.Command(os.Args[0], "convert", "--quiet", "--workers", "1", src, dst)
			cmds[k].Env = append(os.Environ(), "UCP_TEST_AS_MAIN=1")
			if err := cmds[k].Start(); err != nil {
				t.Fatal(err)
			}
			go func() { errs[k] = cmds[k].Wait(); done <- k }()
			if k == 0 {
				time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
			}
		}
		<-done
		<-done
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
			}
		}
		if ok == 0 {
			t.Fatalf("attempt %d: neither conversion succeeded: %v", i, errs)
		}
		if ok == 2 {
			t.Fatalf("attempt %d: both conversions into one DST exited 0", i)
		}
		if r := ucp(t, nil, "verify", dst); r.code != 0 {
			t.Fatalf("attempt %d: one conversion exited 0 but DST does not verify:\n%s%s", i, r.stdout, r.stderr)
		}
	}
}

// TestResumeSourceChanged (issue 26 fault 4): a run killed after writing
// its files, then its source rank files changed in place (same size;
// mtime put back; or replaced by a rename with the same bytes), is not
// resumed: --resume is refused naming the file, and a run without it
// converts the new source.
func TestResumeSourceChanged(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, path string)
		want   string
	}{
		{"bytes changed", func(t *testing.T, path string) {
			flipMiddle(t, path)
		}, "was modified"},
		{"bytes changed, mtime put back", func(t *testing.T, path string) {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			flipMiddle(t, path)
			if err := os.Chtimes(path, st.ModTime(), st.ModTime()); err != nil {
				t.Fatal(err)
			}
		}, "other bytes"},
		{"replaced by a copy", func(t *testing.T, path string) {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, path+".new", data)
			if err := os.Chtimes(path+".new", st.ModTime(), st.ModTime()); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(path+".new", path); err != nil {
				t.Fatal(err)
			}
		}, "was replaced"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := realCkpt(t)
			dst := filepath.Join(t.TempDir(), "atomic")
			stopped(t, "converted", "convert", "--quiet", src, dst)()
			rank := filepath.Join(src, "global_step3", "zero_pp_rank_1_mp_rank_00_optim_states.pt")
			tc.change(t, rank)
			r := ucp(t, nil, "convert", "--quiet", "--resume", src, dst)
			if r.code == 0 || !strings.Contains(r.stderr, "cannot resume") || !strings.Contains(r.stderr, rank) || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("resume after the source changed: exit %d, %q", r.code, r.stderr)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Error("DST appeared")
			}
		})
	}
}

// flipMiddle changes one byte in the middle of a file, keeping its size.
func flipMiddle(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, st.Size()/2); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, st.Size()/2); err != nil {
		t.Fatal(err)
	}
}
