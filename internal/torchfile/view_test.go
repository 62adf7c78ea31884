package torchfile

import (
	"bytes"
	"hash/crc32"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// TestViewsShareStorage writes tensors that are views of one storage (as
// torch saves DeepSpeed's flat-buffer module weights): the file has one
// storage record, the reader gives each view its offset, shape and stride
// over it, the record's CRC-32 is read from the zip (Storage.CRC32), and
// torch loads the views as one shared storage with the same values. A
// view reaching outside its storage is refused.
func TestViewsShareStorage(t *testing.T) {
	base := blob(dtype.BFloat16, 5, 12)
	views := []struct {
		key                   string
		off                   int64
		shape, stride         []int64
		first, step, elements int64 // the elements it reads: first, first+step, ...
	}{
		{"a", 0, []int64{2, 3}, []int64{3, 1}, 0, 1, 6},
		{"b", 6, []int64{4}, []int64{1}, 6, 1, 4},
		{"c", 1, []int64{3}, []int64{4}, 1, 4, 3},
	}
	root := pyobj.NewDict(pyobj.OrderedDict)
	for _, v := range views {
		root.Set(v.key, &View{Base: base, Offset: v.off, Shape: v.shape, Stride: v.stride})
	}
	path := filepath.Join(t.TempDir(), "views.pt")
	if err := Save(path, root); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Storages) != 1 {
		t.Fatalf("%d storages, want 1", len(f.Storages))
	}
	if st := f.Storages[0]; st.CRC32 != crc32.ChecksumIEEE(base.Data) || st.Numel != 12 || st.DType != dtype.BFloat16 {
		t.Errorf("storage: CRC %08x (want %08x), %d %v elements", st.CRC32, crc32.ChecksumIEEE(base.Data), st.Numel, st.DType)
	}
	d := f.Root.(*pyobj.Dict)
	for _, v := range views {
		x, _ := d.Get(v.key)
		tn, ok := x.(*Tensor)
		if !ok {
			t.Fatalf("%s: %T", v.key, x)
		}
		if tn.Storage != f.Storages[0] || tn.StorageOffset != v.off || !reflect.DeepEqual(tn.Shape, v.shape) || !reflect.DeepEqual(tn.Stride, v.stride) {
			t.Errorf("%s: %v %v +%d", v.key, tn.Shape, tn.Stride, tn.StorageOffset)
		}
		got, err := f.ReadTensor(tn)
		if err != nil {
			t.Fatal(err)
		}
		var want []byte
		for i := int64(0); i < v.elements; i++ {
			e := v.first + i*v.step
			want = append(want, base.Data[2*e:2*e+2]...)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: bytes %x, want %x", v.key, got, want)
		}
	}
	for _, bad := range []*View{
		{Base: base, Offset: 10, Shape: []int64{3}, Stride: []int64{1}},
		{Base: base, Offset: 0, Shape: []int64{2, 2}, Stride: []int64{1}},
		{Base: &Blob{DType: dtype.Uint32, Shape: []int64{4}}, Shape: []int64{4}, Stride: []int64{1}},
	} {
		if err := Save(filepath.Join(t.TempDir(), "bad.pt"), pyobj.DictOf("x", bad)); err == nil {
			t.Errorf("view %+v of %v %v: saved", bad, bad.Base.DType, bad.Base.Shape)
		}
	}

	requireTorch(t)
	script := `
import sys, torch
d = torch.load(sys.argv[1], weights_only=True)
s = {t.storage().data_ptr() for t in d.values()}
assert len(s) == 1, s
base = torch.tensor([], dtype=torch.bfloat16).set_(d["a"].storage())
assert base.numel() == 12, base.numel()
assert torch.equal(d["b"], base[6:10]) and torch.equal(d["c"], base[1:12:4]) and torch.equal(d["a"], base[:6].view(2, 3))
print("torch loads 3 views of 1 storage")
`
	out, err := exec.Command("/usr/bin/python3", "-c", script, path).CombinedOutput()
	if err != nil {
		t.Fatalf("torch: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(string(out)))
}
