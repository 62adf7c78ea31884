package torchfile

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// Blob is a tensor to be written: a contiguous array of DType elements in
// Shape. Its bytes are supplied separately (Writer.WriteAt), so a
// multi-gigabyte tensor never has to be in memory; Data may hold them
// instead for small tensors. The same *Blob referenced twice in an object
// is written once and shared, as torch shares storages.
type Blob struct {
	DType        dtype.DType
	Shape        []int64
	RequiresGrad bool
	Data         []byte // optional: the whole payload
}

// PyTypeName implements the pyobj type naming.
func (b *Blob) PyTypeName() string { return "torch.Tensor" }

// NBytes returns the payload size.
func (b *Blob) NBytes() int64 { return Numel(b.Shape) * int64(b.DType.Size()) }

// View is a tensor over part of a Blob's storage, as torch saves the
// tensors that share one flat buffer (DeepSpeed's ZeRO-1/2 module weights
// are views of one bf16 buffer): one storage record, each tensor a view
// of it. Base must have a typed storage class (not _rebuild_tensor_v3).
type View struct {
	Base   *Blob // the storage, written as one record
	Offset int64 // in elements of Base.DType
	Shape  []int64
	Stride []int64
}

// PyTypeName implements the pyobj type naming.
func (v *View) PyTypeName() string { return "torch.Tensor" }

// NewBlob returns a blob holding data (little-endian elements).
func NewBlob(dt dtype.DType, shape []int64, data []byte) *Blob {
	return &Blob{DType: dt, Shape: append([]int64(nil), shape...), Data: data}
}

// Zip structure sizes and signatures (APPNOTE.TXT).
const (
	sigLocal      = 0x04034b50
	sigCentral    = 0x02014b50
	sigDescriptor = 0x08074b50
	sigEnd64      = 0x06064b50
	sigLocator64  = 0x07064b50
	sigEnd        = 0x06054b50
	localLen      = 30
	centralLen    = 46
	end64Len      = 56
	locator64Len  = 20
	endLen        = 22
	flagsDD       = 0x0808 // data descriptor follows + UTF-8 names, as torch writes
	zip64Limit    = 0xFFFFFFFF
	alignment     = 64
)

// record is one zip member of the layout.
type record struct {
	name      string
	header    int64 // offset of the local header
	data      int64 // offset of the payload (a multiple of 64)
	size      int64
	localExt  []byte // zip64 extra (if any) + FB padding
	blob      int    // index into Layout.Blobs, or -1
	payload   []byte // content of non-blob records
	descLen   int64
	zip64Size bool
}

// Layout is the complete byte plan of one torch.save zip file: every
// offset is fixed before any tensor byte is written, so several writers
// (goroutines or processes) can fill disjoint ranges of the same pre-sized
// file and the tail is written last. It is a pure function of the object.
type Layout struct {
	Prefix   string
	Blobs    []*Blob
	blobData []int64 // file offset of each blob's payload
	records  []record
	cdOff    int64
	cdLen    int64
	size     int64
}

// NewLayout plans the file that torch.save(root, "<prefix>.pt") would write,
// with the tensors of root (*Blob values) as storages data/0, data/1, ...
func NewLayout(prefix string, root pyobj.Value) (*Layout, error) {
	if prefix == "" || strings.ContainsAny(prefix, "/\\") {
		return nil, fmt.Errorf("archive prefix %q must be a plain non-empty name", prefix)
	}
	l := &Layout{Prefix: prefix}
	keys := map[*Blob]int{}
	key := func(b *Blob) string {
		k, seen := keys[b]
		if !seen {
			k = len(l.Blobs)
			keys[b] = k
			l.Blobs = append(l.Blobs, b)
		}
		return strconv.Itoa(k)
	}
	pkl, err := pyobj.Marshal(root, func(e *pyobj.Encoder, v pyobj.Value) (bool, error) {
		switch v := v.(type) {
		case *Blob:
			return true, encodeBlob(e, v, key(v))
		case *View:
			return true, encodeView(e, v, key(v.Base))
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	l.add("data.pkl", pkl, -1)
	l.add("byteorder", []byte("little"), -1)
	for i := range l.Blobs {
		l.add("data/"+strconv.Itoa(i), nil, i)
	}
	l.add("version", []byte("3\n"), -1)
	l.finish()
	return l, nil
}

// encodeBlob writes _rebuild_tensor_v2(storage, 0, shape, stride, requires_grad, OrderedDict()),
// or _rebuild_tensor_v3 with an UntypedStorage for dtypes that have no typed storage class.
func encodeBlob(e *pyobj.Encoder, b *Blob, key string) error {
	if !b.DType.Valid() {
		return fmt.Errorf("tensor has invalid dtype")
	}
	for _, d := range b.Shape {
		if d < 0 {
			return fmt.Errorf("tensor has negative dimension in shape %v", b.Shape)
		}
	}
	class, numel := b.DType.StorageClass(), Numel(b.Shape)
	v3 := class == ""
	if v3 {
		class, numel = "UntypedStorage", b.NBytes()
	}
	if v3 {
		e.Global("torch._utils", "_rebuild_tensor_v3")
	} else {
		e.Global("torch._utils", "_rebuild_tensor_v2")
	}
	e.Op('(', '(')
	if err := e.Encode("storage"); err != nil {
		return err
	}
	e.Global("torch", class)
	for _, v := range []pyobj.Value{key, "cpu", numel} {
		if err := e.Encode(v); err != nil {
			return err
		}
	}
	e.Op('t', 'Q') // TUPLE, BINPERSID
	shape := make(pyobj.Tuple, len(b.Shape))
	stride := make(pyobj.Tuple, len(b.Shape))
	for i, s := range ContiguousStrides(b.Shape) {
		shape[i], stride[i] = b.Shape[i], s
	}
	for _, v := range []pyobj.Value{int64(0), shape, stride, b.RequiresGrad, pyobj.NewDict(pyobj.OrderedDict)} {
		if err := e.Encode(v); err != nil {
			return err
		}
	}
	if v3 {
		if err := e.Encode(pyobj.DType{DType: b.DType}); err != nil {
			return err
		}
	}
	e.Op('t', 'R') // TUPLE, REDUCE
	return nil
}

// encodeView writes _rebuild_tensor_v2(storage of v.Base, offset, shape,
// stride, False, OrderedDict()); torch.load gives every view of one storage
// key the same storage.
func encodeView(e *pyobj.Encoder, v *View, key string) error {
	b := v.Base
	class := b.DType.StorageClass()
	if !b.DType.Valid() || class == "" {
		return fmt.Errorf("a view of a %v storage cannot be written", b.DType)
	}
	if len(v.Shape) != len(v.Stride) || v.Offset < 0 {
		return fmt.Errorf("view of shape %v, stride %v at offset %d", v.Shape, v.Stride, v.Offset)
	}
	end := v.Offset // one past the last element the view reaches
	for i, d := range v.Shape {
		if d < 0 || v.Stride[i] < 0 {
			return fmt.Errorf("view of shape %v, stride %v", v.Shape, v.Stride)
		}
		if d == 0 {
			end = v.Offset
			break
		}
		end += (d - 1) * v.Stride[i]
	}
	if Numel(v.Shape) > 0 && end+1 > Numel(b.Shape) {
		return fmt.Errorf("view of shape %v, stride %v at offset %d outside its storage of %d elements", v.Shape, v.Stride, v.Offset, Numel(b.Shape))
	}
	e.Global("torch._utils", "_rebuild_tensor_v2")
	e.Op('(', '(')
	if err := e.Encode("storage"); err != nil {
		return err
	}
	e.Global("torch", class)
	for _, x := range []pyobj.Value{key, "cpu", Numel(b.Shape)} {
		if err := e.Encode(x); err != nil {
			return err
		}
	}
	e.Op('t', 'Q') // TUPLE, BINPERSID
	shape := make(pyobj.Tuple, len(v.Shape))
	stride := make(pyobj.Tuple, len(v.Shape))
	for i := range v.Shape {
		shape[i], stride[i] = v.Shape[i], v.Stride[i]
	}
	for _, x := range []pyobj.Value{v.Offset, shape, stride, false, pyobj.NewDict(pyobj.OrderedDict)} {
		if err := e.Encode(x); err != nil {
			return err
		}
	}
	e.Op('t', 'R') // TUPLE, REDUCE
	return nil
}

func (l *Layout) add(name string, payload []byte, blob int) {
	r := record{name: l.Prefix + "/" + name, payload: payload, blob: blob, size: int64(len(payload))}
	if blob >= 0 {
		r.size = l.Blobs[blob].NBytes()
	}
	l.records = append(l.records, r)
}

// finish assigns offsets: local header, extra fields padded so that the
// payload starts at a multiple of 64, payload, data descriptor.
func (l *Layout) finish() {
	var at int64
	for i := range l.records {
		r := &l.records[i]
		r.header = at
		var ext []byte
		r.zip64Size = r.size >= zip64Limit
		if r.zip64Size {
			ext = binary.LittleEndian.AppendUint16(ext, 1)
			ext = binary.LittleEndian.AppendUint16(ext, 16)
			ext = binary.LittleEndian.AppendUint64(ext, uint64(r.size))
			ext = binary.LittleEndian.AppendUint64(ext, uint64(r.size))
		}
		base := at + localLen + int64(len(r.name)) + int64(len(ext)) + 4
		pad := (alignment - base%alignment) % alignment
		ext = append(ext, 'F', 'B', byte(pad), byte(pad>>8))
		for j := int64(0); j < pad; j++ {
			ext = append(ext, 'Z')
		}
		r.localExt = ext
		r.data = base + pad
		r.descLen = 16
		if r.zip64Size {
			r.descLen = 24
		}
		at = r.data + r.size + r.descLen
		if r.blob >= 0 {
			l.blobData = append(l.blobData, r.data)
		}
	}
	l.cdOff = at
	for _, r := range l.records {
		l.cdLen += centralLen + int64(len(r.name)) + int64(len(centralExtra(r)))
	}
	l.size = l.cdOff + l.cdLen + end64Len + locator64Len + endLen
}

// Size returns the file size.
func (l *Layout) Size() int64 { return l.size }

// BlobOffset returns the file offset of blob i's first byte.
func (l *Layout) BlobOffset(i int) int64 { return l.blobData[i] }

// Segment is bytes at a file offset.
type Segment struct {
	Off  int64
	Data []byte
}

// Head returns the bytes that do not depend on tensor data: local headers
// and the small records' payloads.
func (l *Layout) Head() []Segment {
	var segs []Segment
	for _, r := range l.records {
		h := make([]byte, 0, localLen+len(r.name)+len(r.localExt)+len(r.payload))
		h = binary.LittleEndian.AppendUint32(h, sigLocal)
		h = binary.LittleEndian.AppendUint16(h, versionNeeded(r.zip64Size))
		h = binary.LittleEndian.AppendUint16(h, flagsDD)
		h = append(h, 0, 0, 0, 0, 0, 0) // method stored, time, date
		h = binary.LittleEndian.AppendUint32(h, 0)
		if r.zip64Size {
			h = binary.LittleEndian.AppendUint32(h, zip64Limit)
			h = binary.LittleEndian.AppendUint32(h, zip64Limit)
		} else {
			h = append(h, 0, 0, 0, 0, 0, 0, 0, 0) // sizes follow in the descriptor
		}
		h = binary.LittleEndian.AppendUint16(h, uint16(len(r.name)))
		h = binary.LittleEndian.AppendUint16(h, uint16(len(r.localExt)))
		h = append(h, r.name...)
		h = append(h, r.localExt...)
		h = append(h, r.payload...) // empty for blobs
		segs = append(segs, Segment{Off: r.header, Data: h})
	}
	return segs
}

func versionNeeded(zip64 bool) uint16 {
	if zip64 {
		return 45
	}
	return 20
}

func centralExtra(r record) []byte {
	var ext []byte
	if r.zip64Size || r.header >= zip64Limit {
		var body []byte
		if r.zip64Size {
			body = binary.LittleEndian.AppendUint64(body, uint64(r.size))
			body = binary.LittleEndian.AppendUint64(body, uint64(r.size))
		}
		if r.header >= zip64Limit {
			body = binary.LittleEndian.AppendUint64(body, uint64(r.header))
		}
		ext = binary.LittleEndian.AppendUint16(ext, 1)
		ext = binary.LittleEndian.AppendUint16(ext, uint16(len(body)))
		ext = append(ext, body...)
	}
	return ext
}

// Tail returns the data descriptors, the central directory and the end
// records, given the CRC-32 of each blob.
func (l *Layout) Tail(blobCRCs []uint32) ([]Segment, error) {
	if len(blobCRCs) != len(l.Blobs) {
		return nil, fmt.Errorf("%d CRCs for %d tensors", len(blobCRCs), len(l.Blobs))
	}
	crcs := make([]uint32, len(l.records))
	var segs []Segment
	for i, r := range l.records {
		if r.blob >= 0 {
			crcs[i] = blobCRCs[r.blob]
		} else {
			crcs[i] = crc32.ChecksumIEEE(r.payload)
		}
		d := binary.LittleEndian.AppendUint32(nil, sigDescriptor)
		d = binary.LittleEndian.AppendUint32(d, crcs[i])
		if r.zip64Size {
			d = binary.LittleEndian.AppendUint64(d, uint64(r.size))
			d = binary.LittleEndian.AppendUint64(d, uint64(r.size))
		} else {
			d = binary.LittleEndian.AppendUint32(d, uint32(r.size))
			d = binary.LittleEndian.AppendUint32(d, uint32(r.size))
		}
		segs = append(segs, Segment{Off: r.data + r.size, Data: d})
	}
	cd := make([]byte, 0, l.cdLen+end64Len+locator64Len+endLen)
	for i, r := range l.records {
		ext := centralExtra(r)
		cd = binary.LittleEndian.AppendUint32(cd, sigCentral)
		cd = binary.LittleEndian.AppendUint16(cd, versionNeeded(r.zip64Size || r.header >= zip64Limit))
		cd = binary.LittleEndian.AppendUint16(cd, versionNeeded(r.zip64Size || r.header >= zip64Limit))
		cd = binary.LittleEndian.AppendUint16(cd, flagsDD)
		cd = append(cd, 0, 0, 0, 0, 0, 0)
		cd = binary.LittleEndian.AppendUint32(cd, crcs[i])
		size32 := uint32(r.size)
		if r.zip64Size {
			size32 = zip64Limit
		}
		cd = binary.LittleEndian.AppendUint32(cd, size32)
		cd = binary.LittleEndian.AppendUint32(cd, size32)
		cd = binary.LittleEndian.AppendUint16(cd, uint16(len(r.name)))
		cd = binary.LittleEndian.AppendUint16(cd, uint16(len(ext)))
		cd = append(cd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) // comment len, disk, internal and external attrs
		hdr32 := uint32(r.header)
		if r.header >= zip64Limit {
			hdr32 = zip64Limit
		}
		cd = binary.LittleEndian.AppendUint32(cd, hdr32)
		cd = append(cd, r.name...)
		cd = append(cd, ext...)
	}
	n := uint64(len(l.records))
	end64 := l.cdOff + l.cdLen
	// zip64 end record and locator, always present as torch writes them.
	cd = binary.LittleEndian.AppendUint32(cd, sigEnd64)
	cd = binary.LittleEndian.AppendUint64(cd, end64Len-12)
	cd = binary.LittleEndian.AppendUint16(cd, 45)
	cd = binary.LittleEndian.AppendUint16(cd, 45)
	cd = binary.LittleEndian.AppendUint32(cd, 0)
	cd = binary.LittleEndian.AppendUint32(cd, 0)
	cd = binary.LittleEndian.AppendUint64(cd, n)
	cd = binary.LittleEndian.AppendUint64(cd, n)
	cd = binary.LittleEndian.AppendUint64(cd, uint64(l.cdLen))
	cd = binary.LittleEndian.AppendUint64(cd, uint64(l.cdOff))
	cd = binary.LittleEndian.AppendUint32(cd, sigLocator64)
	cd = binary.LittleEndian.AppendUint32(cd, 0)
	cd = binary.LittleEndian.AppendUint64(cd, uint64(end64))
	cd = binary.LittleEndian.AppendUint32(cd, 1)
	cd = binary.LittleEndian.AppendUint32(cd, sigEnd)
	cd = append(cd, 0, 0, 0, 0)
	n16 := uint16(min(n, 0xFFFF))
	cd = binary.LittleEndian.AppendUint16(cd, n16)
	cd = binary.LittleEndian.AppendUint16(cd, n16)
	cd = binary.LittleEndian.AppendUint32(cd, uint32(min(l.cdLen, zip64Limit)))
	cd = binary.LittleEndian.AppendUint32(cd, uint32(min(l.cdOff, zip64Limit)))
	cd = append(cd, 0, 0)
	segs = append(segs, Segment{Off: l.cdOff, Data: cd})
	return segs, nil
}

// blobFile is a pre-sized file of a Layout whose tensor payloads arrive in
// pieces, each piece's CRC kept so the payload CRC needs no read-back.
type blobFile struct {
	Layout *Layout
	path   string
	f      *os.File
	mu     sync.Mutex
	pieces [][]Piece
	// Writeback starts writing each range to disk as soon as it is
	// written (sync_file_range), for files that will be synced: the
	// final sync then finds most of the work done.
	Writeback bool
	// BlockSize, when set, cuts every range written or copied at the
	// multiples of BlockSize from the start of its tensor's payload and
	// hashes the parts separately, so that Writer.BlockCRCs gives each
	// block's CRC-32 with no extra read (atomic/FORMAT.md, "block_crc32").
	BlockSize int64
}

// cuts calls fn for each part of [off, off+n) of a payload cut at the
// multiples of BlockSize (one part without a BlockSize), stopping at the
// first error.
func (b *blobFile) cuts(off, n int64, fn func(off, n int64) error) error {
	for n > 0 {
		k := n
		if b.BlockSize > 0 {
			k = min(n, b.BlockSize-off%b.BlockSize)
		}
		if err := fn(off, k); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// prepare sizes the file and writes the bytes that do not depend on tensor data.
func (b *blobFile) prepare() error {
	b.pieces = make([][]Piece, len(b.Layout.Blobs))
	if err := fsutil.Presize(b.f, b.Layout.Size()); err != nil {
		return err
	}
	for _, s := range b.Layout.Head() {
		if _, err := b.f.WriteAt(s.Data, s.Off); err != nil {
			return err
		}
	}
	return nil
}

// WriteAt writes p at byte off of blob i's payload. Safe for concurrent
// use with disjoint ranges.
func (b *blobFile) WriteAt(i int, p []byte, off int64) error {
	if i < 0 || i >= len(b.Layout.Blobs) {
		return fmt.Errorf("%s: no tensor %d", b.path, i)
	}
	if off < 0 || off+int64(len(p)) > b.Layout.Blobs[i].NBytes() {
		return fmt.Errorf("%s: write of %d bytes at %d outside tensor %d of %d bytes", b.path, len(p), off, i, b.Layout.Blobs[i].NBytes())
	}
	if err := fsutil.WriteAt(b.f, p, b.Layout.BlobOffset(i)+off); err != nil {
		return fmt.Errorf("%s: %w", b.path, err)
	}
	if b.Writeback {
		fsutil.StartWriteback(b.f, b.Layout.BlobOffset(i)+off, int64(len(p)))
	}
	var pcs [4]Piece
	ps := pcs[:0]
	b.cuts(off, int64(len(p)), func(o, k int64) error {
		ps = append(ps, NewPiece(o, p[o-off:o-off+k]))
		return nil
	})
	b.mu.Lock()
	b.pieces[i] = append(b.pieces[i], ps...)
	b.mu.Unlock()
	return nil
}

// CopyFrom copies n bytes of src at srcOff to byte off of blob i's
// payload through c (copy_file_range, the CRC taken on the way: read
// back, or made from the source's block CRC-32s in c.Blocks): the bytes
// never pass through a user buffer. Safe for concurrent use with
// disjoint ranges, one Copier per goroutine.
func (b *blobFile) CopyFrom(c *fsutil.Copier, i int, src *os.File, srcOff, off, n int64) error {
	if err := b.checkCopy(i, off, n); err != nil {
		return err
	}
	return b.cuts(off, n, func(o, k int64) error {
		crc, err := c.CopyRangeCRC(b.f, b.Layout.BlobOffset(i)+o, src, srcOff+o-off, k)
		if err != nil {
			return fmt.Errorf("%s: %w", b.path, err)
		}
		return b.copied(i, o, k, crc)
	})
}

// CopyFromCRC is CopyFrom for bytes whose CRC-32 is known (a whole source
// record, Storage.CRC32): they are copied in the kernel and never read
// back, and the file's CRC is made from crc.
func (b *blobFile) CopyFromCRC(c *fsutil.Copier, i int, src *os.File, srcOff, off, n int64, crc uint32) error {
	if err := b.checkCopy(i, off, n); err != nil {
		return err
	}
	if err := c.CopyRange(b.f, b.Layout.BlobOffset(i)+off, src, srcOff, n); err != nil {
		return fmt.Errorf("%s: %w", b.path, err)
	}
	return b.copied(i, off, n, crc)
}

func (b *blobFile) checkCopy(i int, off, n int64) error {
	if i < 0 || i >= len(b.Layout.Blobs) {
		return fmt.Errorf("%s: no tensor %d", b.path, i)
	}
	if off < 0 || n < 0 || off+n > b.Layout.Blobs[i].NBytes() {
		return fmt.Errorf("%s: copy of %d bytes at %d outside tensor %d of %d bytes", b.path, n, off, i, b.Layout.Blobs[i].NBytes())
	}
	return nil
}

// copied records a copied piece and starts its writeback.
func (b *blobFile) copied(i int, off, n int64, crc uint32) error {
	if b.Writeback {
		fsutil.StartWriteback(b.f, b.Layout.BlobOffset(i)+off, n)
	}
	b.mu.Lock()
	b.pieces[i] = append(b.pieces[i], Piece{Off: off, Len: n, CRC: crc})
	b.mu.Unlock()
	return nil
}

// Writer writes one torch.save file through a temporary name: the file
// appears under its final name only after Commit, complete.
type Writer struct {
	blobFile
	tmp    string
	crcs   []uint32   // per blob, set by Commit
	blocks [][]uint32 // per blob, set by Commit with a BlockSize
	// NoSync skips the fsync in Commit, for callers that sync a whole
	// folder at once before they publish it.
	NoSync bool
}

// Create starts writing root to path. Blob payloads are written with
// WriteAt (or come from Blob.Data), then Commit finishes the file.
func Create(path string, root pyobj.Value) (*Writer, error) {
	base := filepath.Base(path)
	prefix := strings.TrimSuffix(base, filepath.Ext(base))
	if prefix == "" {
		prefix = "archive"
	}
	l, err := NewLayout(prefix, root)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f, err := fsutil.CreateTemp(filepath.Dir(path), "."+base+".tmp-*")
	if err != nil {
		return nil, err
	}
	w := &Writer{blobFile: blobFile{Layout: l, path: path, f: f}, tmp: f.Name()}
	fail := func(err error) (*Writer, error) {
		w.Abort()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := w.prepare(); err != nil {
		return fail(err)
	}
	for i, b := range l.Blobs {
		if b.Data != nil {
			if int64(len(b.Data)) != b.NBytes() {
				return fail(fmt.Errorf("tensor %d: %d bytes of data for %v %v", i, len(b.Data), b.DType, b.Shape))
			}
			if err := w.WriteAt(i, b.Data, 0); err != nil {
				return fail(err)
			}
		}
	}
	return w, nil
}

// Commit checks that every tensor byte was written exactly once, writes
// the zip tail, syncs, and renames the file into place.
func (w *Writer) Commit() error {
	crcs := make([]uint32, len(w.Layout.Blobs))
	for i, b := range w.Layout.Blobs {
		c, err := CombinePieces(w.pieces[i], b.NBytes())
		if err != nil {
			w.Abort()
			return fmt.Errorf("%s: tensor %d: %w", w.path, i, err)
		}
		crcs[i] = c
	}
	w.crcs = crcs
	if w.BlockSize > 0 {
		w.blocks = make([][]uint32, len(w.Layout.Blobs))
		for i, b := range w.Layout.Blobs {
			w.blocks[i] = CombineBlocks(w.pieces[i], b.NBytes(), w.BlockSize)
		}
	}
	tail, err := w.Layout.Tail(crcs)
	if err == nil {
		for _, s := range tail {
			if _, err = w.f.WriteAt(s.Data, s.Off); err != nil {
				break
			}
		}
	}
	if err == nil && !w.NoSync {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.tmp, w.path)
	}
	if err != nil {
		os.Remove(w.tmp)
		return fmt.Errorf("%s: %w", w.path, err)
	}
	return nil
}

// BlockCRCs returns the CRC-32 of each BlockSize block of blob i's
// payload after Commit; nil without a BlockSize, or when a piece of the
// payload spans blocks (CopyFromCRC of a record of more than one block)
// or the payload is empty.
func (w *Writer) BlockCRCs(i int) []uint32 {
	if i < 0 || i >= len(w.blocks) {
		return nil
	}
	return w.blocks[i]
}

// CombineBlocks combines pieces that tile [0, size) into the CRC of each
// block-byte block; nil when a piece crosses a block's end.
func CombineBlocks(pieces []Piece, size, block int64) []uint32 {
	if size == 0 {
		return nil
	}
	ps := append([]Piece(nil), pieces...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].Off < ps[j].Off })
	out := make([]uint32, 0, (size+block-1)/block)
	var crc uint32
	for _, p := range ps {
		if p.Len == 0 {
			continue
		}
		if p.Off/block != (p.Off+p.Len-1)/block {
			return nil
		}
		crc = fsutil.CRC32Combine(crc, p.CRC, p.Len)
		if end := p.Off + p.Len; end%block == 0 || end == size {
			out = append(out, crc)
			crc = 0
		}
	}
	if int64(len(out)) != (size+block-1)/block {
		return nil
	}
	return out
}

// Abort removes the temporary file.
func (w *Writer) Abort() {
	w.f.Close()
	os.Remove(w.tmp)
}

// Save writes root, whose tensors are *Blob values with Data, to path.
func Save(path string, root pyobj.Value) error {
	w, err := Create(path, root)
	if err != nil {
		return err
	}
	return w.Commit()
}
