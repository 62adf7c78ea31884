package torchfile

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// Format names the container variant of a torch.save file.
type Format string

const (
	FormatZip    Format = "torch-zip"    // torch >= 1.6 default
	FormatLegacy Format = "torch-legacy" // _use_new_zipfile_serialization=False
)

// legacyMagic is the first pickled value of a legacy file.
var legacyMagic, _ = new(big.Int).SetString("1950a86a20f9469cfc6c", 16)

// maxPickle bounds the pickle of one file: real checkpoints stay far below.
const maxPickle = 1 << 30

// File is an opened torch.save file: its decoded object tree with lazy
// tensors, and the means to read their bytes.
type File struct {
	Name        string
	Format      Format
	Prefix      string      // zip archive folder ("" for legacy)
	Root        pyobj.Value // the saved object
	Storages    []*Storage  // in order of first reference
	PickleBytes int64       // bytes of pickle decoded to build Root
	Globals     map[string]int
	// Unexpected lists the globals outside pyobj's allowlist: decoded as
	// inert objects, never executed, but worth a look.
	Unexpected []string

	r      io.ReaderAt
	size   int64
	closer io.Closer
}

// Options tune how a file is read; the zero value is the default.
type Options struct {
	// MaxBudget, when > 0, lowers the memory that decoding the file's
	// pickle may take (pyobj.Limits.MaxBytes, and with it how far a
	// compressed pickle record may expand) below pyobj.SizeBudget of the
	// file's size: a command's --memory shared by its decoders.
	MaxBudget int64
}

// Open opens a torch.save file by path. Close it when done.
func Open(path string) (*File, error) { return Options{}.Open(path) }

// Open opens a torch.save file by path with these options.
func (o Options) Open(path string) (*File, error) {
	tf, f, err := fsutil.OpenReaderAt(path, o.Read)
	if err != nil {
		return nil, err
	}
	tf.closer = f
	return tf, nil
}

// Read decodes the torch.save file of size bytes in r. The name is used in
// error messages. Tensor data stays in r until read.
func Read(r io.ReaderAt, size int64, name string) (*File, error) {
	return Options{}.Read(r, size, name)
}

// budget returns the decoding budget for a file of size bytes.
func (o Options) budget(size int64) int64 {
	if o.MaxBudget > 0 {
		return min(o.MaxBudget, pyobj.SizeBudget(size))
	}
	return pyobj.SizeBudget(size)
}

// maxPickleIn is the largest pickle worth reading under budget: decoding
// costs at least three times the pickle's bytes (the input, and each byte
// an opcode or a payload byte copied twice), so a larger one is refused
// before it is read or decompressed.
func maxPickleIn(budget int64) int64 { return min(maxPickle, budget/3) }

// Read decodes the torch.save file of size bytes in r with these options.
func (o Options) Read(r io.ReaderAt, size int64, name string) (*File, error) {
	head := make([]byte, 4)
	if _, err := r.ReadAt(head, 0); err != nil {
		if size < 4 {
			return nil, fmt.Errorf("%s: file of %d bytes is too short to be a torch file", name, size)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var (
		f   *File
		err error
	)
	switch {
	case bytes.Equal(head, []byte("PK\x03\x04")):
		f, err = readZip(r, size, name, o.budget(size))
	case head[0] == 0x80:
		f, err = readLegacy(r, size, name, o.budget(size))
	default:
		return nil, fmt.Errorf("%s: not a torch.save file (starts with %x)", name, head)
	}
	if err != nil {
		var be *pyobj.BudgetError
		if errors.As(err, &be) {
			how := fmt.Sprintf("%d times the file's size, at least %d MiB", pyobj.BudgetPerByte, pyobj.MinBudget>>20)
			if o.MaxBudget > 0 {
				how += ", at most this file's share of --memory"
			}
			err = fmt.Errorf("%w; the budget is %s", err, how)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return f, nil
}

// Close releases the file opened by Open.
func (f *File) Close() error {
	if f.closer != nil {
		return f.closer.Close()
	}
	return nil
}

// Size returns the file size in bytes.
func (f *File) Size() int64 { return f.size }

// ReaderAt returns the underlying reader, for ranged reads of tensor bytes.
func (f *File) ReaderAt() io.ReaderAt { return f.r }

func newHooks(legacy bool) *torchHooks {
	return &torchHooks{storages: map[string]*Storage{}, legacy: legacy}
}

func (f *File) decode(pkl []byte, h *torchHooks, budget int64) error {
	f.Globals = map[string]int{}
	root, err := pyobj.Unpickle(pkl, pyobj.Options{Hooks: h.hooks(), Globals: f.Globals, Limits: pyobj.Limits{MaxBytes: budget}})
	if err != nil {
		return err
	}
	f.Root = root
	f.PickleBytes = int64(len(pkl))
	f.Unexpected = pyobj.Unexpected(f.Globals)
	return nil
}

func (f *File) sortStorages(h *torchHooks) {
	for _, s := range h.storages {
		f.Storages = append(f.Storages, s)
	}
	// Keys are decimal in first-use order in current torch; sort numerically
	// when they are numbers so the listing follows the pickle.
	sort.Slice(f.Storages, func(i, j int) bool {
		a, ea := strconv.ParseInt(f.Storages[i].Key, 10, 64)
		b, eb := strconv.ParseInt(f.Storages[j].Key, 10, 64)
		if ea == nil && eb == nil {
			return a < b
		}
		return f.Storages[i].Key < f.Storages[j].Key
	})
}

func readZip(r io.ReaderAt, size int64, name string, budget int64) (*File, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("corrupt zip archive: %w", err)
	}
	if len(zr.File) == 0 {
		return nil, fmt.Errorf("zip archive has no records")
	}
	first := zr.File[0].Name
	slash := strings.IndexByte(first, '/')
	if slash <= 0 {
		return nil, fmt.Errorf("zip record %q is not in a folder (not a torch.save archive)", first)
	}
	prefix := first[:slash]
	records := make(map[string]*zip.File, len(zr.File))
	for _, zf := range zr.File {
		rest, ok := strings.CutPrefix(zf.Name, prefix+"/")
		if !ok {
			return nil, fmt.Errorf("zip record %q is outside the archive folder %q", zf.Name, prefix)
		}
		if _, dup := records[rest]; dup {
			return nil, fmt.Errorf("zip record %q appears twice", zf.Name)
		}
		records[rest] = zf
	}
	if _, ok := records["constants.pkl"]; ok {
		return nil, fmt.Errorf("this is a TorchScript archive (torch.jit.save), not a torch.save file")
	}
	if records["version"] == nil && records[".data/version"] == nil {
		return nil, fmt.Errorf("zip archive has no version record (not a torch.save file)")
	}
	if bo := records["byteorder"]; bo != nil {
		b, err := readSmall(r, size, bo, 16)
		if err != nil {
			return nil, err
		}
		if s := string(b); s != "little" {
			return nil, fmt.Errorf("byteorder %q is not supported (only little-endian)", s)
		}
	}
	pk := records["data.pkl"]
	if pk == nil {
		return nil, fmt.Errorf("zip archive has no data.pkl record")
	}
	if lim := maxPickleIn(budget); pk.UncompressedSize64 > uint64(lim) {
		return nil, fmt.Errorf("record %s has %d bytes of pickle; decoding them would need more than the memory budget of %d MiB",
			pk.Name, pk.UncompressedSize64, budget>>20)
	}
	pkl, err := readSmall(r, size, pk, maxPickle)
	if err != nil {
		return nil, err
	}
	f := &File{Name: name, Format: FormatZip, Prefix: prefix, r: r, size: size}
	h := newHooks(false)
	if err := f.decode(pkl, h, budget); err != nil {
		return nil, fmt.Errorf("%s: %w", pk.Name, err)
	}
	f.sortStorages(h)
	for _, st := range f.Storages {
		zf := records["data/"+st.Key]
		if zf == nil {
			return nil, fmt.Errorf("storage record data/%s is missing", st.Key)
		}
		if zf.Method != zip.Store {
			return nil, fmt.Errorf("storage record data/%s is compressed; torch writes them stored", st.Key)
		}
		if int64(zf.UncompressedSize64) != st.NBytes() || zf.CompressedSize64 != zf.UncompressedSize64 {
			return nil, fmt.Errorf("storage record data/%s has %d bytes, but its %d %v elements need %d",
				st.Key, zf.UncompressedSize64, st.Numel, st.DType, st.NBytes())
		}
		off, err := zf.DataOffset()
		if err != nil {
			return nil, fmt.Errorf("storage record data/%s: %w", st.Key, err)
		}
		if off < 0 || off > size || st.NBytes() > size-off {
			return nil, fmt.Errorf("storage record data/%s lies outside the file", st.Key)
		}
		st.Offset = off
		st.CRC32 = zf.CRC32
	}
	return f, nil
}

// readSmall reads a whole record of at most limit bytes.
func readSmall(r io.ReaderAt, size int64, zf *zip.File, limit int64) ([]byte, error) {
	if zf.UncompressedSize64 > uint64(limit) {
		return nil, fmt.Errorf("record %s has %d bytes, more than the %d allowed", zf.Name, zf.UncompressedSize64, limit)
	}
	if zf.Method == zip.Store {
		off, err := zf.DataOffset()
		if err != nil {
			return nil, fmt.Errorf("record %s: %w", zf.Name, err)
		}
		n := int64(zf.UncompressedSize64)
		if off < 0 || off > size || n > size-off {
			return nil, fmt.Errorf("record %s lies outside the file", zf.Name)
		}
		buf := make([]byte, n)
		if _, err := r.ReadAt(buf, off); err != nil {
			return nil, fmt.Errorf("record %s: %w", zf.Name, err)
		}
		return buf, nil
	}
	rc, err := zf.Open()
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", zf.Name, err)
	}
	defer rc.Close()
	// Exactly the declared size (within limit, checked above): growing a
	// buffer while decompressing would double the peak, and a record that
	// inflates past its declared size is corrupt (archive/zip refuses it).
	buf := make([]byte, zf.UncompressedSize64)
	if _, err := io.ReadFull(rc, buf); err != nil {
		return nil, fmt.Errorf("record %s: %w", zf.Name, err)
	}
	if n, err := rc.Read(make([]byte, 1)); n > 0 || !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("record %s decompresses to more than its %d bytes", zf.Name, zf.UncompressedSize64)
	}
	return buf, nil
}

// pickleReader reads consecutive pickles from the start of a legacy file,
// growing its window until each pickle fits.
type pickleReader struct {
	r      io.ReaderAt
	size   int64
	budget int64
	pos    int64
	buf    []byte // file bytes from bufAt
	at     int64
}

func (p *pickleReader) next(decode func([]byte) error) error {
	lim := pyobj.DefaultLimits()
	lim.MaxBytes = p.budget
	for want := int64(1 << 16); ; want *= 4 {
		if err := p.fill(min(want, p.size-p.pos, maxPickleIn(p.budget))); err != nil {
			return err
		}
		window := p.buf[p.pos-p.at:]
		n, err := pyobj.Scan(window, lim)
		if err != nil {
			left := min(p.size-p.pos, maxPickleIn(p.budget))
			var te *pyobj.TruncatedError
			if int64(len(window)) >= left || !errors.As(err, &te) {
				return err
			}
			if te.Need > uint64(left) {
				// A length that the rest of the file cannot hold: reading
				// more would only allocate.
				return err
			}
			want = max(want, int64(te.Need)/4+1)
			continue // the pickle runs past the window: read more
		}
		if err := decode(window[:n]); err != nil {
			return err
		}
		p.pos += int64(n)
		return nil
	}
}

func (p *pickleReader) fill(n int64) error {
	end := p.pos + n
	if p.buf != nil && p.at <= p.pos && end <= p.at+int64(len(p.buf)) {
		return nil
	}
	buf := make([]byte, n)
	if _, err := p.r.ReadAt(buf, p.pos); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	p.buf, p.at = buf, p.pos
	return nil
}

func readLegacy(r io.ReaderAt, size int64, name string, budget int64) (*File, error) {
	p := &pickleReader{r: r, size: size, budget: budget}
	simple := func(into *pyobj.Value) func([]byte) error {
		return func(b []byte) error {
			v, err := pyobj.Unpickle(b, pyobj.Options{})
			*into = v
			return err
		}
	}
	var magic, proto, sysInfo pyobj.Value
	if err := p.next(simple(&magic)); err != nil {
		return nil, fmt.Errorf("not a torch.save file: %w", err)
	}
	if m, ok := magic.(*big.Int); !ok || m.Cmp(legacyMagic) != 0 {
		return nil, fmt.Errorf("not a torch.save file (legacy magic number missing)")
	}
	if err := p.next(simple(&proto)); err != nil {
		return nil, fmt.Errorf("legacy header: %w", err)
	}
	if v, _ := pyobj.Int(proto); v != 1001 {
		return nil, fmt.Errorf("legacy protocol version %s, want 1001", pyobj.Repr(proto))
	}
	if err := p.next(simple(&sysInfo)); err != nil {
		return nil, fmt.Errorf("legacy sys_info: %w", err)
	}
	if d, ok := sysInfo.(*pyobj.Dict); ok {
		if le, ok := d.Get("little_endian"); ok && le == false {
			return nil, fmt.Errorf("big-endian legacy files are not supported")
		}
	}
	f := &File{Name: name, Format: FormatLegacy, r: r, size: size}
	h := newHooks(true)
	at := p.pos
	if err := p.next(func(b []byte) error { return f.decode(b, h, budget) }); err != nil {
		return nil, fmt.Errorf("legacy object pickle at offset %d: %w", at, err)
	}
	var keysVal pyobj.Value
	if err := p.next(simple(&keysVal)); err != nil {
		return nil, fmt.Errorf("legacy storage key list: %w", err)
	}
	keys, ok := pyobj.Strings(keysVal)
	if !ok {
		return nil, fmt.Errorf("legacy storage key list is %s, not a list of strings", pyobj.TypeName(keysVal))
	}
	// Storages follow in key-list order, each as u64 element count + bytes.
	off := p.pos
	var hdr [8]byte
	for _, k := range keys {
		st, ok := h.storages[k]
		if !ok {
			return nil, fmt.Errorf("legacy storage %s is listed but not referenced", k)
		}
		if off+8 > size {
			return nil, fmt.Errorf("legacy storage %s: file ends before its header", k)
		}
		if _, err := r.ReadAt(hdr[:], off); err != nil {
			return nil, fmt.Errorf("legacy storage %s: %w", k, err)
		}
		n := int64(binary.LittleEndian.Uint64(hdr[:]))
		if n != st.Numel {
			return nil, fmt.Errorf("legacy storage %s holds %d elements, but the pickle says %d", k, n, st.Numel)
		}
		off += 8
		if st.NBytes() > size-off {
			return nil, fmt.Errorf("legacy storage %s: file ends inside its data", k)
		}
		st.Offset = off
		off += st.NBytes()
	}
	for k, st := range h.storages {
		if st.Offset < 0 {
			return nil, fmt.Errorf("legacy storage %s is referenced but not stored", k)
		}
	}
	f.sortStorages(h)
	return f, nil
}

// ReadRange reads elements [start, start+n) of t in row-major order into
// dst (n*elsize bytes), as stored (no dtype conversion). Contiguous tensors
// cost one ranged read; strided views are gathered.
func (f *File) ReadRange(t *Tensor, start, n int64, dst []byte) error {
	return ReadRange(f.r, t, start, n, dst)
}

// ReadTensor reads all elements of t in row-major order.
func (f *File) ReadTensor(t *Tensor) ([]byte, error) {
	if err := checkRange(t, 0, t.Numel()); err != nil {
		return nil, err
	}
	buf := make([]byte, t.NBytes())
	return buf, f.ReadRange(t, 0, t.Numel(), buf)
}

// maxRead bounds one ReadTensor/ReadFloat32 allocation. A view with zero
// strides (an expanded tensor) can be far larger than its storage and
// the file; such tensors must be read in ranges.
const maxRead = 1 << 40

// checkRange validates the element range [start, start+n) of t.
func checkRange(t *Tensor, start, n int64) error {
	if start < 0 || n < 0 || start > t.Numel() || n > t.Numel()-start {
		return fmt.Errorf("%d elements from element %d: outside tensor of %d elements", n, start, t.Numel())
	}
	if n > maxRead/int64(max(t.DType.Size(), 4)) {
		return fmt.Errorf("%d elements are too many to read at once", n)
	}
	return nil
}

// ReadFloat32 reads elements [start, start+n) of t converted to float32.
func (f *File) ReadFloat32(t *Tensor, start, n int64) ([]float32, error) {
	if err := checkRange(t, start, n); err != nil {
		return nil, err
	}
	raw := make([]byte, n*int64(t.DType.Size()))
	if err := f.ReadRange(t, start, n, raw); err != nil {
		return nil, err
	}
	out := make([]byte, 4*n)
	if err := dtype.ToFloat32(out, raw, t.DType); err != nil {
		return nil, err
	}
	return dtype.Float32s(out), nil
}

// gatherLimit is the largest storage span read at once for a strided view.
const gatherLimit = 64 << 20

// ReadRange reads elements [start, start+n) of t from r; see File.ReadRange.
func ReadRange(r io.ReaderAt, t *Tensor, start, n int64, dst []byte) error {
	es := int64(t.DType.Size())
	if err := checkRange(t, start, n); err != nil {
		return err
	}
	if int64(len(dst)) < n*es {
		return fmt.Errorf("buffer of %d bytes for %d elements", len(dst), n)
	}
	if n == 0 {
		return nil
	}
	if t.Storage.Offset < 0 {
		return fmt.Errorf("storage %s has no data location", t.Storage.Key)
	}
	if t.IsContiguous() {
		_, err := readFull(r, dst[:n*es], t.FileOffset()+start*es)
		return err
	}
	// Strided: walk runs along the last dimension.
	nd := len(t.Shape)
	idx := make([]int64, nd)
	rem := start
	for d := nd - 1; d >= 0; d-- {
		idx[d] = rem % t.Shape[d]
		rem /= t.Shape[d]
	}
	inner := t.Stride[nd-1]
	var cache []byte
	var cacheAt int64 = -1
	out := dst[:0]
	for done := int64(0); done < n; {
		base := t.StorageOffset
		for d := 0; d < nd; d++ {
			base += idx[d] * t.Stride[d]
		}
		run := min(t.Shape[nd-1]-idx[nd-1], n-done)
		if inner == 1 {
			b := make([]byte, run*es)
			if _, err := readFull(r, b, t.Storage.Offset+base*es); err != nil {
				return err
			}
			out = append(out, b...)
		} else {
			// Elements of the run are inner*es bytes apart: read their span
			// once (bounded), then pick.
			span := ((run-1)*inner + 1) * es
			if span > gatherLimit {
				for k := int64(0); k < run; k++ {
					b := make([]byte, es)
					if _, err := readFull(r, b, t.Storage.Offset+(base+k*inner)*es); err != nil {
						return err
					}
					out = append(out, b...)
				}
			} else {
				lo := t.Storage.Offset + base*es
				if cacheAt < 0 || lo < cacheAt || lo+span > cacheAt+int64(len(cache)) {
					size := min(max(span, gatherLimit/4), t.Storage.Offset+t.Storage.NBytes()-lo)
					cache = make([]byte, size)
					if _, err := readFull(r, cache, lo); err != nil {
						return err
					}
					cacheAt = lo
				}
				for k := int64(0); k < run; k++ {
					p := lo - cacheAt + k*inner*es
					out = append(out, cache[p:p+es]...)
				}
			}
		}
		done += run
		idx[nd-1] += run
		for d := nd - 1; d > 0 && idx[d] >= t.Shape[d]; d-- {
			idx[d] = 0
			idx[d-1]++
		}
	}
	return nil
}

func readFull(r io.ReaderAt, b []byte, off int64) (int, error) {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return n, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return n, fmt.Errorf("reading %d bytes at offset %d: %w", len(b), off, err)
}

// WithBytes returns v (a value decoded from f) with every tensor replaced
// by a Blob holding its bytes, contiguous, as torch.save writes them
// again; containers are copied only where they hold a tensor
// (pyobj.Rewrite). More than max bytes of tensors in all is an error
// (max <= 0: no bound).
func (f *File) WithBytes(v pyobj.Value, lim pyobj.Limits, max int64) (pyobj.Value, error) {
	var total int64
	return pyobj.Rewrite(v, lim, func(v pyobj.Value) (pyobj.Value, bool, error) {
		t, ok := v.(*Tensor)
		if !ok {
			return nil, false, nil
		}
		if total += t.NBytes(); max > 0 && total > max {
			return nil, false, fmt.Errorf("tensors add up to more than %d bytes", max)
		}
		b, err := f.ReadTensor(t)
		if err != nil {
			return nil, false, err
		}
		bl := NewBlob(t.DType, t.Shape, b)
		bl.RequiresGrad = t.RequiresGrad
		return bl, true, nil
	})
}
