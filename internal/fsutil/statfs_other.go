//go:build !linux

package fsutil

import "math"

// FSInfo is unknown here: no free-space limit, the POSIX name limit.
func FSInfo(dir string) (free int64, nameMax int, err error) {
	return math.MaxInt64, 255, nil
}
