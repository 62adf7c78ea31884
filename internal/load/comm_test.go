package load_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/load"
	"github.com/ucp-project/ucp/internal/testkit"
)

// ring starts n ranks on loopback ports.
func ring(t *testing.T, n int) []*load.TCPComm { return ringOpts(t, n, load.RingOptions{}) }

func ringOpts(t *testing.T, n int, opt load.RingOptions) []*load.TCPComm {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	comms := make([]*load.TCPComm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[i], errs[i] = load.NewTCPCommOptions(ctx, i, lns[i], addrs, opt)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

func TestAllGather(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		comms := ring(t, n)
		got := make([][][]byte, n)
		var wg sync.WaitGroup
		for i, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				block := bytes.Repeat([]byte{byte(i)}, 1000*i+1) // sizes differ
				var err error
				if got[i], err = c.AllGather(context.Background(), block); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		for i := range comms {
			for r := 0; r < n; r++ {
				if want := bytes.Repeat([]byte{byte(r)}, 1000*r+1); !bytes.Equal(got[i][r], want) {
					t.Fatalf("%d ranks: rank %d got a wrong block from rank %d", n, i, r)
				}
			}
		}
	}
}

func TestAllGatherCancelled(t *testing.T) {
	comms := ring(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	// Rank 1 never joins: rank 0 must give up when the context ends.
	if _, err := comms[0].AllGather(ctx, []byte("x")); err == nil {
		t.Fatal("all-gather with a silent peer returned no error")
	}
}

// TestLoadShared: three data-parallel ranks load the TP shard 1 of every
// state of a converted checkpoint; each reads about a third from storage
// and all end with the same tensors as a plain read.
func TestLoadShared(t *testing.T) {
	tbl, err := deepspeed.Index(context.Background(), testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint"), deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{})
	var reqs []load.Request
	for _, p := range r.Params() {
		for _, f := range p.Files {
			if f.State == "step" {
				continue
			}
			s, err := r.OpenState(p.Name, f.State)
			if err != nil {
				t.Fatal(err)
			}
			meta, err := layout.ReadMeta(s.Path)
			s.Close()
			if err != nil {
				t.Fatal(err)
			}
			sh, err := layout.TPShard(meta, p.Shape, 2, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, load.Request{Param: p.Name, State: f.State, Shard: sh})
		}
	}
	comms := ring(t, 3)
	results := make([][][]float32, 3)
	stats := make([]load.LoadStats, 3)
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if results[i], stats[i], err = load.LoadShared(context.Background(), c, r, reqs); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var total int64
	for _, s := range stats {
		total += s.BytesRead
	}
	for i, s := range stats {
		if float64(s.BytesRead) > 0.5*float64(total) || s.BytesRead == 0 {
			t.Errorf("rank %d read %d of %d bytes", i, s.BytesRead, total)
		}
	}
	for k, q := range reqs {
		single, _, err := load.LoadShared(context.Background(), soloComm{}, r, []load.Request{q})
		if err != nil {
			t.Fatal(err)
		}
		for i := range results {
			if fmt.Sprint(results[i][k]) != fmt.Sprint(single[0]) {
				t.Fatalf("rank %d: %s/%s differs from a plain read", i, q.Param, q.State)
			}
		}
	}
}

type soloComm struct{}

func (soloComm) Rank() int { return 0 }
func (soloComm) Size() int { return 1 }
func (soloComm) AllGather(_ context.Context, b []byte) ([][]byte, error) {
	return [][]byte{b}, nil
}
func (soloComm) Close() error { return nil }
