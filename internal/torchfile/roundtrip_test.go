package torchfile

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// pattern returns n deterministic bytes.
func pattern(n int64, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + seed*7 + i>>7)
	}
	return b
}

func blob(dt dtype.DType, seed int, shape ...int64) *Blob {
	b := &Blob{DType: dt, Shape: shape}
	b.Data = pattern(b.NBytes(), seed)
	if dt == dtype.Bool {
		for i := range b.Data {
			b.Data[i] &= 1
		}
	}
	return b
}

func bigInt(s string) *big.Int {
	b, ok := new(big.Int).SetString(s, 10)
	if !ok {
		panic(s)
	}
	return b
}

func odict(kv ...pyobj.Value) *pyobj.Dict {
	d := pyobj.DictOf(kv...)
	d.Kind = pyobj.OrderedDict
	return d
}

func list(items ...pyobj.Value) *pyobj.List { return &pyobj.List{Items: items} }

// weightsRoot is an object that torch 1.13's weights_only loader accepts:
// no floats, no bytes, no sets, no dtype values outside its allow list.
func weightsRoot() pyobj.Value {
	shared := blob(dtype.Float32, 99, 2, 2)
	ints := []pyobj.Value{int64(0), int64(1), int64(255), int64(256), int64(65535), int64(65536),
		int64(-1), int64(-256), int64(math.MinInt32), int64(math.MaxInt32), int64(1) << 31,
		int64(math.MinInt32) - 1, int64(1) << 40, int64(math.MaxInt64), int64(math.MinInt64),
		bigInt("18446744073709551616"), bigInt("-1180591620717411303424"), bigInt("-170141183460469231731687303715884105728")}
	bigList := make([]pyobj.Value, 2500)
	for i := range bigList {
		bigList[i] = int64(i * 7)
	}
	bigDict := pyobj.NewDict(pyobj.PlainDict)
	for i := 0; i < 1500; i++ {
		bigDict.Set("k"+strconv.Itoa(i), int64(i))
	}
	sd := odict("weight", blob(dtype.Float16, 5, 2, 3), "bias", blob(dtype.Float16, 6, 2))
	sd.Attrs = pyobj.DictOf("_metadata", odict("", pyobj.DictOf("version", int64(1))))
	grad := blob(dtype.Float32, 7, 3)
	grad.RequiresGrad = true
	return odict(
		"f32", blob(dtype.Float32, 1, 2, 3),
		"f64", blob(dtype.Float64, 2, 4),
		"f16", blob(dtype.Float16, 3, 3, 2),
		"bf16", blob(dtype.BFloat16, 4, 5),
		"i8", blob(dtype.Int8, 5, 7),
		"i16", blob(dtype.Int16, 6, 3),
		"i32", blob(dtype.Int32, 7, 2, 2),
		"i64", blob(dtype.Int64, 8, 3),
		"u8", blob(dtype.Uint8, 9, 9),
		"bool", blob(dtype.Bool, 10, 4),
		"c64", blob(dtype.Complex64, 11, 2),
		"c128", blob(dtype.Complex128, 12, 1),
		"empty", blob(dtype.Float32, 0, 0),
		"empty2d", blob(dtype.Int64, 0, 3, 0),
		"scalar", blob(dtype.Float32, 13),
		"scalar_i64", blob(dtype.Int64, 14),
		"grad", grad,
		"shared", shared,
		"nested", pyobj.DictOf("again", shared, "list", list(shared, int64(1), pyobj.Tuple{int64(2), "x"}),
			"deeper", pyobj.DictOf("a", list(list(list(pyobj.Tuple{}))))),
		"ints", list(ints...),
		"strs", list("", "héllo", "日本語", "🚀", "a\x00b", strings.Repeat("long", 80)),
		"consts", list(nil, true, false),
		"tuples", list(pyobj.Tuple{}, pyobj.Tuple{int64(1)}, pyobj.Tuple{int64(1), int64(2)},
			pyobj.Tuple{int64(1), int64(2), int64(3)}, pyobj.Tuple{int64(1), int64(2), int64(3), int64(4), "five"}),
		"int_keys", pyobj.DictOf(int64(1), "one", int64(-5), "neg", int64(1)<<40, "big", nil, "none"),
		"tuple_key", pyobj.DictOf(pyobj.Tuple{int64(1), "a"}, "tk"),
		"size", pyobj.Size{2, 3},
		"dtype", pyobj.DType{DType: dtype.Float16},
		"state_dict", sd,
		"big_list", list(bigList...),
		"big_dict", bigDict,
	)
}

// pyRoot holds values that need weights_only=False in torch 1.13.
func pyRoot() pyobj.Value {
	nanPayload := math.Float64frombits(0x7ff800000000dead)
	return odict(
		"floats", list(0.0, math.Copysign(0, -1), 1.5, math.Inf(1), math.Inf(-1), math.NaN(), nanPayload,
			5e-324, 1.0/3, math.MaxFloat64),
		"huge", list(new(big.Int).Lsh(big.NewInt(1), 2400), new(big.Int).Neg(new(big.Int).Lsh(big.NewInt(3), 2100))),
		"bytes", pyobj.Bytes{0, 1, 0x7f, 0x80, 0xff},
		"empty_bytes", pyobj.Bytes{},
		"set", &pyobj.Set{Items: []pyobj.Value{int64(1), int64(2), "three"}},
		"frozenset", &pyobj.Set{Items: []pyobj.Value{"x"}, Frozen: true},
		"dtypes", list(pyobj.DType{DType: dtype.BFloat16}, pyobj.DType{DType: dtype.Bool}, pyobj.DType{DType: dtype.Uint8}),
		"args", &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}, Via: pyobj.ByNewObj,
			State: pyobj.DictOf("lr", 0.5, "name", "x", "layers", int64(4)), Built: true},
		"t", blob(dtype.Float32, 3, 2),
	)
}

type rtFile struct {
	name        string
	prefix      string
	weightsOnly bool
	root        pyobj.Value
}

// writePieces writes a file whose two tensors arrive in uneven pieces from
// concurrent goroutines, out of order, as reducers write them.
func writePieces(t *testing.T, path string) pyobj.Value {
	a := &Blob{DType: dtype.Float32, Shape: []int64{1000, 257}}
	b := &Blob{DType: dtype.BFloat16, Shape: []int64{3001}}
	root := pyobj.DictOf("a", a, "b", b, "meta", pyobj.DictOf("step", int64(3)))
	w, err := Create(path, root)
	if err != nil {
		t.Fatal(err)
	}
	a.Data = pattern(a.NBytes(), 21)
	b.Data = pattern(b.NBytes(), 22)
	type piece struct {
		blob     int
		off, end int64
	}
	var pieces []piece
	cuts := []int64{0, 4, 100003, 100004, 333333, 500000, 777777, 1027999, a.NBytes()}
	for i := len(cuts) - 2; i >= 0; i-- {
		pieces = append(pieces, piece{0, cuts[i], cuts[i+1]})
	}
	pieces = append(pieces, piece{1, 4000, b.NBytes()}, piece{1, 0, 1}, piece{1, 1, 4000})
	var wg sync.WaitGroup
	errs := make(chan error, len(pieces))
	for _, p := range pieces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := a.Data
			if p.blob == 1 {
				src = b.Data
			}
			errs <- w.WriteAt(p.blob, src[p.off:p.end], p.off)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestRoundTripTorch writes files with the Go writer, checks their zip
// structure (64-byte aligned payloads, CRC-32 of every record, one folder)
// and reads them back with both the Go reader and real torch.load.
func TestRoundTripTorch(t *testing.T) {
	dir := t.TempDir()
	files := []rtFile{
		{"weights.pt", "weights", true, weightsRoot()},
		{"pyvalues.pt", "pyvalues", false, pyRoot()},
		{"dotted.name.v2.pt", "dotted.name.v2", true, odict("w", blob(dtype.BFloat16, 30, 3))},
		{"nothing.pt", "nothing", true, pyobj.NewDict(pyobj.PlainDict)},
	}
	for _, f := range files {
		if err := Save(filepath.Join(dir, f.name), f.root); err != nil {
			t.Fatal(err)
		}
	}
	files = append(files, rtFile{"pieces.pt", "pieces", true, writePieces(t, filepath.Join(dir, "pieces.pt"))})

	// Saving again gives the same bytes.
	again := filepath.Join(t.TempDir(), "weights.pt")
	if err := Save(again, weightsRoot()); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(filepath.Join(dir, "weights.pt"))
	b2, _ := os.ReadFile(again)
	if !bytes.Equal(b1, b2) {
		t.Errorf("two saves of one object differ")
	}

	var manifest struct {
		Files []map[string]any `json:"files"`
	}
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		checkZip(t, path, f.prefix)
		want := typed(f.root, nil, map[any]int{})
		tf, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if tf.Prefix != f.prefix || tf.Format != FormatZip {
			t.Errorf("%s: prefix %q format %q", f.name, tf.Prefix, tf.Format)
		}
		got := typed(tf.Root, tf, map[any]int{})
		tf.Close()
		wj, _ := json.Marshal(want)
		gj, _ := json.Marshal(got)
		if !bytes.Equal(wj, gj) {
			t.Errorf("%s: Go reader reads back\n%s\nwant\n%s", f.name, gj, wj)
		}
		manifest.Files = append(manifest.Files, map[string]any{
			"file": f.name, "prefix": f.prefix, "weights_only": f.weightsOnly, "root": want})
	}
	mj, err := json.Marshal(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), mj, 0o644); err != nil {
		t.Fatal(err)
	}

	requireTorch(t)
	out, err := exec.Command("/usr/bin/python3", "../../testdata/gen/check_roundtrip.py", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("check_roundtrip.py: %v\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
}

// requireTorch skips the test when /usr/bin/python3 cannot import torch,
// unless UCP_REQUIRE_TORCH=1 (as in CI), where it fails instead.
func requireTorch(t *testing.T) {
	t.Helper()
	out, err := exec.Command("/usr/bin/python3", "-c", "import torch").CombinedOutput()
	if err == nil {
		return
	}
	msg := fmt.Sprintf("/usr/bin/python3 cannot import torch: %v %s", err, bytes.TrimSpace(out))
	if os.Getenv("UCP_REQUIRE_TORCH") == "1" {
		t.Fatal(msg + " (UCP_REQUIRE_TORCH=1)")
	}
	t.Skip(msg)
}

// checkZip verifies the container with archive/zip: one folder, stored
// records, payloads at multiples of 64, and every CRC-32 (archive/zip
// checks it when a record is read to the end).
func checkZip(t *testing.T, path, prefix string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	zr, err := zip.NewReader(f, st.Size())
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var names []string
	for _, zf := range zr.File {
		names = append(names, strings.TrimPrefix(zf.Name, prefix+"/"))
		if !strings.HasPrefix(zf.Name, prefix+"/") {
			t.Errorf("%s: record %s outside %s/", path, zf.Name, prefix)
		}
		if zf.Method != zip.Store {
			t.Errorf("%s: record %s is compressed", path, zf.Name)
		}
		off, err := zf.DataOffset()
		if err != nil || off%64 != 0 {
			t.Errorf("%s: record %s payload at %d (%v), not 64-byte aligned", path, zf.Name, off, err)
		}
		rc, err := zf.Open()
		if err != nil {
			t.Fatalf("%s: %s: %v", path, zf.Name, err)
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil || uint64(n) != zf.UncompressedSize64 {
			t.Errorf("%s: %s: read %d bytes: %v", path, zf.Name, n, err)
		}
	}
	if len(names) < 3 || names[0] != "data.pkl" || names[1] != "byteorder" || names[len(names)-1] != "version" {
		t.Errorf("%s: records %v", path, names)
	}
}

// typed renders a value in the manifest encoding of check_roundtrip.py.
// Written *Blob values and read-back *Tensor values (read through f) give
// the same rendering when the file round-trips.
func typed(v pyobj.Value, f *File, groups map[any]int) any {
	items := func(vs []pyobj.Value) []any {
		out := make([]any, len(vs))
		for i, x := range vs {
			out[i] = typed(x, f, groups)
		}
		return out
	}
	m := func(kv ...any) map[string]any {
		out := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	group := func(id any) int {
		if g, ok := groups[id]; ok {
			return g
		}
		groups[id] = len(groups)
		return groups[id]
	}
	switch x := v.(type) {
	case nil:
		return m("t", "none")
	case bool:
		return m("t", "bool", "v", x)
	case int64:
		return m("t", "int", "v", strconv.FormatInt(x, 10))
	case *big.Int:
		return m("t", "int", "v", x.String())
	case float64:
		return m("t", "float", "bits", fmt.Sprintf("%016x", math.Float64bits(x)))
	case string:
		return m("t", "str", "v", x)
	case pyobj.Bytes:
		return m("t", "bytes", "hex", hex.EncodeToString(x))
	case pyobj.Size:
		return m("t", "size", "v", []int64(x))
	case pyobj.DType:
		return m("t", "dtype", "v", x.DType.String())
	case pyobj.Tuple:
		return m("t", "tuple", "items", items(x))
	case *pyobj.List:
		return m("t", "list", "items", items(x.Items))
	case *pyobj.Set:
		return m("t", "set", "frozen", x.Frozen, "items", items(x.Items))
	case *pyobj.Dict:
		kind := "dict"
		if x.Kind == pyobj.OrderedDict {
			kind = "OrderedDict"
		}
		pairs := make([]any, x.Len())
		for i := range pairs {
			k, val := x.Item(i)
			pairs[i] = []any{typed(k, f, groups), typed(val, f, groups)}
		}
		out := m("t", "dict", "kind", kind, "items", pairs)
		if x.Attrs != nil {
			out["attrs"] = typed(x.Attrs, f, groups)
		}
		return out
	case *pyobj.Object:
		out := m("t", "object", "class", x.Class.String())
		if x.Built {
			out["state"] = typed(x.State, f, groups)
		}
		return out
	case *Blob:
		return m("t", "tensor", "dtype", x.DType.String(), "shape", append([]int64{}, x.Shape...),
			"hex", hex.EncodeToString(x.Data), "requires_grad", x.RequiresGrad, "group", group(x))
	case *Tensor:
		data, err := f.ReadTensor(x)
		if err != nil {
			return m("t", "error", "v", err.Error())
		}
		if !x.IsContiguous() || x.StorageOffset != 0 || x.Storage.NBytes() != x.NBytes() {
			return m("t", "error", "v", "not a plain tensor")
		}
		return m("t", "tensor", "dtype", x.DType.String(), "shape", append([]int64{}, x.Shape...),
			"hex", hex.EncodeToString(data), "requires_grad", x.RequiresGrad, "group", group(x.Storage))
	}
	return m("t", "unsupported", "v", fmt.Sprintf("%T", v))
}

// TestWriterLayoutBytes pins the exact bytes of a small file against the
// miniz layout torch writes (caffe2/serialize/inline_container.cc): header fields, FB padding and
// descriptors.
func TestWriterLayoutBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "small.pt")
	root := odict("w", NewBlob(dtype.Float32, []int64{2, 3}, dtype.Float32Bytes([]float32{0, 1, 2, 3, 4, 5})),
		"b", NewBlob(dtype.BFloat16, []int64{2}, []byte{0xc0, 0x3f, 0x00, 0xc0}))
	if err := Save(path, root); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	// data.pkl: header at 0, payload at 64 (30 + 14 + 4 + 16 pad).
	if le.Uint32(b) != sigLocal || le.Uint16(b[6:]) != flagsDD || le.Uint16(b[8:]) != 0 {
		t.Errorf("data.pkl local header: % x", b[:30])
	}
	if string(b[30:44]) != "small/data.pkl" || string(b[44:46]) != "FB" || le.Uint16(b[46:]) != 16 ||
		!bytes.Equal(b[48:64], bytes.Repeat([]byte("Z"), 16)) || b[64] != 0x80 || b[65] != 2 {
		t.Errorf("data.pkl name/padding/payload start: %q", b[30:66])
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, _ := pyobj.Path(f.Root, "w")
	if off := w.(*Tensor).FileOffset(); off%64 != 0 {
		t.Errorf("tensor w at %d", off)
	}
	// The end: zip64 EOCD (56) + locator (20) + EOCD (22).
	end := b[len(b)-22:]
	loc := b[len(b)-42 : len(b)-22]
	e64 := b[len(b)-98 : len(b)-42]
	if le.Uint32(end) != sigEnd || le.Uint32(loc) != sigLocator64 || le.Uint32(e64) != sigEnd64 {
		t.Errorf("end records missing")
	}
	if int(le.Uint64(loc[8:])) != len(b)-98 {
		t.Errorf("zip64 locator points to %d, want %d", le.Uint64(loc[8:]), len(b)-98)
	}
}
