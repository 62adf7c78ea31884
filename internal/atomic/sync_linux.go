package atomic

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncTree makes every file under dir durable with one syncfs(2) on its
// filesystem, instead of an fsync per file.
func syncTree(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return syncEach(dir)
	}
	return nil
}
