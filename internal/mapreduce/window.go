package mapreduce

import (
	"errors"
	"io"
	"os"
)

// windowSize is how much a reducer reads ahead for small reads: the next
// parameters of a flat partition usually lie right after the current one.
const windowSize = 1 << 20

// maxWindows bounds a reducer's open read-ahead windows (one per file).
const maxWindows = 8

// window serves reads of one file from the last chunk read ahead; reads
// at least windowSize long go straight to the file.
type window struct {
	f   *os.File
	buf []byte
	off int64
	use int64 // for eviction: the reducer's read counter at last use
}

func (w *window) ReadAt(p []byte, off int64) (int, error) {
	if off >= w.off && off+int64(len(p)) <= w.off+int64(len(w.buf)) {
		return copy(p, w.buf[off-w.off:]), nil
	}
	if len(p) >= windowSize {
		return w.f.ReadAt(p, off)
	}
	if cap(w.buf) < windowSize {
		w.buf = make([]byte, windowSize)
	}
	n, err := w.f.ReadAt(w.buf[:windowSize], off)
	if err != nil && !errors.Is(err, io.EOF) {
		w.buf = w.buf[:0]
		return 0, err
	}
	w.buf, w.off = w.buf[:n], off
	if n < len(p) {
		return copy(p, w.buf), io.EOF
	}
	return copy(p, w.buf), nil
}

// reader returns the reducer's read-ahead view of path.
func (red *reducer) reader(path string) (io.ReaderAt, error) {
	red.uses++
	if w, ok := red.windows[path]; ok {
		w.use = red.uses
		return w, nil
	}
	f, err := red.r.src.get(path)
	if err != nil {
		return nil, err
	}
	if red.windows == nil {
		red.windows = map[string]*window{}
	}
	if len(red.windows) >= maxWindows {
		var oldest string
		for p, w := range red.windows {
			if oldest == "" || w.use < red.windows[oldest].use {
				oldest = p
			}
		}
		delete(red.windows, oldest)
	}
	w := &window{f: f, use: red.uses}
	red.windows[path] = w
	return w, nil
}
