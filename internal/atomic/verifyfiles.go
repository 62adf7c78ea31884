package atomic

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// verifyPiece is the most bytes of one file a VerifyFiles task hashes: the
// workers share a big file (a model-state file of hundreds of MB, listed
// last) instead of one of them reading it alone while the others idle.
const verifyPiece = 32 << 20

// verifyBuf is each worker's read buffer: few system calls, and the bytes
// stay in the CPU's cache between the read and the CRC.
const verifyBuf = 256 << 10

// VerifyFiles checks the size and CRC-32 of each file paths[i] against
// entries[i] as VerifyFile does, with workers goroutines sharing pieces of
// at most verifyPiece bytes, each with one buffer it reuses. done is
// called once per file, from the worker that finished it, with nil or what
// is wrong with it (callers synchronise). It returns only ctx's error.
//
// Measured (ucp verify of the real DeepSpeed checkpoint's atomic
// conversion: 3.5 GB, 787 files, its 506 MB model-state file listed last;
// Linux 6.18, 2 cores, a VM at a load of 10; best of 5, alternated): 0.81 s
// of CPU and 1.06 s wall against 1.17 s and 1.72 s when each worker read
// whole files with a buffer allocated per file; cat 0.97 s and 1.68 s.
func VerifyFiles(ctx context.Context, paths []string, entries []FileEntry, workers int, done func(i int, err error)) error {
	return verifyFiles(ctx, paths, entries, workers, verifyPiece, done)
}

// verifyFiles is VerifyFiles with pieces of at most piece bytes.
func verifyFiles(ctx context.Context, paths []string, entries []FileEntry, workers int, piece int64, done func(i int, err error)) error {
	type file struct {
		left   atomic.Int64 // pieces not yet hashed
		mu     sync.Mutex
		pieces []torchfile.Piece
		err    error
	}
	type task struct {
		i      int
		off, n int64
	}
	files := make([]file, len(paths))
	var tasks []task
	for i, e := range entries {
		n := max((e.Bytes+piece-1)/piece, 1)
		files[i].left.Store(n)
		for k := range n {
			off := k * piece
			tasks = append(tasks, task{i: i, off: off, n: min(piece, e.Bytes-off)})
		}
	}
	// finish records piece t's outcome; the last piece of a file settles it.
	finish := func(t task, crc uint32, err error) {
		f := &files[t.i]
		f.mu.Lock()
		if err != nil && f.err == nil {
			f.err = err
		}
		f.pieces = append(f.pieces, torchfile.Piece{Off: t.off, Len: t.n, CRC: crc})
		f.mu.Unlock()
		if f.left.Add(-1) > 0 {
			return
		}
		err = f.err
		if err == nil {
			err = checkPieces(paths[t.i], entries[t.i], f.pieces)
		}
		f.pieces = nil
		done(t.i, err)
	}
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range min(max(workers, 1), max(len(tasks), 1)) {
		g.Go(func() error {
			buf := make([]byte, verifyBuf)
			for {
				if err := ctx.Err(); err != nil {
					return err
				}
				k := next.Add(1) - 1
				if k >= int64(len(tasks)) {
					return nil
				}
				t := tasks[k]
				crc, err := hashRange(paths[t.i], entries[t.i], t.off, t.n, buf)
				finish(t, crc, err)
			}
		})
	}
	return g.Wait()
}

// hashRange returns the CRC-32 of bytes [off, off+n) of path, checking
// first that the file has the entry's size.
func hashRange(path string, e FileEntry, off, n int64, buf []byte) (uint32, error) {
	f, err := fsutil.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() != e.Bytes {
		return 0, fmt.Errorf("%s: %d bytes, but the manifest says %d", path, st.Size(), e.Bytes)
	}
	var crc uint32
	for n > 0 {
		b := buf[:min(n, int64(len(buf)))]
		if _, err := f.ReadAt(b, off); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // shrunk since the Stat
			}
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		crc = crc32.Update(crc, crc32.IEEETable, b)
		off, n = off+int64(len(b)), n-int64(len(b))
	}
	return crc, nil
}

// checkPieces combines the CRC-32s of pieces tiling a file into the
// file's and compares it with the entry.
func checkPieces(path string, e FileEntry, pieces []torchfile.Piece) error {
	crc, err := torchfile.CombinePieces(pieces, e.Bytes)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if got := fmt.Sprintf("%08x", crc); got != strings.ToLower(e.CRC32) {
		return fmt.Errorf("%s: CRC-32 %s, but the manifest says %s (the file changed or is corrupt)", path, got, e.CRC32)
	}
	return nil
}
