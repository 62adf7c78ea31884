//go:build !linux

package atomic

func syncTree(dir string) error { return syncEach(dir) }
