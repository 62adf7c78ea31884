package load_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/load"
	"github.com/ucp-project/ucp/internal/testkit"
)

// groupItems: tensor-parallel shard t of T of every parameter's fp32 and
// exp_avg, as float32 and as bfloat16.
func groupItems(t *testing.T, r *atomic.Reader, T, tp int) []load.Item {
	t.Helper()
	var items []load.Item
	for _, p := range r.Params() {
		for _, state := range []string{"fp32", "exp_avg"} {
			s, err := r.OpenState(p.Name, state)
			if err != nil {
				t.Fatal(err)
			}
			meta, err := layout.ReadMeta(s.Path)
			s.Close()
			if err != nil {
				t.Fatal(err)
			}
			sh, err := layout.TPShard(meta, p.Shape, T, tp, 0)
			if err != nil {
				t.Fatal(err)
			}
			n := int64(1)
			for _, d := range sh.Shape {
				n *= d
			}
			dt := dtype.Float32
			if state == "exp_avg" {
				dt = dtype.BFloat16
			}
			items = append(items, load.Item{Param: p.Name, State: state, Shard: sh, N: n, DType: dt})
		}
	}
	return items
}

func groupReader(t *testing.T) *atomic.Reader {
	t.Helper()
	tbl, err := deepspeed.Index(context.Background(), testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint"), deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{})
	return r
}

func alloc(items []load.Item) [][]byte {
	dst := make([][]byte, len(items))
	for i, it := range items {
		dst[i] = bytes.Repeat([]byte{0xa5}, int(it.Bytes())) // garbage a load must overwrite
	}
	return dst
}

// runGroup loads items[k] into fresh buffers on rank k of an n-rank ring.
func runGroup(t *testing.T, r *atomic.Reader, items [][]load.Item, opt load.GroupOptions, breakRank int) ([][][]byte, []load.GroupStats, []error) {
	return runGroupRing(t, r, items, opt, breakRank, load.RingOptions{})
}

func runGroupRing(t *testing.T, r *atomic.Reader, items [][]load.Item, opt load.GroupOptions, breakRank int, ro load.RingOptions) ([][][]byte, []load.GroupStats, []error) {
	n := len(items)
	comms := ringOpts(t, n, ro)
	for k, c := range comms {
		from, to := c.SameHost()
		if ro.TCPOnly && (from || to) {
			t.Fatalf("rank %d copies between processes with TCPOnly", k)
		}
		if !ro.TCPOnly && n > 1 && (!from || !to) && load.SameHostWorks() {
			t.Fatalf("rank %d of %d in one process: the links stay on TCP (from the previous rank %v, to the next %v)", k, n, from, to)
		}
	}
	dst := make([][][]byte, n)
	stats := make([]load.GroupStats, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k, c := range comms {
		dst[k] = alloc(items[k])
		wg.Add(1)
		go func() {
			defer wg.Done()
			if k == breakRank {
				c.Close() // a rank that died before loading
				errs[k] = errors.New("killed")
				return
			}
			stats[k], errs[k] = load.LoadGroup(context.Background(), c, r, items[k], dst[k], opt)
		}()
	}
	wg.Wait()
	return dst, stats, errs
}

// TestLoadGroup: 2 and 4 ranks load the same request; every rank ends
// with the bytes a plain single-rank read gives, each reads at most 1/N
// of the bytes plus one item, and what one sends the next receives.
func TestLoadGroup(t *testing.T) {
	r := groupReader(t)
	items := groupItems(t, r, 2, 1)
	var total, biggest int64
	for _, it := range items {
		total += it.Bytes()
		biggest = max(biggest, it.Bytes())
	}
	one, sts, errs := runGroup(t, r, [][]load.Item{items}, load.GroupOptions{}, -1)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	solo, st1 := one[0], sts[0]
	// A plain read, item by item, gives the same bytes.
	for i, it := range items {
		s, err := r.OpenState(it.Param, it.State)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, it.Bytes())
		_, err = layout.ReadLocalAs(s, it.Shard, 0, it.N, it.DType, b)
		s.Close()
		if err != nil || !bytes.Equal(b, solo[i]) {
			t.Fatalf("%s/%s: one-rank group load differs from ReadLocalAs (%v)", it.Param, it.State, err)
		}
	}
	if st1.BytesRead == 0 || st1.BytesReceived != 0 {
		t.Fatalf("one rank: %+v", st1)
	}
	for _, c := range []struct {
		n  int
		ro load.RingOptions
	}{{2, load.RingOptions{}}, {4, load.RingOptions{}}, {2, load.RingOptions{TCPOnly: true}}, {4, load.RingOptions{TCPOnly: true}}} {
		n := c.n
		reqs := make([][]load.Item, n)
		for k := range reqs {
			reqs[k] = items
		}
		dst, stats, errs := runGroupRing(t, r, reqs, load.GroupOptions{Args: `{"tp":2,"tp_rank":1}`}, -1, c.ro)
		var read, sent, recv int64
		for k := 0; k < n; k++ {
			if errs[k] != nil {
				t.Fatalf("%d ranks: rank %d: %v", n, k, errs[k])
			}
			for i := range items {
				if !bytes.Equal(dst[k][i], solo[i]) {
					t.Fatalf("%d ranks: rank %d: %s/%s differs from a plain read", n, k, items[i].Param, items[i].State)
				}
			}
			s := stats[k]
			if s.BytesRead == 0 || float64(s.BytesRead) > float64(st1.BytesRead)/float64(n)+float64(biggest) {
				t.Errorf("%d ranks: rank %d read %d of %d bytes", n, k, s.BytesRead, st1.BytesRead)
			}
			read += s.BytesRead
			sent += s.BytesSent
			recv += s.BytesReceived
		}
		if read != st1.BytesRead || sent != recv || recv != int64(n-1)*total {
			t.Errorf("%d ranks: read %d (alone %d), sent %d, received %d, total %d", n, read, st1.BytesRead, sent, recv, total)
		}
	}
}

// TestLoadGroupMismatch: ranks asking for different slices or arguments
// all fail, naming the ranks and the argument, before anything moves.
func TestLoadGroupMismatch(t *testing.T) {
	r := groupReader(t)
	a, b := groupItems(t, r, 2, 0), groupItems(t, r, 2, 1)
	dst, _, errs := runGroup(t, r, [][]load.Item{a, b, a}, load.GroupOptions{}, -1)
	for k, err := range errs {
		var me *load.MismatchError
		if !errors.As(err, &me) || len(me.Ranks) != 1 || me.Ranks[0] != 1 || !strings.Contains(err.Error(), "ranks [1] differ") {
			t.Fatalf("rank %d: %v", k, err)
		}
		for i := range dst[k] {
			if dst[k][i][0] != 0xa5 {
				t.Fatalf("rank %d: item %d was written before the ranks agreed", k, i)
			}
		}
	}
	_, _, errs = runGroup(t, r, [][]load.Item{a, a}, load.GroupOptions{Args: `{"fn":"load_state_dict","tp_rank":0}`}, -1)
	for k, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", k, err)
		}
	}
	comms := ring(t, 2)
	errs = make([]error, 2)
	var wg sync.WaitGroup
	for k, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{`{"tp_rank":0,"dtype":"float32"}`, `{"tp_rank":1,"dtype":"float32"}`}[k]
			_, errs[k] = load.LoadGroup(context.Background(), c, r, a, alloc(a), load.GroupOptions{Args: args})
		}()
	}
	wg.Wait()
	for k, err := range errs {
		if err == nil || !strings.Contains(err.Error(), `tp_rank (rank 0: 0, rank 1: 1)`) || strings.Contains(err.Error(), "dtype") {
			t.Fatalf("rank %d: %v", k, err)
		}
	}
}

// TestLoadGroupDeadRank: a rank that died makes every other rank fail
// promptly (the ring breaks), well within the timeout, and never hang.
func TestLoadGroupDeadRank(t *testing.T) {
	r := groupReader(t)
	items := groupItems(t, r, 1, 0)
	for _, c := range []struct {
		dead int
		ro   load.RingOptions
	}{{0, load.RingOptions{}}, {2, load.RingOptions{}}, {2, load.RingOptions{TCPOnly: true}}} {
		dead := c.dead
		reqs := [][]load.Item{items, items, items, items}
		start := time.Now()
		_, _, errs := runGroupRing(t, r, reqs, load.GroupOptions{Timeout: 5 * time.Second}, dead, c.ro)
		for k, err := range errs {
			if err == nil {
				t.Fatalf("dead rank %d: rank %d succeeded", dead, k)
			}
		}
		if el := time.Since(start); el > 7*time.Second {
			t.Fatalf("dead rank %d: the others took %v to fail", dead, el)
		}
	}
}

// TestLoadGroupSilentRank: a rank that stays connected but never loads
// (hung, or busy elsewhere) fails the others after the timeout.
func TestLoadGroupSilentRank(t *testing.T) {
	r := groupReader(t)
	items := groupItems(t, r, 1, 0)
	comms := ring(t, 3)
	errs := make([]error, 3)
	start := time.Now()
	var wg sync.WaitGroup
	for k, c := range comms[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[k] = load.LoadGroup(context.Background(), c, r, items, alloc(items), load.GroupOptions{Timeout: time.Second})
		}()
	}
	wg.Wait()
	for k, err := range errs[:2] {
		if err == nil || !strings.Contains(err.Error(), "rank") {
			t.Fatalf("rank %d: %v", k, err)
		}
	}
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("the others took %v to fail", el)
	}
}

// TestStateLinkOutside: a state file replaced by a symbolic link to a copy
// outside the checkpoint is refused (with and without verify), one to a
// file inside it is read.
func TestStateLinkOutside(t *testing.T) {
	r := groupReader(t)
	p := r.Params()[0]
	rel := p.Files[0].Path
	for _, f := range p.Files {
		if f.State == "fp32" {
			rel = f.Path
		}
	}
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	if err := os.CopyFS(ck, os.DirFS(r.Dir)); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(ck, filepath.FromSlash(rel))
	outside := filepath.Join(dir, "elsewhere.pt")
	inside := filepath.Join(ck, "copy.pt")
	for _, c := range []string{outside, inside} {
		b, err := os.ReadFile(state)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		target string
		ok     bool
	}{{outside, false}, {inside, true}} {
		os.Remove(state)
		if err := os.Symlink(c.target, state); err != nil {
			t.Fatal(err)
		}
		for _, verify := range []bool{false, true} {
			lr, err := atomic.OpenReader(ck, atomic.ReaderOptions{Verify: verify})
			if err != nil {
				t.Fatal(err)
			}
			s, err := lr.OpenState(p.Name, "fp32")
			if c.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "outside the checkpoint")) {
				t.Fatalf("link to %s, verify %v: %v", c.target, verify, err)
			}
			if s != nil {
				s.Close()
			}
		}
	}
}
