package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fsutil"
)

// Entry is a tensor to be written. Data optionally holds its bytes
// (little-endian, row-major); without it, bytes are supplied through
// Writer.WriteAt so that a large tensor never has to be in memory.
type Entry struct {
	Name  string
	DType dtype.DType
	Shape []int64
	Data  []byte
}

// Layout is the complete byte plan of one safetensors file: the header
// bytes and every tensor's position are fixed before any tensor byte is
// written, so disjoint ranges can be filled concurrently.
type Layout struct {
	Entries  []Entry           // in the caller's order; indexes refer to it
	Metadata map[string]string // as written (nil: no __metadata__)

	order  []int   // entry indexes in file order
	begin  []int64 // per entry: offset within the byte buffer
	nbytes []int64
	header []byte // u64le N, JSON, space padding
	size   int64
}

// NewLayout plans a file of entries with metadata, adding
// "format": "pt" unless metadata sets "format" (transformers refuses
// files whose metadata lacks it).
func NewLayout(entries []Entry, metadata map[string]string) (*Layout, error) {
	m := make(map[string]string, len(metadata)+1)
	for k, v := range metadata {
		m[k] = v
	}
	if _, ok := m["format"]; !ok {
		m["format"] = "pt"
	}
	return NewRawLayout(entries, m)
}

// NewRawLayout plans a file with metadata exactly as given: nil writes no
// __metadata__ (as the reference does for metadata=None), an empty map
// writes "__metadata__":{}.
//
// Tensors are ordered as the reference writer orders them: by dtype in
// descending order of its enum (U64, I64, F64, C64, F32, ..., U8, BOOL),
// then by name byte-wise, and laid out back to back from offset 0. The
// reference keeps __metadata__ in a hash map, so its key order is random;
// here keys are sorted, which gives identical bytes for one key.
func NewRawLayout(entries []Entry, metadata map[string]string) (*Layout, error) {
	l := &Layout{
		Entries:  entries,
		Metadata: metadata,
		begin:    make([]int64, len(entries)),
		nbytes:   make([]int64, len(entries)),
	}
	ranks := make([]refDType, len(entries))
	seen := make(map[string]bool, len(entries))
	for i, e := range entries {
		if !utf8.ValidString(e.Name) {
			return nil, fmt.Errorf("tensor %q: name is not valid UTF-8", e.Name)
		}
		if e.Name == metadataKey {
			return nil, fmt.Errorf("tensor name %q is reserved for metadata", e.Name)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("tensor %q: duplicate name", e.Name)
		}
		seen[e.Name] = true
		r, ok := rankOf(e.DType)
		if !ok {
			return nil, fmt.Errorf("tensor %q: dtype %v cannot be stored in safetensors", e.Name, e.DType)
		}
		ranks[i] = r
		n, err := entryBytes(e)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", e.Name, err)
		}
		if e.Data != nil && int64(len(e.Data)) != n {
			return nil, fmt.Errorf("tensor %q: %d bytes of data for %v %v, want %d", e.Name, len(e.Data), e.DType, e.Shape, n)
		}
		l.nbytes[i] = n
	}
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("metadata %q: key and value must be valid UTF-8", k)
		}
	}

	l.order = make([]int, len(entries))
	for i := range l.order {
		l.order[i] = i
	}
	slices.SortFunc(l.order, func(a, b int) int {
		if ranks[a] != ranks[b] {
			return int(ranks[b]) - int(ranks[a])
		}
		return strings.Compare(entries[a].Name, entries[b].Name)
	})
	var at int64
	for _, i := range l.order {
		if l.nbytes[i] > math.MaxInt64-at {
			return nil, fmt.Errorf("tensors total more than 2^63-1 bytes")
		}
		l.begin[i] = at
		at += l.nbytes[i]
	}

	js := l.headerJSON()
	n := (len(js) + 7) &^ 7
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("%w: header of %d bytes exceeds %d", ErrHeaderTooLarge, n, MaxHeaderSize)
	}
	l.header = make([]byte, 8, 8+n)
	binary.LittleEndian.PutUint64(l.header, uint64(n))
	l.header = append(l.header, js...)
	l.header = append(l.header, bytes.Repeat([]byte{' '}, n-len(js))...)
	if at > math.MaxInt64-int64(len(l.header)) {
		return nil, fmt.Errorf("file would exceed 2^63-1 bytes")
	}
	l.size = int64(len(l.header)) + at
	return l, nil
}

// entryBytes returns the payload size of e, checking the shape.
func entryBytes(e Entry) (int64, error) {
	for _, d := range e.Shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", e.Shape)
		}
	}
	// A zero anywhere makes the tensor empty, however large the other
	// dimensions (the reader accepts such shapes, so must the writer).
	if slices.Contains(e.Shape, 0) {
		return 0, nil
	}
	n := uint64(e.DType.Size())
	for _, d := range e.Shape {
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("shape %v of %v overflows 2^63-1 bytes", e.Shape, e.DType)
		}
		n = lo
	}
	return int64(n), nil
}

// headerJSON serialises the header as serde_json does: compact,
// __metadata__ first, then tensors in file order with fields dtype,
// shape, data_offsets.
func (l *Layout) headerJSON() []byte {
	b := []byte{'{'}
	first := true
	if l.Metadata != nil {
		b = append(b, `"__metadata__":{`...)
		keys := make([]string, 0, len(l.Metadata))
		for k := range l.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for j, k := range keys {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, l.Metadata[k])
		}
		b = append(b, '}')
		first = false
	}
	for _, i := range l.order {
		e := l.Entries[i]
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, e.Name)
		b = append(b, `:{"dtype":"`...)
		b = append(b, e.DType.SafetensorsName()...)
		b = append(b, `","shape":[`...)
		for j, d := range e.Shape {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, d, 10)
		}
		b = append(b, `],"data_offsets":[`...)
		b = strconv.AppendInt(b, l.begin[i], 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, l.begin[i]+l.nbytes[i], 10)
		b = append(b, "]}"...)
	}
	return append(b, '}')
}

// appendJSONString quotes s as serde_json does: '"' and '\\' escaped,
// control characters as \b \t \n \f \r or \u00xx (lower-case hex),
// everything else (DEL, non-ASCII) raw.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			} else {
				b = append(b, c)
			}
		}
	}
	return append(b, '"')
}

// Header returns the bytes before the tensor data: the u64le length, the
// JSON header and its padding.
func (l *Layout) Header() []byte { return l.header }

// DataStart returns the file offset of the first tensor byte.
func (l *Layout) DataStart() int64 { return int64(len(l.header)) }

// Size returns the file size.
func (l *Layout) Size() int64 { return l.size }

// Offset returns the absolute file offset of entry i's first byte.
func (l *Layout) Offset(i int) int64 { return int64(len(l.header)) + l.begin[i] }

// NBytes returns the payload size of entry i.
func (l *Layout) NBytes(i int) int64 { return l.nbytes[i] }

// Order returns the entry indexes in file order.
func (l *Layout) Order() []int { return slices.Clone(l.order) }

// Serialize returns the whole file in memory; every entry must have Data.
func (l *Layout) Serialize() ([]byte, error) {
	out := make([]byte, 0, l.size)
	out = append(out, l.header...)
	for _, i := range l.order {
		e := l.Entries[i]
		if e.Data == nil && l.nbytes[i] > 0 {
			return nil, fmt.Errorf("tensor %q: no data", e.Name)
		}
		out = append(out, e.Data...)
	}
	return out, nil
}

// Serialize returns the file NewLayout(entries, metadata) describes, with
// each entry's Data as its bytes.
func Serialize(entries []Entry, metadata map[string]string) ([]byte, error) {
	l, err := NewLayout(entries, metadata)
	if err != nil {
		return nil, err
	}
	return l.Serialize()
}

// span is a written byte range of one tensor.
type span struct{ off, n int64 }

// Writer writes one safetensors file through a temporary file in the
// target directory: the file appears under its name only after Commit,
// complete.
type Writer struct {
	Layout *Layout
	path   string
	tmp    string
	f      *os.File
	mu     sync.Mutex
	pieces [][]span
	closed bool
}

// Create starts writing the file NewLayout(entries, metadata) describes.
// Entries with Data are written at once; the others through WriteAt.
func Create(path string, entries []Entry, metadata map[string]string) (*Writer, error) {
	l, err := NewLayout(entries, metadata)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return CreateLayout(path, l)
}

// CreateLayout starts writing l to path.
func CreateLayout(path string, l *Layout) (*Writer, error) {
	f, err := fsutil.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w := &Writer{Layout: l, path: path, tmp: f.Name(), f: f, pieces: make([][]span, len(l.Entries))}
	fail := func(err error) (*Writer, error) {
		w.Abort()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// Pre-size so that concurrent WriteAt calls never extend the file
	// (blocks reserved where the filesystem can: fsutil.Presize).
	if err := fsutil.Presize(f, l.Size()); err != nil {
		return fail(err)
	}
	if _, err := f.WriteAt(l.header, 0); err != nil {
		return fail(err)
	}
	for i, e := range l.Entries {
		if e.Data != nil {
			if err := w.WriteAt(i, e.Data, 0); err != nil {
				w.Abort()
				return nil, err
			}
		}
	}
	return w, nil
}

// WriteAt writes p at byte off of entry i's payload. It is safe for
// concurrent use with disjoint ranges.
func (w *Writer) WriteAt(i int, p []byte, off int64) error {
	if i < 0 || i >= len(w.Layout.Entries) {
		return fmt.Errorf("%s: no tensor %d", w.path, i)
	}
	name, size := w.Layout.Entries[i].Name, w.Layout.nbytes[i]
	if off < 0 || off > size || int64(len(p)) > size-off {
		return fmt.Errorf("%s: tensor %q: write of %d bytes at %d outside its %d bytes", w.path, name, len(p), off, size)
	}
	if len(p) == 0 {
		return nil
	}
	if err := fsutil.WriteAt(w.f, p, w.Layout.Offset(i)+off); err != nil {
		return fmt.Errorf("%s: tensor %q: %w", w.path, name, err)
	}
	w.written(i, off, int64(len(p)))
	return nil
}

// written records a range of entry i as written and, as Commit syncs,
// starts writing it to disk (the sync then finds most of the work done).
func (w *Writer) written(i int, off, n int64) {
	fsutil.StartWriteback(w.f, w.Layout.Offset(i)+off, n)
	w.mu.Lock()
	w.pieces[i] = append(w.pieces[i], span{off, n})
	w.mu.Unlock()
}

// CopyFrom copies n bytes of src at srcOff to byte off of entry i's
// payload through c, in the kernel where it can (fsutil.Copier; c.Last is
// then the CRC-32 of the bytes copied). Safe for concurrent use with
// disjoint ranges, one Copier per goroutine.
func (w *Writer) CopyFrom(c *fsutil.Copier, i int, src *os.File, srcOff, off, n int64) error {
	if i < 0 || i >= len(w.Layout.Entries) {
		return fmt.Errorf("%s: no tensor %d", w.path, i)
	}
	name, size := w.Layout.Entries[i].Name, w.Layout.nbytes[i]
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("%s: tensor %q: copy of %d bytes at %d outside its %d bytes", w.path, name, n, off, size)
	}
	if n == 0 {
		return nil
	}
	if _, err := c.CopyRangeCRC(w.f, w.Layout.Offset(i)+off, src, srcOff, n); err != nil {
		return fmt.Errorf("%s: tensor %q: %w", w.path, name, err)
	}
	w.written(i, off, n)
	return nil
}

// Commit checks that every byte of every tensor was written exactly once,
// syncs the file and renames it into place. On error the temporary file
// is removed.
func (w *Writer) Commit() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("%s: writer already committed or aborted", w.path)
	}
	for i := range w.Layout.Entries {
		if err := checkCoverage(w.pieces[i], w.Layout.nbytes[i]); err != nil {
			w.abort()
			return fmt.Errorf("%s: tensor %q: %w", w.path, w.Layout.Entries[i].Name, err)
		}
	}
	w.closed = true
	err := w.f.Sync()
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
	// Make the rename durable; some file systems cannot sync a directory,
	// which is not worth failing a complete file for.
	if d, err := os.Open(filepath.Dir(w.path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// Abort removes the temporary file. It is a no-op after Commit.
func (w *Writer) Abort() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.abort()
	}
}

func (w *Writer) abort() {
	w.closed = true
	w.f.Close()
	os.Remove(w.tmp)
}

// checkCoverage checks that pieces tile [0, size) exactly once.
func checkCoverage(pieces []span, size int64) error {
	ps := slices.Clone(pieces)
	slices.SortFunc(ps, func(a, b span) int { return cmp.Compare(a.off, b.off) })
	var at int64
	for _, p := range ps {
		if p.off > at {
			return fmt.Errorf("bytes [%d, %d) were never written", at, p.off)
		}
		if p.off < at {
			return fmt.Errorf("bytes [%d, %d) were written more than once", p.off, min(at, p.off+p.n))
		}
		at += p.n
	}
	if at != size {
		return fmt.Errorf("bytes [%d, %d) were never written", at, size)
	}
	return nil
}

// Save writes entries, each with its Data, and metadata (plus
// "format": "pt" unless set) to path.
func Save(path string, entries []Entry, metadata map[string]string) error {
	for _, e := range entries {
		if e.Data == nil {
			if n, err := entryBytes(e); err == nil && n > 0 {
				return fmt.Errorf("%s: tensor %q: no data", path, e.Name)
			}
		}
	}
	w, err := Create(path, entries, metadata)
	if err != nil {
		return err
	}
	return w.Commit()
}
