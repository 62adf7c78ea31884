//go:build !linux

package mapreduce

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// preadRuns fills bufs in order from f's bytes at off, one read each.
func preadRuns(f *os.File, off int64, bufs [][]byte) error {
	for _, b := range bufs {
		if _, err := f.ReadAt(b, off); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("reading %d bytes at offset %d: %w", len(b), off, err)
		}
		off += int64(len(b))
	}
	return nil
}
