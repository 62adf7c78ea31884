package atomic_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestSharedBlockCRCs: a state file three nodes fill in ranges that end
// inside blocks, each written in odd pieces, gets from the finalizer the
// CRC-32 of each 1 MiB block of its data, combined from the nodes'
// records. A record whose block CRC-32 or piece CRC-32 was damaged fails
// the finalizer naming the record and the file, and nothing is published;
// a record without block CRC-32s (written by an older ucp) gives a file
// without them.
func TestSharedBlockCRCs(t *testing.T) {
	const n = 3*atomic.BlockSize + 12345
	data := make([]byte, n)
	rng := rand.New(rand.NewPCG(28, 1))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	var want []byte
	for k := 0; k < n; k += atomic.BlockSize {
		want = binary.LittleEndian.AppendUint32(want, crc32.ChecksumIEEE(data[k:min(k+atomic.BlockSize, n)]))
	}
	// Node 0 writes both ends, nodes 1 and 2 the middle: every node
	// boundary falls inside a block, and block 1 has parts of all three.
	a, b, c := int64(700001), int64(atomic.BlockSize+300007), int64(2*atomic.BlockSize+5)
	ranges := [][][2]int64{{{0, a}, {c, n}}, {{a, b}}, {{b, c}}}
	const rel = "zero/w/fp32.pt"

	for _, tc := range []struct {
		name    string
		edit    func(piece map[string]any) // applied to node 1's first piece
		wantErr string
		blocks  bool
	}{
		{name: "intact", blocks: true},
		{name: "block CRC damaged", edit: func(p map[string]any) {
			raw, _ := base64.StdEncoding.DecodeString(p["block_crc32"].(string))
			raw[len(raw)-1] ^= 1
			p["block_crc32"] = base64.StdEncoding.EncodeToString(raw)
		}, wantErr: "block CRC-32s combine to"},
		{name: "piece CRC damaged", edit: func(p map[string]any) {
			p["CRC"] = p["CRC"].(float64) + 1
		}, wantErr: "block CRC-32s combine to"},
		{name: "block CRC missing", edit: func(p map[string]any) {
			raw, _ := base64.StdEncoding.DecodeString(p["block_crc32"].(string))
			p["block_crc32"] = base64.StdEncoding.EncodeToString(raw[4:])
		}, wantErr: "block CRC-32s for the 2 blocks"},
		{name: "record of an older ucp", edit: func(p map[string]any) { delete(p, "block_crc32") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "atomic")
			root := torchfile.NewBlob(dtype.Uint8, []int64{n}, nil)
			var w *atomic.Writer
			for node, rs := range ranges {
				var err error
				w, err = atomic.Create(dst, atomic.Options{Node: node, Nodes: len(ranges), PlanID: "p", NoSync: true, NoLatest: true, Dirs: []string{"zero/w"}})
				if err != nil {
					t.Fatal(err)
				}
				f, err := w.CreateFile(rel, root, true)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rs {
					for off := r[0]; off < r[1]; off += 300001 {
						end := min(off+300001, r[1])
						if err := f.WriteAt(0, data[off:end], off); err != nil {
							t.Fatal(err)
						}
					}
				}
				if _, err := f.Commit(); err != nil {
					t.Fatal(err)
				}
				if _, err := w.FinishNode(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.edit != nil {
				editRecord(t, filepath.Join(dst+atomic.PartialSuffix, ".ucp-nodes", "node-1.json"), tc.edit)
			}
			m, err := w.Finalize(func(recs *atomic.Records) (*atomic.Manifest, error) {
				e, err := w.FinishShared(rel, root, recs.Pieces[rel], recs.Parts[rel])
				if err != nil {
					return nil, err
				}
				return &atomic.Manifest{Format: atomic.ManifestFormat, Version: atomic.ManifestVersion,
					Params: []atomic.ParamEntry{{Name: "w", Shape: []int64{n}, DType: "uint8", Files: []atomic.StateEntry{{State: "fp32", FileEntry: e}}}}}, nil
			})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "node-1.json") || !strings.Contains(err.Error(), rel) {
					t.Fatalf("finalize: %v, want an error naming node-1.json and %s: %q", err, rel, tc.wantErr)
				}
				if _, err := os.Stat(dst); !os.IsNotExist(err) {
					t.Fatalf("%s published after a failed finalize", dst)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			e := m.Params[0].Files[0]
			if got := e.Blocks; tc.blocks && got != base64.StdEncoding.EncodeToString(want) || !tc.blocks && got != "" {
				t.Errorf("block_crc32 %q, want %q (or none: %v)", got, base64.StdEncoding.EncodeToString(want), !tc.blocks)
			}
			// The reader takes the file's block CRC-32s only once they
			// combine to its record's CRC-32.
			r, err := atomic.OpenReader(dst, atomic.ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			st, err := r.OpenState("w", "fp32")
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if (st.Blocks() != nil) != tc.blocks {
				t.Errorf("reader's block CRC-32s: %v, want %v", st.Blocks() != nil, tc.blocks)
			}
			got := make([]byte, n)
			if err := st.ReadRange(0, n, got); err != nil || !bytes.Equal(got, data) {
				t.Errorf("the file's data differ from what the nodes wrote (%v)", err)
			}
		})
	}
}

// editRecord applies edit to the first shared piece of a node record.
func editRecord(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	edit(rec["shared"].([]any)[0].(map[string]any)["pieces"].([]any)[0].(map[string]any))
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
