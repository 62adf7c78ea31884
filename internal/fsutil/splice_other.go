//go:build !linux

package fsutil

import "os"

func writeAt(f *os.File, p []byte, off int64) error { return pwriteChunks(f, p, off) }
