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
// DCP Metadata, or whose parts have the wrong types, is an error naming
// the value's path in the pickle.
func ParseMetadata(data []byte) (*Metadata, error) { return parseMetadata(data, 0) }

// parseMetadata is ParseMetadata within a decoding budget (<= 0: that of
// the pickle's size).
func parseMetadata(data []byte, budget int64) (*Metadata, error) {
	globals := map[string]int{}
	v, err := pyobj.Unpickle(data, pyobj.Options{Globals: globals, Limits: pyobj.Limits{MaxBytes: budget}})
	if err != nil {
		return nil, fmt.Errorf("not a DCP .metadata pickle: %w", err)
	}
	root := pyobj.NewDec("", v).AsObject("")
	if root == nil {
		return nil, fmt.Errorf("pickle holds %s, not a torch.distributed.checkpoint Metadata", pyobj.TypeName(v))
	}
	state := pyobj.NewDec("", root.State)
	if state.AsDict() == nil {
		return nil, fmt.Errorf("%s has state %s, not the attribute dict of a Metadata", root.Class, pyobj.TypeName(root.State))
	}
	m := &Metadata{Globals: globals, byKey: map[string]*Entry{}, storage: map[string]int{}}
	m.fields(state)
	if err := state.Err(); err != nil {
		return nil, err
	}
	if !state.Has("state_dict_metadata") {
		return nil, fmt.Errorf("%s has no state_dict_metadata (not a DCP Metadata)", root.Class)
	}
	m.parseEntries(state.Key("state_dict_metadata"))
	if pd, ok := state.Opt("planner_data"); ok {
		m.parsePlannerData(pd)
	}
	sd, ok := state.Opt("storage_data")
	if !ok && state.Err() == nil {
		return nil, fmt.Errorf("Metadata.storage_data is missing: the save did not finish")
	}
	m.parseStorage(sd)
	if smv, ok := state.Opt("storage_meta"); ok {
		m.StorageMeta = parseStorageMeta(smv)
	}
	m.Version = state.OptStr("version", "")
	if err := state.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

// fields lists the Metadata attributes present, keeping the values of
// those ucp does not know.
func (m *Metadata) fields(state pyobj.Dec) {
	known := map[string]bool{"state_dict_metadata": true, "planner_data": true, "storage_data": true,
		"storage_meta": true, "version": true}
	for _, it := range state.Items() {
		m.Fields = append(m.Fields, it.Key)
		if !known[it.Key] {
			m.Unknown = append(m.Unknown, it.Key)
			if m.Attrs == nil {
				m.Attrs = map[string]pyobj.Value{}
			}
			m.Attrs[it.Key] = it.Value()
		}
	}
}

func (m *Metadata) parseEntries(d pyobj.Dec) {
	for _, it := range d.Items() {
		if _, dup := m.byKey[it.Key]; dup {
			it.Failf("state_dict_metadata lists %q twice", it.Key)
			return
		}
		e := parseEntry(it.Key, it.Dec)
		if d.Err() != nil {
			return
		}
		m.Entries = append(m.Entries, e)
		m.byKey[it.Key] = e
	}
}

func className(o *pyobj.Object) string {
	if o.Class == nil {
		return ""
	}
	return o.Class.Name
}

func parseEntry(key string, d pyobj.Dec) *Entry {
	o := d.AsObject("")
	if o == nil {
		return nil
	}
	e := &Entry{Key: key}
	switch className(o) {
	case "BytesStorageMetadata":
		e.Bytes = true
		return e
	case "TensorStorageMetadata":
	default:
		d.Failf("is %s, not TensorStorageMetadata or BytesStorageMetadata", o.Class)
		return nil
	}
	e.parseProperties(d.Attr("properties"))
	e.Size = shape(d.Attr("size"))
	for _, c := range d.Attr("chunks").AsList() {
		c = c.Object("ChunkStorageMetadata")
		off := shape(c.Attr("offsets"))
		sz := shape(c.Attr("sizes"))
		e.Chunks = append(e.Chunks, Chunk{Offsets: off, Sizes: sz})
	}
	return e
}

// shape reads a torch.Size (or a tuple or list of ints) of non-negative dims.
func shape(d pyobj.Dec) []int64 {
	s := d.AsInts()
	for _, x := range s {
		if x < 0 {
			d.Failf("%v has a negative dim", s)
			return nil
		}
	}
	if s == nil {
		s = []int64{}
	}
	return s
}

// parseProperties reads TensorProperties: its __getstate__ gives the tuple
// (dtype, layout, requires_grad, memory format encoding, pin_memory); an
// attribute dict (without the memory format) is accepted too. A None
// layout, requires_grad or pin_memory reads as absent.
func (e *Entry) parseProperties(d pyobj.Dec) {
	o := d.AsObject("TensorProperties")
	if o == nil {
		return
	}
	e.Props.Class = o.Class.String()
	var dt, layout, rg, enc, pin pyobj.Dec
	switch s := o.State.(type) {
	case pyobj.Tuple:
		if len(s) != 5 {
			d.Failf("TensorProperties state has %d items, want 5", len(s))
			return
		}
		at := func(i int) pyobj.Dec { return d.At(int64(i), s[i]) }
		dt, layout, rg, enc, pin = at(0), at(1), at(2), at(3), at(4)
	case *pyobj.Dict:
		at := func(k string) pyobj.Dec {
			if v, ok := s.Get(k); ok {
				return d.At(k, v)
			}
			return d.At(k, nil) // a missing key reads as None
		}
		dt, layout, rg, enc, pin = at("dtype"), at("layout"), at("requires_grad"), d.At("memory_format", nil), at("pin_memory")
	default:
		d.Failf("TensorProperties state is %s", pyobj.TypeName(o.State))
		return
	}
	switch x := dt.Value().(type) {
	case pyobj.DType:
		e.DType = x.DType
	case *pyobj.Global:
		dt.Failf("dtype %s is not supported", x)
	default:
		dt.Failf("TensorProperties.dtype is %s, not a torch dtype", pyobj.TypeName(x))
	}
	e.Props.Layout = layoutName(layout)
	if e.Props.Layout != "" && e.Props.Layout != "torch.strided" {
		layout.Failf("layout %s is not supported (only torch.strided)", e.Props.Layout)
	}
	if rg.Value() != nil {
		e.Props.RequiresGrad = rg.AsBool()
	}
	if pin.Value() != nil {
		e.Props.PinMemory = pin.AsBool()
	}
	e.Props.MemoryFormat = memoryFormat(enc)
}

// layoutName reads a torch.layout as torch pickles it,
// torch.serialization._get_layout('torch.strided'): "" when None; a layout
// pickled as a global (torch.strided) is checked and reads as "".
func layoutName(d pyobj.Dec) string {
	switch x := d.Value().(type) {
	case nil:
		return ""
	case *pyobj.Global:
		if x.String() != "torch.strided" {
			d.Failf("layout %s is not supported (only torch.strided)", x)
		}
		return ""
	case *pyobj.Object:
		if len(x.Args) != 1 {
			d.Failf("TensorProperties.layout is %s with %d arguments, not a layout name", x.Class, len(x.Args))
			return ""
		}
		return d.At(int64(0), x.Args[0]).AsStr()
	}
	d.Failf("TensorProperties.layout is %s, not a torch.layout", pyobj.TypeName(d.Value()))
	return ""
}

// memoryFormat reads the _MEM_FORMAT_ENCODING of TensorProperties: an
// enum member by name or by value, or a plain int; None is contiguous.
func memoryFormat(d pyobj.Dec) int64 {
	mf := int64(0)
	known := true
	switch x := d.Value().(type) {
	case nil:
	case pyobj.Enum:
		if x.ByName {
			mf, known = map[string]int64{"TORCH_CONTIGUOUS_FORMAT": 0, "TORCH_CHANNELS_LAST": 1, "TORCH_PRESERVE_FORMAT": 2}[x.Name]
		} else {
			mf, known = pyobj.Int(x.Value)
		}
	case *pyobj.Object: // Enum(0) pickled by value: a call of the class
		known = len(x.Args) == 1
		if known {
			mf, known = pyobj.Int(x.Args[0])
		}
	case int64:
		mf = x
	default:
		known = false
	}
	if _, ok := memoryFormats[mf]; !ok || !known {
		d.Failf("TensorProperties has the unknown memory format %s", pyobj.Repr(d.Value()))
	}
	return mf
}

func (m *Metadata) parsePlannerData(d pyobj.Dec) {
	items := d.Items()
	m.PlannerData = make(map[string][]pyobj.Value, len(items))
	for _, it := range items {
		elems := it.AsList()
		if len(elems) == 0 {
			it.Failf("planner_data[%q] is %s, not a path tuple", it.Key, pyobj.Repr(it.Value()))
			return
		}
		path := make([]pyobj.Value, len(elems))
		for j, el := range elems {
			switch x := el.Value().(type) {
			case string:
				path[j] = x
			case int64:
				if x < 0 {
					el.Failf("planner_data[%q] has the negative list position %d", it.Key, x)
					return
				}
				path[j] = x
			default:
				el.Failf("planner_data[%q] has a path element of type %s", it.Key, pyobj.TypeName(x))
				return
			}
		}
		if _, dup := m.PlannerData[it.Key]; !dup {
			m.PlannerOrder = append(m.PlannerOrder, it.Key)
		}
		m.PlannerData[it.Key] = path
	}
}

func (m *Metadata) parseStorage(d pyobj.Dec) {
	for _, p := range d.Pairs() {
		idx := parseIndex(p.Key)
		info := parseStorageInfo(p.Val)
		if d.Err() != nil {
			return
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
}

func (x MetadataIndex) String() string {
	if !x.HasOffset {
		return fmt.Sprintf("MetadataIndex(%q)", x.FQN)
	}
	return fmt.Sprintf("MetadataIndex(%q, %v)", x.FQN, x.Offset)
}

func parseIndex(d pyobj.Dec) MetadataIndex {
	d = d.Object("MetadataIndex")
	idx := MetadataIndex{Hint: -1, FQN: d.Attr("fqn").AsStr()}
	if ov, ok := d.OptAttr("offset"); ok {
		idx.Offset, idx.HasOffset = shape(ov), true
	}
	if hv, ok := d.OptAttr("index"); ok {
		idx.Hint = hv.AsInt()
	}
	return idx
}

func parseStorageInfo(d pyobj.Dec) StorageInfo {
	d = d.Object("_StorageInfo")
	si := StorageInfo{RelativePath: d.Attr("relative_path").AsStr()}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"offset", &si.Offset}, {"length", &si.Length}} {
		fd := d.Attr(f.name)
		n := fd.AsInt()
		if n < 0 {
			fd.Failf("%s %d is negative", f.name, n)
		}
		*f.dst = n
	}
	if tv, ok := d.OptAttr("transform_descriptors"); ok {
		si.Transforms = tv.AsStrings()
	}
	return si
}

// parseStorageMeta reads StorageMeta; save_id and load_id are Optional[str],
// modules a list of str.
func parseStorageMeta(d pyobj.Dec) *StorageMeta {
	d = d.Object("StorageMeta")
	sm := &StorageMeta{}
	if cv, ok := d.OptAttr("checkpoint_id"); ok {
		sm.CheckpointID = pathString(cv)
	}
	if sv, ok := d.OptAttr("save_id"); ok {
		sm.SaveID = sv.AsStr()
	}
	if lv, ok := d.OptAttr("load_id"); ok {
		sm.LoadID = lv.AsStr()
	}
	if mv, ok := d.OptAttr("modules"); ok {
		sm.Modules = mv.AsStrings()
	}
	return sm
}

// pathString renders a checkpoint_id: a str, or a pathlib path pickled as
// PosixPath(*parts).
func pathString(d pyobj.Dec) string {
	switch x := d.Value().(type) {
	case string:
		return x
	case *pyobj.Object:
		parts := d.At("args", pyobj.Tuple(x.Args)).AsStrings()
		if len(parts) == 0 {
			return ""
		}
		if parts[0] == "/" {
			return "/" + strings.Join(parts[1:], "/")
		}
		return strings.Join(parts, "/")
	}
	d.Failf("checkpoint_id is %s, not a str or a path", pyobj.TypeName(d.Value()))
	return ""
}
