//go:build cuda

package load_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/load"
)

// gpuReader is UCP_GPU_CKPT (a large generated atomic checkpoint, from
// scripts/gpu-check.sh) or the small converted fixture.
func gpuReader(t *testing.T) *atomic.Reader {
	if dir := os.Getenv("UCP_GPU_CKPT"); dir != "" {
		r, err := atomic.OpenReader(dir, atomic.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	return groupReader(t)
}

// needGPU skips without a usable GPU, unless UCP_REQUIRE_GPU=1.
func needGPU(t *testing.T) {
	if _, err := load.AllocDevice(0, 1); err != nil {
		if os.Getenv("UCP_REQUIRE_GPU") == "1" {
			t.Fatalf("UCP_REQUIRE_GPU=1 but: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
}

func gbps(b int64, d time.Duration) string {
	return fmt.Sprintf("%.2f GB/s (%.2f GB in %.2f s)", float64(b)/d.Seconds()/1e9, float64(b)/1e9, d.Seconds())
}

// TestCUDALoad loads every state of the checkpoint (float32 as stored, and
// as bfloat16 cast on the host) into cuMemAlloc'd device memory on one
// rank, without and with NCCL, copies it back and compares it byte for
// byte with a CPU group load; it prints the throughput of each and of
// reading the files.
func TestCUDALoad(t *testing.T) {
	needGPU(t)
	r := gpuReader(t)
	var items []load.Item
	for _, p := range r.Params() {
		for _, f := range p.Files {
			if f.State == atomic.StepState {
				continue
			}
			dt, err := p.StateDType()
			if err != nil {
				t.Fatal(err)
			}
			n := int64(1)
			for _, d := range p.Shape {
				n *= d
			}
			items = append(items, load.Item{Param: p.Name, State: f.State, N: n, DType: dt, Stored: true, Shard: fullShard(p.Shape)})
		}
	}
	var total int64
	for _, it := range items {
		total += it.Bytes()
	}
	// Reading the files (the page cache holds them if the generator just wrote them).
	start := time.Now()
	var fileBytes int64
	for _, e := range r.Manifest.AllFiles() {
		f, err := os.Open(filepath.Join(r.Dir, e.Path))
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		fileBytes += n
	}
	t.Logf("GPUCHECK read files: %s", gbps(fileBytes, time.Since(start)))

	// The CPU load into host memory.
	host := make([][]byte, len(items))
	for i, it := range items {
		host[i] = make([]byte, it.Bytes())
	}
	comms := ring(t, 1)
	start = time.Now()
	if _, err := load.LoadGroup(context.Background(), comms[0], r, items, host, load.GroupOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("GPUCHECK ucp CPU load (1 rank, host memory): %s", gbps(total, time.Since(start)))

	for _, c := range []struct {
		name string
		bf16 bool
		nccl bool
	}{{"cuda", false, false}, {"cuda bf16", true, false}, {"cuda+nccl", false, true}} {
		its := append([]load.Item(nil), items...)
		want := host
		if c.bf16 {
			want = make([][]byte, len(its))
			for i := range its {
				if its[i].DType == dtype.Float32 {
					its[i].DType, its[i].Stored = dtype.BFloat16, false
					want[i] = make([]byte, its[i].Bytes())
					if err := dtype.FromFloat32(want[i], host[i], dtype.BFloat16); err != nil {
						t.Fatal(err)
					}
				} else {
					want[i] = host[i]
				}
			}
		}
		bufs := make([]load.DeviceBuffer, len(its))
		ptrs := make([]uint64, len(its))
		var bytesDev int64
		for i, it := range its {
			b, err := load.AllocDevice(0, it.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			bufs[i], ptrs[i] = b, b.Ptr
			bytesDev += it.Bytes()
		}
		comms := ring(t, 1)
		start := time.Now()
		st, err := load.LoadGroupCUDA(context.Background(), comms[0], r, its, ptrs, 0, load.CUDAOptions{NCCL: c.nccl})
		el := time.Since(start)
		if err != nil {
			if c.nccl && strings.Contains(err.Error(), "cannot load libnccl") && os.Getenv("UCP_REQUIRE_NCCL") != "1" {
				t.Logf("GPUCHECK %s: skipped: %v", c.name, err)
				continue
			}
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("GPUCHECK ucp %s load (1 rank, device memory): %s; stats %+v", c.name, gbps(bytesDev, el), st)
		for i, b := range bufs {
			got := make([]byte, its[i].Bytes())
			if err := b.CopyToHost(0, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want[i]) {
				t.Fatalf("%s: %s/%s on the device differs from the CPU load", c.name, its[i].Param, its[i].State)
			}
			b.Free(0)
		}
		t.Logf("GPUCHECK %s: %d tensors match the CPU load byte for byte", c.name, len(its))
	}
	// A destination that is not device memory is refused, not written.
	comms = ring(t, 1)
	hostBuf := make([]byte, items[0].Bytes())
	if _, err := load.LoadGroupCUDA(context.Background(), comms[0], r, items[:1], []uint64{uint64(uintptrOf(hostBuf))}, 0, load.CUDAOptions{}); err == nil {
		t.Fatal("a host pointer was taken as device memory")
	}
}
