package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/testkit"
)

// TestPointersInSummary (issue 22, friction 5): the summary says which
// pointer file beside DST was written or changed; --no-latest leaves it
// alone (convert and reshard --to deepspeed).
func TestPointersInSummary(t *testing.T) {
	src := testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	dir := t.TempDir()
	ptr := filepath.Join(dir, "latest_universal")
	steps := []struct {
		args []string
		want string // in the summary; "" for no pointer line
		now  string // the pointer's content after
	}{
		{[]string{"convert", src, filepath.Join(dir, "a")}, "wrote " + ptr + " naming a", "a"},
		{[]string{"convert", "--no-latest", src, filepath.Join(dir, "b")}, "", "a"},
		{[]string{"convert", src, filepath.Join(dir, "c")}, "changed " + ptr + " from a to c", "c"},
		{[]string{"convert", "--force", src, filepath.Join(dir, "c")}, ptr + " already names c", "c"},
		{[]string{"reshard", filepath.Join(dir, "a"), filepath.Join(dir, "ds", "step3"), "--to", "deepspeed", "--dp", "1", "--zero", "1"},
			"wrote " + filepath.Join(dir, "ds", "latest") + " naming step3", "c"},
		{[]string{"reshard", "--no-latest", filepath.Join(dir, "a"), filepath.Join(dir, "ds", "step4"), "--to", "deepspeed", "--dp", "1", "--zero", "1"},
			"", "c"},
	}
	for i, s := range steps {
		r := ucp(t, nil, s.args...)
		if r.code != 0 {
			t.Fatalf("step %d %v: exit %d: %s", i, s.args, r.code, r.stderr)
		}
		if s.want != "" && !strings.Contains(r.stdout, "  "+s.want+" (--no-latest leaves it alone)\n") {
			t.Errorf("step %d %v: the summary does not say %q:\n%s", i, s.args, s.want, r.stdout)
		}
		if s.want == "" && strings.Contains(r.stdout, "latest") {
			t.Errorf("step %d %v: --no-latest, yet the summary says:\n%s", i, s.args, r.stdout)
		}
		if b, err := os.ReadFile(ptr); err != nil || string(b) != s.now {
			t.Errorf("step %d: latest_universal holds %q (%v), want %q", i, b, err, s.now)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "ds", "latest")); err != nil || string(b) != "step3" {
		t.Errorf("ds/latest holds %q (%v), want step3", b, err)
	}
}

// TestFiguresAgree (issue 22, friction 9): the file count and size that
// convert's summary, inspect and verify give for DST are what a walk of
// the folder finds (what ls and du --apparent-size count for the files).
func TestFiguresAgree(t *testing.T) {
	src := testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint")
	dst := filepath.Join(t.TempDir(), "atomic")
	conv := ucp(t, nil, "convert", src, dst)
	if conv.code != 0 {
		t.Fatal(conv.stderr)
	}
	var n int
	var size int64
	if err := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		n, size = n+1, size+info.Size()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d files, %s: ", n, humanBytes(size))
	for _, args := range [][]string{nil, {"inspect", dst}, {"verify", dst}} {
		out := conv.stdout
		if args != nil {
			r := ucp(t, nil, args...)
			if r.code != 0 {
				t.Fatal(r.stderr)
			}
			out = r.stdout
		}
		if !strings.Contains(out, want) {
			t.Errorf("%v does not say %q:\n%s", args, want, out)
		}
	}
}

// TestInspectDTypeLabels (issue 22, friction 8): inspect of the atomic
// output of a bf16 run says it trained in bfloat16 and names its column
// for what it shows (the state files' float32), and inspect of a ZeRO-3
// bf16 checkpoint (bf16_ files, ucp's reshard output or DeepSpeed's) says
// bfloat16.
func TestInspectDTypeLabels(t *testing.T) {
	dir := t.TempDir()
	dst := filepath.Join(dir, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint"), dst); r.code != 0 {
		t.Fatal(r.stderr)
	}
	z3 := filepath.Join(dir, "z3")
	if r := ucp(t, nil, "reshard", "--quiet", dst, filepath.Join(z3, "step3"), "--to", "deepspeed", "--dp", "2", "--zero", "3", "--dtype", "bfloat16"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	for _, c := range []struct {
		path       string
		want, nope []string
	}{
		{dst, []string{"ZeRO-1  trained in bfloat16\n", "DTYPE: the dtype of the state files here", "  DTYPE    STATES\n"}, []string{"SOURCE DTYPE"}},
		{z3, []string{"ZeRO-3  trained in bfloat16\n"}, nil},
		{testkit.Fixture("zero3", "dp3_bf16", "checkpoint"), []string{"ZeRO-3  trained in bfloat16\n"}, nil},
		{testkit.Fixture("zero3", "dp4_fp32", "checkpoint"), []string{"ZeRO-3\n"}, nil},
	} {
		r := ucp(t, nil, "inspect", c.path)
		if r.code != 0 {
			t.Fatal(r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("inspect %s lacks %q:\n%s", c.path, w, r.stdout)
			}
		}
		for _, w := range c.nope {
			if strings.Contains(r.stdout, w) {
				t.Errorf("inspect %s says %q:\n%s", c.path, w, r.stdout)
			}
		}
	}
}
