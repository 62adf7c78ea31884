package safetensors

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzRead checks that Read never panics, hangs or allocates beyond what
// the input justifies, and that whatever it accepts is self-consistent:
// tensors tile the data exactly, and the writer reproduces a file that
// reads back the same and is a fixed point of rewriting.
//
//	go test ./safetensors -run='^$' -fuzz=FuzzRead -fuzztime=2m
func FuzzRead(f *testing.F) {
	paths, err := filepath.Glob(filepath.Join(fixtureDir, "*.safetensors"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no fixtures: %v", err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, c := range acceptCases() {
		f.Add(fileOf(c.hdr, c.data))
	}
	for _, c := range invalidCases() {
		f.Add(c.file)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sf, err := Read(bytes.NewReader(data), int64(len(data)), "fuzz")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		at := sf.DataStart()
		for i := range sf.Tensors {
			tt := &sf.Tensors[i]
			if tt.Offset != at || tt.NBytes != tt.Numel()*int64(tt.DType.Size()) {
				t.Fatalf("tensor %q at %d+%d (numel %d), expected at %d", tt.Name, tt.Offset, tt.NBytes, tt.Numel(), at)
			}
			at += tt.NBytes
			if p, ok := sf.Tensor(tt.Name); !ok || p != tt {
				t.Fatalf("lookup of %q failed", tt.Name)
			}
		}
		if at != int64(len(data)) {
			t.Fatalf("tensors end at %d of %d bytes", at, len(data))
		}

		entries := entriesOf(t, sf)
		l, err := NewRawLayout(entries, sf.Metadata)
		if err != nil {
			t.Fatalf("accepted file cannot be rewritten: %v", err)
		}
		out, err := l.Serialize()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Read(bytes.NewReader(out), int64(len(out)), "rewrite")
		if err != nil {
			t.Fatalf("rewrite unreadable: %v", err)
		}
		if !reflect.DeepEqual(back.Metadata, sf.Metadata) {
			t.Fatalf("metadata %q became %q", sf.Metadata, back.Metadata)
		}
		if got, want := entriesOf(t, back), sortByName(entries, back.Names()); len(got) != len(entries) || !reflect.DeepEqual(got, want) {
			t.Fatalf("tensors changed in rewrite")
		}
		l2, err := NewRawLayout(entriesOf(t, back), back.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		if out2, _ := l2.Serialize(); !bytes.Equal(out, out2) {
			t.Fatalf("rewrite is not a fixed point")
		}
	})
}
