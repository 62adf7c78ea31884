package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
)

// fixtureDir holds files built by testdata/gen/safetensors_fixtures.py
// from real torch tensors, and expected.json describing them.
const fixtureDir = "../../testdata/fixtures/safetensors"

type wantTensor struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Offset int64   `json:"offset"`
	NBytes int64   `json:"nbytes"`
	Hex    string  `json:"hex"`
	F32Hex string  `json:"f32_hex"`
}

type wantFile struct {
	Size      int64             `json:"size"`
	HeaderLen int64             `json:"header_len"`
	Metadata  map[string]string `json:"metadata"`
	Tensors   []wantTensor      `json:"tensors"`
}

func loadExpected(t testing.TB) map[string]wantFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Files map[string]wantFile `json:"files"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Files) == 0 {
		t.Fatal("expected.json lists no files")
	}
	return doc.Files
}

func sortedNames(m map[string]wantFile) []string {
	var names []string
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

func TestReadFixtures(t *testing.T) {
	want := loadExpected(t)
	for _, fname := range sortedNames(want) {
		w := want[fname]
		t.Run(fname, func(t *testing.T) {
			path := filepath.Join(fixtureDir, fname)
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Size() != w.Size || f.HeaderLen != w.HeaderLen {
				t.Errorf("size %d header %d, want %d %d", f.Size(), f.HeaderLen, w.Size, w.HeaderLen)
			}
			if !reflect.DeepEqual(f.Metadata, w.Metadata) {
				t.Errorf("metadata %q, want %q", f.Metadata, w.Metadata)
			}
			if len(f.Tensors) != len(w.Tensors) {
				t.Fatalf("%d tensors, want %d", len(f.Tensors), len(w.Tensors))
			}
			for i, wt := range w.Tensors {
				got := &f.Tensors[i]
				if got.Name != wt.Name || got.DType.SafetensorsName() != wt.DType || !reflect.DeepEqual(got.Shape, wt.Shape) ||
					got.Offset != wt.Offset || got.NBytes != wt.NBytes {
					t.Errorf("tensor %d = %q %v %v @%d+%d, want %q %s %v @%d+%d", i, got.Name, got.DType, got.Shape, got.Offset, got.NBytes,
						wt.Name, wt.DType, wt.Shape, wt.Offset, wt.NBytes)
					continue
				}
				if p, ok := f.Tensor(wt.Name); !ok || p != got {
					t.Errorf("Tensor(%q) = %v, %v", wt.Name, p, ok)
				}
				raw, err := f.ReadTensor(got)
				if err != nil {
					t.Fatal(err)
				}
				if h := hex.EncodeToString(raw); h != wt.Hex {
					t.Errorf("%q bytes %s, want %s", wt.Name, h, wt.Hex)
				}
				// float32 values bit-exact against torch's .to(torch.float32).
				vals, err := f.ReadFloat32(got, 0, got.Numel())
				if err != nil {
					t.Fatal(err)
				}
				if h := hex.EncodeToString(dtype.Float32Bytes(vals)); h != wt.F32Hex {
					t.Errorf("%q as float32 %s, want %s (torch)", wt.Name, h, wt.F32Hex)
				}
			}
			if _, ok := f.Tensor("no such tensor"); ok {
				t.Error("lookup of a missing name succeeded")
			}
		})
	}
}

// The unaligned fixture really exercises unaligned payloads.
func TestUnalignedFixtureIsUnaligned(t *testing.T) {
	f, err := Open(filepath.Join(fixtureDir, "unaligned.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unaligned := 0
	for _, tt := range f.Tensors {
		if tt.Offset%int64(tt.DType.Size()) != 0 {
			unaligned++
		}
	}
	if unaligned == 0 || f.HeaderLen%8 == 0 {
		t.Errorf("fixture is aligned (header %d); regenerate it", f.HeaderLen)
	}
}

func TestReadRange(t *testing.T) {
	f, err := Open(filepath.Join(fixtureDir, "all_dtypes.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tt, ok := f.Tensor("f32_3d") // arange(24)*0.5-3, shape [2,3,4]
	if !ok {
		t.Fatal("f32_3d missing")
	}
	for _, c := range []struct{ start, n int64 }{{0, 24}, {0, 0}, {5, 7}, {23, 1}, {24, 0}, {12, 12}} {
		dst := make([]byte, 4*c.n)
		if err := f.ReadRange(tt, c.start, c.n, dst); err != nil {
			t.Fatalf("ReadRange(%d, %d): %v", c.start, c.n, err)
		}
		for i, v := range dtype.Float32s(dst) {
			if want := float32(c.start+int64(i))*0.5 - 3; v != want {
				t.Errorf("ReadRange(%d, %d)[%d] = %v, want %v", c.start, c.n, i, v, want)
			}
		}
		vals, err := f.ReadFloat32(tt, c.start, c.n)
		if err != nil || len(vals) != int(c.n) {
			t.Fatalf("ReadFloat32(%d, %d) = %v, %v", c.start, c.n, vals, err)
		}
	}
	i16, _ := f.Tensor("i16")
	dst := make([]byte, 4)
	if err := f.ReadRange(i16, 2, 2, dst); err != nil || !bytes.Equal(dst, []byte{0xff, 0x7f, 0x00, 0x80}) {
		t.Errorf("i16[2:4] = %x, %v", dst, err)
	}
	for _, c := range []struct {
		start, n int64
		buf      int
		want     string
	}{
		{-1, 1, 4, "outside 24 elements"},
		{0, 25, 100, "outside 24 elements"},
		{24, 1, 4, "outside 24 elements"},
		{math.MaxInt64, math.MaxInt64, 4, "outside 24 elements"},
		{0, -1, 4, "outside"},
		{0, 2, 7, "buffer of 7 bytes"},
	} {
		err := f.ReadRange(tt, c.start, c.n, make([]byte, c.buf))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"f32_3d"`) {
			t.Errorf("ReadRange(%d, %d) error %v, want %q naming the tensor", c.start, c.n, err, c.want)
		}
	}
}

// A reader whose data is shorter than the size it was opened with (a file
// truncated under us) gives an error naming the tensor, not a panic.
func TestReadRangeShortReader(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(fixtureDir, "spec_example1.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Read(bytes.NewReader(data), int64(len(data)), "x.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	f.r = bytes.NewReader(data[:len(data)-2])
	tb, _ := f.Tensor("b")
	if _, err := f.ReadTensor(tb); err == nil || !strings.Contains(err.Error(), `x.safetensors: tensor "b"`) {
		t.Errorf("short read error %v", err)
	}
}

func TestOpenMissing(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "nope.safetensors")); err == nil || !strings.Contains(err.Error(), "nope.safetensors") {
		t.Errorf("Open of a missing file: %v", err)
	}
}

// header builds a file from a header string and data bytes.
func fileOf(hdr string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	b = append(b, hdr...)
	return append(b, data...)
}

type acceptCase struct {
	name, hdr string
	data      []byte
	check     func(t *testing.T, f *File)
}

// acceptCases are edge cases the reference reader accepts (checked
// against it); they also seed FuzzRead.
func acceptCases() []acceptCase {
	return []acceptCase{
		{"no tensors", `{}`, nil, func(t *testing.T, f *File) {
			if len(f.Tensors) != 0 || f.Metadata != nil {
				t.Errorf("got %v %v", f.Tensors, f.Metadata)
			}
		}},
		{"metadata only", `{"__metadata__":{}}`, nil, func(t *testing.T, f *File) {
			if f.Metadata == nil || len(f.Metadata) != 0 {
				t.Errorf("metadata %v, want empty non-nil", f.Metadata)
			}
		}},
		{"null metadata", `{"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, []byte{1, 2}, func(t *testing.T, f *File) {
			if f.Metadata != nil {
				t.Errorf("metadata %v, want nil", f.Metadata)
			}
		}},
		{"escaped metadata key", `{"\u005f_metadata__":{"k":"v"}}`, nil, func(t *testing.T, f *File) {
			if f.Metadata["k"] != "v" {
				t.Errorf("metadata %v", f.Metadata)
			}
		}},
		{"whitespace around", "\n\t {\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}\r\n ", []byte{1, 2}, nil},
		{"unknown fields", `{"a":{"x":[{"y":-1.5e3},0.5,1E-2,-0,0e+1,"\\\/\b\f\n\r\t\u00e9"],"dtype":"U8","z":null,"shape":[2],"data_offsets":[0,2],"w":"s"}}`, []byte{1, 2}, nil},
		{"escaped field name", `{"a":{"d\u0074ype":"U8","shape":[2],"data_offsets":[0,2]}}`, []byte{1, 2}, nil},
		{"surrogate pair and NUL", `{"\ud83d\ude00\u0000":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}, func(t *testing.T, f *File) {
			if _, ok := f.Tensor("\U0001F600\x00"); !ok {
				t.Errorf("names %q", f.Names())
			}
		}},
		{"zero-sized share offsets", `{"c":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[2,0],"data_offsets":[0,0]}}`, []byte{5}, func(t *testing.T, f *File) {
			if got := strings.Join(f.Names(), ","); got != "b,a,c" {
				t.Errorf("data order %s, want b,a,c (stable by offsets)", got)
			}
		}},
		{"large dims with a zero", `{"a":{"dtype":"U64","shape":[4294967296,0,4294967296],"data_offsets":[0,0]}}`, nil, func(t *testing.T, f *File) {
			if n := f.Tensors[0].Numel(); n != 0 {
				t.Errorf("numel %d", n)
			}
		}},
		{"nesting at the limit", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":` + strings.Repeat("[", maxDepth-2) + strings.Repeat("]", maxDepth-2) + `}}`, []byte{1, 2}, nil},
		{"C64 and F8", `{"c":{"dtype":"C64","shape":[1],"data_offsets":[0,8]},"f":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[8,10]}}`, make([]byte, 10), func(t *testing.T, f *File) {
			if f.Tensors[0].DType != dtype.Complex64 || f.Tensors[1].DType != dtype.Float8E4M3FN {
				t.Errorf("dtypes %v %v", f.Tensors[0].DType, f.Tensors[1].DType)
			}
		}},
	}
}

func TestReadAccepts(t *testing.T) {
	for _, c := range acceptCases() {
		t.Run(c.name, func(t *testing.T) {
			b := fileOf(c.hdr, c.data)
			f, err := Read(bytes.NewReader(b), int64(len(b)), "ok.safetensors")
			if err != nil {
				t.Fatal(err)
			}
			if c.check != nil {
				c.check(t, f)
			}
		})
	}
}
