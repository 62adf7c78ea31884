package dcp

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

// The safetensors layouts of HuggingFaceStorageWriter convert bit for bit
// to the weights of the live run that wrote them.
func TestHFFixturesConvertToTruth(t *testing.T) {
	for _, tc := range []struct {
		c     string
		world int
	}{{"sharded_w2", 2}, {"consolidated", 1}} {
		t.Run(tc.c, func(t *testing.T) {
			dir := testkit.Fixture("dcp_hf", tc.c, "checkpoint")
			if !DetectHF(dir) || Detect(dir) {
				t.Fatalf("DetectHF %v, Detect %v", DetectHF(dir), Detect(dir))
			}
			tbl, err := IndexHF(context.Background(), dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer tbl.Close()
			tr, err := testkit.Load(testkit.Fixture("dcp_hf", tc.c, "truth.pt"))
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			names, _ := pyobj.Strings(mustGet(t, tr.Root, "param_names"))
			if len(tbl.Params) != len(names) || tbl.Format != "hf" || tbl.Degrees.DP != tc.world {
				t.Errorf("%d parameters (want %d), format %s, DP %d (want %d)", len(tbl.Params), len(names), tbl.Format, tbl.Degrees.DP, tc.world)
			}
			want := map[string]bool{}
			for _, n := range names {
				want[n] = true
			}
			for _, p := range tbl.Params {
				if !want[p.Name] || !p.Frozen {
					t.Errorf("parameter %s (frozen %v) is not a weight of the model", p.Name, p.Frozen)
				}
			}
			testkit.Check(t, testkit.Convert(t, tbl, 2), tr.Path)
		})
	}
}

// editHeader rewrites the JSON header of a safetensors file.
func editHeader(t *testing.T, path string, change func(h map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b[:8])
	var h map[string]any
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	change(h)
	nh, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(nh)))
	out = append(append(out, nh...), b[8+n:]...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// setOffsets changes the DCP_SHARDING_INFO saved_offsets of key.
func setOffsets(t *testing.T, path, key string, off []int64) {
	editHeader(t, path, func(h map[string]any) {
		meta := h["__metadata__"].(map[string]any)
		var info map[string]map[string][]int64
		if err := json.Unmarshal([]byte(meta["DCP_SHARDING_INFO"].(string)), &info); err != nil {
			t.Fatal(err)
		}
		info[key]["saved_offsets"] = off
		b, _ := json.Marshal(info)
		meta["DCP_SHARDING_INFO"] = string(b)
	})
}

// Broken safetensors layouts: errors naming the file or the key.
func TestHFErrors(t *testing.T) {
	const rank2 = "shard-00002-model-00001-of-00002.safetensors" // embed.weight rows [6, 11)
	tests := []struct {
		name, c string
		break_  func(t *testing.T, d string)
		want    []string
	}{
		{"missing consolidated file", "consolidated", func(t *testing.T, d string) {
			os.Remove(filepath.Join(d, "model-00002-of-00002.safetensors"))
		}, []string{"model-00002-of-00002.safetensors", "missing", HFIndexFile}},
		{"missing rank-1 shard", "sharded_w2", func(t *testing.T, d string) {
			os.Remove(filepath.Join(d, "shard-00001-model-00001-of-00002.safetensors"))
		}, []string{`"embed.weight"`, "cover", "shard file may be missing"}},
		{"overlapping chunks", "sharded_w2", func(t *testing.T, d string) {
			setOffsets(t, filepath.Join(d, rank2), "embed.weight", []int64{5, 0})
		}, []string{`"embed.weight"`, "overlap"}},
		{"chunks leave a hole", "sharded_w2", func(t *testing.T, d string) {
			setOffsets(t, filepath.Join(d, rank2), "embed.weight", []int64{7, 0})
		}, []string{`"embed.weight"`, "cover 66 of the 72 elements"}},
		{"offsets of another rank", "sharded_w2", func(t *testing.T, d string) {
			setOffsets(t, filepath.Join(d, rank2), "embed.weight", []int64{6})
		}, []string{rank2, `"embed.weight"`, "saved_offsets"}},
		{"no sharding info for a tensor", "sharded_w2", func(t *testing.T, d string) {
			editHeader(t, filepath.Join(d, rank2), func(h map[string]any) {
				h["__metadata__"].(map[string]any)["DCP_SHARDING_INFO"] = "{}"
			})
		}, []string{rank2, "DCP_SHARDING_INFO has no saved_offsets"}},
		{"tensor not in the weight map", "consolidated", func(t *testing.T, d string) {
			p := filepath.Join(d, HFIndexFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(b), `"head.bias"`, `"head.bias2"`, 1)), 0o644)
		}, []string{"head.bias", "not mapped to this file"}},
		// config.json values of the wrong type were once read as absent.
		{"config.json torch_dtype an int", "consolidated", func(t *testing.T, d string) {
			os.WriteFile(filepath.Join(d, "config.json"), []byte(`{"torch_dtype": 3}`), 0o644)
		}, []string{"config.json", "torch_dtype is 3, not a string"}},
		{"config.json model_type a list", "consolidated", func(t *testing.T, d string) {
			os.WriteFile(filepath.Join(d, "config.json"), []byte(`{"model_type": ["llama"]}`), 0o644)
		}, []string{"config.json", "model_type is [llama], not a string"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := testkit.CopyTree(t, testkit.Fixture("dcp_hf", tc.c, "checkpoint"))
			tc.break_(t, d)
			_, err := IndexHF(context.Background(), d, Options{})
			wantError(t, err, tc.want...)
		})
	}
}

// wantError fails unless err mentions every one of want.
func wantError(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	t.Log(err)
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}
