//go:build !cuda && cgo

package main

import (
	"context"
	"errors"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/load"
)

// loadDevice: this libucp.so has no CUDA support (build it with -tags cuda:
// make python-cuda).
func loadDevice(context.Context, *load.TCPComm, *atomic.Reader, []load.Item, []uint64, int, *groupSpec, load.GroupOptions) (load.GroupStats, error) {
	return load.GroupStats{}, errors.New("ucp: this libucp.so was built without CUDA support: build it with `make python-cuda` (go build -tags cuda) to load into CUDA tensors with transport=\"ucp\", or use transport=\"torch\"")
}
