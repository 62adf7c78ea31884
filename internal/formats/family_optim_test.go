package formats

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// roleStates reads every state of an atomic checkpoint of a known family
// by role, whatever the naming and fusion of its source: "HF name/state"
// -> the fp32 bytes of the role's tensor in Hugging Face row order, and
// "HF name/step" -> the step's value.
func roleStates(t *testing.T, r *atomic.Reader) map[string]string {
	t.Helper()
	c, err := r.Model()
	if err != nil {
		t.Fatal(err)
	}
	var ps []family.Param
	for _, e := range r.Manifest.Params {
		ps = append(ps, family.Param{Name: e.Name, Shape: e.Shape})
	}
	src, err := family.Resolve(c, ps, r.Manifest.Source.Format)
	if err != nil {
		t.Fatal(err)
	}
	views, err := src.Unfused(family.HF)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, v := range views {
		for _, state := range []string{fragment.FP32, "exp_avg", "exp_avg_sq"} {
			var b []byte
			for _, pc := range v.Pieces {
				e, _ := r.Param(pc.Param)
				st, err := r.OpenState(pc.Param, state)
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, pc.Len*4)
				if _, err := layout.ReadLocalAs(st, fragment.Shard{Shape: e.Shape}, pc.Start, pc.Len, dtype.Float32, buf); err != nil {
					t.Fatal(err)
				}
				st.Close()
				b = append(b, buf...)
			}
			out[v.Name+"/"+state] = string(b)
		}
		sv, ok, err := r.Step(v.Pieces[0].Param)
		if err != nil || !ok {
			t.Fatalf("%s: step %v %v", v.Pieces[0].Param, ok, err)
		}
		out[v.Name+"/step"] = stepString(sv)
	}
	return out
}

func stepString(v any) string {
	if b, ok := v.(*torchfile.Blob); ok {
		if f, err := blobFloat(b); err == nil {
			return fmt.Sprint(f)
		}
	}
	switch x := v.(type) {
	case int64:
		return fmt.Sprint(float64(x))
	case float64:
		return fmt.Sprint(x)
	}
	return fmt.Sprintf("%T %v", v, v)
}

func blobFloat(b *torchfile.Blob) (float64, error) {
	out := make([]byte, 4)
	if err := dtype.ToFloat32(out, b.Data, b.DType); err != nil {
		return 0, err
	}
	return float64(dtype.Float32s(out)[0]), nil
}

func sameStates(t *testing.T, want, got map[string]string) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	bad := 0
	for _, k := range keys {
		g, ok := got[k]
		if !ok {
			t.Errorf("no %s", k)
			bad++
		} else if g != want[k] {
			t.Errorf("%s differs", k)
			bad++
		}
		if bad > 10 {
			t.Fatal("too many differences")
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d states, want %d", len(got), len(want))
	}
}

// TestDeepSpeedToMegatronOptimizer: a Megatron-DeepSpeed checkpoint of the
// llama family (testdata/gen/deepspeed_fixtures.py, GQA in its [Q; K; V]
// layout, ZeRO-1 at TP 2) goes to Megatron-LM at TP 1, 2 and TP 1 x PP 2
// with its optimizer: read back by ucp's Megatron reader, every role's
// fp32 main parameter, exp_avg and exp_avg_sq equal the source's bit for
// bit and the step is the source's.
func TestDeepSpeedToMegatronOptimizer(t *testing.T) {
	tg, err := LookupTarget("megatron")
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := Index(context.Background(), testkit.Fixture("deepspeed", "megatron_llama_tp2_z1_bf16_dp4", "checkpoint"), "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := atomic.OpenReader(testkit.Convert(t, tbl, 2), atomic.ReaderOptions{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	want := roleStates(t, a)
	for _, deg := range []struct {
		tp, pp int
		opt    string
	}{{1, 1, ""}, {2, 1, "fused"}, {1, 2, "adamw"}} {
		t.Run(fmt.Sprintf("tp%d_pp%d_%s", deg.tp, deg.pp, deg.opt), func(t *testing.T) {
			mg := filepath.Join(t.TempDir(), "megatron")
			if _, err := tg.Reshard(context.Background(), a, mg, ReshardOptions{TP: deg.tp, PP: deg.pp, DP: 1, Zero: -1, MegatronOptimizer: deg.opt, NoSync: true}); err != nil {
				t.Fatal(err)
			}
			tb2, err := Index(context.Background(), mg, "", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tb2.Format != "megatron" || tb2.Model == nil || tb2.Model.Family != "llama" {
				t.Fatalf("read back as %s, model %+v", tb2.Format, tb2.Model)
			}
			b, err := atomic.OpenReader(testkit.Convert(t, tb2, 2), atomic.ReaderOptions{Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			sameStates(t, want, roleStates(t, b))
		})
	}
}
