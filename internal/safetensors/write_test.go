package safetensors

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
)

// The hexdumps of two worked examples (xxd columns; the fixtures
// spec_example1/2.safetensors hold the same bytes).
const (
	specExample1 = `
9000 0000 0000 0000 7b22 5f5f 6d65 7461
6461 7461 5f5f 223a 7b22 666f 726d 6174
223a 2270 7422 7d2c 2277 223a 7b22 6474
7970 6522 3a22 4633 3222 2c22 7368 6170
6522 3a5b 322c 335d 2c22 6461 7461 5f6f
6666 7365 7473 223a 5b30 2c32 345d 7d2c
2262 223a 7b22 6474 7970 6522 3a22 4246
3136 222c 2273 6861 7065 223a 5b32 5d2c
2264 6174 615f 6f66 6673 6574 7322 3a5b
3234 2c32 385d 7d7d 0000 0000 0000 803f
0000 0040 0000 4040 0000 8040 0000 a040
c03f 00c0`
	specExample2 = `
a800 0000 0000 0000 7b22 7374 6570 223a
7b22 6474 7970 6522 3a22 4936 3422 2c22
7368 6170 6522 3a5b 5d2c 2264 6174 615f
6f66 6673 6574 7322 3a5b 302c 385d 7d2c
2265 223a 7b22 6474 7970 6522 3a22 4631
3622 2c22 7368 6170 6522 3a5b 302c 345d
2c22 6461 7461 5f6f 6666 7365 7473 223a
5b38 2c38 5d7d 2c22 6d22 3a7b 2264 7479
7065 223a 2255 3822 2c22 7368 6170 6522
3a5b 335d 2c22 6461 7461 5f6f 6666 7365
7473 223a 5b38 2c31 315d 7d7d 2020 2020
0a00 0000 0000 0000 0102 03`
)

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.NewReplacer(" ", "", "\n", "").Replace(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func f32Bytes(v ...float32) []byte { return dtype.Float32Bytes(v) }

func TestSpecExamplesGolden(t *testing.T) {
	// §7: metadata {"format":"pt"}, which NewLayout adds by itself.
	ex1, err := Serialize([]Entry{
		{Name: "b", DType: dtype.BFloat16, Shape: []int64{2}, Data: []byte{0xc0, 0x3f, 0x00, 0xc0}},
		{Name: "w", DType: dtype.Float32, Shape: []int64{2, 3}, Data: f32Bytes(0, 1, 2, 3, 4, 5)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// §8: no metadata at all, as the reference writes for metadata=None.
	l, err := NewRawLayout([]Entry{
		{Name: "m", DType: dtype.Uint8, Shape: []int64{3}, Data: []byte{1, 2, 3}},
		{Name: "step", DType: dtype.Int64, Shape: []int64{}, Data: []byte{10, 0, 0, 0, 0, 0, 0, 0}},
		{Name: "e", DType: dtype.Float16, Shape: []int64{0, 4}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ex2, err := l.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		got     []byte
		want    string
		fixture string
	}{
		{"example 1", ex1, specExample1, "spec_example1.safetensors"},
		{"example 2", ex2, specExample2, "spec_example2.safetensors"},
	} {
		want := mustHex(t, c.want)
		if !bytes.Equal(c.got, want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, c.got, want)
		}
		fix, err := os.ReadFile(filepath.Join(fixtureDir, c.fixture))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fix, want) {
			t.Errorf("%s: fixture %s differs from the hexdump", c.name, c.fixture)
		}
	}
	if l.Offset(2) != 8+168+8 || l.NBytes(2) != 0 || l.Offset(0) != 8+168+8 || l.Offset(1) != 8+168 || l.Size() != 187 {
		t.Errorf("offsets %d %d %d size %d", l.Offset(0), l.Offset(1), l.Offset(2), l.Size())
	}
	if got := l.Order(); !reflect.DeepEqual(got, []int{1, 2, 0}) {
		t.Errorf("order %v, want [1 2 0] (I64, F16, U8)", got)
	}
}

// Every fixture written by the reference writer's rules (from torch
// tensors, in Python) is reproduced byte for byte from what the reader
// returns, whatever the order of the entries given to the writer.
func TestRewriteFixturesGolden(t *testing.T) {
	want := loadExpected(t)
	for _, fname := range sortedNames(want) {
		t.Run(fname, func(t *testing.T) {
			path := filepath.Join(fixtureDir, fname)
			orig, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := Read(bytes.NewReader(orig), int64(len(orig)), path)
			if err != nil {
				t.Fatal(err)
			}
			entries := entriesOf(t, f)
			rand.New(rand.NewPCG(1, uint64(len(entries)))).Shuffle(len(entries), func(i, j int) { entries[i], entries[j] = entries[j], entries[i] })
			l, err := NewRawLayout(entries, f.Metadata)
			if err != nil {
				t.Fatal(err)
			}
			out, err := l.Serialize()
			if err != nil {
				t.Fatal(err)
			}
			canonical := fname != "unaligned.safetensors" && fname != "pretty.safetensors"
			if canonical && !bytes.Equal(out, orig) {
				t.Errorf("rewrite differs:\n got %q\nwant %q", out, orig)
			}
			if !canonical && bytes.Equal(out, orig) {
				t.Errorf("non-canonical fixture rewrote to identical bytes")
			}
			// Either way the rewrite reads back to the same tensors.
			g, err := Read(bytes.NewReader(out), int64(len(out)), "rewrite")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(g.Metadata, f.Metadata) || !reflect.DeepEqual(entriesOf(t, g), sortByName(entriesOf(t, f), g.Names())) {
				t.Errorf("round trip differs")
			}
		})
	}
}

func entriesOf(t *testing.T, f *File) []Entry {
	t.Helper()
	var out []Entry
	for i := range f.Tensors {
		tt := &f.Tensors[i]
		data, err := f.ReadTensor(tt)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, Entry{Name: tt.Name, DType: tt.DType, Shape: tt.Shape, Data: data})
	}
	return out
}

func sortByName(es []Entry, names []string) []Entry {
	by := map[string]Entry{}
	for _, e := range es {
		by[e.Name] = e
	}
	var out []Entry
	for _, n := range names {
		out = append(out, by[n])
	}
	return out
}

func TestNewLayoutMetadata(t *testing.T) {
	for _, c := range []struct {
		meta map[string]string
		raw  bool
		want string
	}{
		{nil, false, `{"__metadata__":{"format":"pt"}}`},
		{map[string]string{}, false, `{"__metadata__":{"format":"pt"}}`},
		{map[string]string{"format": "tf"}, false, `{"__metadata__":{"format":"tf"}}`},
		{map[string]string{"z": "1", "a": "2", "é": "3"}, false, `{"__metadata__":{"a":"2","format":"pt","z":"1","é":"3"}}`},
		{nil, true, `{}`},
		{map[string]string{}, true, `{"__metadata__":{}}`},
		{map[string]string{"k\"\\\x00\x1f\x7f\b\f\n\r\t/": "ü"}, true, `{"__metadata__":{"k\"\\\u0000\u001f` + "\x7f" + `\b\f\n\r\t/":"ü"}}`},
	} {
		var l *Layout
		var err error
		if c.raw {
			l, err = NewRawLayout(nil, c.meta)
		} else {
			l, err = NewLayout(nil, c.meta)
		}
		if err != nil {
			t.Fatal(err)
		}
		h := l.Header()
		js := strings.TrimRight(string(h[8:]), " ")
		if js != c.want || len(h)%8 != 0 || int(h[0]) != len(h)-8 || len(h)-8-len(js) >= 8 || l.Size() != int64(len(h)) {
			t.Errorf("metadata %q: header %q, want %q padded to a multiple of 8", c.meta, h, c.want)
		}
		b, _ := l.Serialize()
		f, err := Read(bytes.NewReader(b), int64(len(b)), "m")
		if err != nil {
			t.Fatal(err)
		}
		if c.raw && !reflect.DeepEqual(f.Metadata, c.meta) {
			t.Errorf("metadata read back as %q, want %q", f.Metadata, c.meta)
		}
	}
	if meta := map[string]string{"a": "b"}; func() bool { NewLayout(nil, meta); return len(meta) != 1 }() {
		t.Error("NewLayout modified the caller's metadata")
	}
}

// Names are escaped as serde_json does, and sorted by dtype rank then
// byte-wise name.
func TestLayoutOrderAndEscaping(t *testing.T) {
	var entries []Entry
	for _, d := range []dtype.DType{dtype.Bool, dtype.Uint8, dtype.Int8, dtype.Float8E5M2, dtype.Float8E4M3FN, dtype.Float8E4M3FNUZ,
		dtype.Float8E5M2FNUZ, dtype.Int16, dtype.Uint16, dtype.Float16, dtype.BFloat16, dtype.Int32, dtype.Uint32, dtype.Float32,
		dtype.Complex64, dtype.Float64, dtype.Int64, dtype.Uint64} {
		entries = append(entries, Entry{Name: d.SafetensorsName(), DType: d, Shape: []int64{1}})
	}
	entries = append(entries,
		Entry{Name: "b\x01\"é", DType: dtype.Float32, Shape: []int64{1}},
		Entry{Name: "B", DType: dtype.Float32, Shape: []int64{1}},
		Entry{Name: "", DType: dtype.Float32, Shape: []int64{1}},
	)
	l, err := NewRawLayout(entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range l.Order() {
		got = append(got, entries[i].Name)
	}
	want := []string{"U64", "I64", "F64", "C64", "", "B", "F32", "b\x01\"é", "U32", "I32", "BF16", "F16", "U16", "I16",
		"F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E4M3", "F8_E5M2", "I8", "U8", "BOOL"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("order %q\nwant  %q", got, want)
	}
	if !strings.Contains(string(l.Header()), `"b\u0001\"é":{"dtype":"F32","shape":[1],"data_offsets":[`) {
		t.Errorf("escaping: %s", l.Header())
	}
	// Offsets are aligned to min(8, element size): the reference layout's property.
	for i, e := range entries {
		if a := int64(min(8, e.DType.Size())); l.Offset(i)%a != 0 {
			t.Errorf("%s at %d not aligned to %d", e.Name, l.Offset(i), a)
		}
	}
}

func TestLayoutErrors(t *testing.T) {
	f32 := func(name string, shape ...int64) Entry { return Entry{Name: name, DType: dtype.Float32, Shape: shape} }
	for _, c := range []struct {
		name    string
		entries []Entry
		meta    map[string]string
		want    string
	}{
		{"duplicate", []Entry{f32("a", 1), f32("a", 2)}, nil, `tensor "a": duplicate name`},
		{"reserved", []Entry{f32("__metadata__", 1)}, nil, "reserved"},
		{"bad UTF-8 name", []Entry{f32("a\xff", 1)}, nil, "not valid UTF-8"},
		{"bad UTF-8 metadata", nil, map[string]string{"k": "\xc3"}, "valid UTF-8"},
		{"complex128", []Entry{{Name: "c", DType: dtype.Complex128, Shape: []int64{1}}}, nil, "complex128 cannot be stored"},
		{"invalid dtype", []Entry{{Name: "c", Shape: []int64{1}}}, nil, "cannot be stored"},
		{"negative dim", []Entry{f32("a", 2, -1)}, nil, "negative dimension"},
		{"overflow", []Entry{f32("a", 1<<40, 1<<40)}, nil, "overflows"},
		{"total overflow", []Entry{f32("a", 1<<60), f32("b", 1<<60)}, nil, "2^63-1"},
		{"data size", []Entry{{Name: "a", DType: dtype.Float32, Shape: []int64{2}, Data: make([]byte, 7)}}, nil, `tensor "a": 7 bytes of data for float32 [2], want 8`},
		{"header too large", []Entry{f32(strings.Repeat("x", MaxHeaderSize), 1)}, nil, "header too large"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewLayout(c.entries, c.meta)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
		})
	}
	// Found by FuzzRead: the reader accepts an empty tensor whose other
	// dimensions multiply past 2^63, so the writer must too.
	l, err := NewLayout([]Entry{{Name: "e", DType: dtype.Uint8, Shape: []int64{2170000000, 7000000000, 0}}}, nil)
	if err != nil || l.NBytes(0) != 0 {
		t.Errorf("empty tensor with large dimensions: %v", err)
	}
	l, _ = NewLayout([]Entry{f32("a", 2)}, nil)
	if _, err := l.Serialize(); err == nil || !strings.Contains(err.Error(), `tensor "a": no data`) {
		t.Errorf("Serialize without data: %v", err)
	}
	dir := t.TempDir()
	if err := Save(filepath.Join(dir, "x.safetensors"), []Entry{f32("a", 2)}, nil); err == nil || !strings.Contains(err.Error(), "no data") {
		t.Errorf("Save without data: %v", err)
	}
	if err := Save(filepath.Join(dir, "missing", "x.safetensors"), nil, nil); err == nil || !strings.Contains(err.Error(), "x.safetensors") {
		t.Errorf("Save into a missing directory: %v", err)
	}
	assertOnly(t, dir)
}

// assertOnly checks that dir holds exactly the named files (no temp files).
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("directory holds %q, want %q", got, names)
	}
}

// A writer fed concurrently in chunks, out of order, gives the same bytes
// as the one-shot serialisation.
func TestWriterConcurrent(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var entries, bare []Entry
	for i, d := range []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Int64, dtype.Uint8, dtype.Bool, dtype.Float64} {
		shape := []int64{int64(1 + rng.IntN(300)), int64(1 + rng.IntN(7))}
		e := Entry{Name: fmt.Sprintf("layer.%d.w", i), DType: d, Shape: shape}
		n, _ := entryBytes(e)
		e.Data = make([]byte, n)
		for j := range e.Data {
			e.Data[j] = byte(rng.Uint32())
		}
		entries = append(entries, e)
		bare = append(bare, Entry{Name: e.Name, DType: d, Shape: shape})
	}
	bare = append(bare, Entry{Name: "empty", DType: dtype.Float32, Shape: []int64{0}})
	entries = append(entries, bare[len(bare)-1])
	want, err := Serialize(entries, map[string]string{"step": "3"})
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	if err := os.WriteFile(path, []byte("old contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := Create(path, bare, map[string]string{"step": "3"})
	if err != nil {
		t.Fatal(err)
	}
	type job struct {
		i   int
		off int64
		p   []byte
	}
	var jobs []job
	for i, e := range entries {
		for off := 0; off < len(e.Data); {
			n := min(len(e.Data)-off, 1+rng.IntN(97))
			jobs = append(jobs, job{i, int64(off), e.Data[off : off+n]})
			off += n
		}
	}
	rng.Shuffle(len(jobs), func(a, b int) { jobs[a], jobs[b] = jobs[b], jobs[a] })
	var wg sync.WaitGroup
	errs := make(chan error, len(jobs))
	for k := 0; k < 8; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			for j := k; j < len(jobs); j += 8 {
				if err := w.WriteAt(jobs[j].i, jobs[j].p, jobs[j].off); err != nil {
					errs <- err
				}
			}
		}(k)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old contents" {
		t.Error("target replaced before Commit")
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("concurrent write differs from Serialize")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", st.Mode())
	}
	assertOnly(t, dir, "model.safetensors")
	if err := w.Commit(); err == nil {
		t.Error("second Commit succeeded")
	}
	w.Abort() // no-op after Commit
	assertOnly(t, dir, "model.safetensors")

	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata["step"] != "3" || f.Metadata["format"] != "pt" {
		t.Errorf("metadata %v", f.Metadata)
	}
	for _, e := range entries {
		tt, ok := f.Tensor(e.Name)
		if !ok {
			t.Fatalf("%s missing", e.Name)
		}
		b, err := f.ReadTensor(tt)
		if err != nil || !bytes.Equal(b, e.Data) || tt.DType != e.DType || !reflect.DeepEqual(tt.Shape, e.Shape) {
			t.Errorf("%s read back differs (%v)", e.Name, err)
		}
	}
}

func TestWriterCoverage(t *testing.T) {
	entries := []Entry{
		{Name: "a", DType: dtype.Float32, Shape: []int64{4}},
		{Name: "b", DType: dtype.Uint8, Shape: []int64{3}},
	}
	data := make([]byte, 16)
	for _, c := range []struct {
		name   string
		writes func(w *Writer) error
		want   string
	}{
		{"nothing written", func(w *Writer) error { return nil }, `tensor "a": bytes [0, 16) were never written`},
		{"hole", func(w *Writer) error {
			w.WriteAt(0, data[:4], 0)
			w.WriteAt(1, data[:3], 0)
			return w.WriteAt(0, data[:8], 8)
		}, `tensor "a": bytes [4, 8) were never written`},
		{"tail missing", func(w *Writer) error {
			w.WriteAt(0, data, 0)
			return w.WriteAt(1, data[:2], 0)
		}, `tensor "b": bytes [2, 3) were never written`},
		{"twice", func(w *Writer) error {
			w.WriteAt(0, data, 0)
			w.WriteAt(1, data[:3], 0)
			return w.WriteAt(1, data[:1], 2)
		}, `tensor "b": bytes [2, 3) were written more than once`},
		{"overlap", func(w *Writer) error {
			w.WriteAt(1, data[:3], 0)
			w.WriteAt(0, data[:10], 0)
			return w.WriteAt(0, data[:8], 8)
		}, `tensor "a": bytes [8, 10) were written more than once`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "x.safetensors")
			w, err := Create(path, entries, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.writes(w); err != nil {
				t.Fatal(err)
			}
			err = w.Commit()
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("Commit: %v, want %q", err, c.want)
			}
			assertOnly(t, dir)
		})
	}

	dir := t.TempDir()
	w, err := Create(filepath.Join(dir, "x.safetensors"), entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		i    int
		n    int
		off  int64
		want string
	}{
		{2, 1, 0, "no tensor 2"},
		{-1, 1, 0, "no tensor -1"},
		{0, 17, 0, `tensor "a": write of 17 bytes at 0 outside its 16 bytes`},
		{0, 1, 16, "outside"},
		{0, 1, -1, "outside"},
		{1, 1, 1 << 62, "outside"},
	} {
		if err := w.WriteAt(c.i, make([]byte, c.n), c.off); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("WriteAt(%d, %d bytes, %d): %v, want %q", c.i, c.n, c.off, err, c.want)
		}
	}
	w.Abort()
	assertOnly(t, dir)
	if err := w.Commit(); err == nil {
		t.Error("Commit after Abort succeeded")
	}
}

func TestSaveRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.safetensors")
	entries := []Entry{
		{Name: "scalar", DType: dtype.Float64, Shape: []int64{}, Data: []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x3f}},
		{Name: "empty", DType: dtype.BFloat16, Shape: []int64{2, 0}},
		{Name: "x.y/z", DType: dtype.Int32, Shape: []int64{2}, Data: []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}},
	}
	if err := Save(path, entries, map[string]string{"format": "pt", "note": "n"}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := strings.Join(f.Names(), ","); got != "scalar,x.y/z,empty" {
		t.Errorf("order %s", got)
	}
	vals, err := f.ReadFloat32(&f.Tensors[0], 0, 1)
	if err != nil || len(vals) != 1 || vals[0] != 1 {
		t.Errorf("scalar %v %v", vals, err)
	}
	vals, err = f.ReadFloat32(&f.Tensors[1], 0, 2)
	if err != nil || vals[0] != 1 || vals[1] != -1 {
		t.Errorf("int32 %v %v", vals, err)
	}
	if e := f.Tensors[2]; e.NBytes != 0 || e.Numel() != 0 || !reflect.DeepEqual(e.Shape, []int64{2, 0}) {
		t.Errorf("empty %+v", e)
	}
}
