package atomic

import (
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Deferred verification. A command that reads each state file's elements
// once (export, reshard) would read every file twice if it checked the
// CRC-32 up front: once for the check and once for the work. With
// VerifyingReads the bytes are hashed as they are read (State.ReadRange) or
// copied in the kernel (State.Record with the copy's CRC), and at its end
// the reader combines those CRCs, reading only the bytes nobody read (the
// file's zip header, pickle and directory, a few KiB), into the whole
// file's CRC-32 to compare with the manifest. The check is then of the very bytes used,
// which an up-front check is not (the file may change in between).

// readTrack is one state file being verified from what is read of it.
type readTrack struct {
	e      FileEntry
	path   string
	mu     sync.Mutex
	pieces []torchfile.Piece // byte ranges of the file, hashed as read
}

func (t *readTrack) add(off, n int64, crc uint32) {
	if n <= 0 {
		return
	}
	t.mu.Lock()
	t.pieces = append(t.pieces, torchfile.Piece{Off: off, Len: n, CRC: crc})
	t.mu.Unlock()
}

// VerifyingReads runs fn with the state files OpenState opens verified
// (ReaderOptions.Verify) from the bytes fn reads of them rather than read
// whole before their first use, and returns fn's error or else the first
// file that does not match the manifest. Callers publish nothing written
// from them before it returns nil. Global files (Load, Step) are still
// checked before their first use.
func (r *Reader) VerifyingReads(fn func() error) error {
	r.mu.Lock()
	r.tracks = map[string]*readTrack{}
	r.mu.Unlock()
	err := fn()
	if serr := r.settle(); err == nil {
		err = serr
	}
	return err
}

// trackOrVerify checks a state file about to be opened: refused if a link
// leading outside the checkpoint; verified now, or tracked when deferred
// (nil track when nothing is left to check).
func (r *Reader) trackOrVerify(e FileEntry) (*readTrack, error) {
	r.mu.Lock()
	deferred := r.tracks != nil
	r.mu.Unlock()
	if !deferred || !r.opt.Verify {
		return nil, r.verify(e)
	}
	path := filepath.Join(r.Dir, filepath.FromSlash(e.Path))
	if err := r.Inside(path); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err, done := r.verified[e.Path]; done {
		return nil, err
	}
	t, ok := r.tracks[e.Path]
	if !ok {
		t = &readTrack{e: e, path: path}
		r.tracks[e.Path] = t
	}
	return t, nil
}

// settle ends VerifyingReads: it verifies every state file opened since
// against the manifest, from the CRCs of the ranges read and the bytes not
// read, and returns the first mismatch. Files are checked once.
func (r *Reader) settle() error {
	r.mu.Lock()
	tracks := make([]*readTrack, 0, len(r.tracks))
	for _, t := range r.tracks {
		tracks = append(tracks, t)
	}
	r.tracks = nil
	r.mu.Unlock()
	sort.Slice(tracks, func(i, j int) bool { return tracks[i].path < tracks[j].path })
	var first error
	for _, t := range tracks {
		err := t.settle()
		r.mu.Lock()
		r.verified[t.e.Path] = err
		r.mu.Unlock()
		if first == nil {
			first = err
		}
	}
	return first
}

// settle computes the file's CRC-32 from its pieces read, hashing the gaps
// (and any piece overlapping one before it) from the file.
func (t *readTrack) settle() error {
	f, err := fsutil.Open(t.path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if size != t.e.Bytes {
		return fmt.Errorf("%s: %d bytes, but the manifest says %d", t.path, size, t.e.Bytes)
	}
	t.mu.Lock()
	ps := t.pieces
	t.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].Off < ps[j].Off || ps[i].Off == ps[j].Off && ps[i].Len > ps[j].Len })
	var tiled []torchfile.Piece
	var at int64
	var buf []byte
	gap := func(end int64) error {
		if end <= at {
			return nil
		}
		if want := min(end-at, 256<<10); int64(len(buf)) < want {
			buf = make([]byte, want) // gaps are mostly a few KiB of header: no 256 KiB per file
		}
		var crc uint32
		for off := at; off < end; {
			b := buf[:min(end-off, int64(len(buf)))]
			if _, err := f.ReadAt(b, off); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return fmt.Errorf("%s: %w", t.path, err)
			}
			crc = crc32.Update(crc, crc32.IEEETable, b)
			off += int64(len(b))
		}
		tiled = append(tiled, torchfile.Piece{Off: at, Len: end - at, CRC: crc})
		at = end
		return nil
	}
	for _, p := range ps {
		if p.Off < at {
			continue // overlaps a piece taken: its bytes are counted once
		}
		if p.Off+p.Len > size {
			return fmt.Errorf("%s: %d bytes were read at %d of a file of %d (the file changed)", t.path, p.Len, p.Off, size)
		}
		if err := gap(p.Off); err != nil {
			return err
		}
		tiled = append(tiled, p)
		at = p.Off + p.Len
	}
	if err := gap(size); err != nil {
		return err
	}
	crc, err := torchfile.CombinePieces(tiled, size)
	if err != nil {
		return fmt.Errorf("%s: %w", t.path, err)
	}
	if got := fmt.Sprintf("%08x", crc); got != strings.ToLower(t.e.CRC32) {
		return fmt.Errorf("%s: CRC-32 %s, but the manifest says %s (the file changed or is corrupt)", t.path, got, t.e.CRC32)
	}
	return nil
}
