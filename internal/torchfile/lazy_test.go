package torchfile

import (
	"archive/zip"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	r     io.ReaderAt
	bytes atomic.Int64
	calls atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.bytes.Add(int64(n))
	c.calls.Add(1)
	return n, err
}

// zeroCRC returns the CRC-32 of n zero bytes, by doubling with crc32Combine.
func zeroCRC(n int64) uint32 {
	var crc uint32 // CRC of the empty string
	block, blockLen := crc32.ChecksumIEEE([]byte{0}), int64(1)
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			crc = fsutil.CRC32Combine(crc, block, blockLen)
		}
		block = fsutil.CRC32Combine(block, block, blockLen)
		blockLen *= 2
	}
	return crc
}

// sparseTorchFile writes a torch.save file of all-zero tensors without
// writing their bytes: only the layout's head and tail segments.
func sparseTorchFile(t *testing.T, path string, root pyobj.Value) *Layout {
	t.Helper()
	l, err := NewLayout(strings.TrimSuffix(filepath.Base(path), ".pt"), root)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(l.Size()); err != nil {
		t.Skipf("cannot create a sparse %d-byte file: %v", l.Size(), err)
	}
	crcs := make([]uint32, len(l.Blobs))
	for i, b := range l.Blobs {
		crcs[i] = zeroCRC(b.NBytes())
	}
	tail, err := l.Tail(crcs)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(l.Head(), tail...) {
		if _, err := f.WriteAt(s.Data, s.Off); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// TestLazyOpenHuge proves that opening reads only the zip directory and
// the pickle: a 5.4 GB file (zip64 sizes and offsets) opens by reading a
// few KB.
func TestLazyOpenHuge(t *testing.T) {
	big1 := &Blob{DType: dtype.Float32, Shape: []int64{1 << 28}}                  // 1 GiB
	big2 := &Blob{DType: dtype.BFloat16, Shape: []int64{1 << 30, 2}}              // 4 GiB: a zip64 size
	small := &Blob{DType: dtype.Int64, Shape: []int64{3}, Data: make([]byte, 24)} // after 5 GiB: zip64 offset
	layers := pyobj.NewDict(pyobj.OrderedDict)
	for i := 0; i < 200; i++ {
		layers.Set(fmt.Sprintf("layer.%d.weight", i), &Blob{DType: dtype.Float16, Shape: []int64{64, 64}})
	}
	root := pyobj.DictOf("big1", big1, "big2", big2, "small", small, "layers", layers)
	path := filepath.Join(t.TempDir(), "huge.pt")
	l := sparseTorchFile(t, path, root)
	if l.Size() < 5<<30 {
		t.Fatalf("layout of %d bytes", l.Size())
	}

	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	cr := &countingReaderAt{r: fh}
	f, err := Read(cr, l.Size(), path)
	if err != nil {
		t.Fatal(err)
	}
	read := cr.bytes.Load()
	t.Logf("opened a %d-byte file (%d tensors) by reading %d bytes in %d calls (pickle %d bytes)",
		l.Size(), len(f.Storages), read, cr.calls.Load(), f.PickleBytes)
	// Central directory (~60 B per record) + pickle + local headers.
	if limit := 128*int64(len(f.Storages)+4) + 2*f.PickleBytes + 64<<10; read > limit {
		t.Errorf("read %d bytes to open, more than %d", read, limit)
	}
	if len(f.Storages) != 203 {
		t.Errorf("%d storages", len(f.Storages))
	}
	for i, st := range f.Storages {
		if want := l.BlobOffset(i); st.Offset != want {
			t.Errorf("storage %s at %d, layout says %d", st.Key, st.Offset, want)
		}
	}
	v, _ := pyobj.Path(f.Root, "small")
	sm := v.(*Tensor)
	if sm.FileOffset() < 5<<30 || sm.FileOffset()%64 != 0 {
		t.Errorf("small tensor at %d", sm.FileOffset())
	}
	// Reading one element costs its bytes.
	before := cr.bytes.Load()
	v, _ = pyobj.Path(f.Root, "big2")
	if err := ReadRange(cr, v.(*Tensor), 1<<31-1, 1, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if d := cr.bytes.Load() - before; d != 2 {
		t.Errorf("reading one bf16 element read %d bytes", d)
	}

	// archive/zip agrees on every record (zip64 extra fields included).
	zr, err := zip.NewReader(fh, l.Size())
	if err != nil {
		t.Fatal(err)
	}
	for _, zf := range zr.File {
		off, err := zf.DataOffset()
		if err != nil || off%64 != 0 {
			t.Errorf("%s: payload at %d (%v)", zf.Name, off, err)
		}
	}
	if zf := zr.File[3]; zf.Name != "huge/data/1" || zf.UncompressedSize64 != 4<<30 {
		t.Errorf("record %s has %d bytes, want huge/data/1 of 4 GiB", zf.Name, zf.UncompressedSize64)
	}

	// torch's own zip reader (miniz) parses the zip64 structures and reads
	// the small records without touching the tensor data.
	if _, err := exec.Command("/usr/bin/python3", "-c", "import torch").CombinedOutput(); err != nil {
		if os.Getenv("UCP_REQUIRE_TORCH") == "1" {
			t.Fatalf("/usr/bin/python3 cannot import torch: %v", err)
		}
		t.Logf("skipping the miniz check: no torch")
		return
	}
	script := `import sys, torch
r = torch._C.PyTorchFileReader(sys.argv[1])
recs = r.get_all_records()
assert len(recs) == 206, len(recs)
assert bytes(r.get_record("version")) == b"3\n"
assert len(r.get_record("data.pkl")) == int(sys.argv[2])
s = r.get_storage_from_record("data/2", 3, torch.int64)
print("miniz ok", len(recs), "records")`
	out, err := exec.Command("/usr/bin/python3", "-c", script, path, fmt.Sprint(f.PickleBytes)).CombinedOutput()
	if err != nil {
		t.Fatalf("miniz: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

// TestZeroCRC checks the helper against crc32 itself.
func TestZeroCRC(t *testing.T) {
	for _, n := range []int64{0, 1, 2, 3, 64, 1000, 4097} {
		if got, want := zeroCRC(n), crc32.ChecksumIEEE(make([]byte, n)); got != want {
			t.Errorf("zeroCRC(%d) = %08x, want %08x", n, got, want)
		}
	}
}
