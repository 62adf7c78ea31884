package dcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/safetensors"
	"github.com/ucp-project/ucp/internal/testkit"
)

// safetensorsCheckpoint writes a two-rank DCP folder in torch's
// SerializationFormat.SAFETENSORS layout: each rank file holds its bytes
// items (torch.save streams) and then one safetensors blob with the rank's
// chunks; a chunk's recorded offset is the blob's start and its length
// the tensor's bytes. It returns the folder and the full tensor.
func safetensorsCheckpoint(t *testing.T, sharding func(rank int) string) (string, []float32) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	full := make([]float32, 12)
	for i := range full {
		full[i] = float32(i)*0.25 - 1
	}
	rows := func(a, b int) []byte {
		out := make([]byte, 0, 4*3*(b-a))
		for _, v := range full[3*a : 3*b] {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
		}
		return out
	}
	step, err := saveBytes(int64(7))
	if err != nil {
		t.Fatal(err)
	}
	md := &Metadata{PlannerData: map[string][]pyobj.Value{"model.w": {"model", "w"}, "step": {"step"}},
		PlannerOrder: []string{"model.w", "step"}}
	md.Entries = []*Entry{
		{Key: "model.w", DType: dtype.Float32, Size: []int64{4, 3}, Chunks: []Chunk{
			{Offsets: []int64{0, 0}, Sizes: []int64{2, 3}}, {Offsets: []int64{2, 0}, Sizes: []int64{2, 3}}}},
		{Key: "step", Bytes: true},
	}
	for rank := 0; rank < 2; rank++ {
		name := []string{"__0_0.distcp", "__1_0.distcp"}[rank]
		var file []byte
		if rank == 0 {
			file = append(file, step...)
			md.Storage = append(md.Storage, StorageEntry{Index: MetadataIndex{FQN: "step", Hint: -1},
				Info: StorageInfo{RelativePath: name, Length: int64(len(step))}})
		}
		blob, err := safetensors.Serialize([]safetensors.Entry{{Name: "model.w", DType: dtype.Float32, Shape: []int64{2, 3},
			Data: rows(2*rank, 2*rank+2)}}, map[string]string{"DCP_SHARDING_INFO": sharding(rank), "format": "pt"})
		if err != nil {
			t.Fatal(err)
		}
		md.Storage = append(md.Storage, StorageEntry{Index: MetadataIndex{FQN: "model.w", Offset: []int64{int64(2 * rank), 0}, HasOffset: true, Hint: int64(rank)},
			Info: StorageInfo{RelativePath: name, Offset: int64(len(file)), Length: 24}})
		file = append(file, blob...)
		if err := os.WriteFile(filepath.Join(dir, name), file, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := md.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, MetadataFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, full
}

func offsetsJSON(rank int) string {
	return `{"model.w": {"saved_offsets": [` + []string{"0, 0", "2, 0"}[rank] + `]}}`
}

func TestSafetensorsItems(t *testing.T) {
	dir, full := safetensorsCheckpoint(t, offsetsJSON)
	tbl, err := Index(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	dst := testkit.Convert(t, tbl, 1)
	got, _, err := testkit.ReadAtomic(filepath.Join(dst, atomic.StatePath("w", fragment.FP32)))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 0, 48)
	for _, v := range full {
		want = binary.LittleEndian.AppendUint32(want, math.Float32bits(v))
	}
	if !bytes.Equal(got, want) {
		t.Errorf("w = %x, want %x", got, want)
	}
	if v, _ := pyobj.Path(tbl.Extra, "step"); v != int64(7) {
		t.Errorf("step %v", v)
	}

	// A blob that saved the chunk at other offsets is refused.
	dir, _ = safetensorsCheckpoint(t, func(int) string { return `{"model.w": {"saved_offsets": [1, 0]}}` })
	if _, err := Index(context.Background(), dir, Options{}); err == nil || !strings.Contains(err.Error(), "saved \"model.w\" at offsets [1 0]") {
		t.Errorf("wrong saved_offsets: %v", err)
	}
}

// Tensor items holding only the chunk's elements (raw little-endian bytes,
// length numel x element size) read as well as torch.save streams.
func TestRawItems(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var file []byte
	want := make([]byte, 0, 48)
	for i := 0; i < 12; i++ {
		want = binary.LittleEndian.AppendUint32(want, math.Float32bits(float32(i)/3))
	}
	file = append(file, want...)
	file = append(file, 0x80, 0x3f) // bfloat16 1.0
	if err := os.WriteFile(filepath.Join(dir, "__0_0.distcp"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	md := &Metadata{Entries: []*Entry{
		{Key: "w", DType: dtype.Float32, Size: []int64{4, 3}, Chunks: []Chunk{{Offsets: []int64{0, 0}, Sizes: []int64{1, 3}}, {Offsets: []int64{1, 0}, Sizes: []int64{3, 3}}}},
		{Key: "s", DType: dtype.BFloat16, Size: []int64{}, Chunks: []Chunk{{Offsets: []int64{}, Sizes: []int64{}}}},
	}, Storage: []StorageEntry{
		{Index: MetadataIndex{FQN: "w", Offset: []int64{0, 0}, HasOffset: true}, Info: StorageInfo{RelativePath: "__0_0.distcp", Length: 12}},
		{Index: MetadataIndex{FQN: "w", Offset: []int64{1, 0}, HasOffset: true}, Info: StorageInfo{RelativePath: "__0_0.distcp", Offset: 12, Length: 36}},
		{Index: MetadataIndex{FQN: "s", Offset: []int64{}, HasOffset: true}, Info: StorageInfo{RelativePath: "__0_0.distcp", Offset: 48, Length: 2}},
	}}
	b, err := md.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, MetadataFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tbl, err := Index(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	dst := testkit.Convert(t, tbl, 1)
	got, _, err := testkit.ReadAtomic(filepath.Join(dst, atomic.StatePath("w", fragment.FP32)))
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("w = %x (%v), want %x", got, err, want)
	}
	got, _, err = testkit.ReadAtomic(filepath.Join(dst, atomic.StatePath("s", fragment.FP32)))
	if err != nil || !bytes.Equal(got, []byte{0, 0, 0x80, 0x3f}) {
		t.Errorf("s = %x (%v)", got, err)
	}
}
