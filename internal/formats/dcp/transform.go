package dcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// maxZstdWindow bounds the memory one zstd decoder may use: 128 MiB covers
// every level the zstandard package writes (level 22 --ultra uses 2^27).
const maxZstdWindow = 1 << 27

// transform undoes one stream transform of torch >= 2.7's FileSystemWriter
// extensions (_extension.py): a reader of the transformed bytes gives the
// plain ones.
type transform func(io.Reader) (io.ReadCloser, error)

// transformFor returns the transform of a descriptor "<name>[@domain]/<version>".
// Only major version 1 of each extension exists.
func transformFor(desc string) (transform, error) {
	name, version, _ := strings.Cut(desc, "/")
	major, _, _ := strings.Cut(version, ".")
	switch {
	case name == "stream.zstd" && major == "1":
		return func(r io.Reader) (io.ReadCloser, error) {
			d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxWindow(maxZstdWindow))
			if err != nil {
				return nil, err
			}
			return d.IOReadCloser(), nil
		}, nil
	case name == "stream.rot13" && major == "1":
		return func(r io.Reader) (io.ReadCloser, error) { return io.NopCloser(rot13{r}), nil }, nil
	}
	return nil, fmt.Errorf("unsupported stream transform %q (ucp undoes stream.zstd/1 and stream.rot13/1)", desc)
}

// checkTransforms rejects descriptors ucp cannot undo before anything is read.
func checkTransforms(descs []string) error {
	for _, d := range descs {
		if _, err := transformFor(d); err != nil {
			return err
		}
	}
	return nil
}

// rot13 is the test extension Rot13Example: letters rotated by 13.
type rot13 struct{ r io.Reader }

func (x rot13) Read(p []byte) (int, error) {
	n, err := x.r.Read(p)
	for i, c := range p[:n] {
		switch {
		case c >= 'a' && c <= 'z':
			p[i] = 'a' + (c-'a'+13)%26
		case c >= 'A' && c <= 'Z':
			p[i] = 'A' + (c-'A'+13)%26
		}
	}
	return n, err
}

// plainReader returns the item's plain bytes: its byte range read through
// every transform in descriptor order, as FileSystemReader does.
func plainReader(it item) (io.Reader, func(), error) {
	var r io.Reader = io.NewSectionReader(it.df.f, it.off, it.len)
	var closers []io.Closer
	done := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i].Close()
		}
	}
	for _, d := range it.transforms {
		t, err := transformFor(d)
		if err != nil {
			done()
			return nil, nil, err
		}
		rc, err := t(r)
		if err != nil {
			done()
			return nil, nil, fmt.Errorf("%s: %w", d, err)
		}
		closers = append(closers, rc)
		r = rc
	}
	return r, done, nil
}

// undoErr says what a decoder error means for the user.
func undoErr(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("the compressed stream is truncated (%w)", err)
	}
	return err
}

// spill decodes a transformed tensor item into a file of the scratch
// folder, streaming (memory stays within the decoder's window), and
// returns the plain item there: tensor data must be readable by range,
// which a compressed stream is not.
func (fs *files) spill(it item, key string) (item, error) {
	dir, err := fs.scratchDir()
	if err != nil {
		return item{}, err
	}
	r, done, err := plainReader(it)
	if err != nil {
		return item{}, fmt.Errorf("%s: item of %q at offset %d: %w", it.path, key, it.off, err)
	}
	defer done()
	f, err := os.CreateTemp(dir, "item-*")
	if err != nil {
		return item{}, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	n, err := io.Copy(w, r)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		f.Close()
		return item{}, fmt.Errorf("%s: item of %q at offset %d (%s): %w", it.path, key, it.off, strings.Join(it.transforms, ", "), undoErr(err))
	}
	path := f.Name()
	fs.mu.Lock()
	fs.spilled = append(fs.spilled, f)
	fs.mu.Unlock()
	return item{path: path, rel: it.rel, off: 0, len: n, df: &dataFile{f: f, size: n},
		shown: fmt.Sprintf("%s (%s item at offset %d, decoded)", it.path, strings.Join(it.transforms, ", "), it.off)}, nil
}

// scratchDir creates the folder of decoded items on first use.
func (fs *files) scratchDir() (string, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.scratch == "" {
		d, err := os.MkdirTemp("", "ucp-dcp-decoded-")
		if err != nil {
			return "", fmt.Errorf("a folder for decompressed DCP items: %w", err)
		}
		fs.scratch = d
	}
	return fs.scratch, nil
}

// removeScratch deletes the decoded items (when Open fails, or the table
// is closed).
func removeScratch(dir string) error {
	if dir == "" || !strings.HasPrefix(filepath.Base(dir), "ucp-dcp-decoded-") {
		return nil
	}
	return os.RemoveAll(dir)
}
