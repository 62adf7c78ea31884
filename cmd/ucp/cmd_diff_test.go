package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/NAME, after replacing the test's
// temporary folders by stable names.
func golden(t *testing.T, name, got string, subst ...string) {
	t.Helper()
	for i := 0; i+1 < len(subst); i += 2 {
		got = strings.ReplaceAll(got, subst[i], subst[i+1])
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it)\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// patchState rewrites element i of an atomic state file in place.
func patchState(t *testing.T, dir, param, state string, i int64, v float32) {
	t.Helper()
	path := filepath.Join(dir, "zero", param, state+".pt")
	f, err := torchfile.Decode(path)
	if err != nil {
		t.Fatal(err)
	}
	v0, err := atomic.StateTensor(f.Root)
	if err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
	if _, err := fh.WriteAt(b[:], v0.FileOffset()+4*i); err != nil {
		t.Fatal(err)
	}
}

func TestDiff(t *testing.T) {
	src := testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	tmp := t.TempDir()
	atomicDir := filepath.Join(tmp, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", "--workers", "2", src, atomicDir); r.code != 0 {
		t.Fatalf("convert: %s", r.stderr)
	}
	changed := testkit.CopyTree(t, atomicDir)
	patchState(t, changed, "head.weight", "exp_avg", 5, 1.5)
	patchState(t, changed, "head.bias", "fp32", 0, float32(math.NaN()))
	// ds_to_universal's layout: no manifest, one parameter missing.
	bare := testkit.CopyTree(t, atomicDir)
	for _, p := range []string{"ucp.json", "zero/head.bias"} {
		if err := os.RemoveAll(filepath.Join(bare, p)); err != nil {
			t.Fatal(err)
		}
	}
	subst := []string{atomicDir, "ATOMIC", changed, "CHANGED", bare, "BARE", src, "SRC", tmp, "TMP"}
	cases := []struct {
		name   string
		args   []string
		code   int
		golden string
	}{
		{"source equals its conversion", []string{src, atomicDir}, 0, "diff/equal.golden"},
		{"every state listed", []string{"--all", atomicDir, src}, 0, "diff/all.golden"},
		{"changed values", []string{src, changed}, 1, "diff/different.golden"},
		// 4 KiB over 3 workers: pieces of 64 elements, the same result.
		{"changed values, compared in small pieces", []string{"--memory", "4KiB", src, changed}, 1, "diff/different.golden"},
		{"tolerance does not excuse a NaN", []string{"--atol", "10", src, changed}, 1, "diff/atol.golden"},
		{"missing parameter", []string{atomicDir, bare}, 1, "diff/missing.golden"},
		{"unreadable side", []string{src, filepath.Join(tmp, "nonexistent")}, 2, "diff/nonexistent.golden"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := ucp(t, nil, append([]string{"diff", "--workers", "3"}, c.args...)...)
			if r.code != c.code {
				t.Fatalf("exit %d, want %d\n%s%s", r.code, c.code, r.stdout, r.stderr)
			}
			golden(t, c.golden, r.stdout+"--- stderr\n"+r.stderr, subst...)
		})
	}
}

// TestDiffShapeAndTolerance: a state of another shape is reported and not
// compared; a small change passes within --rtol.
func TestDiffShapeAndTolerance(t *testing.T) {
	src := testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	tmp := t.TempDir()
	a := filepath.Join(tmp, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", src, a); r.code != 0 {
		t.Fatalf("convert: %s", r.stderr)
	}
	b := testkit.CopyTree(t, a)
	// A bare flat tensor of another length than the parameter's.
	f, err := torchfile.Decode(filepath.Join(b, "zero", "head.bias", "fp32.pt"))
	if err != nil {
		t.Fatal(err)
	}
	tt, err := atomic.StateTensor(f.Root)
	if err != nil {
		t.Fatal(err)
	}
	old := tt.Numel()
	for _, s := range []string{"fp32", "exp_avg", "exp_avg_sq"} {
		if err := torchfile.Save(filepath.Join(b, "zero", "head.bias", s+".pt"),
			torchfile.NewBlob(dtype.Float32, []int64{old + 1}, make([]byte, 4*(old+1)))); err != nil {
			t.Fatal(err)
		}
	}
	r := ucp(t, nil, "diff", a, b)
	if r.code != 1 || !strings.Contains(r.stdout, "shape differs") || !strings.Contains(r.stdout, fmt.Sprintf("[%d] | [%d]", old, old+1)) {
		t.Fatalf("exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	golden(t, "diff/shape.golden", r.stdout+"--- stderr\n"+r.stderr, a, "A", b, "B")
	c := testkit.CopyTree(t, a)
	ft, err := torchfile.Decode(filepath.Join(c, "zero", "head.weight", "fp32.pt"))
	if err != nil {
		t.Fatal(err)
	}
	hw, err := atomic.StateTensor(ft.Root)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(c, "zero", "head.weight", "fp32.pt"))
	if err != nil {
		t.Fatal(err)
	}
	v := math.Float32frombits(binary.LittleEndian.Uint32(raw[hw.FileOffset():]))
	patchState(t, c, "head.weight", "fp32", 0, math.Nextafter32(v, float32(math.Inf(1))))
	if r := ucp(t, nil, "diff", a, c); r.code != 1 || !strings.Contains(r.stdout, "1 with other values") {
		t.Fatalf("one ulp apart, exact: exit %d\n%s", r.code, r.stdout)
	}
	if r := ucp(t, nil, "diff", "--rtol", "1e-6", a, c); r.code != 0 {
		t.Fatalf("one ulp apart, --rtol 1e-6: exit %d\n%s", r.code, r.stdout)
	}
}

// TestDiffDeepSpeedUniversal compares ucp's conversion of real DeepSpeed
// checkpoints with DeepSpeed's own ds_to_universal output: equal, except
// that ds_to_universal writes no step files for ZeRO-3.
func TestDiffDeepSpeedUniversal(t *testing.T) {
	root := testkit.Fixture("deepspeed-real")
	for _, c := range []string{"z1_dp2_fp32", "z1_dp2_fp16", "z2_dp2_bf16", "bf16opt_z1_dp2", "z3_dp2_fp32"} {
		t.Run(c, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "atomic")
			if r := ucp(t, nil, "convert", "--quiet", filepath.Join(root, c, "checkpoint"), dst); r.code != 0 {
				t.Fatalf("convert: %s", r.stderr)
			}
			r := ucp(t, nil, "diff", dst, filepath.Join(root, c, "universal"))
			if c != "z3_dp2_fp32" {
				if r.code != 0 {
					t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
				}
				return
			}
			if r.code != 1 || !strings.Contains(r.stdout, "54 equal, 18 only in A") || strings.Count(r.stdout, "step ") != 18 ||
				!strings.Contains(r.stdout, "flat 1-D tensors") {
				t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
		})
	}
}

// TestDiffDCP: DCP sources (steps are items inside .distcp files, zstd
// items are decoded to a scratch folder) equal their conversion and each
// other, and the hf layouts equal each other; no decoded item is left.
func TestDiffDCP(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	plain := testkit.Fixture("dcp", "fsdp2_train_w2", "checkpoint")
	zstd := testkit.Fixture("dcp", "zstd_w2", "checkpoint")
	atomicDir := filepath.Join(tmp, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", "--workers", "2", zstd, atomicDir); r.code != 0 {
		t.Fatalf("convert: %s", r.stderr)
	}
	for _, args := range [][]string{
		{plain, atomicDir},
		{zstd, plain},
		{testkit.Fixture("dcp_hf", "sharded_w2", "checkpoint"), testkit.Fixture("dcp_hf", "consolidated", "checkpoint")},
	} {
		r := ucp(t, nil, append([]string{"diff", "--workers", "2"}, args...)...)
		if r.code != 0 || !strings.Contains(r.stdout, "A and B equal") {
			t.Errorf("diff %v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "ucp-dcp-decoded-*")); len(left) != 0 {
		t.Errorf("decoded items left behind: %v", left)
	}
}

// TestDiffTorchDistVocab: a torch_dist checkpoint saved without args keeps
// the padded vocabulary unless --vocab-size names the true one; with it, the
// source equals its conversion (made with the same --vocab-size).
func TestDiffTorchDistVocab(t *testing.T) {
	src := testkit.Fixture("megatron_dist", "core0_19_tp2_pp2_tied_bf16_dprs", "checkpoint")
	tmp := t.TempDir()
	atomicDir := filepath.Join(tmp, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", "--workers", "2", "--vocab-size", "50", src, atomicDir); r.code != 0 {
		t.Fatalf("convert: %s", r.stderr)
	}
	subst := []string{atomicDir, "ATOMIC", src, "SRC"}
	cases := []struct {
		name   string
		args   []string
		code   int
		golden string
	}{
		{"padded vocabulary differs", []string{src, atomicDir}, 1, "diff/torch_dist_padded.golden"},
		{"true vocabulary equal", []string{"--vocab-size", "50", src, atomicDir}, 0, "diff/torch_dist_vocab.golden"},
		{"vocabulary cut too far", []string{"--vocab-size", "40", src, atomicDir}, 1, "diff/torch_dist_vocab40.golden"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := ucp(t, nil, append([]string{"diff", "--workers", "2"}, c.args...)...)
			if r.code != c.code {
				t.Fatalf("exit %d, want %d\n%s%s", r.code, c.code, r.stdout, r.stderr)
			}
			golden(t, c.golden, r.stdout+"--- stderr\n"+r.stderr, subst...)
		})
	}
}
