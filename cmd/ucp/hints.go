package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
)

// checkPath fails with what to do when path does not exist, before any
// format tries it and fails with a vaguer message.
func checkPath(path string) error {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: no such file or folder (give the checkpoint's folder: the one with 'latest', a tag folder, an iter_* folder or a .metadata folder)", path)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// escapeControl quotes names holding control or invalid characters, so
// that a hostile checkpoint cannot move the terminal's cursor.
func escapeControl(s string) string {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\uFFFD' {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}
