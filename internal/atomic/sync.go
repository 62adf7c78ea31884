package atomic

import (
	"io/fs"
	"os"
	"path/filepath"
)

// syncEach fsyncs every file and folder under dir.
func syncEach(dir string) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		return err
	})
}
