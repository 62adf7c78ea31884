//go:build !unix

package fsutil

import "os"

// Flock is not available here: every lock is granted (no exclusion
// between conversions).
func Flock(f *os.File, shared bool) (bool, error) { return true, nil }

// openDir opens the folder path after checking with Lstat that it is a
// folder and not a link (a window remains where the unix open has none).
func openDir(path string) (*os.File, error) {
	if err := CheckDirOrAbsent(path); err != nil {
		return nil, err
	}
	return os.Open(path)
}

// inode is not available here (0: not compared).
func inode(st os.FileInfo) uint64 { return 0 }
