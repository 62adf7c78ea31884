//go:build !linux

package fsutil

import "os"

func kernelCopy(*os.File, int64, *os.File, int64, int) (int, error) { return 0, errKernelUnsupported }
