package fsutil

import (
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"
)

// identityEdge is how much of each end of a file FileID's CRC covers.
const identityEdge = 1 << 20

// FileID identifies a source file's content as of one moment cheaply: a
// file changed in place keeps its path, and usually its size, but not its
// mtime (nanoseconds), its inode (when replaced by a rename) or the bytes
// at its ends. --resume compares them to reuse only work done from the
// same input.
type FileID struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	Inode   uint64 `json:"inode,omitempty"`
	// CRC is the CRC-32 (IEEE) of the first and last MiB (the whole file
	// when smaller), lower-case hex.
	CRC string `json:"crc32"`
}

// Identify returns the FileID of each path (sorted by path, duplicates
// once).
func Identify(paths []string) ([]FileID, error) {
	seen := map[string]bool{}
	var out []FileID
	for _, p := range paths {
		if seen[p] {
			continue
		}
		seen[p] = true
		id, err := identify(p)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func identify(path string) (FileID, error) {
	f, err := Open(path)
	if err != nil {
		return FileID{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return FileID{}, err
	}
	id := FileID{Path: path, Size: st.Size(), MtimeNs: st.ModTime().UnixNano(), Inode: inode(st)}
	h := crc32.NewIEEE()
	head := min(id.Size, identityEdge)
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, head)); err != nil {
		return FileID{}, fmt.Errorf("%s: %w", path, err)
	}
	if tail := max(head, id.Size-identityEdge); tail < id.Size {
		if _, err := io.Copy(h, io.NewSectionReader(f, tail, id.Size-tail)); err != nil {
			return FileID{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	id.CRC = fmt.Sprintf("%08x", h.Sum32())
	return id, nil
}

// ChangedSince compares the files recorded (was) with their state now and
// returns why the first that differs is not the same input, or "".
func ChangedSince(was []FileID) (string, error) {
	for _, w := range was {
		now, err := identify(w.Path)
		if os.IsNotExist(err) {
			return fmt.Sprintf("%s is gone", w.Path), nil
		}
		if err != nil {
			return "", err
		}
		switch {
		case now.Size != w.Size:
			return fmt.Sprintf("%s has %d bytes, %d before", w.Path, now.Size, w.Size), nil
		case now.Inode != w.Inode:
			return fmt.Sprintf("%s was replaced (inode %d, %d before)", w.Path, now.Inode, w.Inode), nil
		case now.MtimeNs != w.MtimeNs:
			return fmt.Sprintf("%s was modified (mtime %d ns, %d before)", w.Path, now.MtimeNs, w.MtimeNs), nil
		case now.CRC != w.CRC:
			return fmt.Sprintf("%s has other bytes at its start or end (CRC-32 %s, %s before)", w.Path, now.CRC, w.CRC), nil
		}
	}
	return "", nil
}
