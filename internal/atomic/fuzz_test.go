package atomic

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// seedManifest is a small valid manifest.
func seedManifest() []byte {
	m := Manifest{Format: ManifestFormat, Version: ManifestVersion, Source: SourceInfo{Format: "deepspeed", Degrees: Degrees{TP: 1, PP: 1, DP: 2}},
		Params: []ParamEntry{{Name: "embed.weight", Shape: []int64{37, 11}, DType: "float32", Pattern: "Shard-V", SplitDims: []int{-1},
			TPLayout: TPFromSource, Files: []StateEntry{{State: "fp32", FileEntry: FileEntry{Path: "zero/embed.weight/fp32.pt", Bytes: 2526, CRC32: "032279f8"}}}},
			{Name: "pos", Shape: []int64{1, 7}, DType: "int64", Frozen: true, Files: []StateEntry{{State: "fp32", FileEntry: FileEntry{Path: "zero/pos/fp32.pt", Bytes: 900, CRC32: "00000000"}}}}},
		Files: []FileEntry{{Path: "mp_rank_00_model_states.pt", Bytes: 13723, CRC32: "0badf00d"}}}
	b, _ := json.Marshal(m)
	return b
}

// FuzzManifest: ucp.json from disk never panics the parser or the reader
// index built on it; whatever is accepted has every path inside the
// checkpoint, shapes whose element count fits, and state dtypes with a
// size.
//
//	go test ./internal/atomic -run='^$' -fuzz=FuzzManifest -fuzztime=5m
func FuzzManifest(f *testing.F) {
	f.Add(seedManifest())
	f.Add([]byte(`{"format":"ucp-atomic","version":1,"params":[{"name":"a","shape":[-1],"files":[]}]}`))
	f.Add([]byte(`{"format":"ucp-atomic","version":1,"params":[{"name":"a","shape":[4611686018427387904,4],"files":[]}]}`))
	f.Add([]byte(`{"format":"ucp-atomic","version":1,"files":[{"path":"../x","bytes":1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest("fuzz/ucp.json", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz/ucp.json") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		r, err := newReader("fuzz", "fuzz", m, ReaderOptions{})
		if err != nil {
			return
		}
		for i := range r.Manifest.Params {
			p := &r.Manifest.Params[i]
			dt, err := p.StateDType()
			if err != nil || dt.Size() == 0 {
				t.Fatalf("accepted %s with dtype %q: %v", p.Name, p.DType, err)
			}
			n := int64(1)
			for _, d := range p.Shape {
				if d < 0 {
					t.Fatalf("accepted shape %v", p.Shape)
				}
				n *= d
			}
			if n < 0 || n > maxManifestNumel {
				t.Fatalf("accepted shape %v of %d elements", p.Shape, n)
			}
			if q, ok := r.Param(p.Name); !ok || q != p {
				t.Fatalf("parameter %s not indexed", p.Name)
			}
		}
		for _, e := range r.Manifest.AllFiles() {
			if CheckPath("fuzz", e.Path) != nil || e.Bytes < 0 {
				t.Fatalf("accepted file %+v", e)
			}
		}
	})
}

// FuzzJournal: a journal left in DST.partial (by a killed run, torn, or
// edited) never panics parseJournal, and every entry it offers for reuse
// names a file inside DST.partial other than the folder itself and ucp's
// own records, once, with a size that is not negative.
//
//	go test ./internal/atomic -run='^$' -fuzz=FuzzJournal -fuzztime=5m
func FuzzJournal(f *testing.F) {
	var seed bytes.Buffer
	enc := json.NewEncoder(&seed)
	enc.Encode(journalHead{Plan: "0123456789abcdef", Sources: []fsutil.FileID{{Path: "/src/a.pt", Size: 10, MtimeNs: 1, Inode: 2, CRC: "00000000"}}})
	enc.Encode(FileEntry{Path: "zero/a/fp32.pt", Bytes: 100, CRC32: "deadbeef"})
	enc.Encode(FileEntry{Path: "zero/a/fp32.pt", Bytes: 100, CRC32: "deadbeef"})
	enc.Encode(FileEntry{Path: ".ucp-nodes/done-0.jsonl", Bytes: 1, CRC32: "00000000"})
	f.Add(seed.Bytes())
	f.Add(append(seed.Bytes()[:seed.Len()-10:seed.Len()-10], []byte(`{"path":".","bytes":-1}`+"\n")...))
	f.Add([]byte(`{"plan":"x"}` + "\n" + `{"path":"a/../../b","bytes":1}` + "\n" + `{"path":"./a","bytes":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, entries, ok := parseJournal(bytes.NewReader(data), "fuzz")
		if !ok && entries != nil {
			t.Fatal("entries without a head")
		}
		seen := map[string]bool{}
		for _, e := range entries {
			if CheckPath("fuzz", e.Path) != nil || e.Path == "." || strings.HasPrefix(e.Path, nodesDir) || e.Bytes < 0 || seen[e.Path] {
				t.Fatalf("offered %+v", e)
			}
			seen[e.Path] = true
		}
	})
}
