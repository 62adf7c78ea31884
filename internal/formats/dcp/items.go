package dcp

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/safetensors"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// maxBytesItem bounds a non-tensor item read into memory (dataloader and
// scheduler states are small).
const maxBytesItem = 1 << 30

// files opens the checkpoint's data files once each, for concurrent ReadAt.
type files struct {
	dir  string
	mu   sync.Mutex
	open map[string]*dataFile
	st   map[string]*safetensors.File // safetensors blobs by "path@offset"
	// scratch is the folder of decompressed items (transformed tensor
	// items), "" until one is needed; spilled are their open files.
	scratch string
	spilled []*os.File
}

type dataFile struct {
	f    *os.File
	size int64
	err  error
}

func newFiles(dir string) *files {
	return &files{dir: dir, open: map[string]*dataFile{}, st: map[string]*safetensors.File{}}
}

func (fs *files) close() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, d := range fs.open {
		if d.f != nil {
			d.f.Close()
		}
	}
	for _, f := range fs.spilled {
		f.Close()
	}
	fs.open, fs.spilled = map[string]*dataFile{}, nil
}

// checkRelative rejects storage paths that leave the checkpoint folder;
// FileSystemWriter only writes plain file names.
func checkRelative(rel string) error {
	if rel == "" || rel == "." || rel == ".." || strings.ContainsAny(rel, "/\\\x00") {
		return fmt.Errorf("relative_path %q is not a file name inside the checkpoint folder", rel)
	}
	return nil
}

func (fs *files) get(rel string) (*dataFile, error) {
	if err := checkRelative(rel); err != nil {
		return nil, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if d, ok := fs.open[rel]; ok {
		return d, d.err
	}
	d := &dataFile{}
	path := filepath.Join(fs.dir, rel)
	f, err := fsutil.Open(path)
	if err == nil {
		var st os.FileInfo
		if st, err = f.Stat(); err == nil {
			d.f, d.size = f, st.Size()
		} else {
			f.Close()
		}
	}
	if err != nil {
		if os.IsNotExist(err) {
			err = fmt.Errorf("%s: data file is missing", path)
		}
		d.err = err
	}
	fs.open[rel] = d
	return d, d.err
}

// item is one storage_data entry resolved to its file.
type item struct {
	path string // absolute path of the data file
	rel  string
	off  int64
	len  int64
	df   *dataFile
	// transforms are the stream transforms to undo, in order.
	transforms []string
	// shown names the item's file in messages: path, or for a decoded
	// item the data file it came from.
	shown string
}

func (it item) String() string { return fmt.Sprintf("%s@%d+%d", it.rel, it.off, it.len) }

// resolve checks that an item lies inside its file and uses no stream
// transform ucp cannot undo.
func (fs *files) resolve(si StorageInfo) (item, error) {
	if err := checkTransforms(si.Transforms); err != nil {
		return item{}, fmt.Errorf("%s: %w", filepath.Join(fs.dir, si.RelativePath), err)
	}
	df, err := fs.get(si.RelativePath)
	if err != nil {
		return item{}, err
	}
	path := filepath.Join(fs.dir, si.RelativePath)
	if si.Offset > df.size || si.Length > df.size-si.Offset {
		return item{}, fmt.Errorf("%s: item at offset %d of %d bytes reaches past the end of the %d-byte file",
			path, si.Offset, si.Length, df.size)
	}
	return item{path: path, rel: si.RelativePath, off: si.Offset, len: si.Length, df: df, transforms: si.Transforms, shown: path}, nil
}

var zipMagic = []byte("PK\x03\x04")

// tensor decodes a tensor item and checks it against its chunk: a
// torch.save stream (its zip offsets are item-relative), or, for
// SerializationFormat.SAFETENSORS, the safetensors blob that starts at the
// recorded offset and runs to the end of the file.
func (fs *files) tensor(key string, it item, want dtype.DType, offsets, sizes []int64) (fragment.TensorRef, error) {
	if len(it.transforms) > 0 {
		var err error
		if it, err = fs.spill(it, key); err != nil {
			return fragment.TensorRef{}, err
		}
	}
	head := make([]byte, 4)
	if it.len >= 4 {
		if _, err := it.df.f.ReadAt(head, it.off); err != nil {
			return fragment.TensorRef{}, fmt.Errorf("%s: %w", it.shown, err)
		}
	}
	var ref fragment.TensorRef
	switch raw := torchfile.Numel(sizes) * int64(want.Size()); {
	case bytes.Equal(head, zipMagic):
		tf, err := torchfile.Read(io.NewSectionReader(it.df.f, it.off, it.len), it.len, it.String())
		if err != nil {
			return ref, fmt.Errorf("%s: item of %q: %w", it.shown, key, err)
		}
		root := pyobj.NewDec(fmt.Sprintf("%s: item of %q at offset %d", it.shown, key, it.off), tf.Root)
		t := pyobj.As[*torchfile.Tensor](root, "a tensor")
		if err := root.Err(); err != nil {
			return ref, err
		}
		ref = fragment.Ref(it.path, t, it.off)
	case fs.looksSafetensors(it):
		t, err := fs.safetensorsTensor(key, it, offsets)
		if err != nil {
			return ref, err
		}
		ref = fragment.TensorRef{Path: it.path, T: t}
	case it.len == raw:
		// The chunk's elements themselves, little-endian and row-major.
		ref = fragment.TensorRef{Path: it.path, T: &torchfile.Tensor{
			Storage: &torchfile.Storage{Key: "raw", DType: want, Location: "cpu", Numel: torchfile.Numel(sizes), Offset: it.off},
			DType:   want, Shape: clone(sizes), Stride: torchfile.ContiguousStrides(sizes)}}
	default:
		return ref, fmt.Errorf("%s: item of %q at offset %d (%d bytes) is neither a torch.save stream, a safetensors blob, nor the chunk's %d raw bytes",
			it.shown, key, it.off, it.len, raw)
	}
	if ref.T.DType != want {
		return ref, fmt.Errorf("%s: item of %q at offset %d is %v, but the metadata says %v", it.shown, key, it.off, ref.T.DType, want)
	}
	if !torchfile.SameShape(ref.T.Shape, sizes) {
		return ref, fmt.Errorf("%s: item of %q at offset %d has shape %v, but its chunk has sizes %v", it.shown, key, it.off, ref.T.Shape, sizes)
	}
	return ref, nil
}

// looksSafetensors reports whether a safetensors header starts at the
// item: a plausible little-endian header length, then '{'.
func (fs *files) looksSafetensors(it item) bool {
	var b [9]byte
	if it.df.size-it.off < 9 {
		return false
	}
	if _, err := it.df.f.ReadAt(b[:], it.off); err != nil {
		return false
	}
	n := binary.LittleEndian.Uint64(b[:8])
	return n > 0 && n <= uint64(it.df.size-it.off-8) && b[8] == '{'
}

// safetensorsTensor finds key in the safetensors blob at the item's offset.
func (fs *files) safetensorsTensor(key string, it item, offsets []int64) (*torchfile.Tensor, error) {
	id := fmt.Sprintf("%s@%d", it.rel, it.off)
	fs.mu.Lock()
	sf, ok := fs.st[id]
	fs.mu.Unlock()
	if !ok {
		size := it.df.size - it.off
		var err error
		sf, err = safetensors.Read(io.NewSectionReader(it.df.f, it.off, size), size, it.String())
		if err != nil {
			return nil, fmt.Errorf("%s: item of %q: %w", it.shown, key, err)
		}
		fs.mu.Lock()
		fs.st[id] = sf
		fs.mu.Unlock()
	}
	st, ok := sf.Tensor(key)
	if !ok {
		return nil, fmt.Errorf("%s: the safetensors blob at offset %d has no tensor %q", it.shown, it.off, key)
	}
	if info, ok := sf.Metadata["DCP_SHARDING_INFO"]; ok {
		var sharding map[string]struct {
			SavedOffsets []int64 `json:"saved_offsets"`
		}
		if err := json.Unmarshal([]byte(info), &sharding); err != nil {
			return nil, fmt.Errorf("%s: DCP_SHARDING_INFO of the safetensors blob at offset %d: %w", it.shown, it.off, err)
		}
		if sh, ok := sharding[key]; ok && !torchfile.SameShape(sh.SavedOffsets, offsets) {
			return nil, fmt.Errorf("%s: the safetensors blob at offset %d saved %q at offsets %v, but the chunk is at %v",
				it.shown, it.off, key, sh.SavedOffsets, offsets)
		}
	}
	if st.NBytes != it.len {
		return nil, fmt.Errorf("%s: tensor %q of the safetensors blob has %d bytes, but its item length is %d", it.shown, key, st.NBytes, it.len)
	}
	t := &torchfile.Tensor{
		Storage: &torchfile.Storage{Key: "safetensors:" + key, DType: st.DType, Location: "cpu",
			Numel: st.Numel(), Offset: it.off + st.Offset},
		DType:  st.DType,
		Shape:  append([]int64{}, st.Shape...),
		Stride: torchfile.ContiguousStrides(st.Shape),
	}
	return t, nil
}

// bytesValue decodes a non-tensor item: a torch.save stream of any Python
// value (DefaultSavePlanner's transform_object). Tensors inside become
// TensorRefs; an item that does not decode is carried as its raw bytes.
func (fs *files) bytesValue(key string, it item) (pyobj.Value, string, error) {
	if it.len > maxBytesItem {
		return nil, "", fmt.Errorf("%s: non-tensor item of %q has %d bytes, more than the %d ucp carries", it.shown, key, it.len, maxBytesItem)
	}
	if len(it.transforms) > 0 {
		// Decoded to a file too: tensors inside are read by range later.
		var err error
		if it, err = fs.spill(it, key); err != nil {
			return nil, "", err
		}
	}
	if it.len > maxBytesItem {
		return nil, "", fmt.Errorf("%s: non-tensor item of %q has %d bytes, more than the %d ucp carries", it.shown, key, it.len, maxBytesItem)
	}
	data := make([]byte, it.len)
	if _, err := it.df.f.ReadAt(data, it.off); err != nil && it.len > 0 {
		return nil, "", fmt.Errorf("%s: %w", it.shown, err)
	}
	if bytes.HasPrefix(data, zipMagic) {
		tf, err := torchfile.Read(bytes.NewReader(data), it.len, it.String())
		if err != nil {
			return pyobj.Bytes(data), fmt.Sprintf("%s: kept as raw bytes (%v)", key, err), nil
		}
		v, err := refTensors(tf.Root, it, pyobj.DefaultLimits())
		if err != nil {
			return nil, "", fmt.Errorf("%s: item of %q: %w", it.shown, key, err)
		}
		return v, "", nil
	}
	// A custom planner may store a bare pickle.
	if v, err := pyobj.Unpickle(data, pyobj.Options{}); err == nil {
		return v, "", nil
	}
	return pyobj.Bytes(data), fmt.Sprintf("%s: not a torch.save stream or pickle, kept as raw bytes", key), nil
}

// refTensors replaces the tensors of a decoded item with TensorRefs whose
// storage offsets are absolute in the data file.
func refTensors(v pyobj.Value, it item, lim pyobj.Limits) (pyobj.Value, error) {
	return pyobj.Rewrite(v, lim, func(v pyobj.Value) (pyobj.Value, bool, error) {
		switch x := v.(type) {
		case *torchfile.Tensor: // other values stay as they are
			r := fragment.Ref(it.path, x, it.off)
			return &r, true, nil
		}
		return nil, false, nil
	})
}
