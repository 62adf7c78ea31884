// Package dcp reads and writes PyTorch Distributed Checkpoint (DCP)
// folders as torch.distributed.checkpoint's FileSystemWriter leaves them:
// a pickled .metadata that maps every flattened state-dict key to chunks
// (n-dimensional boxes) stored as items in __<rank>_<n>.distcp files.
//
// Index turns a DCP folder into a fragment table (each chunk a shard placed
// by its box); Export writes an atomic checkpoint back as a DCP folder.
// NOTES.md beside this file gives the layout rules with their PyTorch
// sources; FORMAT.md describes what Export writes.
package dcp

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// MetadataFile is the name of the metadata pickle FileSystemWriter writes last.
const MetadataFile = ".metadata"

// maxMetadata bounds the .metadata pickle read into memory: a checkpoint
// of 100k tensors on 1k ranks stays far below.
const maxMetadata = 4 << 30

// Metadata is a decoded .metadata pickle.
type Metadata struct {
	// Entries is state_dict_metadata in pickle order.
	Entries []*Entry
	// PlannerData maps flattened keys to their path in the nested state
	// dict (str dict keys, int64 list positions); nil when the pickle
	// holds None (flatten_state_dict=False).
	PlannerData map[string][]pyobj.Value
	// PlannerOrder lists planner_data's keys in pickle order.
	PlannerOrder []string
	// Storage is storage_data in pickle order.
	Storage []StorageEntry
	// StorageMeta is the StorageMeta object, nil when absent or None.
	StorageMeta *StorageMeta
	// Version is Metadata.version ("1.0.0" from torch 2.6 on), "" when absent.
	Version string
	// Fields are the Metadata attributes present, in pickle order;
	// Unknown are those ucp does not know (kept out of the table).
	Fields, Unknown []string
	// Attrs holds the values of the Unknown attributes (Megatron's
	// mcore_data, all_local_plans) for readers that know them.
	Attrs map[string]pyobj.Value
	// Class, when set, is the class Marshal pickles instead of torch's
	// Metadata (a subclass such as Megatron's MCoreMetadata).
	Class pyobj.Global
	// Globals counts the module.name references of the pickle.
	Globals map[string]int

	byKey   map[string]*Entry
	storage map[string]int // storage lookup key -> index into Storage
}

// Entry is one value of state_dict_metadata: a tensor (TensorStorageMetadata)
// or a non-tensor saved as a torch.save stream (BytesStorageMetadata).
type Entry struct {
	Key    string
	Bytes  bool
	DType  dtype.DType
	Size   []int64
	Chunks []Chunk
	Props  Properties
}

// Properties is TensorProperties beyond the dtype (deprecated fields kept
// for the writer and for listings).
type Properties struct {
	Class        string // module.name of the TensorProperties class
	Layout       string // "torch.strided"
	RequiresGrad bool
	MemoryFormat int64 // _MEM_FORMAT_ENCODING value: 0 contiguous
	PinMemory    bool
}

// Chunk is one ChunkStorageMetadata: the box [Offsets, Offsets+Sizes).
type Chunk struct {
	Offsets, Sizes []int64
}

// MetadataIndex is a MetadataIndex. Python compares indexes by FQN and Offset
// only; HasOffset is false for bytes items (the attribute is absent),
// which is not the same as the empty offset of a 0-dim tensor.
type MetadataIndex struct {
	FQN       string
	Offset    []int64
	HasOffset bool
	Hint      int64 // the index attribute, -1 when None
}

// StorageInfo is a _StorageInfo: where an item's bytes lie.
type StorageInfo struct {
	RelativePath string
	Offset       int64
	Length       int64
	// Transforms are the stream transform descriptors ("stream.zstd/1"),
	// nil when the attribute is absent or None.
	Transforms []string
}

// StorageEntry is one storage_data item.
type StorageEntry struct {
	Index MetadataIndex
	Info  StorageInfo
}

// StorageMeta is the StorageMeta object of torch 2.4 and later.
type StorageMeta struct {
	CheckpointID string // a str, or a pathlib path joined from its parts
	SaveID       string
	LoadID       string
	Modules      []string
}

// Entry returns the entry of a flattened key.
func (m *Metadata) Entry(key string) (*Entry, bool) {
	e, ok := m.byKey[key]
	return e, ok
}

// Lookup returns the storage of an index, matching as Python does: by
// FQN and offset, ignoring the index hint.
func (m *Metadata) Lookup(fqn string, offset []int64, hasOffset bool) (StorageInfo, bool) {
	i, ok := m.storage[storageKey(fqn, offset, hasOffset)]
	if !ok {
		return StorageInfo{}, false
	}
	return m.Storage[i].Info, true
}

// Path returns the planner_data path of key, or (key,) when it has none.
func (m *Metadata) Path(key string) []pyobj.Value {
	if p, ok := m.PlannerData[key]; ok {
		return p
	}
	return []pyobj.Value{key}
}

func storageKey(fqn string, offset []int64, hasOffset bool) string {
	var b strings.Builder
	b.WriteString(fqn)
	b.WriteByte(0)
	if !hasOffset {
		b.WriteString("bytes")
		return b.String()
	}
	b.WriteByte('[')
	for i, o := range offset {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(o, 10))
	}
	b.WriteByte(']')
	return b.String()
}

// ReadMetadata reads and decodes a .metadata file. Its decoding budget
// (pyobj.SizeBudget) is that of the whole checkpoint it describes, the
// .metadata and the .distcp files beside it: a checkpoint of many tensors
// on many ranks has a large, dense .metadata (about 64 bytes of estimated
// decoding memory per byte) but far more bytes of data.
func ReadMetadata(path string) (*Metadata, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > maxMetadata {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d a .metadata may have", path, st.Size(), int64(maxMetadata))
	}
	data, err := fsutil.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m, err := parseMetadata(data, pyobj.SizeBudget(st.Size()+distcpBytes(filepath.Dir(path))))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// distcpBytes is the size of the .distcp files in dir; what cannot be
// listed counts nothing (it only raises a budget).
func distcpBytes(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".distcp") {
			continue
		}
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// ParseMetadata decodes the pickle of a .metadata file. Every layout torch
// has written since 1.13 is accepted (see NOTES.md §6); attributes ucp does
// not know are tolerated and listed in Unknown. A pickle that is not a
// DCP Metadata, or whose parts have the wrong types, is an error.
func ParseMetadata(data []byte) (*Metadata, error) { return parseMetadata(data, 0) }

// parseMetadata is ParseMetadata within a decoding budget (<= 0: that of
// the pickle's size).
func parseMetadata(data []byte, budget int64) (*Metadata, error) {
	globals := map[string]int{}
	v, err := pyobj.Unpickle(data, pyobj.Options{Globals: globals, Limits: pyobj.Limits{MaxBytes: budget}})
	if err != nil {
		return nil, fmt.Errorf("not a DCP .metadata pickle: %w", err)
	}
	root, ok := v.(*pyobj.Object)
	if !ok {
		return nil, fmt.Errorf("pickle holds %s, not a torch.distributed.checkpoint Metadata", pyobj.TypeName(v))
	}
	state, ok := root.State.(*pyobj.Dict)
	if !ok {
		return nil, fmt.Errorf("%s has state %s, not the attribute dict of a Metadata", root.Class, pyobj.TypeName(root.State))
	}
	m := &Metadata{Globals: globals, byKey: map[string]*Entry{}, storage: map[string]int{}}
	known := map[string]bool{"state_dict_metadata": true, "planner_data": true, "storage_data": true,
		"storage_meta": true, "version": true}
	for _, k := range state.Keys() {
		name, ok := k.(string)
		if !ok {
			return nil, fmt.Errorf("%s has an attribute named by %s", root.Class, pyobj.TypeName(k))
		}
		m.Fields = append(m.Fields, name)
		if !known[name] {
			m.Unknown = append(m.Unknown, name)
			if m.Attrs == nil {
				m.Attrs = map[string]pyobj.Value{}
			}
			m.Attrs[name], _ = state.Get(name) // present: name is one of state's keys
		}
	}
	sdm, ok := state.Get("state_dict_metadata")
	if !ok {
		return nil, fmt.Errorf("%s has no state_dict_metadata (not a DCP Metadata)", root.Class)
	}
	if err := m.parseEntries(sdm); err != nil {
		return nil, err
	}
	if pd, ok := state.Get("planner_data"); ok && pd != nil {
		if err := m.parsePlannerData(pd); err != nil {
			return nil, err
		}
	}
	sd, ok := state.Get("storage_data")
	if !ok || sd == nil {
		return nil, fmt.Errorf("Metadata.storage_data is missing: the save did not finish")
	}
	if err := m.parseStorage(sd); err != nil {
		return nil, err
	}
	if smv, ok := state.Get("storage_meta"); ok && smv != nil {
		sm, err := parseStorageMeta(smv)
		if err != nil {
			return nil, err
		}
		m.StorageMeta = sm
	}
	if vv, ok := state.Get("version"); ok && vv != nil {
		s, ok := vv.(string)
		if !ok {
			return nil, fmt.Errorf("Metadata.version is %s, not a str", pyobj.TypeName(vv))
		}
		m.Version = s
	}
	return m, nil
}

func (m *Metadata) parseEntries(v pyobj.Value) error {
	d, ok := v.(*pyobj.Dict)
	if !ok {
		return fmt.Errorf("state_dict_metadata is %s, not a dict", pyobj.TypeName(v))
	}
	for i := 0; i < d.Len(); i++ {
		k, ev := d.Item(i)
		key, ok := k.(string)
		if !ok {
			return fmt.Errorf("state_dict_metadata has a key of type %s, not str", pyobj.TypeName(k))
		}
		if _, dup := m.byKey[key]; dup {
			return fmt.Errorf("state_dict_metadata lists %q twice", key)
		}
		e, err := parseEntry(key, ev)
		if err != nil {
			return fmt.Errorf("state_dict_metadata[%q]: %w", key, err)
		}
		m.Entries = append(m.Entries, e)
		m.byKey[key] = e
	}
	return nil
}

func className(o *pyobj.Object) string {
	if o.Class == nil {
		return ""
	}
	return o.Class.Name
}

func parseEntry(key string, v pyobj.Value) (*Entry, error) {
	o, ok := v.(*pyobj.Object)
	if !ok {
		return nil, fmt.Errorf("is %s, not TensorStorageMetadata or BytesStorageMetadata", pyobj.TypeName(v))
	}
	e := &Entry{Key: key}
	switch className(o) {
	case "BytesStorageMetadata":
		e.Bytes = true
		return e, nil
	case "TensorStorageMetadata":
	default:
		return nil, fmt.Errorf("is %s, not TensorStorageMetadata or BytesStorageMetadata", o.Class)
	}
	pv, ok := o.Attr("properties")
	if !ok {
		return nil, fmt.Errorf("TensorStorageMetadata has no properties")
	}
	if err := e.parseProperties(pv); err != nil {
		return nil, err
	}
	sv, ok := o.Attr("size")
	if !ok {
		return nil, fmt.Errorf("TensorStorageMetadata has no size")
	}
	size, err := shape(sv, "size")
	if err != nil {
		return nil, err
	}
	e.Size = size
	cv, ok := o.Attr("chunks")
	if !ok {
		return nil, fmt.Errorf("TensorStorageMetadata has no chunks")
	}
	items, ok := pyobj.Seq(cv)
	if !ok {
		return nil, fmt.Errorf("chunks is %s, not a list", pyobj.TypeName(cv))
	}
	for i, it := range items {
		c, ok := it.(*pyobj.Object)
		if !ok || className(c) != "ChunkStorageMetadata" {
			return nil, fmt.Errorf("chunks[%d] is %s, not ChunkStorageMetadata", i, pyobj.TypeName(it))
		}
		ov, ok1 := c.Attr("offsets")
		zv, ok2 := c.Attr("sizes")
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("chunks[%d] lacks offsets or sizes", i)
		}
		off, err := shape(ov, fmt.Sprintf("chunks[%d].offsets", i))
		if err != nil {
			return nil, err
		}
		sz, err := shape(zv, fmt.Sprintf("chunks[%d].sizes", i))
		if err != nil {
			return nil, err
		}
		e.Chunks = append(e.Chunks, Chunk{Offsets: off, Sizes: sz})
	}
	return e, nil
}

// shape reads a torch.Size (or a tuple or list of ints) of non-negative dims.
func shape(v pyobj.Value, what string) ([]int64, error) {
	s, ok := pyobj.Ints(v)
	if !ok {
		return nil, fmt.Errorf("%s is %s, not a torch.Size", what, pyobj.TypeName(v))
	}
	for _, d := range s {
		if d < 0 {
			return nil, fmt.Errorf("%s %v has a negative dim", what, s)
		}
	}
	if s == nil {
		s = []int64{}
	}
	return s, nil
}

// parseProperties reads TensorProperties: its __getstate__ gives the tuple
// (dtype, layout, requires_grad, memory format encoding, pin_memory); an
// attribute dict is accepted too.
func (e *Entry) parseProperties(v pyobj.Value) error {
	o, ok := v.(*pyobj.Object)
	if !ok || className(o) != "TensorProperties" {
		return fmt.Errorf("properties is %s, not TensorProperties", pyobj.TypeName(v))
	}
	e.Props.Class = o.Class.String()
	var dt, layout, rg, enc, pin pyobj.Value
	switch s := o.State.(type) {
	case pyobj.Tuple:
		if len(s) != 5 {
			return fmt.Errorf("TensorProperties state has %d items, want 5", len(s))
		}
		dt, layout, rg, enc, pin = s[0], s[1], s[2], s[3], s[4]
	case *pyobj.Dict:
		dt, _ = s.Get("dtype")
		layout, _ = s.Get("layout")
		rg, _ = s.Get("requires_grad")
		pin, _ = s.Get("pin_memory")
	default:
		return fmt.Errorf("TensorProperties state is %s", pyobj.TypeName(o.State))
	}
	switch d := dt.(type) {
	case pyobj.DType:
		e.DType = d.DType
	case *pyobj.Global:
		return fmt.Errorf("dtype %s is not supported", d)
	default:
		return fmt.Errorf("TensorProperties.dtype is %s, not a torch dtype", pyobj.TypeName(dt))
	}
	if o, ok := layout.(*pyobj.Object); ok && len(o.Args) == 1 {
		if e.Props.Layout, ok = o.Args[0].(string); !ok {
			return fmt.Errorf("TensorProperties.layout is %s(%s), not a layout name", o.Class, pyobj.Repr(o.Args[0]))
		}
	}
	if e.Props.Layout != "" && e.Props.Layout != "torch.strided" {
		return fmt.Errorf("layout %s is not supported (only torch.strided)", e.Props.Layout)
	}
	if e.Props.RequiresGrad, ok = rg.(bool); !ok && rg != nil {
		return fmt.Errorf("TensorProperties.requires_grad is %s, not a bool", pyobj.TypeName(rg))
	}
	if e.Props.PinMemory, ok = pin.(bool); !ok && pin != nil {
		return fmt.Errorf("TensorProperties.pin_memory is %s, not a bool", pyobj.TypeName(pin))
	}
	mf := int64(0)
	known := true
	switch x := enc.(type) {
	case pyobj.Enum:
		if x.ByName {
			mf, known = map[string]int64{"TORCH_CONTIGUOUS_FORMAT": 0, "TORCH_CHANNELS_LAST": 1, "TORCH_PRESERVE_FORMAT": 2}[x.Name]
		} else {
			mf, known = pyobj.Int(x.Value)
		}
	case *pyobj.Object: // Enum(0) pickled by value: a call of the class
		if len(x.Args) == 1 {
			mf, known = pyobj.Int(x.Args[0])
		}
	case int64:
		mf = x
	}
	if _, ok := memoryFormats[mf]; !ok || !known {
		return fmt.Errorf("TensorProperties has the unknown memory format %s", pyobj.Repr(enc))
	}
	e.Props.MemoryFormat = mf
	return nil
}

func (m *Metadata) parsePlannerData(v pyobj.Value) error {
	d, ok := v.(*pyobj.Dict)
	if !ok {
		return fmt.Errorf("planner_data is %s, not a dict", pyobj.TypeName(v))
	}
	m.PlannerData = make(map[string][]pyobj.Value, d.Len())
	for i := 0; i < d.Len(); i++ {
		k, pv := d.Item(i)
		key, ok := k.(string)
		if !ok {
			return fmt.Errorf("planner_data has a key of type %s, not str", pyobj.TypeName(k))
		}
		items, ok := pyobj.Seq(pv)
		if !ok || len(items) == 0 {
			return fmt.Errorf("planner_data[%q] is %s, not a path tuple", key, pyobj.Repr(pv))
		}
		path := make([]pyobj.Value, len(items))
		for j, it := range items {
			switch x := it.(type) {
			case string:
				path[j] = x
			case int64:
				if x < 0 {
					return fmt.Errorf("planner_data[%q] has the negative list position %d", key, x)
				}
				path[j] = x
			default:
				return fmt.Errorf("planner_data[%q] has a path element of type %s", key, pyobj.TypeName(it))
			}
		}
		if _, dup := m.PlannerData[key]; !dup {
			m.PlannerOrder = append(m.PlannerOrder, key)
		}
		m.PlannerData[key] = path
	}
	return nil
}

func (m *Metadata) parseStorage(v pyobj.Value) error {
	d, ok := v.(*pyobj.Dict)
	if !ok {
		return fmt.Errorf("storage_data is %s, not a dict", pyobj.TypeName(v))
	}
	for i := 0; i < d.Len(); i++ {
		k, sv := d.Item(i)
		idx, err := parseIndex(k)
		if err != nil {
			return fmt.Errorf("storage_data key %d: %w", i, err)
		}
		info, err := parseStorageInfo(sv)
		if err != nil {
			return fmt.Errorf("storage_data[%s]: %w", idx, err)
		}
		sk := storageKey(idx.FQN, idx.Offset, idx.HasOffset)
		if j, dup := m.storage[sk]; dup {
			// Equal MetadataIndex keys are one dict key in Python: the
			// last value wins.
			m.Storage[j].Info = info
			continue
		}
		m.storage[sk] = len(m.Storage)
		m.Storage = append(m.Storage, StorageEntry{Index: idx, Info: info})
	}
	return nil
}

func (x MetadataIndex) String() string {
	if !x.HasOffset {
		return fmt.Sprintf("MetadataIndex(%q)", x.FQN)
	}
	return fmt.Sprintf("MetadataIndex(%q, %v)", x.FQN, x.Offset)
}

func parseIndex(v pyobj.Value) (MetadataIndex, error) {
	o, ok := v.(*pyobj.Object)
	if !ok || className(o) != "MetadataIndex" {
		return MetadataIndex{}, fmt.Errorf("is %s, not MetadataIndex", pyobj.TypeName(v))
	}
	idx := MetadataIndex{Hint: -1}
	fv, has := o.Attr("fqn")
	if idx.FQN, ok = fv.(string); !has || !ok {
		return MetadataIndex{}, fmt.Errorf("MetadataIndex.fqn is %s, not a str", pyobj.TypeName(fv))
	}
	if ov, ok := o.Attr("offset"); ok && ov != nil {
		off, err := shape(ov, "MetadataIndex.offset")
		if err != nil {
			return MetadataIndex{}, fmt.Errorf("%q: %w", idx.FQN, err)
		}
		idx.Offset, idx.HasOffset = off, true
	}
	if hv, ok := o.Attr("index"); ok && hv != nil {
		h, ok := pyobj.Int(hv)
		if !ok {
			return MetadataIndex{}, fmt.Errorf("%q: MetadataIndex.index is %s, not an int", idx.FQN, pyobj.TypeName(hv))
		}
		idx.Hint = h
	}
	return idx, nil
}

func parseStorageInfo(v pyobj.Value) (StorageInfo, error) {
	o, ok := v.(*pyobj.Object)
	if !ok || className(o) != "_StorageInfo" {
		return StorageInfo{}, fmt.Errorf("is %s, not _StorageInfo", pyobj.TypeName(v))
	}
	var si StorageInfo
	rp, _ := o.Attr("relative_path")
	if si.RelativePath, ok = rp.(string); !ok {
		return StorageInfo{}, fmt.Errorf("relative_path is %s, not a str", pyobj.TypeName(rp))
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"offset", &si.Offset}, {"length", &si.Length}} {
		fv, _ := o.Attr(f.name)
		n, ok := pyobj.Int(fv)
		if !ok {
			return StorageInfo{}, fmt.Errorf("%s is %s, not an int", f.name, pyobj.TypeName(fv))
		}
		if n < 0 {
			return StorageInfo{}, fmt.Errorf("%s %d is negative", f.name, n)
		}
		*f.dst = n
	}
	if tv, ok := o.Attr("transform_descriptors"); ok && tv != nil {
		ts, ok := pyobj.Strings(tv)
		if !ok {
			return StorageInfo{}, fmt.Errorf("transform_descriptors is %s, not a list of str", pyobj.TypeName(tv))
		}
		si.Transforms = ts
	}
	return si, nil
}

func parseStorageMeta(v pyobj.Value) (*StorageMeta, error) {
	o, ok := v.(*pyobj.Object)
	if !ok || className(o) != "StorageMeta" {
		return nil, fmt.Errorf("storage_meta is %s, not StorageMeta", pyobj.TypeName(v))
	}
	sm := &StorageMeta{}
	if cv, ok := o.Attr("checkpoint_id"); ok {
		sm.CheckpointID = pathString(cv)
	}
	// save_id and load_id are Optional[str].
	if sv, ok := o.Attr("save_id"); ok && sv != nil {
		if sm.SaveID, ok = sv.(string); !ok {
			return nil, fmt.Errorf("storage_meta.save_id is %s, not a str", pyobj.TypeName(sv))
		}
	}
	if lv, ok := o.Attr("load_id"); ok && lv != nil {
		if sm.LoadID, ok = lv.(string); !ok {
			return nil, fmt.Errorf("storage_meta.load_id is %s, not a str", pyobj.TypeName(lv))
		}
	}
	if mv, ok := o.Attr("modules"); ok {
		sm.Modules, _ = pyobj.Strings(mv)
	}
	return sm, nil
}

// pathString renders a checkpoint_id: a str, or a pathlib path pickled as
// PosixPath(*parts).
func pathString(v pyobj.Value) string {
	switch x := v.(type) {
	case string:
		return x
	case *pyobj.Object:
		parts, ok := pyobj.Strings(pyobj.Tuple(x.Args))
		if !ok || len(parts) == 0 {
			return ""
		}
		if parts[0] == "/" {
			return "/" + strings.Join(parts[1:], "/")
		}
		return strings.Join(parts, "/")
	}
	return ""
}
