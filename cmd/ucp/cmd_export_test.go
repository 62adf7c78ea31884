package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/testkit"
)

// ucp convert reads a DCP folder, ucp export writes it back as DCP, and a
// second convert gives the same atomic state files.
func TestExportDCPRoundTrip(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	src := testkit.Fixture("dcp", "fsdp_tp_w4", "checkpoint")
	a := filepath.Join(tmp, "a", "atomic")
	copts := convertOptions{Workers: 2, CheckReplicas: true, Quiet: true}
	if err := runConvert(ctx, io.Discard, io.Discard, src, a, copts); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(tmp, "dcp")
	var out bytes.Buffer
	eopts := exportOptions{To: "dcp", Shards: 3, DType: "float32", ModelKey: "model", Workers: 2, Verify: true}
	if err := runExport(ctx, &out, a, d, eopts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "in 3 rank files") {
		t.Errorf("summary: %s", out.String())
	}
	for _, f := range []string{".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"} {
		if _, err := os.Stat(filepath.Join(d, f)); err != nil {
			t.Error(err)
		}
	}
	b := filepath.Join(tmp, "b", "atomic")
	if err := runConvert(ctx, io.Discard, io.Discard, d, b, copts); err != nil {
		t.Fatal(err)
	}
	want, got := zeroFiles(t, a), zeroFiles(t, b)
	if len(got) != len(want) {
		t.Errorf("%d files back, want %d", len(got), len(want))
	}
	for name, w := range want {
		if !bytes.Equal(got[name], w) {
			t.Errorf("%s differs", name)
		}
	}
	if err := runExport(ctx, io.Discard, a, d, eopts); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("export over an existing folder: %v", err)
	}
}

func TestExportFlags(t *testing.T) {
	ctx := context.Background()
	a := t.TempDir()
	tests := []struct {
		opts exportOptions
		want string
	}{
		{exportOptions{Shards: 1, DType: "float32", Workers: 1}, "--to is required"},
		{exportOptions{To: "megatron", Shards: 1, DType: "float32", Workers: 1}, `unknown target format "megatron"`},
		{exportOptions{To: "dcp", Shards: 0, DType: "float32", Workers: 1}, "--shards must be at least 1"},
		{exportOptions{To: "dcp", Shards: 1, DType: "float99", Workers: 1}, "--dtype"},
		{exportOptions{To: "dcp", Shards: 1, DType: "float32", Workers: 1}, "ucp.json"},
	}
	for _, tc := range tests {
		err := runExport(ctx, io.Discard, a, filepath.Join(a, "out"), tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.opts, err, tc.want)
		}
	}
}

// ucp inspect on a DCP folder shows each parameter's pattern as the
// chunks place it.
func TestInspectDCP(t *testing.T) {
	var out bytes.Buffer
	src := testkit.Fixture("dcp", "fsdp_tp_w4", "checkpoint")
	if err := runInspect(context.Background(), &out, src, inspectOptions{JSON: true}); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Format string `json:"format"`
		Params []struct {
			Name    string `json:"name"`
			Pattern string `json:"pattern"`
		} `json:"params"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"tok_embeddings.weight":           "Shard-Hy",
		"layers.0.attention.wq.weight":    "Shard-V",
		"layers.0.attention.wo.weight":    "Shard-Hy",
		"layers.0.attention_norm.weight":  "Shard-V",
		"layers.0.feed_forward.w2.weight": "Shard-H",
		"output.weight":                   "Shard-Hy",
	}
	if rep.Format != "dcp" || len(rep.Params) != len(want) {
		t.Fatalf("format %s, %d params", rep.Format, len(rep.Params))
	}
	for _, p := range rep.Params {
		if want[p.Name] != p.Pattern {
			t.Errorf("%s: %s, want %s", p.Name, p.Pattern, want[p.Name])
		}
	}
}

// zeroFiles returns the bytes of every file under DIR/zero.
func zeroFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	root := filepath.Join(dir, "zero")
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A DeepSpeed source's param groups (flat-group ids) are written to DCP
// with the parameters named by order: group 0 holds the decayed weights,
// group 1 the biases and norms of z1_twogroups_dp3.
func TestExportDCPDeepSpeedParamGroups(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	a := filepath.Join(tmp, "atomic")
	if err := runConvert(ctx, io.Discard, io.Discard, testkit.Fixture("deepspeed", "z1_twogroups_dp3", "checkpoint"), a,
		convertOptions{Workers: 2, CheckReplicas: true, Quiet: true}); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(tmp, "dcp")
	var out bytes.Buffer
	if err := runExport(ctx, &out, a, d, exportOptions{To: "dcp", Shards: 1, DType: "float32", ModelKey: "model", Workers: 1}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "param groups not written") {
		t.Fatalf("summary: %s", out.String())
	}
	c, err := dcp.Open(ctx, d, dcp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(d, "__0_0.distcp"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"optim.param_groups.0.params": {"'embed.weight'", "blocks.1.fc2.weight", "head.weight"},
		"optim.param_groups.1.params": {"blocks.0.ln.bias", "ln_f.weight", "head.bias"},
	}
	for _, s := range c.Meta.Storage {
		names, ok := want[s.Index.FQN]
		if !ok {
			continue
		}
		delete(want, s.Index.FQN)
		item := string(data[s.Info.Offset : s.Info.Offset+s.Info.Length])
		for _, n := range names {
			if !strings.Contains(item, strings.Trim(n, "'")) {
				t.Errorf("%s does not name %s", s.Index.FQN, n)
			}
		}
		if s.Index.FQN == "optim.param_groups.0.params" && strings.Contains(item, "bias") {
			t.Errorf("group 0 names a bias")
		}
	}
	if len(want) > 0 {
		t.Errorf("missing keys %v", want)
	}
}
