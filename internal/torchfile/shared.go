package torchfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SharedWriter fills part of a torch.save file that several processes
// (nodes of a conversion) write at once. Every process opens the same
// partial file, writes the same head (the layout is a pure function of the
// object) and its own byte ranges, and reports the pieces it wrote; one
// process then calls FinishShared with everybody's pieces.
type SharedWriter struct {
	blobFile
}

// PartialPath is the name under which a shared file is filled.
func PartialPath(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".partial")
}

func prefixOf(path string) string {
	base := filepath.Base(path)
	if p := strings.TrimSuffix(base, filepath.Ext(base)); p != "" {
		return p
	}
	return "archive"
}

// OpenShared opens (creating if needed) the partial file of path for root,
// sized and with its head written; existing bytes of other writers are kept.
func OpenShared(path string, root any) (*SharedWriter, error) {
	l, err := NewLayout(prefixOf(path), root)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f, err := os.OpenFile(PartialPath(path), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	w := &SharedWriter{blobFile{Layout: l, path: path, f: f}}
	if err := w.prepare(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}

// Pieces returns what this writer wrote, per blob.
func (w *SharedWriter) Pieces() [][]Piece {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([][]Piece, len(w.pieces))
	for i, ps := range w.pieces {
		out[i] = append([]Piece(nil), ps...)
	}
	return out
}

// Close closes this writer's handle; the file stays partial.
func (w *SharedWriter) Close() error { return w.f.Close() }

// FinishShared completes the shared file of path: it checks that the
// pieces of all writers tile every blob exactly, writes the tail, syncs
// unless noSync, renames the file into place and returns its CRC-32.
func FinishShared(path string, root any, pieces [][]Piece, noSync bool) (uint32, int64, error) {
	l, err := NewLayout(prefixOf(path), root)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	if len(pieces) != len(l.Blobs) {
		return 0, 0, fmt.Errorf("%s: pieces for %d tensors, the file has %d", path, len(pieces), len(l.Blobs))
	}
	crcs := make([]uint32, len(l.Blobs))
	for i, b := range l.Blobs {
		c, err := CombinePieces(pieces[i], b.NBytes())
		if err != nil {
			return 0, 0, fmt.Errorf("%s: tensor %d: %w", path, i, err)
		}
		crcs[i] = c
	}
	f, err := os.OpenFile(PartialPath(path), os.O_RDWR, 0)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() != l.Size() {
		return 0, 0, fmt.Errorf("%s: partial file has the wrong size", path)
	}
	tail, err := l.Tail(crcs)
	if err != nil {
		return 0, 0, err
	}
	all := []Piece{}
	for _, s := range l.Head() {
		all = append(all, NewPiece(s.Off, s.Data))
	}
	for i, b := range l.Blobs {
		all = append(all, Piece{Off: l.BlobOffset(i), Len: b.NBytes(), CRC: crcs[i]})
	}
	for _, s := range tail {
		if _, err := f.WriteAt(s.Data, s.Off); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", path, err)
		}
		all = append(all, NewPiece(s.Off, s.Data))
	}
	if !noSync {
		if err := f.Sync(); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", path, err)
		}
	}
	crc, err := CombinePieces(all, l.Size())
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	if err := os.Rename(PartialPath(path), path); err != nil {
		return 0, 0, err
	}
	return crc, l.Size(), nil
}
