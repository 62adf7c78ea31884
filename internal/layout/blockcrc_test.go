package layout_test

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestCopiesFromBlockCRCs: an atomic state of several 1 MiB blocks copied
// in the kernel into torch files, in ranges that start and end inside
// blocks, gives byte-exact output whose zip CRCs hold, with the state's
// block CRC-32s (no Verify: not read back), with Verify (read back and
// checked), and from a manifest without them (an older checkpoint). It
// pins the trust rule: without Verify a data byte corrupted inside a
// block the copies cover whole is not read, and the output record's
// CRC-32 disagrees with its data (archive/zip's checksum error), while
// Verify refuses it naming the file; block CRCs that do not combine to
// the record's CRC are refused naming the file.
func TestCopiesFromBlockCRCs(t *testing.T) {
	const numel = 3<<18 + 12345 // 3 MiB + of float32: 4 blocks
	data := make([]byte, 4*numel)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	dir := oneStateAtomic(t, data)
	m, err := atomic.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Params[0].Files[0].Blocks == "" {
		t.Fatal("the converted state has no block CRC-32s")
	}
	statePath := filepath.Join(dir, m.Params[0].Files[0].Path)
	// Two output tensors: elements [1000, 600000) and [600000, numel-7).
	cuts := []int64{1000, 600000, numel - 7}
	fill := func(t *testing.T, opt atomic.ReaderOptions, wantBlocks bool) (string, error) {
		pre, err := atomic.OpenReader(dir, atomic.ReaderOptions{}) // no up-front check
		if err != nil {
			t.Fatal(err)
		}
		st, err := pre.OpenState("w", fragment.FP32)
		if err != nil {
			return "", err
		}
		if (st.Blocks() != nil) != wantBlocks {
			t.Fatalf("state blocks %v, want %v", st.Blocks() != nil, wantBlocks)
		}
		st.Close()
		r, err := atomic.OpenReader(dir, opt)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "out.pt")
		var fills []layout.TensorFill
		var blobs []pyobj.Value
		for k := 0; k+1 < len(cuts); k++ {
			n := cuts[k+1] - cuts[k]
			blobs = append(blobs, torchfile.NewBlob(dtype.Float32, []int64{n}, nil))
			fills = append(fills, layout.TensorFill{I: k, DType: dtype.Float32, N: n, Pieces: []layout.StatePiece{
				{Param: "w", State: fragment.FP32, Shard: fragment.Shard{Shape: []int64{numel}}, Local: cuts[k], N: n}}})
		}
		w, err := torchfile.Create(out, &pyobj.List{Items: blobs})
		if err != nil {
			t.Fatal(err)
		}
		err = r.VerifyingReads(func() error { return layout.WriteFills(context.Background(), r, w, fills, 2, 1<<20) })
		if err != nil {
			w.Abort()
			return "", err
		}
		return out, w.Commit()
	}
	// check reads every record of out through archive/zip, which checks
	// its CRC-32, and compares the tensors with data.
	check := func(t *testing.T, out string) error {
		z, err := zip.OpenReader(out)
		if err != nil {
			t.Fatal(err)
		}
		defer z.Close()
		k := 0
		for _, zf := range z.File {
			rc, err := zf.Open()
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return err
			}
			if strings.Contains(zf.Name, "/data/") {
				if !bytes.Equal(b, data[4*cuts[k]:4*cuts[k+1]]) {
					t.Errorf("%s differs from the source", zf.Name)
				}
				k++
			}
		}
		if k != len(cuts)-1 {
			t.Fatalf("%d data records", k)
		}
		return nil
	}
	for _, c := range []struct {
		name   string
		opt    atomic.ReaderOptions
		blocks bool
	}{{"block CRCs", atomic.ReaderOptions{}, true}, {"verified", atomic.ReaderOptions{Verify: true}, true}} {
		out, err := fill(t, c.opt, c.blocks)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := check(t, out); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	// A byte of block 1, which the first output tensor covers whole.
	orig, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	testkit.FlipState(t, statePath, func(b []byte, off int64) { b[off+atomic.BlockSize+77] ^= 0x40 })
	data[atomic.BlockSize+77] ^= 0x40 // what the output holds
	out, err := fill(t, atomic.ReaderOptions{}, true)
	if err != nil {
		t.Fatalf("corrupt data byte with block CRCs: %v", err)
	}
	if err := check(t, out); !errors.Is(err, zip.ErrChecksum) {
		t.Fatalf("corrupt data byte copied without reading it: %v, want the output record's CRC-32 to disagree", err)
	}
	if _, err := fill(t, atomic.ReaderOptions{Verify: true}, true); err == nil || !strings.Contains(err.Error(), statePath) {
		t.Fatalf("corrupt data byte verified: %v", err)
	}
	data[atomic.BlockSize+77] ^= 0x40
	if err := os.WriteFile(statePath, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	// Block CRCs that are not the file's, then none (an older checkpoint).
	mpath := filepath.Join(dir, atomic.ManifestName)
	setBlocks := func(s string) {
		m.Params[0].Files[0].Blocks = s
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(mpath, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	good := m.Params[0].Files[0].Blocks
	setBlocks("AAAA" + good[4:])
	if _, err := fill(t, atomic.ReaderOptions{}, true); err == nil || !strings.Contains(err.Error(), statePath) || !strings.Contains(err.Error(), "block CRC-32s") {
		t.Fatalf("wrong block CRCs: %v", err)
	}
	setBlocks(good[8:])
	if _, err := fill(t, atomic.ReaderOptions{}, true); err == nil || !strings.Contains(err.Error(), statePath) {
		t.Fatalf("too few block CRCs: %v", err)
	}
	setBlocks("")
	for _, opt := range []atomic.ReaderOptions{{}, {Verify: true}} {
		out, err = fill(t, opt, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := check(t, out); err != nil {
			t.Fatal(err)
		}
	}
}
