//go:build cuda

package load_test

import (
	"unsafe"

	"github.com/ucp-project/ucp/internal/fragment"
)

func fullShard(shape []int64) fragment.Shard {
	return fragment.Shard{Shape: append([]int64(nil), shape...)}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
