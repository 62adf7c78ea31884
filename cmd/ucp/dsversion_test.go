package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestConvertDeepSpeedVersion: --deepspeed-version before 0.19.3 writes a
// ZeRO-3 source's state files as bare tensors (that release's ZeRO-3
// universal loader calls .view(-1) on them), still equal to the source;
// later releases and ZeRO-1/2 sources keep the dict.
func TestConvertDeepSpeedVersion(t *testing.T) {
	z3 := testkit.Fixture("zero3", "tinylm_dp3", "checkpoint")
	z1 := testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	for _, c := range []struct {
		src, version string
		bare         bool
		note         string
	}{
		{z3, "0.14", true, "bare tensors for DeepSpeed 0.14's ZeRO-3 universal loader"},
		{z3, "0.19.2", true, "bare tensors"},
		{z3, "0.19.3", false, ""},
		{z3, "", false, ""},
		{z1, "0.14.5", false, "its ZeRO-3 universal loader cannot read them"},
	} {
		dst := filepath.Join(t.TempDir(), "atomic")
		args := []string{"convert", "--quiet", c.src, dst}
		if c.version != "" {
			args = append(args, "--deepspeed-version", c.version)
		}
		if r := ucp(t, nil, args...); r.code != 0 {
			t.Fatalf("%v: %s", args, r.stderr)
		}
		m, err := atomic.ReadManifest(dst)
		if err != nil {
			t.Fatal(err)
		}
		if c.note != "" && !strings.Contains(strings.Join(m.Notes, "\n"), c.note) {
			t.Errorf("%s %s: notes %q, want one saying %q", filepath.Base(filepath.Dir(c.src)), c.version, m.Notes, c.note)
		}
		for _, p := range m.Params {
			for _, f := range p.Files {
				if f.State == "step" {
					continue
				}
				tf, err := torchfile.Decode(filepath.Join(dst, f.Path))
				if err != nil {
					t.Fatal(err)
				}
				_, isTensor := tf.Root.(*torchfile.Tensor)
				_, isDict := tf.Root.(*pyobj.Dict)
				if isTensor != c.bare || isDict == c.bare {
					t.Fatalf("%s %s: %s holds %s", filepath.Base(filepath.Dir(c.src)), c.version, f.Path, pyobj.TypeName(tf.Root))
				}
			}
		}
		if r := ucp(t, nil, "diff", c.src, dst); r.code != 0 {
			t.Errorf("%s %s: diff with the source: %s%s", filepath.Base(filepath.Dir(c.src)), c.version, r.stdout, r.stderr)
		}
		if r := ucp(t, nil, "verify", dst); r.code != 0 {
			t.Errorf("verify: %s", r.stderr)
		}
	}
	r := ucp(t, nil, "convert", z3, filepath.Join(t.TempDir(), "x"), "--deepspeed-version", "fourteen")
	if r.code == 0 || !strings.Contains(r.stderr, `--deepspeed-version "fourteen"`) {
		t.Errorf("bad version: exit %d, %s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(z3), "x")); err == nil {
		t.Error("wrote output for a bad version")
	}
}
