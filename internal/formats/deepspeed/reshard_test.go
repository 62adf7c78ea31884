package deepspeed_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats"
	. "github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/testkit"
)

// convertDS converts a DeepSpeed checkpoint (ZeRO-1/2/3) into a fresh atomic folder.
func convertDS(t *testing.T, ckpt string) string {
	t.Helper()
	tbl, err := formats.Index(context.Background(), ckpt, "", formats.Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	return testkit.Convert(t, tbl, 2)
}

// reshardTo writes atomic checkpoint a as a DeepSpeed tag folder and returns
// the save folder (holding 'latest').
func reshardTo(t *testing.T, a string, o ReshardOptions) string {
	t.Helper()
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	save := filepath.Join(t.TempDir(), "save")
	o.NoSync = true // durability is not under test: fsyncs would only slow the suite
	if _, err := Reshard(context.Background(), r, filepath.Join(save, "global_step9"), o); err != nil {
		t.Fatal(err)
	}
	return save
}

func TestReshardRoundTrip(t *testing.T) {
	bf := dtype.BFloat16
	cases := []struct {
		name, ckpt string
		o          ReshardOptions
	}{
		{"real_z1_dp2_to_dp3", "deepspeed-real/z1_dp2_fp32", ReshardOptions{DP: 3, TP: 1, Zero: 1}},
		{"real_z1_dp2_to_z2_dp4", "deepspeed-real/z1_dp2_fp32", ReshardOptions{DP: 4, TP: 1, Zero: 2}},
		{"z2_bf16_dp4_to_dp3", "deepspeed/z2_bf16_dp4", ReshardOptions{DP: 3, TP: 1, Zero: 2}},
		{"z2_bf16_dp4_to_bf16opt_dp2", "deepspeed/z2_bf16_dp4", ReshardOptions{DP: 2, TP: 1, Zero: 1, BF16Optimizer: true}},
		{"bf16opt_dp3_to_z2_dp2", "deepspeed/bf16opt_z1_dp3", ReshardOptions{DP: 2, TP: 1, Zero: 2}},
		{"bf16opt_dp3_to_bf16opt_dp2", "deepspeed/bf16opt_z1_dp3", ReshardOptions{DP: 2, TP: 1, Zero: 1, BF16Optimizer: true}},
		{"twogroups_dp3_to_dp2", "deepspeed/z1_twogroups_dp3", ReshardOptions{DP: 2, TP: 1, Zero: 1}},
		{"fp16_dp3_to_dp2", "deepspeed/z2_fp16_dp3", ReshardOptions{DP: 2, TP: 1, Zero: 2}},
		{"fp16_to_bf16_dp1", "deepspeed/z2_fp16_dp3", ReshardOptions{DP: 1, TP: 1, Zero: 1, DType: bf}},
		{"intstep_dp3_to_dp4", "deepspeed/z1_fp16_fusedadam_intstep_dp3", ReshardOptions{DP: 4, TP: 1, Zero: 1}},
		{"frozen_buffers_dp2_to_dp3", "deepspeed/z2_frozen_buffers_dp2", ReshardOptions{DP: 3, TP: 1, Zero: 2}},
		{"hf_nouci_dp2_to_dp3", "deepspeed/hf_z2_bf16_nouci_dp2", ReshardOptions{DP: 3, TP: 1, Zero: 2}},
		{"megatron_tp2_to_tp1_dp3", "deepspeed/megatron_tp2_bf16opt_dp2", ReshardOptions{DP: 3, TP: 1, Zero: 1}},
		{"megatron_tp2_to_tp2_dp1", "deepspeed/megatron_tp2_bf16opt_dp2", ReshardOptions{DP: 1, TP: 2, Zero: 1, BF16Optimizer: true}},
		{"real_z1_dp2_to_z3_dp3", "deepspeed-real/z1_dp2_fp32", ReshardOptions{DP: 3, TP: 1, Zero: 3}},
		{"twogroups_z1_dp3_to_z3_dp2", "deepspeed/z1_twogroups_dp3", ReshardOptions{DP: 2, TP: 1, Zero: 3}},
		{"frozen_buffers_z2_to_z3_dp3", "deepspeed/z2_frozen_buffers_dp2", ReshardOptions{DP: 3, TP: 1, Zero: 3}},
		{"bf16_z2_dp4_to_z3_dp3", "deepspeed/z2_bf16_dp4", ReshardOptions{DP: 3, TP: 1, Zero: 3}},
		{"z3_dp3_to_dp2", "zero3/tinylm_dp3", ReshardOptions{DP: 2, TP: 1, Zero: 3}},
		{"z3_dp2_to_z2_dp3", "zero3/dp2_fp32_torch2", ReshardOptions{DP: 3, TP: 1, Zero: 2}},
		{"z3_subgroups_to_z1_dp2", "zero3/subgroups_2pg_dp3", ReshardOptions{DP: 2, TP: 1, Zero: 1}},
		{"z3_frozen_fp16_dp3_to_z3_dp4", "zero3/frozen_buffers_dp3_fp16", ReshardOptions{DP: 4, TP: 1, Zero: 3}},
		{"z3_autotp_tp2_to_z2_tp1", "zero3/tp2_dp2_bf16", ReshardOptions{DP: 2, TP: 1, Zero: 2}},
		{"megatron_gqa_tp2_to_tp1_dp2", "deepspeed/megatron_tp2_unevengqa_z2_bf16_dp3", ReshardOptions{DP: 2, TP: 1, Zero: 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := convertDS(t, testkit.Fixture(c.ckpt, "checkpoint"))
			save := reshardTo(t, a, c.o)
			tbl, err := formats.Index(context.Background(), save, "", formats.Options{Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			want := fragment.Degrees{TP: c.o.TP, PP: 1, DP: c.o.DP, EP: 1, ZeRO: c.o.Zero}
			if tbl.Degrees != want {
				t.Errorf("resharded degrees %+v, want %+v", tbl.Degrees, want)
			}
			b := testkit.Convert(t, tbl, 2)
			src, err := atomic.ReadManifest(a)
			if err != nil {
				t.Fatal(err)
			}
			// Byte-identical state files unless the TP or the ZeRO-3-ness changed: a
			// source of another TP records other split metadata (cat_dim,
			// sub_param_shape) beside 'param'. The written checkpoint may hold
			// a step state the source's parameter lacked.
			testkit.SameAtomic(t, a, b, testkit.SameOptions{ExtraStep: true,
				Files: src.Source.Degrees.TP == c.o.TP && (src.Source.Degrees.ZeRO == 3) == (c.o.Zero == 3)})
			testkit.Check(t, b, testkit.Fixture(c.ckpt, "truth.pt"))
		})
	}
}

func TestReshardBadTarget(t *testing.T) {
	tiny := convertDS(t, testkit.Fixture("deepspeed/z1_tiny_dp4_padonly", "checkpoint"))
	meg := convertDS(t, testkit.Fixture("deepspeed/megatron_tp2_bf16opt_dp2", "checkpoint"))
	cases := []struct {
		name, atomic string
		o            ReshardOptions
		want         string
	}{
		{"unknown stage", tiny, ReshardOptions{DP: 2, TP: 1, Zero: 4}, "unknown ZeRO stage 4"},
		{"stage 0", tiny, ReshardOptions{DP: 2, TP: 1, Zero: 0}, "--zero 0 is not supported"},
		{"dp 0", tiny, ReshardOptions{DP: 0, TP: 1, Zero: 1}, "--dp must be at least 1"},
		{"padding beyond the last partition", tiny, ReshardOptions{DP: 4, TP: 1, Zero: 1}, "its last rank would hold 3 padding elements in a partition of 2"},
		{"tp not dividing the heads", meg, ReshardOptions{DP: 1, TP: 3, Zero: 1}, "tensor-parallel size 3 does not divide the 4 attention heads"},
		{"tp not dividing the query groups", meg, ReshardOptions{DP: 1, TP: 4, Zero: 1}, "tensor-parallel size 4 does not divide the 2 query groups"},
		{"bf16 optimizer at fp32", tiny, ReshardOptions{DP: 1, TP: 1, Zero: 1, BF16Optimizer: true}, "--bf16-optimizer needs --dtype bfloat16"},
		{"bf16 optimizer at stage 2", meg, ReshardOptions{DP: 1, TP: 1, Zero: 2, BF16Optimizer: true}, "--bf16-optimizer needs --dtype bfloat16 and --zero 1"},
	}
	r, err := atomic.OpenReader(tiny, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{tiny, filepath.Join(tiny, "zero", "tag"), filepath.Dir(tiny)} {
		_, err := Reshard(context.Background(), r, dst, ReshardOptions{DP: 2, TP: 1, Zero: 1, Force: true})
		if err == nil || !strings.Contains(err.Error(), "refusing to write") {
			t.Errorf("reshard into %s: %v, want a refusal", dst, err)
		}
	}
	if _, err := atomic.ReadManifest(tiny); err != nil {
		t.Fatalf("the source was damaged: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := atomic.OpenReader(c.atomic, atomic.ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			save := t.TempDir()
			dst := filepath.Join(save, "tag")
			_, err = Reshard(context.Background(), r, dst, c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
			if ents, _ := os.ReadDir(save); len(ents) != 0 {
				t.Errorf("wrote %v before failing", ents)
			}
		})
	}
}

// TestReshardLossScalerNote: a target dtype of float16 from a source
// without an fp16 loss scaler gets DeepSpeed's default DynamicLossScaler
// in every optimizer file, and the summary says so once; a source that
// has one keeps it without a note.
func TestReshardLossScalerNote(t *testing.T) {
	const note = "a DynamicLossScaler with DeepSpeed's defaults"
	bf16 := convertDS(t, testkit.Fixture("deepspeed", "z2_bf16_dp4", "checkpoint"))
	fp16 := convertDS(t, testkit.Fixture("deepspeed", "z2_fp16_dp3", "checkpoint"))
	for _, c := range []struct {
		name, atomic string
		o            ReshardOptions
		notes        int
	}{
		{"bf16 source, zero 2", bf16, ReshardOptions{DP: 3, TP: 1, Zero: 2, DType: dtype.Float16}, 1},
		{"bf16 source, zero 3", bf16, ReshardOptions{DP: 3, TP: 1, Zero: 3, DType: dtype.Float16}, 1},
		{"fp16 source", fp16, ReshardOptions{DP: 2, TP: 1, Zero: 2}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := atomic.OpenReader(c.atomic, atomic.ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c.o.NoSync = true
			st, err := Reshard(context.Background(), r, filepath.Join(t.TempDir(), "save", "tag"), c.o)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, s := range st.Notes {
				if strings.Contains(s, note) {
					n++
				}
			}
			if n != c.notes {
				t.Errorf("%d notes saying %q, want %d: %q", n, note, c.notes, st.Notes)
			}
		})
	}
}
