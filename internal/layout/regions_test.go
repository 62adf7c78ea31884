package layout_test

import (
	"bytes"
	"context"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestWriteFillsRegions fills regions of one file (as the torch_dist
// writer places chunk payloads in a rank file) from TP shards with
// vocabulary padding, in float32 (copied in the kernel) and bfloat16
// (converted), cut into tiny tasks shared by several workers: each region
// must hold what ReadLocalAs reads, zeros around the piece, the bytes
// between regions untouched, and CRC must be the region's CRC-32.
func TestWriteFillsRegions(t *testing.T) {
	r := tp2Atomic(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "rank.distcp"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type want struct {
		i        int
		off      int64
		data     []byte
		unfilled bool
	}
	var regions layout.Regions
	var fills []layout.TensorFill
	var wants []want
	var at int64
	const gap = 13 // bytes between regions, never written
	for _, p := range r.Params() {
		st, meta := openFP32(t, r, p.Name)
		rows := int64(0)
		if meta.Vocab {
			rows = (st.Shape[0]+7)/8*4 + 3
		}
		for tp := 0; tp < 2; tp++ {
			sh, err := layout.TPShard(meta, st.Shape, 2, tp, rows)
			if err != nil {
				t.Fatal(err)
			}
			n := torchfile.Numel(sh.Shape)
			for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
				es := int64(dt.Size())
				// Elements [1, n-1) of the shard at [2, n): zeros at 0, 1.
				data := make([]byte, n*es)
				if _, err := layout.ReadLocalAs(st, sh, 1, n-2, dt, data[2*es:]); err != nil {
					t.Fatal(err)
				}
				at += gap
				i := regions.Add(f, at, n*es)
				fills = append(fills, layout.TensorFill{I: i, DType: dt, N: n, Pieces: []layout.StatePiece{
					{Param: p.Name, State: "fp32", Shard: sh, Local: 1, N: n - 2, At: 2}}})
				wants = append(wants, want{i: i, off: at, data: data})
				at += n * es
			}
		}
		st.Close()
	}
	at += gap
	unfilled := regions.Add(f, at, 8)
	at += 8
	if err := f.Truncate(at); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, int(at)), 0); err != nil {
		t.Fatal(err)
	}
	if err := layout.WriteFills(context.Background(), r, &regions, fills, 3, 40); err != nil {
		t.Fatal(err)
	}
	all, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	prev := int64(0)
	for _, w := range wants {
		if !bytes.Equal(all[prev:w.off], bytes.Repeat([]byte{0xa5}, int(w.off-prev))) {
			t.Fatalf("bytes [%d,%d) outside the regions were written", prev, w.off)
		}
		got := all[w.off : w.off+int64(len(w.data))]
		if !bytes.Equal(got, w.data) {
			t.Fatalf("region %d differs from ReadLocalAs", w.i)
		}
		crc, err := regions.CRC(w.i)
		if err != nil {
			t.Fatal(err)
		}
		if crc != crc32.ChecksumIEEE(w.data) {
			t.Fatalf("region %d: CRC %08x, its bytes' %08x", w.i, crc, crc32.ChecksumIEEE(w.data))
		}
		prev = w.off + int64(len(w.data))
	}
	if _, err := regions.CRC(unfilled); err == nil {
		t.Fatal("CRC of a region never written: no error")
	}
	// Overlapping pieces are refused before anything is written.
	pc := fills[0].Pieces[0]
	bad := []layout.TensorFill{{I: fills[0].I, DType: fills[0].DType, N: fills[0].N, Pieces: []layout.StatePiece{pc, pc}}}
	if err := layout.WriteFills(context.Background(), r, &regions, bad, 2, 0); err == nil {
		t.Fatal("overlapping pieces: no error")
	}
}
