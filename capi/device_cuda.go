//go:build cuda

package main

import (
	"context"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/load"
)

// loadDevice loads into CUDA device memory (load.LoadGroupCUDA).
func loadDevice(ctx context.Context, comm *load.TCPComm, r *atomic.Reader, items []load.Item, ptrs []uint64, device int, spec *groupSpec, opt load.GroupOptions) (load.GroupStats, error) {
	return load.LoadGroupCUDA(ctx, comm, r, items, ptrs, device, load.CUDAOptions{GroupOptions: opt, NCCL: spec.ForceNCCL, NCCLLibrary: spec.NCCLLibrary})
}
