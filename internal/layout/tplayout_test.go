package layout_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestSliceNeedsTPLayout (issue 26 fault 6): Model.Slice cuts a parameter
// for a tensor-parallel target only when the atomic checkpoint records how
// the source cut it. Sources saved without tensor parallelism (plain
// DeepSpeed, ZeRO-3, DCP/FSDP) record nothing: every float parameter is
// refused at tp > 1 by name, buffers (integer, or no cat_dim) stay whole, and tp 1 loads
// everything. A Megatron-DeepSpeed TP 2 source is cut by its recorded
// layout: norms whole, row-parallel weights on dim 1, and a tp that does
// not divide its heads is refused.
func TestSliceNeedsTPLayout(t *testing.T) {
	ctx := context.Background()
	index := map[string]func() (*fragment.Table, error){
		"deepspeed z2_frozen_buffers_dp2": func() (*fragment.Table, error) {
			return deepspeed.Index(ctx, testkit.Fixture("deepspeed", "z2_frozen_buffers_dp2", "checkpoint"), deepspeed.Options{})
		},
		"zero3 frozen_buffers_dp3_fp16": func() (*fragment.Table, error) {
			return deepspeed.IndexZero3(ctx, testkit.Fixture("zero3", "frozen_buffers_dp3_fp16", "checkpoint"), deepspeed.Zero3Options{})
		},
		"dcp fsdp2_w2": func() (*fragment.Table, error) {
			return dcp.Index(ctx, testkit.Fixture("dcp", "fsdp2_w2", "checkpoint"), dcp.Options{})
		},
	}
	for name, idx := range index {
		t.Run(name, func(t *testing.T) {
			r := convertFixture(t, idx)
			model, err := layout.ReadModel(r)
			if err != nil {
				t.Fatal(err)
			}
			refused, whole := 0, 0
			for i := range r.Manifest.Params {
				p := &r.Manifest.Params[i]
				meta := readMeta(t, r, p)
				for _, T := range []int{2, 3} {
					sh, err := model.Slice(p, meta, T, T-1, 0)
					dt, _ := p.StateDType()
					if !dt.IsFloat() || meta.CatDim < 0 {
						if err != nil || !torchfile.SameShape(sh.Shape, p.Shape) || sh.Maps != nil {
							t.Errorf("buffer %s (%v) at tp %d: shard %v, %v; want it whole", p.Name, dt, T, sh.Shape, err)
						}
						whole++
						continue
					}
					if err == nil || !strings.Contains(err.Error(), p.Name) || !strings.Contains(err.Error(), "does not record how") {
						t.Errorf("%s %v at tp %d: shard %v, %v; want a refusal naming it", p.Name, p.Shape, T, sh.Shape, err)
					}
					refused++
				}
				if sh, err := model.Slice(p, meta, 1, 0, 0); err != nil || !torchfile.SameShape(sh.Shape, p.Shape) {
					t.Errorf("%s at tp 1: %v %v", p.Name, sh.Shape, err)
				}
			}
			if refused == 0 {
				t.Fatal("no parameter checked")
			}
			t.Logf("%d refusals, %d buffers kept whole", refused, whole)
		})
	}
	t.Run("megatron-deepspeed tp2", func(t *testing.T) {
		r := convertFixture(t, func() (*fragment.Table, error) {
			return deepspeed.Index(ctx, testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint"), deepspeed.Options{})
		})
		model, err := layout.ReadModel(r)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]int64{
			"language_model.encoder.layers.0.input_layernorm.weight":      {9},
			"language_model.encoder.layers.0.self_attention.dense.weight": {9, 4},
			"language_model.encoder.layers.0.mlp.dense_4h_to_h.weight":    {9, 6},
			"language_model.encoder.layers.0.mlp.dense_4h_to_h.bias":      {9},
		}
		for name, shape := range want {
			p, ok := r.Param(name)
			if !ok {
				t.Fatalf("no %s", name)
			}
			sh, err := model.Slice(p, readMeta(t, r, p), 2, 1, 0)
			if err != nil || !torchfile.SameShape(sh.Shape, shape) {
				t.Errorf("%s at tp 2: %v %v, want %v", name, sh.Shape, err, shape)
			}
		}
		p, _ := r.Param("language_model.encoder.layers.0.input_layernorm.weight")
		if _, err := model.Slice(p, readMeta(t, r, p), 3, 0, 0); err == nil || !strings.Contains(err.Error(), "does not divide the 4 attention heads") {
			t.Errorf("tp 3 with 4 heads: %v", err)
		}
	})
}

func convertFixture(t *testing.T, idx func() (*fragment.Table, error)) *atomic.Reader {
	t.Helper()
	tbl, err := idx()
	if err != nil {
		t.Fatal(err)
	}
	r := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{})
	return r
}

func readMeta(t *testing.T, r *atomic.Reader, p *atomic.ParamEntry) layout.Meta {
	t.Helper()
	m, err := layout.ReadMeta(r.Dir + "/" + atomic.StatePath(p.Name, fragment.FP32))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSliceFamilyRules: a Hugging Face source records no TP layout, but
// its manifest records the model family; at tp 2 the loader's Slice cuts
// each parameter by its role's rule (internal/family): q/k/v and
// gate/up on dim 0, o/down on dim 1, the embedding and lm_head as a
// padded vocabulary, norms (and qwen3's q/k norms) whole; a tp that does
// not divide the query groups is refused.
func TestSliceFamilyRules(t *testing.T) {
	for _, name := range []string{"qwen3_fp32", "llama31_untied_fp32"} {
		t.Run(name, func(t *testing.T) {
			r := convertFixture(t, func() (*fragment.Table, error) {
				return dcp.IndexHF(context.Background(), testkit.Fixture("hf_family", name), dcp.Options{})
			})
			model, err := layout.ReadModel(r)
			if err != nil {
				t.Fatal(err)
			}
			c := r.Manifest.Source.Model
			cut := map[string]int{}
			for i := range r.Manifest.Params {
				p := &r.Manifest.Params[i]
				if p.TPLayout != "" {
					t.Fatalf("%s: tp_layout %q; the test wants a source that records none", p.Name, p.TPLayout)
				}
				sh, err := model.Slice(p, readMeta(t, r, p), 2, 1, 0)
				if err != nil {
					t.Fatalf("%s: %v", p.Name, err)
				}
				want := append([]int64(nil), p.Shape...)
				dim := -1
				switch n := p.Name; {
				case strings.HasSuffix(n, "norm.weight"):
				case strings.Contains(n, "embed_tokens") || strings.HasPrefix(n, "lm_head"):
					want[0], dim = (p.Shape[0]+1)/2, 0
				case strings.Contains(n, "o_proj") || strings.Contains(n, "down_proj"):
					want[1], dim = p.Shape[1]/2, 1
				default:
					want[0], dim = p.Shape[0]/2, 0
				}
				if !torchfile.SameShape(sh.Shape, want) {
					t.Errorf("%s %v at tp 2: shard %v, want %v", p.Name, p.Shape, sh.Shape, want)
				}
				cut[fmt.Sprint(dim)]++
			}
			if cut["0"] == 0 || cut["1"] == 0 || cut["-1"] == 0 {
				t.Errorf("cuts %v: want some of each", cut)
			}
			p, _ := r.Param("model.layers.0.self_attn.k_proj.weight")
			if _, err := model.Slice(p, readMeta(t, r, p), int(c.QueryGroups)*2, 0, 0); err == nil || !strings.Contains(err.Error(), "does not divide") {
				t.Errorf("tp %d with %d query groups: %v", c.QueryGroups*2, c.QueryGroups, err)
			}
		})
	}
}
