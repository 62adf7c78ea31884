package dcp

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

func obj(module, name string, state pyobj.Value) *pyobj.Object { return newObject(module, name, state) }

// sample builds a Metadata pickle tree by hand, as the layouts of several
// torch versions (and Megatron) shape it.
func sample(props pyobj.Value, info *pyobj.Dict, extra ...pyobj.Value) pyobj.Value {
	chunk := obj(metaModule, "ChunkStorageMetadata", pyobj.DictOf("offsets", pyobj.Size{0}, "sizes", pyobj.Size{3}))
	sdm := pyobj.DictOf(
		"w", obj(metaModule, "TensorStorageMetadata", pyobj.DictOf("properties", props, "size", pyobj.Size{3},
			"chunks", &pyobj.List{Items: []pyobj.Value{chunk}})),
		"b", obj(metaModule, "BytesStorageMetadata", nil))
	sd := pyobj.NewDict(pyobj.PlainDict)
	sd.Set(obj(metaModule, "MetadataIndex", pyobj.DictOf("fqn", "w", "index", int64(0), "offset", pyobj.Size{0})),
		obj(fsModule, "_StorageInfo", info))
	sd.Set(obj(metaModule, "MetadataIndex", pyobj.DictOf("fqn", "b", "index", nil)),
		obj(fsModule, "_StorageInfo", pyobj.DictOf("relative_path", "__0_0.distcp", "offset", int64(0), "length", int64(5))))
	state := pyobj.DictOf("state_dict_metadata", sdm, "planner_data", pyobj.DictOf("w", pyobj.Tuple{"w"}), "storage_data", sd)
	for i := 0; i+1 < len(extra); i += 2 {
		state.Set(extra[i], extra[i+1])
	}
	return obj(metaModule, "Metadata", state)
}

func newProps(enc pyobj.Value) pyobj.Value {
	return obj("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties", pyobj.Tuple{
		pyobj.DType{DType: dtype.BFloat16},
		&pyobj.Object{Class: &pyobj.Global{Module: "torch.serialization", Name: "_get_layout"}, Via: pyobj.ByReduce, Args: []pyobj.Value{"torch.strided"}},
		false, enc, false})
}

// propsWith is newProps(0) with item i of the state replaced by v.
func propsWith(i int, v pyobj.Value) pyobj.Value {
	p := newProps(int64(0)).(*pyobj.Object)
	st := append(pyobj.Tuple(nil), p.State.(pyobj.Tuple)...)
	st[i] = v
	p.State = st
	return p
}

func TestMetadataVariants(t *testing.T) {
	byValue := &pyobj.Object{Class: &pyobj.Global{Module: "torch.distributed._shard.sharded_tensor.metadata", Name: "MEM_FORMAT_ENCODING"},
		Via: pyobj.ByReduce, Args: []pyobj.Value{int64(1)}}
	info := pyobj.DictOf("relative_path", "__0_0.distcp", "offset", int64(5), "length", int64(100))
	tests := []struct {
		name  string
		v     pyobj.Value
		check func(t *testing.T, md *Metadata)
	}{
		{"enum by value, old module", sample(newProps(byValue), info), func(t *testing.T, md *Metadata) {
			e, _ := md.Entry("w")
			if e.DType != dtype.BFloat16 || e.Props.MemoryFormat != 1 || e.Props.Layout != "torch.strided" {
				t.Errorf("properties %+v %v", e.Props, e.DType)
			}
		}},
		{"properties as an attribute dict", sample(obj(metaModule, "TensorProperties", pyobj.DictOf("dtype", pyobj.DType{DType: dtype.Float16})), info),
			func(t *testing.T, md *Metadata) {
				if e, _ := md.Entry("w"); e.DType != dtype.Float16 {
					t.Errorf("dtype %v", e.DType)
				}
			}},
		{"transform descriptors", sample(newProps(int64(0)), pyobj.DictOf("relative_path", "__0_0.distcp", "offset", int64(5), "length", int64(9),
			"transform_descriptors", &pyobj.List{Items: []pyobj.Value{"stream.zstd/1"}})), func(t *testing.T, md *Metadata) {
			si, ok := md.Lookup("w", []int64{0}, true)
			if !ok || fmt.Sprint(si.Transforms) != "[stream.zstd/1]" {
				t.Errorf("storage %+v", si)
			}
		}},
		{"Megatron's extra attributes and a str checkpoint_id", sample(newProps(int64(0)), info,
			"all_local_plans", &pyobj.List{Items: []pyobj.Value{obj("torch.distributed.checkpoint.planner", "SavePlan", pyobj.NewDict(pyobj.PlainDict))}},
			"storage_meta", obj(metaModule, "StorageMeta", pyobj.DictOf("checkpoint_id", "/ckpt/x", "save_id", "s", "load_id", nil)),
			"version", "1.0.0"),
			func(t *testing.T, md *Metadata) {
				// ucp does not write attributes it does not know.
				if (len(md.Fields) == 6) != (fmt.Sprint(md.Unknown) == "[all_local_plans]") || md.StorageMeta.CheckpointID != "/ckpt/x" || md.Version != "1.0.0" {
					t.Errorf("unknown %v, storage_meta %+v, version %q", md.Unknown, md.StorageMeta, md.Version)
				}
			}},
		{"a bytes index without offset is not the 0-dim one", sample(newProps(int64(0)), info), func(t *testing.T, md *Metadata) {
			if _, ok := md.Lookup("b", nil, false); !ok {
				t.Error("bytes item not found")
			}
			if _, ok := md.Lookup("b", []int64{}, true); ok {
				t.Error("bytes item found as a 0-dim tensor")
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := pyobj.Marshal(tc.v, nil)
			if err != nil {
				t.Fatal(err)
			}
			md, err := ParseMetadata(b)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, md)
			// What ucp writes reads back the same.
			b2, err := md.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			md2, err := ParseMetadata(b2)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, md2)
		})
	}
}

func TestMetadataErrors(t *testing.T) {
	info := pyobj.DictOf("relative_path", "__0_0.distcp", "offset", int64(5), "length", int64(100))
	badChunks := sample(newProps(int64(0)), info)
	badChunks.(*pyobj.Object).State.(*pyobj.Dict).Set("storage_data", &pyobj.List{})
	tests := []struct {
		name string
		v    pyobj.Value
		want string
	}{
		{"a dict", pyobj.DictOf("state_dict_metadata", 1), "not a torch.distributed.checkpoint Metadata"},
		{"no state_dict_metadata", obj(metaModule, "Metadata", pyobj.DictOf("planner_data", nil)), "no state_dict_metadata"},
		{"storage_data a list", badChunks, `["storage_data"]: got list, want dict`},
		{"negative offset", sample(newProps(int64(0)), pyobj.DictOf("relative_path", "x", "offset", int64(-1), "length", int64(1))), "offset -1 is negative"},
		{"no dtype", sample(obj(metaModule, "TensorProperties", pyobj.Tuple{nil, nil, false, nil, false}), info), "not a torch dtype"},
		{"sparse layout", sample(obj(metaModule, "TensorProperties", pyobj.Tuple{pyobj.DType{DType: dtype.Float32},
			&pyobj.Object{Class: &pyobj.Global{Module: "torch.serialization", Name: "_get_layout"}, Via: pyobj.ByReduce, Args: []pyobj.Value{"torch.sparse_coo"}},
			false, int64(0), false}), info), "layout torch.sparse_coo is not supported"},
		// Malformed values that were once read as absent or default.
		{"modules a str", sample(newProps(int64(0)), info, "storage_meta", obj(metaModule, "StorageMeta", pyobj.DictOf("modules", "m"))),
			`["storage_meta"].modules: got str, want a list of str`},
		{"checkpoint_id an int", sample(newProps(int64(0)), info, "storage_meta", obj(metaModule, "StorageMeta", pyobj.DictOf("checkpoint_id", int64(3)))),
			`["storage_meta"].checkpoint_id: checkpoint_id is int, not a str or a path`},
		{"checkpoint_id parts not str", sample(newProps(int64(0)), info, "storage_meta", obj(metaModule, "StorageMeta", pyobj.DictOf("checkpoint_id",
			&pyobj.Object{Class: &pyobj.Global{Module: "pathlib", Name: "PosixPath"}, Via: pyobj.ByReduce, Args: []pyobj.Value{"/", int64(1)}}))),
			`.checkpoint_id["args"]: got tuple, want a list of str`},
		{"version an int", sample(newProps(int64(0)), info, "version", int64(1)), `["version"]: got int, want str`},
		{"layout without a name", sample(propsWith(1, &pyobj.Object{Class: &pyobj.Global{Module: "torch.serialization", Name: "_get_layout"}, Via: pyobj.ByReduce}), info),
			"_get_layout with 0 arguments, not a layout name"},
		{"layout an int", sample(propsWith(1, int64(0)), info), "TensorProperties.layout is int, not a torch.layout"},
		{"layout a sparse global", sample(propsWith(1, &pyobj.Global{Module: "torch", Name: "sparse_csr"}), info), "layout torch.sparse_csr is not supported"},
		{"requires_grad an int", sample(propsWith(2, int64(1)), info), `.properties[2]: got int, want bool`},
		{"pin_memory a str", sample(propsWith(4, "no"), info), `.properties[4]: got str, want bool`},
		{"memory format a str", sample(newProps("contiguous"), info), `unknown memory format "contiguous"`},
		{"memory format enum of two args", sample(newProps(&pyobj.Object{Class: &pyobj.Global{Module: metaModule, Name: "_MEM_FORMAT_ENCODING"},
			Via: pyobj.ByReduce, Args: []pyobj.Value{int64(0), int64(1)}}), info), "unknown memory format"},
		{"transform descriptors of ints", sample(newProps(int64(0)), pyobj.DictOf("relative_path", "x", "offset", int64(0), "length", int64(1),
			"transform_descriptors", &pyobj.List{Items: []pyobj.Value{int64(1)}})), ".transform_descriptors: got list, want a list of str"},
		{"relative_path an int", sample(newProps(int64(0)), pyobj.DictOf("relative_path", int64(0), "offset", int64(0), "length", int64(1))),
			".relative_path: got int, want str"},
		{"a planner path of floats", sample(newProps(int64(0)), info, "planner_data", pyobj.DictOf("w", pyobj.Tuple{1.5})),
			`planner_data["w"] has a path element of type float`},
		{"an attribute named by an int", obj(metaModule, "Metadata", pyobj.DictOf(int64(1), nil)), "key 1 is int, want str"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := pyobj.Marshal(tc.v, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ParseMetadata(b); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// FuzzMetadata feeds damaged .metadata pickles to the parser: it must
// return an error or a Metadata that ucp writes and reads back the same,
// never panic.
func FuzzMetadata(f *testing.F) {
	seeds, _ := filepath.Glob(testkit.Fixture("dcp", "*", "checkpoint", MetadataFile))
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, v := range []pyobj.Value{sample(newProps(int64(0)), pyobj.DictOf("relative_path", "a", "offset", int64(0), "length", int64(1)))} {
		b, _ := pyobj.Marshal(v, nil)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		md, err := ParseMetadata(data)
		if err != nil {
			return
		}
		b, err := md.Marshal()
		if err != nil {
			t.Fatalf("parsed metadata does not marshal: %v", err)
		}
		md2, err := ParseMetadata(b)
		if err != nil {
			t.Fatalf("marshalled metadata does not parse: %v", err)
		}
		if len(md2.Entries) != len(md.Entries) || len(md2.Storage) != len(md.Storage) {
			t.Fatalf("round trip: %d entries, %d storage; want %d, %d", len(md2.Entries), len(md2.Storage), len(md.Entries), len(md.Storage))
		}
		for i, e := range md.Entries {
			e2 := md2.Entries[i]
			if e.Key != e2.Key || e.Bytes != e2.Bytes || e.DType != e2.DType || fmt.Sprint(e.Size, e.Chunks) != fmt.Sprint(e2.Size, e2.Chunks) {
				t.Fatalf("entry %d: %+v became %+v", i, e, e2)
			}
		}
	})
}

// TestMetadataBudget: a .metadata is decoded within the budget of the
// checkpoint it describes (it and the .distcp files beside it), not of
// its own size: 3 MB of dense pickle is past the 256 MiB floor alone,
// and within the budget of a checkpoint of 300 MB of data.
func TestMetadataBudget(t *testing.T) {
	dir := t.TempDir()
	md := filepath.Join(dir, MetadataFile)
	if err := os.WriteFile(md, []byte("\x80\x02"+strings.Repeat("N0", 1_500_000)+"N."), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMetadata(md); err == nil || !strings.HasPrefix(err.Error(), md+": ") ||
		!strings.Contains(err.Error(), "more than its memory budget of 256 MiB") {
		t.Fatalf("alone: %v", err)
	}
	// A sparse 300 MB data file: the budget grows to 16 times the checkpoint.
	f, err := os.Create(filepath.Join(dir, "__0_0.distcp"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(300 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := ReadMetadata(md); err == nil || strings.Contains(err.Error(), "budget") ||
		!strings.Contains(err.Error(), "not a torch.distributed.checkpoint Metadata") {
		t.Fatalf("beside 300 MB of data: %v", err)
	}
}
