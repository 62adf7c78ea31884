package layout_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestReadLocalAsPadding: ReadLocalAs overwrites every byte of its range
// whatever the buffer held: elements a run covers with the file's values,
// vocabulary padding with zeros (it clears only when the range has
// padding, so a buffer of garbage catches a missed clear).
func TestReadLocalAsPadding(t *testing.T) {
	r := tp2Atomic(t)
	padded := 0
	for _, p := range r.Params() {
		st, meta := openFP32(t, r, p.Name)
		rows := int64(0)
		if meta.Vocab {
			rows = (st.Shape[0]+7)/8*4 + 3 // past the vocabulary on the last rank
		}
		for tp := 0; tp < 2; tp++ {
			sh, err := layout.TPShard(meta, st.Shape, 2, tp, rows)
			if err != nil {
				t.Fatal(err)
			}
			n := torchfile.Numel(sh.Shape)
			for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
				zero := make([]byte, n*int64(dt.Size()))
				junk := bytes.Repeat([]byte{0xa5}, len(zero))
				if _, err := layout.ReadLocalAs(st, sh, 0, n, dt, zero); err != nil {
					t.Fatal(err)
				}
				if _, err := layout.ReadLocalAs(st, sh, 0, n, dt, junk); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(zero, junk) {
					t.Fatalf("%s tp %d %v: a buffer of garbage reads differently from a zeroed one", p.Name, tp, dt)
				}
				if sh.MappedCount() < n {
					padded++
				}
			}
		}
		st.Close()
	}
	if padded == 0 {
		t.Fatal("no shard with padding was read")
	}
}

// openFP32 opens param's fp32 state and reads its layout metadata.
func openFP32(t *testing.T, r *atomic.Reader, param string) (*atomic.State, layout.Meta) {
	t.Helper()
	st, err := r.OpenState(param, "fp32")
	if err != nil {
		t.Fatal(err)
	}
	meta, err := layout.ReadMeta(st.Path)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	return st, meta
}

// tp2Atomic is the atomic checkpoint of a real DeepSpeed Megatron TP 2 bf16
// fixture (vocabulary-padded embeddings, fp32 states).
func tp2Atomic(t *testing.T) *atomic.Reader {
	t.Helper()
	tbl, err := deepspeed.Index(context.Background(), testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint"), deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{})
	return r
}
