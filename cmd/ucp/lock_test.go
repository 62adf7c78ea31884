//go:build unix

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/testkit"
)

// holdLock is a second process's half of the lock tests: it flocks the
// folder dir exclusively as a run writing it does (fsutil.LockDir), says
// so and waits to be killed.
func holdLock(dir string) {
	err := os.MkdirAll(dir, 0o755)
	var d *os.File
	if err == nil {
		d, err = os.Open(dir)
	}
	if err == nil {
		err = unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		fmt.Println("lock failed:", err)
		os.Exit(1)
	}
	fmt.Println("locked")
	time.Sleep(time.Hour)
	os.Exit(0)
}

// lockHolder starts a process holding the lock on dir and returns its
// kill -9.
func lockHolder(t *testing.T, dir string) (kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "UCP_TEST_HOLD_LOCK="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "locked" {
		cmd.Wait()
		t.Fatalf("lock holder: %q", line)
	}
	return func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}
}

// writerCase is one command that writes a folder DST from the atomic
// checkpoint a (reshard, export) or from the source src (convert).
type writerCase struct {
	name string
	args func(a, src, dst string) []string
	part func(dst string) string // the folder it builds in
}

func writerCases() []writerCase {
	partial := func(dst string) string { return dst + atomic.PartialSuffix }
	return []writerCase{
		{"convert", func(a, src, dst string) []string { return []string{"convert", "--quiet", "--force", src, dst} }, partial},
		{"convert --resume", func(a, src, dst string) []string { return []string{"convert", "--quiet", "--resume", src, dst} }, partial},
		{"reshard deepspeed", func(a, src, dst string) []string {
			return []string{"reshard", "--quiet", "--force", a, dst, "--to", "deepspeed", "--dp", "2", "--zero", "1"}
		}, partial},
		{"export dcp", func(a, src, dst string) []string {
			return []string{"export", "--quiet", "--force", "--to", "dcp", "--shards", "2", a, dst}
		}, partial},
		{"export torch", func(a, src, dst string) []string {
			return []string{"export", "--quiet", "--force", "--to", "torch", a, dst}
		}, partial},
	}
}

// lockSetup converts the DeepSpeed fixture once: the atomic source of
// reshard and export.
func lockSetup(t *testing.T) (a, src string) {
	t.Helper()
	src = testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	a = filepath.Join(t.TempDir(), "atomic")
	if r := ucp(t, nil, "convert", "--quiet", src, a); r.code != 0 {
		t.Fatal(r.stderr)
	}
	return a, src
}

// TestWritersTakeTheLock (issue 26 fault 2): convert, reshard and export
// are refused while another live process holds DST.partial's lock, leave
// DST absent, and run once that process is killed (the kernel dropped its
// lock; nothing to clean up).
func TestWritersTakeTheLock(t *testing.T) {
	a, src := lockSetup(t)
	for _, c := range writerCases() {
		t.Run(c.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "out")
			kill := lockHolder(t, c.part(dst))
			r := ucp(t, nil, c.args(a, src, dst)...)
			if r.code == 0 || !strings.Contains(r.stderr, "another ucp run (convert, reshard or export) is writing") {
				kill()
				t.Fatalf("run into a DST.partial another process holds: exit %d, %s", r.code, r.stderr)
			}
			if _, err := os.Lstat(dst); !os.IsNotExist(err) {
				t.Errorf("DST appeared (%v)", err)
			}
			kill()
			if r := ucp(t, nil, c.args(a, src, dst)...); r.code != 0 {
				t.Fatalf("rerun after the holder was killed: %s", r.stderr)
			}
			if _, err := os.Lstat(c.part(dst)); !os.IsNotExist(err) {
				t.Errorf("%s left behind (%v)", c.part(dst), err)
			}
		})
	}
}

// TestWritersRace (issue 26 fault 2, as reported): two reshard --force or
// export --force runs into one DST started together. Each either exits 0
// or is refused by the lock, and DST is always one whole run's output,
// equal to what a single run writes.
func TestWritersRace(t *testing.T) {
	a, src := lockSetup(t)
	for _, c := range writerCases()[2:] {
		t.Run(c.name, func(t *testing.T) {
			ref := filepath.Join(t.TempDir(), "ref")
			if r := ucp(t, nil, c.args(a, src, ref)...); r.code != 0 {
				t.Fatal(r.stderr)
			}
			want := testkit.ReadTree(t, ref)
			dst := filepath.Join(t.TempDir(), "out")
			refused := 0
			for round := range 4 {
				var wg sync.WaitGroup
				res := make([]result, 2)
				for i := range res {
					wg.Add(1)
					go func() {
						defer wg.Done()
						res[i] = ucp(t, nil, c.args(a, src, dst)...)
					}()
				}
				wg.Wait()
				for _, r := range res {
					if r.code != 0 {
						refused++
						if !strings.Contains(r.stderr, "is writing") {
							t.Errorf("round %d: a run failed without the lock's refusal: %s", round, r.stderr)
						}
					}
				}
				got := testkit.ReadTree(t, dst)
				if len(got) != len(want) {
					t.Fatalf("round %d: DST holds %d files, a single run writes %d", round, len(got), len(want))
				}
				for k, b := range want {
					// DCP's .metadata carries a fresh save id per run.
					if !bytes.Equal(got[k], b) && !strings.HasSuffix(k, ".metadata") && !strings.HasSuffix(k, ".distcp") {
						t.Errorf("round %d: %s differs from a single run's", round, k)
					}
				}
			}
			t.Logf("%d of 8 runs refused by the lock", refused)
		})
	}
}

// TestNoFollowLinks (issue 26 fault 1): a symbolic link (or a file) at DST,
// DST.partial or DST.ucp-old is refused by every command that writes a
// folder, and nothing it points to is read, emptied or written.
func TestNoFollowLinks(t *testing.T) {
	a, src := lockSetup(t)
	for _, c := range writerCases() {
		for _, at := range []string{"", atomic.PartialSuffix, atomic.OldSuffix} {
			for _, kind := range []string{"link", "dangling", "file"} {
				t.Run(c.name+"/DST"+at+"/"+kind, func(t *testing.T) {
					dir := t.TempDir()
					dst := filepath.Join(dir, "out")
					other := filepath.Join(dir, "other")
					writeFile(t, filepath.Join(other, "keep.txt"), []byte("data\n"))
					switch kind {
					case "link":
						if err := os.Symlink(other, dst+at); err != nil {
							t.Fatal(err)
						}
					case "dangling":
						if err := os.Symlink(filepath.Join(dir, "nowhere"), dst+at); err != nil {
							t.Fatal(err)
						}
					case "file":
						writeFile(t, dst+at, []byte("user data\n"))
					}
					before := snapTree(t, dir)
					r := ucp(t, nil, c.args(a, src, dst)...)
					if r.code == 0 || !strings.Contains(r.stderr, "refusing to use") {
						t.Errorf("exit %d, stderr %q; want a refusal", r.code, r.stderr)
					}
					after := snapTree(t, dir)
					if fmt.Sprint(after) != fmt.Sprint(before) {
						t.Errorf("the folder changed:\n%v\nnow\n%v", before, after)
					}
					if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !os.IsNotExist(err) {
						t.Errorf("the dangling link's target was created")
					}
				})
			}
		}
	}
}

// snapTree maps every entry under dir to its content, or its target for a
// symbolic link (never followed).
func snapTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&os.ModeSymlink != 0:
			to, err := os.Readlink(p)
			out[rel] = "link to " + to
			return err
		case d.IsDir():
			out[rel] = "folder"
		case !d.Type().IsRegular():
			out[rel] = d.Type().String()
		default:
			b, err := os.ReadFile(p)
			out[rel] = string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
