package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/formats/megatron"
	"github.com/ucp-project/ucp/internal/testkit"
)

// TestPython builds libucp.so, converts a Megatron TP2 x PP2 GQA + SwiGLU
// fixture, the real DeepSpeed ZeRO-1 checkpoint and a ZeRO-3 fixture with
// int64 buffers and fp16 frozen parameters, and runs the Python
// package's tests (python/tests/test_ucp.py) with Debian's torch 1.13, then
// a quick pass with torch 2.6 in the chroot.
func TestPython(t *testing.T) {
	py := testkit.Python(t)
	root := testkit.RepoRoot()
	work := t.TempDir()
	lib := filepath.Join(work, "libucp.so")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", lib, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building libucp.so: %v\n%s", err, out)
	}
	ctx := context.Background()
	megSrc := testkit.Fixture("megatron", "same_tp2_pp2")
	mt, err := megatron.Index(ctx, filepath.Join(megSrc, "checkpoint"), megatron.Options{})
	if err != nil {
		t.Fatal(err)
	}
	meg := testkit.Convert(t, mt, 2)
	dsSrc := testkit.Fixture("deepspeed-real", "z1_dp2_fp32")
	dt, err := deepspeed.Index(ctx, filepath.Join(dsSrc, "checkpoint"), deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ds := testkit.Convert(t, dt, 2)
	frSrc := testkit.Fixture("zero3", "frozen_buffers_dp3_fp16")
	ft, err := deepspeed.IndexZero3(ctx, filepath.Join(frSrc, "checkpoint"), deepspeed.Zero3Options{})
	if err != nil {
		t.Fatal(err)
	}
	fr := testkit.Convert(t, ft, 2)
	args := []string{meg, filepath.Join(megSrc, "truth.pt"), ds, filepath.Join(dsSrc, "truth.pt"),
		"--frozen", fr, filepath.Join(frSrc, "truth.pt")}

	cmd := exec.Command(py, append([]string{filepath.Join(root, "python", "tests", "test_ucp.py")}, args...)...)
	cmd.Env = append(os.Environ(), "UCP_LIBRARY="+lib, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("torch 1.13:\n%s", out)
	if err != nil {
		t.Fatalf("python tests failed: %v", err)
	}

	// torch 2.6: the chroot mounts one folder at /work, so everything goes there.
	t.Run("torch2", func(t *testing.T) {
		dir := filepath.Join(work, "t2")
		for _, c := range []struct{ src, dst string }{
			{filepath.Join(root, "python", "ucp"), "pkg/ucp"}, {meg, "meg"}, {ds, "ds"},
			{filepath.Join(megSrc, "truth.pt"), "meg_truth.pt"}, {filepath.Join(dsSrc, "truth.pt"), "ds_truth.pt"},
			{filepath.Join(root, "python", "tests", "test_ucp.py"), "pkg/tests/test_ucp.py"}, {lib, "pkg/ucp/libucp.so"},
			{fr, "frozen"}, {filepath.Join(frSrc, "truth.pt"), "frozen_truth.pt"},
		} {
			copyPath(t, c.src, filepath.Join(dir, c.dst))
		}
		out := testkit.Torch2(t, dir, filepath.Join(root, "python", "tests", "run_torch2.py"))
		if !strings.Contains(out, "OK") {
			t.Fatalf("torch 2.x run did not pass:\n%s", out)
		}
		t.Logf("torch 2.x:\n%s", out)
	})
}

func copyPath(t *testing.T, src, dst string) {
	t.Helper()
	st, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if st.IsDir() {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(src)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(dst), 0o755)
	}
	if err == nil {
		err = os.WriteFile(dst, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}
