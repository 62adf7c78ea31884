// Package safetensors reads and writes the safetensors format
// (huggingface/safetensors): an 8-byte little-endian header length, a
// JSON header, and the tensors' bytes back to back.
//
// The reader is lazy: it reads and validates the header (with exactly the
// rules of the reference reader, plus duplicate-key rejection) and leaves
// tensor bytes in the file until asked for a range. The writer produces the
// same bytes as the reference library for the same inputs and can be fed
// concurrently. See FORMAT.md.
package safetensors

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"unicode/utf8"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fsutil"
)

// MaxHeaderSize is the largest header the reference accepts (bytes).
const MaxHeaderSize = 100_000_000

const metadataKey = "__metadata__"

// Error kinds, named after the reference implementation's errors. Every
// error returned by Read wraps one of them (test with errors.Is) and names
// the file and, where there is one, the tensor.
var (
	ErrHeaderTooSmall   = errors.New("file too small for the 8-byte header length (HeaderTooSmall)")
	ErrHeaderTooLarge   = errors.New("header too large (HeaderTooLarge)")
	ErrHeaderLength     = errors.New("header length past end of file (InvalidHeaderLength)")
	ErrHeaderUTF8       = errors.New("header is not valid UTF-8 (InvalidHeader)")
	ErrJSON             = errors.New("invalid JSON header")
	ErrInvalidOffset    = errors.New("invalid data_offsets (InvalidOffset)")
	ErrOverflow         = errors.New("size overflow (ValidationOverflow)")
	ErrMisaligned       = errors.New("sub-byte tensor does not end on a byte boundary (MisalignedSlice)")
	ErrTensorInfo       = errors.New("data_offsets do not match shape and dtype (TensorInvalidInfo)")
	ErrIncompleteBuffer = errors.New("tensor data does not end at end of file (MetadataIncompleteBuffer)")
	ErrUnsupported      = errors.New("unsupported dtype")
)

// Tensor is one tensor of a file. Its bytes are little-endian, row-major,
// at file offsets [Offset, Offset+NBytes).
type Tensor struct {
	Name   string
	DType  dtype.DType
	Shape  []int64
	Offset int64 // absolute file offset of the first byte
	NBytes int64
}

// Numel returns the number of elements.
func (t *Tensor) Numel() int64 {
	// Validation bounds the product by the file size, except when a
	// dimension is 0: then the wrapped product is still 0.
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is an opened safetensors file.
type File struct {
	Name      string
	Metadata  map[string]string // nil when the header has no __metadata__
	Tensors   []Tensor          // in data (offset) order
	HeaderLen int64             // N: JSON header bytes including padding

	index  map[string]int
	r      io.ReaderAt
	size   int64
	closer io.Closer
}

// Open opens and validates a safetensors file. Close it when done.
func Open(path string) (*File, error) {
	sf, f, err := fsutil.OpenReaderAt(path, Read)
	if err != nil {
		return nil, err
	}
	sf.closer = f
	return sf, nil
}

// Read reads and validates the header of the safetensors file of size
// bytes in r. The name is used in error messages. Tensor bytes stay in r.
func Read(r io.ReaderAt, size int64, name string) (*File, error) {
	f, err := read(r, size, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return f, nil
}

func read(r io.ReaderAt, size int64, name string) (*File, error) {
	n, hb, err := readHeader(r, size)
	if err != nil {
		return nil, err
	}
	h, err := parseHeader(hb)
	if err != nil {
		return nil, err
	}
	// Reference order: sort by (begin, end), then walk the buffer. The sort
	// is stable so that zero-sized tensors sharing an offset keep JSON order.
	ents := h.entries
	slices.SortStableFunc(ents, func(a, b rawEntry) int {
		if a.begin != b.begin {
			return cmp.Compare(a.begin, b.begin)
		}
		return cmp.Compare(a.end, b.end)
	})
	var at uint64
	for _, e := range ents {
		if err := checkEntry(e, at); err != nil {
			return nil, err
		}
		at = e.end
	}
	dataStart := 8 + n
	if at != uint64(size)-dataStart {
		what := "trailing bytes after the last tensor"
		if at > uint64(size)-dataStart {
			what = "file truncated"
		}
		return nil, fmt.Errorf("%w: header and tensors end at byte %d but the file has %d bytes (%s)",
			ErrIncompleteBuffer, dataStart+at, size, what)
	}

	f := &File{
		Name:      name,
		Metadata:  h.metadata,
		HeaderLen: int64(n),
		Tensors:   make([]Tensor, len(ents)),
		index:     make(map[string]int, len(ents)),
		r:         r,
		size:      size,
	}
	for i, e := range ents {
		dt, ok := dtype.FromSafetensors(e.dtype.String())
		if !ok {
			return nil, fmt.Errorf("tensor %q: %w %s (valid safetensors, but ucp has no such element type)", e.name, ErrUnsupported, e.dtype)
		}
		shape := make([]int64, len(e.shape))
		for j, d := range e.shape {
			if d > math.MaxInt64 {
				return nil, fmt.Errorf("tensor %q: dimension %d of shape %v exceeds 2^63-1", e.name, j, e.shape)
			}
			shape[j] = int64(d)
		}
		// Offsets are bounded by the file size, checked above.
		f.Tensors[i] = Tensor{Name: e.name, DType: dt, Shape: shape, Offset: int64(dataStart + e.begin), NBytes: int64(e.end - e.begin)}
		f.index[e.name] = i
	}
	return f, nil
}

// readHeader reads the header length n and the n header bytes, checked
// against the file size before they are allocated and for UTF-8.
func readHeader(r io.ReaderAt, size int64) (uint64, []byte, error) {
	if size < 8 {
		return 0, nil, fmt.Errorf("%w: file has %d bytes", ErrHeaderTooSmall, size)
	}
	var lenBuf [8]byte
	if err := readFull(r, lenBuf[:], 0); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderSize {
		return 0, nil, fmt.Errorf("%w: header length %d exceeds %d", ErrHeaderTooLarge, n, MaxHeaderSize)
	}
	if n > uint64(size)-8 {
		return 0, nil, fmt.Errorf("%w: header length %d but the file has only %d bytes after the length", ErrHeaderLength, n, size-8)
	}
	// Only now is allocating n bytes justified by the file size.
	hb := make([]byte, n)
	if err := readFull(r, hb, 8); err != nil {
		return 0, nil, err
	}
	if !utf8.Valid(hb) {
		return 0, nil, fmt.Errorf("%w: invalid byte at header offset %d", ErrHeaderUTF8, invalidUTF8At(hb))
	}
	return n, hb, nil
}

// checkEntry checks one tensor of the sorted header, the previous one
// ending at byte at of the data: no hole, no overlap, and data offsets that
// hold exactly its shape of its dtype.
func checkEntry(e rawEntry, at uint64) error {
	switch {
	case e.begin > at:
		return fmt.Errorf("tensor %q: %w: data_offsets [%d, %d] leave bytes [%d, %d) of the data unused (a hole)",
			e.name, ErrInvalidOffset, e.begin, e.end, at, e.begin)
	case e.begin < at:
		return fmt.Errorf("tensor %q: %w: data_offsets [%d, %d] overlap the previous tensor, which ends at %d",
			e.name, ErrInvalidOffset, e.begin, e.end, at)
	case e.end < e.begin:
		return fmt.Errorf("tensor %q: %w: data_offsets [%d, %d] end before they begin",
			e.name, ErrInvalidOffset, e.begin, e.end)
	}
	numel := uint64(1)
	for _, d := range e.shape {
		hi, lo := bits.Mul64(numel, d)
		if hi != 0 {
			return fmt.Errorf("tensor %q: %w: element count of shape %v exceeds 64 bits", e.name, ErrOverflow, e.shape)
		}
		numel = lo
	}
	hi, nbits := bits.Mul64(numel, e.dtype.bits())
	if hi != 0 {
		return fmt.Errorf("tensor %q: %w: %d elements of %s exceed 64 bits of size", e.name, ErrOverflow, numel, e.dtype)
	}
	if nbits%8 != 0 {
		return fmt.Errorf("tensor %q: %w: %d elements of %s are %d bits", e.name, ErrMisaligned, numel, e.dtype, nbits)
	}
	if e.end-e.begin != nbits/8 {
		return fmt.Errorf("tensor %q: %w: shape %v of %s needs %d bytes, data_offsets [%d, %d] hold %d",
			e.name, ErrTensorInfo, e.shape, e.dtype, nbits/8, e.begin, e.end, e.end-e.begin)
	}
	return nil
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

// DataStart returns the file offset of the byte buffer (8 + HeaderLen).
func (f *File) DataStart() int64 { return 8 + f.HeaderLen }

// ReaderAt returns the underlying reader.
func (f *File) ReaderAt() io.ReaderAt { return f.r }

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (*Tensor, bool) {
	i, ok := f.index[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Names returns the tensor names in data order.
func (f *File) Names() []string {
	out := make([]string, len(f.Tensors))
	for i, t := range f.Tensors {
		out[i] = t.Name
	}
	return out
}

// ReadRange reads elements [start, start+n) of t (row-major) into dst,
// which must hold n*elsize bytes, as stored (little-endian, no conversion).
func (f *File) ReadRange(t *Tensor, start, n int64, dst []byte) error {
	es := int64(t.DType.Size())
	numel := t.Numel()
	if start < 0 || n < 0 || start > numel || n > numel-start {
		return fmt.Errorf("%s: tensor %q: element range [%d, %d) outside %d elements", f.Name, t.Name, start, start+n, numel)
	}
	if int64(len(dst)) < n*es {
		return fmt.Errorf("%s: tensor %q: buffer of %d bytes for %d elements of %v", f.Name, t.Name, len(dst), n, t.DType)
	}
	if err := readFull(f.r, dst[:n*es], t.Offset+start*es); err != nil {
		return fmt.Errorf("%s: tensor %q: %w", f.Name, t.Name, err)
	}
	return nil
}

// ReadTensor reads all bytes of t.
func (f *File) ReadTensor(t *Tensor) ([]byte, error) {
	buf := make([]byte, t.NBytes)
	return buf, f.ReadRange(t, 0, t.Numel(), buf)
}

// ReadFloat32 reads elements [start, start+n) of t converted to float32
// as torch's .float() does.
func (f *File) ReadFloat32(t *Tensor, start, n int64) ([]float32, error) {
	if n < 0 || n > t.Numel() {
		return nil, fmt.Errorf("%s: tensor %q: element range [%d, %d) outside %d elements", f.Name, t.Name, start, start+n, t.Numel())
	}
	raw := make([]byte, n*int64(t.DType.Size()))
	if err := f.ReadRange(t, start, n, raw); err != nil {
		return nil, err
	}
	out := make([]byte, 4*n)
	if err := dtype.ToFloat32(out, raw, t.DType); err != nil {
		return nil, fmt.Errorf("%s: tensor %q: %w", f.Name, t.Name, err)
	}
	return dtype.Float32s(out), nil
}

func readFull(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("reading %d bytes at offset %d: %w", len(b), off, err)
}

func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(b)
}
