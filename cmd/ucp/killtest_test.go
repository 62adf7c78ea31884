//go:build unix

package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/report"
	"github.com/ucp-project/ucp/internal/testkit"
)

// TestKillResume is the kill -9 loop (make killtest; UCP_KILLTEST=1): a
// multi-GB generated checkpoint is converted once cleanly, then, once per
// kill point, converted again and killed with SIGKILL (after a random
// delay, and right after each phase via UCP_STOP_AFTER), rerun with
// --resume, and every output file compared with the clean run's.
//
//	UCP_KILLTEST_DIR     where the checkpoint and outputs go (default: a test temp folder)
//	UCP_KILLTEST_LAYERS  transformer layers of the generated model (default 1: about 2.2 GB)
//	UCP_KILLTEST_RANDOM  conversions interrupted after random delays (default 10)
//	UCP_KILLTEST_SEED    seed of the delays (default 1)
func TestKillResume(t *testing.T) {
	if os.Getenv("UCP_KILLTEST") != "1" {
		t.Skip("the kill -9 loop is long: run it with make killtest (UCP_KILLTEST=1)")
	}
	envInt := func(k string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
			return v
		}
		return def
	}
	dir := os.Getenv("UCP_KILLTEST_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	src := filepath.Join(dir, "src")
	if _, err := os.Stat(filepath.Join(src, "latest")); err != nil {
		// The benchmark generator (internal/cmd/benchgen): DeepSpeed's
		// layout at a size torch would take minutes to write.
		gen := exec.Command("go", "run", "./internal/cmd/benchgen", "-out", src,
			"-layers", strconv.Itoa(envInt("UCP_KILLTEST_LAYERS", 1)))
		gen.Dir = testkit.RepoRoot()
		if out, err := gen.CombinedOutput(); err != nil {
			t.Fatalf("benchgen: %v\n%s", err, out)
		}
	}
	srcBytes := fsutil.DiskUsage(src)
	if srcBytes < 2e9 {
		t.Fatalf("the source is %d bytes; the kill test wants a multi-GB checkpoint", srcBytes)
	}
	args := []string{"convert", "--quiet", "--workers", "2"}
	clean := filepath.Join(dir, "clean", "atomic")
	os.RemoveAll(filepath.Dir(clean))
	t0 := time.Now()
	if r := ucp(t, nil, append(args, src, clean)...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	cleanTime := time.Since(t0)
	want := treeHashes(t, clean)
	t.Logf("source %.2f GB, clean conversion %s, %d output files, %.2f GB", float64(srcBytes)/1e9, cleanTime.Round(time.Millisecond),
		len(want), float64(fsutil.DiskUsage(clean))/1e9)

	dst := filepath.Join(dir, "out", "atomic")
	// trial kills one conversion (after phase, or after delay) and resumes
	// it; it reports false when the conversion finished before the kill.
	trial := func(i int, phase string, delay time.Duration) bool {
		os.RemoveAll(filepath.Dir(dst))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		killedAt, finished := killConvert(t, append(args, src, dst), phase, delay)
		if finished {
			return false
		}
		rep := filepath.Join(dir, "resume.json")
		os.Remove(rep) // the last trial's, and its timeline: --report replaces files only with --force
		os.Remove(report.SVGPath(rep))
		t1 := time.Now()
		r := ucp(t, nil, append(append([]string{}, args...), "--resume", "--report", rep, src, dst)...)
		took := time.Since(t1)
		if r.code != 0 {
			t.Fatalf("point %d (%s): the resumed run failed: %s", i, killedAt, r.stderr)
		}
		did := "DST was complete, nothing to redo"
		if read, written := reportBytes(t, rep); read >= 0 {
			did = fmt.Sprintf("read %.2f GB, wrote %.2f GB", float64(read)/1e9, float64(written)/1e9)
		}
		got := treeHashes(t, dst)
		if len(got) != len(want) {
			t.Errorf("point %d (%s): %d files, the clean run has %d", i, killedAt, len(got), len(want))
		}
		for k, h := range want {
			if got[k] != h {
				t.Errorf("point %d (%s): %s differs from the clean run", i, killedAt, k)
			}
		}
		if _, err := os.Stat(dst + atomic.PartialSuffix); !os.IsNotExist(err) {
			t.Errorf("point %d (%s): DST.partial left after the resumed run", i, killedAt)
		}
		if r := ucp(t, nil, "verify", dst); r.code != 0 {
			t.Errorf("point %d (%s): verify: %s", i, killedAt, r.stdout)
		}
		t.Logf("point %2d: killed %-24s resumed in %-8s %s; all %d files identical to the clean run",
			i, killedAt, took.Round(time.Millisecond), did, len(got))
		return true
	}
	n := 0
	for _, ph := range killPhases {
		if !trial(n, ph, 0) {
			t.Fatalf("the conversion finished though it was to stop after %s", ph)
		}
		n++
	}
	// Random delays until that many conversions were really interrupted; a
	// run that finished first (a warm page cache is faster) shortens the
	// range.
	rng := rand.New(rand.NewPCG(uint64(envInt("UCP_KILLTEST_SEED", 1)), 0))
	maxDelay, kills := cleanTime, 0
	for attempt := 0; kills < envInt("UCP_KILLTEST_RANDOM", 10) && attempt < 50; attempt++ {
		if trial(n, "", time.Duration(rng.Int64N(int64(maxDelay)))) {
			kills++
			n++
		} else {
			maxDelay = maxDelay * 3 / 4
		}
	}
	if kills < envInt("UCP_KILLTEST_RANDOM", 10) {
		t.Errorf("only %d conversions were interrupted by a random kill", kills)
	}
}

// killPhases are the phases after which UCP_STOP_AFTER stops convert.
var killPhases = []string{"indexed", "created", "converted", "node-done", "synced", "manifest", "renamed"}

// killConvert starts ucp convert and kills it with SIGKILL after delay,
// or once it stops itself after phase; it says where it was killed, and
// whether the conversion had finished by then.
func killConvert(t *testing.T, args []string, phase string, delay time.Duration) (string, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "UCP_TEST_AS_MAIN=1")
	if phase != "" {
		cmd.Env = append(cmd.Env, "UCP_STOP_AFTER="+phase)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	where := fmt.Sprintf("after %s", delay.Round(time.Millisecond))
	if phase != "" {
		where = "right after " + phase
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "stopped after "+phase) {
				break
			}
		}
	} else {
		go io.Copy(io.Discard, stderr)
		time.Sleep(delay)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	err = cmd.Wait()
	return where, err == nil
}

// treeHashes hashes every file under dir but the manifest (its timings
// differ), whose file list is compared instead.
func treeHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == atomic.ManifestName {
			m, err := atomic.ReadManifest(dir)
			if err != nil {
				return err
			}
			var files []string
			for _, f := range m.AllFiles() {
				files = append(files, fmt.Sprintf("%s %d %s", f.Path, f.Bytes, f.CRC32))
			}
			sort.Strings(files)
			out[rel] = strings.Join(files, "\n")
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		out[rel] = fmt.Sprintf("%x", h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// reportBytes reads what a run read and wrote from its --report JSON.
func reportBytes(t *testing.T, path string) (read, written int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return -1, -1 // the resumed run found DST complete and converted nothing
	}
	var r struct {
		Stats struct {
			Read    int64 `json:"bytes_read"`
			Written int64 `json:"bytes_written"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	os.Remove(path)
	return r.Stats.Read, r.Stats.Written
}
