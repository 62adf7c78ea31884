package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/safetensors"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// keptTensor is a frozen parameter or buffer of a fixture's truth: the
// dtype and bytes the atomic checkpoint must keep.
type keptTensor struct {
	dt    dtype.DType
	shape []int64
	raw   []byte
}

func keptTruth(t *testing.T, truthPath string) map[string]keptTensor {
	t.Helper()
	tr, err := testkit.Load(truthPath)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	out := map[string]keptTensor{}
	for _, key := range testkit.Kept {
		for name, tt := range tr.Tensors(key) {
			raw, err := tr.File.ReadTensor(tt)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = keptTensor{tt.DType, tt.Shape, raw}
		}
	}
	return out
}

// TestKeptDTypesEndToEnd converts fixtures with int64 buffers
// (position ids, num_batches_tracked) and bf16/fp16 frozen parameters and
// buffers, and follows those tensors through every reader of the atomic
// checkpoint: the state files and the manifest keep their dtype bit for
// bit, diff finds the conversion equal to its source, export to DCP and
// back gives the same files, export to safetensors writes them as stored,
// and the loader reads them as stored or cast to float32.
func TestKeptDTypesEndToEnd(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		fixture string
		want    map[string]dtype.DType // at least these, from the truth
	}{
		{"deepspeed/z2_frozen_buffers_dp2", map[string]dtype.DType{"position_ids": dtype.Int64, "pos.weight": dtype.BFloat16}},
		{"zero3/frozen_buffers_dp3_fp16", map[string]dtype.DType{"norm.num_batches_tracked": dtype.Int64, "pos_ids": dtype.Int64,
			"embed.weight": dtype.Float16}},
	} {
		t.Run(filepath.Base(c.fixture), func(t *testing.T) {
			tmp := t.TempDir()
			src := testkit.Fixture(c.fixture, "checkpoint")
			truth := testkit.Fixture(c.fixture, "truth.pt")
			kept := keptTruth(t, truth)
			for name, dt := range c.want {
				if k, ok := kept[name]; !ok || k.dt != dt {
					t.Fatalf("fixture truth: %s is %v, want %v", name, k.dt, dt)
				}
			}
			a := filepath.Join(tmp, "a", "atomic")
			copts := convertOptions{Workers: 2, CheckReplicas: true, Quiet: true}
			if err := runConvert(ctx, io.Discard, io.Discard, src, a, copts); err != nil {
				t.Fatal(err)
			}
			// State files and manifest (testkit.Compare checks "frozen" and
			// "buffers" in their own dtype, trained states as float32).
			testkit.Check(t, a, truth)
			m, err := atomic.ReadManifest(a)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range m.Params {
				if k, ok := kept[p.Name]; ok && (p.DType != k.dt.String() || !p.Frozen) {
					t.Errorf("manifest: %s dtype %q frozen %v, want %v frozen", p.Name, p.DType, p.Frozen, k.dt)
				} else if !ok && !p.Frozen && p.DType != "float32" {
					t.Errorf("manifest: trained %s has dtype %q", p.Name, p.DType)
				}
			}

			// diff: the conversion equals its source.
			if r := ucp(t, nil, "diff", src, a); r.code != 0 {
				t.Errorf("ucp diff SRC OUT: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}

			// DCP and back: identical zero/ files (kept tensors included).
			d := filepath.Join(tmp, "dcp")
			eopts := exportOptions{To: "dcp", Shards: 2, DType: "float32", ModelKey: "model", Workers: 2, Verify: true}
			if err := runExport(ctx, io.Discard, a, d, eopts); err != nil {
				t.Fatal(err)
			}
			b := filepath.Join(tmp, "b", "atomic")
			if err := runConvert(ctx, io.Discard, io.Discard, d, b, copts); err != nil {
				t.Fatal(err)
			}
			for name, k := range kept {
				raw, dt, _, err := testkit.ReadAtomicRaw(filepath.Join(b, atomic.StatePath(name, fragment.FP32)))
				if err != nil || dt != k.dt || !bytes.Equal(raw, k.raw) {
					t.Errorf("DCP round trip: %s is %v (%v), want %v as stored", name, dt, err, k.dt)
				}
			}

			// safetensors: kept tensors written as stored, even with a
			// training dtype of bfloat16 for the rest.
			h := filepath.Join(tmp, "hf")
			hopts := exportOptions{To: "hf", DType: "bfloat16", Workers: 2}
			if err := runExport(ctx, io.Discard, a, h, hopts); err != nil {
				t.Fatal(err)
			}
			files, _ := filepath.Glob(filepath.Join(h, "*.safetensors"))
			found := map[string]bool{}
			for _, fn := range files {
				f, err := safetensors.Open(fn)
				if err != nil {
					t.Fatal(err)
				}
				for name, k := range kept {
					st, ok := f.Tensor(name)
					if !ok {
						continue
					}
					found[name] = true
					raw, err := f.ReadTensor(st)
					if err != nil || st.DType != k.dt || !bytes.Equal(raw, k.raw) {
						t.Errorf("safetensors: %s is %v (%v), want %v as stored", name, st.DType, err, k.dt)
					}
				}
				f.Close()
			}
			if len(found) != len(kept) {
				t.Errorf("safetensors hold %d of the %d frozen parameters and buffers", len(found), len(kept))
			}

			// Loader: as stored, and cast to float32 (values as torch's .float()).
			r, err := atomic.OpenReader(a, atomic.ReaderOptions{Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			for name, k := range kept {
				st, err := r.OpenState(name, fragment.FP32)
				if err != nil {
					t.Fatal(err)
				}
				n := torchfile.Numel(k.shape)
				sh := fragment.Shard{Shape: k.shape}
				raw := make([]byte, n*int64(k.dt.Size()))
				if _, err := layout.ReadLocalAs(st, sh, 0, n, k.dt, raw); err != nil || st.DType != k.dt || !bytes.Equal(raw, k.raw) {
					t.Errorf("loader: %s as stored: %v %v", name, st.DType, err)
				}
				f32, want := make([]byte, 4*n), make([]byte, 4*n)
				if err := dtype.ToFloat32(want, k.raw, k.dt); err != nil {
					t.Fatal(err)
				}
				if _, err := layout.ReadLocalAs(st, sh, 0, n, dtype.Float32, f32); err != nil || !bytes.Equal(f32, want) {
					t.Errorf("loader: %s as float32: %v", name, err)
				}
				st.Close()
			}
		})
	}
}
