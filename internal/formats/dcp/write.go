package dcp

import (
	"fmt"
	"hash/crc32"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Module paths of the classes a current torch (2.4 and later) pickles
// into .metadata.
const (
	metaModule = "torch.distributed.checkpoint.metadata"
	fsModule   = "torch.distributed.checkpoint.filesystem"
	// CurrentVersion is Metadata.version as torch 2.6 and later write it.
	CurrentVersion = "1.0.0"
)

// memoryFormats are the _MEM_FORMAT_ENCODING members by value.
var memoryFormats = map[int64]string{0: "TORCH_CONTIGUOUS_FORMAT", 1: "TORCH_CHANNELS_LAST", 2: "TORCH_PRESERVE_FORMAT"}

func newObject(module, name string, state pyobj.Value) *pyobj.Object {
	return &pyobj.Object{Class: &pyobj.Global{Module: module, Name: name}, Via: pyobj.ByNewObj, State: state, Built: state != nil}
}

func size(s []int64) pyobj.Size { return pyobj.Size(append([]int64{}, s...)) }

// Marshal encodes the metadata as the pickle torch.distributed.checkpoint
// loads: Metadata and the classes it references under torch's current
// module paths, TensorProperties as its __getstate__ tuple, the memory
// format enum by name. Pickle protocol 2: every loader reads it.
func (m *Metadata) Marshal() ([]byte, error) {
	sdm := pyobj.NewDict(pyobj.PlainDict)
	for _, e := range m.Entries {
		if e.Bytes {
			sdm.Set(e.Key, newObject(metaModule, "BytesStorageMetadata", nil))
			continue
		}
		if !e.DType.Valid() {
			return nil, fmt.Errorf("%q has no dtype", e.Key)
		}
		if _, ok := memoryFormats[e.Props.MemoryFormat]; !ok {
			return nil, fmt.Errorf("%q has the unknown memory format encoding %d", e.Key, e.Props.MemoryFormat)
		}
		props := pyobj.Tuple{
			pyobj.DType{DType: e.DType},
			&pyobj.Object{Class: &pyobj.Global{Module: "torch.serialization", Name: "_get_layout"}, Via: pyobj.ByReduce,
				Args: []pyobj.Value{"torch.strided"}},
			e.Props.RequiresGrad,
			// The enum member by name, as Python >= 3.11 pickles it:
			// builtins.getattr(_MEM_FORMAT_ENCODING, 'TORCH_...').
			&pyobj.Object{Class: &pyobj.Global{Module: "builtins", Name: "getattr"}, Via: pyobj.ByReduce, Args: []pyobj.Value{
				&pyobj.Global{Module: metaModule, Name: "_MEM_FORMAT_ENCODING"}, memoryFormats[e.Props.MemoryFormat]}},
			e.Props.PinMemory,
		}
		chunks := &pyobj.List{}
		for _, c := range e.Chunks {
			chunks.Items = append(chunks.Items, newObject(metaModule, "ChunkStorageMetadata",
				pyobj.DictOf("offsets", size(c.Offsets), "sizes", size(c.Sizes))))
		}
		sdm.Set(e.Key, newObject(metaModule, "TensorStorageMetadata", pyobj.DictOf(
			"properties", newObject(metaModule, "TensorProperties", props),
			"size", size(e.Size),
			"chunks", chunks)))
	}
	var planner pyobj.Value
	if m.PlannerData != nil {
		pd := pyobj.NewDict(pyobj.PlainDict)
		for _, k := range m.PlannerOrder {
			pd.Set(k, pyobj.Tuple(m.PlannerData[k]))
		}
		planner = pd
	}
	sd := pyobj.NewDict(pyobj.PlainDict)
	for _, s := range m.Storage {
		st := pyobj.DictOf("fqn", s.Index.FQN)
		if s.Index.Hint >= 0 {
			st.Set("index", s.Index.Hint)
		} else {
			st.Set("index", nil)
		}
		if s.Index.HasOffset {
			st.Set("offset", size(s.Index.Offset))
		}
		info := pyobj.DictOf("relative_path", s.Info.RelativePath, "offset", s.Info.Offset, "length", s.Info.Length)
		if s.Info.Transforms != nil {
			ts := &pyobj.List{}
			for _, t := range s.Info.Transforms {
				ts.Items = append(ts.Items, t)
			}
			info.Set("transform_descriptors", ts)
		}
		sd.Set(newObject(metaModule, "MetadataIndex", st), newObject(fsModule, "_StorageInfo", info))
	}
	state := pyobj.DictOf("state_dict_metadata", sdm, "planner_data", planner, "storage_data", sd)
	if sm := m.StorageMeta; sm != nil {
		mods := &pyobj.List{}
		for _, s := range sm.Modules {
			mods.Items = append(mods.Items, s)
		}
		var id, load pyobj.Value
		if sm.CheckpointID != "" {
			id = sm.CheckpointID
		}
		if sm.LoadID != "" {
			load = sm.LoadID
		}
		state.Set("storage_meta", newObject(metaModule, "StorageMeta", pyobj.DictOf(
			"checkpoint_id", id, "save_id", sm.SaveID, "load_id", load, "modules", mods)))
	}
	if m.Version != "" {
		state.Set("version", m.Version)
	}
	for _, name := range m.Unknown {
		if v, ok := m.Attrs[name]; ok {
			state.Set(name, v) // read from a pickle: kept (Megatron's mcore_data)
		}
	}
	mod, name := metaModule, "Metadata"
	if m.Class.Name != "" {
		mod, name = m.Class.Module, m.Class.Name // a subclass (Megatron's MCoreMetadata)
	}
	return pyobj.Marshal(newObject(mod, name, state), nil)
}

// SaveBytes is saveBytes for other writers of DCP folders (bytes items).
func SaveBytes(v pyobj.Value) ([]byte, error) { return saveBytes(v) }

// saveBytes returns the torch.save stream of a small value whose tensors
// are *torchfile.Blob with Data: a bytes item, as DefaultSavePlanner's
// transform_object writes it (archive prefix "archive").
func saveBytes(v pyobj.Value) ([]byte, error) {
	l, err := torchfile.NewLayout("archive", v)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, l.Size())
	for _, s := range l.Head() {
		copy(buf[s.Off:], s.Data)
	}
	crcs := make([]uint32, len(l.Blobs))
	for i, b := range l.Blobs {
		if int64(len(b.Data)) != b.NBytes() {
			return nil, fmt.Errorf("tensor %d has %d bytes for %v%v", i, len(b.Data), b.DType, b.Shape)
		}
		copy(buf[l.BlobOffset(i):], b.Data)
		crcs[i] = crc32.ChecksumIEEE(b.Data)
	}
	tail, err := l.Tail(crcs)
	if err != nil {
		return nil, err
	}
	for _, s := range tail {
		copy(buf[s.Off:], s.Data)
	}
	return buf, nil
}

// fromFloat32 converts float32 elements to dt as torch's .to() does.
func fromFloat32(dst, src []byte, dt dtype.DType) error { return dtype.FromFloat32(dst, src, dt) }
