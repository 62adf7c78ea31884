package load

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Item is one destination tensor (or a contiguous part of one) of a group
// load: elements [Start, Start+N) of a shard of a parameter's state, cast
// to DType (or the state's own dtype when Stored), N·DType.Size() bytes.
type Item struct {
	Param, State string
	Shard        fragment.Shard
	Start, N     int64
	DType        dtype.DType
	Stored       bool
}

// Bytes is the size of the item's destination.
func (it Item) Bytes() int64 { return it.N * int64(it.DType.Size()) }

// GroupOptions tune LoadGroup.
type GroupOptions struct {
	// Timeout bounds every wait on a peer (connecting, each chunk sent or
	// received): a dead rank or a dropped link fails the load after at
	// most this long instead of hanging. Zero: DefaultTimeout.
	Timeout time.Duration
	// Args describes the caller's request (function and arguments, as
	// JSON of string keys); the ranks compare it, with a digest of the
	// items, before anything moves.
	Args string
}

// DefaultTimeout is the wait on a peer when GroupOptions.Timeout is 0.
const DefaultTimeout = 60 * time.Second

// MaxRanks bounds a group's size and the tensor-parallel or FSDP degree a
// load accepts: the slicing allocates per rank, and larger degrees are
// mistakes (a negative number cast, a size passed as a rank).
const MaxRanks = 1 << 20

// GroupStats tell how a group load went on one rank.
type GroupStats struct {
	Transport     string             `json:"transport"`
	Ranks         int                `json:"ranks"`
	BytesRead     int64              `json:"bytes_read"`     // from storage
	BytesReceived int64              `json:"bytes_received"` // from the other ranks
	BytesSent     int64              `json:"bytes_sent"`     // to the next rank
	Seconds       map[string]float64 `json:"seconds"`        // per phase: connect, agree, read, exchange, total
}

// plan is what every rank of a group computes alike from the same items:
// the owner of each item and the layers the exchange goes through.
type plan struct {
	owner  []int
	layers [][]int // item indices, layer by layer in order of first appearance
}

var layerRE = regexp.MustCompile(`^(.*?\.\d+)(?:\.|$)`)

// LayerOf is the layer a parameter belongs to: its name up to the first
// number (decoder.layers.3), else the name itself. The exchange moves one
// layer while the next is read.
func LayerOf(name string) string {
	if m := layerRE.FindStringSubmatch(name); m != nil {
		return m[1]
	}
	return name
}

func makePlan(items []Item, n int) plan {
	w := make([]int64, len(items))
	for i, it := range items {
		w[i] = it.Bytes()
	}
	p := plan{owner: Balance(w, n)}
	index := map[string]int{}
	for i, it := range items {
		l := LayerOf(it.Param)
		k, ok := index[l]
		if !ok {
			k = len(p.layers)
			index[l] = k
			p.layers = append(p.layers, nil)
		}
		p.layers[k] = append(p.layers[k], i)
	}
	return p
}

// Digest hashes the items as every rank must agree on them: names,
// geometry, element ranges and destination types.
func Digest(items []Item) string {
	h := sha256.New()
	for _, it := range items {
		fmt.Fprintf(h, "%q %q %v %v %d %d %v %v\n", it.Param, it.State, it.Shard.Shape, it.Shard.Maps, it.Start, it.N, it.DType, it.Stored)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// request is what a rank announces before a group load.
type request struct {
	Digest string         `json:"digest"`
	Items  int            `json:"items"`
	Bytes  int64          `json:"bytes"`
	Args   map[string]any `json:"args"`
}

// maxAnnounce bounds an announced request: a corrupt or foreign peer
// cannot make a rank allocate more.
const maxAnnounce = 1 << 20

// agree all-gathers every rank's request and fails, on every rank alike,
// when they differ, naming the ranks and the arguments that differ.
func agree(ctx context.Context, comm *TCPComm, items []Item, args string, timeout time.Duration) error {
	mine := request{Digest: Digest(items), Items: len(items)}
	for _, it := range items {
		mine.Bytes += it.Bytes()
	}
	if args != "" {
		if err := json.Unmarshal([]byte(args), &mine.Args); err != nil {
			return fmt.Errorf("the request's arguments are not a JSON object: %w", err)
		}
	}
	b, err := json.Marshal(mine)
	if err != nil {
		return err
	}
	blocks, err := comm.allGather(ctx, b, maxAnnounce, timeout)
	if err != nil {
		return err
	}
	reqs := make([]request, len(blocks))
	for k, blk := range blocks {
		if err := json.Unmarshal(blk, &reqs[k]); err != nil {
			return fmt.Errorf("rank %d announced a malformed request: %w", k, err)
		}
	}
	return compareRequests(reqs)
}

// compareRequests names the ranks whose request differs from rank 0's and
// the arguments in which they differ.
func compareRequests(reqs []request) error {
	var odd []int
	diff := map[string]bool{}
	for k := 1; k < len(reqs); k++ {
		if reqs[k].Digest == reqs[0].Digest && argsEqual(reqs[k].Args, reqs[0].Args) {
			continue
		}
		odd = append(odd, k)
		for _, key := range keys(reqs[0].Args, reqs[k].Args) {
			if fmt.Sprint(reqs[0].Args[key]) != fmt.Sprint(reqs[k].Args[key]) {
				diff[key] = true
			}
		}
	}
	if len(odd) == 0 {
		return nil
	}
	var what []string
	for _, key := range keys(toAny(diff)) {
		vals := make([]string, len(reqs))
		for k, r := range reqs {
			vals[k] = fmt.Sprintf("rank %d: %v", k, jsonText(r.Args[key]))
		}
		what = append(what, fmt.Sprintf("%s (%s)", key, strings.Join(vals, ", ")))
	}
	if len(what) == 0 {
		vals := make([]string, len(reqs))
		for k, r := range reqs {
			vals[k] = fmt.Sprintf("rank %d: %d tensors, %d bytes, digest %.12s", k, r.Items, r.Bytes, r.Digest)
		}
		what = append(what, "the tensors asked for ("+strings.Join(vals, ", ")+")")
	}
	return &MismatchError{Ranks: odd, Msg: fmt.Sprintf("the group's ranks asked for different tensors: ranks %v differ from rank 0 in %s; every rank of a group must make the same call",
		odd, strings.Join(what, "; "))}
}

// MismatchError is returned by LoadGroup on every rank when the ranks'
// requests differ.
type MismatchError struct {
	Ranks []int
	Msg   string
}

func (e *MismatchError) Error() string { return e.Msg }

func argsEqual(a, b map[string]any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func keys(ms ...map[string]any) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

func toAny(m map[string]bool) map[string]any {
	out := map[string]any{}
	for k := range m {
		out[k] = true
	}
	return out
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil || v == nil {
		return "(none)"
	}
	if s := string(b); len(s) <= 200 {
		return s
	} else {
		return s[:200] + "..."
	}
}

// readChunk bounds the elements one ReadLocalAs call converts, so a cast
// of a huge tensor never allocates more than a few chunk-sized buffers.
const readChunk = 4 << 20

// readItem reads an item into dst (its Bytes()) in chunks, returning the
// bytes read from storage.
func readItem(r *atomic.Reader, it Item, dst []byte) (int64, error) {
	s, err := r.OpenState(it.Param, it.State)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	dt := it.DType
	if it.Stored {
		if s.DType != dt {
			return 0, fmt.Errorf("%s: stored as %v, the destination is %v", s.Path, s.DType, dt)
		}
	}
	if it.Start < 0 || it.N < 0 || it.Start+it.N > torchfile.Numel(it.Shard.Shape) {
		return 0, fmt.Errorf("%s/%s: elements [%d, %d) of a shard of %d", it.Param, it.State, it.Start, it.Start+it.N, torchfile.Numel(it.Shard.Shape))
	}
	es := int64(dt.Size())
	var read int64
	for done := int64(0); done < it.N; {
		n := min(it.N-done, readChunk)
		got, err := layout.ReadLocalAs(s, it.Shard, it.Start+done, n, dt, dst[done*es:(done+n)*es])
		read += got
		if err != nil {
			return read, err
		}
		done += n
	}
	return read, nil
}

// LoadGroup loads items into dst (one byte slice per item, exactly its
// Bytes(), e.g. the memory of CPU tensors) on every rank of the ring
// comm: the ranks first agree that they ask for the same items, then each
// reads from storage only the items Balance gives it (about 1/N of the
// bytes plus one item) straight into their destinations, and the ring
// forwards every rank's items to all the others, layer by layer while the
// next layers are read, received straight into the destinations too. Any
// failure (a peer that dies, a dropped link, a peer silent for
// opt.Timeout, a bad file) closes the ring, so every rank fails instead
// of waiting; the comm is unusable afterwards.
func LoadGroup(ctx context.Context, comm *TCPComm, r *atomic.Reader, items []Item, dst [][]byte, opt GroupOptions) (GroupStats, error) {
	start := time.Now()
	st := GroupStats{Transport: "tcp", Ranks: comm.Size(), Seconds: map[string]float64{}}
	if len(dst) != len(items) {
		return st, fmt.Errorf("%d destinations for %d items", len(dst), len(items))
	}
	for i, it := range items {
		if int64(len(dst[i])) != it.Bytes() {
			return st, fmt.Errorf("%s/%s: a destination of %d bytes for %d %v elements", it.Param, it.State, len(dst[i]), it.N, it.DType)
		}
	}
	timeout := opt.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fail := func(err error) (GroupStats, error) {
		comm.Close() // the peers see the ring break now, not after their timeout
		st.Seconds["total"] = time.Since(start).Seconds()
		return st, err
	}
	t := time.Now()
	if err := agree(ctx, comm, items, opt.Args, timeout); err != nil {
		return fail(err)
	}
	st.Seconds["agree"] = time.Since(t).Seconds()
	p := makePlan(items, comm.Size())

	// The reader goes ahead layer by layer; done[l] closes when this rank's
	// items of layer l are in place.
	done := make([]chan struct{}, len(p.layers))
	for l := range done {
		done[l] = make(chan struct{})
	}
	readErr := make(chan error, 1)
	var readSecs float64
	read := func() error {
		for l, layer := range p.layers {
			for _, i := range layer {
				if p.owner[i] != comm.Rank() {
					continue
				}
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				n, err := readItem(r, items[i], dst[i])
				st.BytesRead += n
				if err != nil {
					cancel(err)
					return err
				}
			}
			close(done[l])
		}
		return nil
	}
	go func() {
		t := time.Now()
		err := read()
		readSecs = time.Since(t).Seconds()
		readErr <- err
	}()
	t = time.Now()
	var wait time.Duration
	for l, layer := range p.layers {
		w := time.Now()
		select {
		case <-done[l]:
		case <-ctx.Done():
			if err := <-readErr; err != nil {
				return fail(err)
			}
			return fail(context.Cause(ctx))
		}
		wait += time.Since(w)
		blocks := make([][][]byte, comm.Size())
		for _, i := range layer {
			blocks[p.owner[i]] = append(blocks[p.owner[i]], dst[i])
		}
		sent, recv, err := comm.ringStep(ctx, l, blocks, timeout)
		st.BytesSent += sent
		st.BytesReceived += recv
		if err != nil {
			cancel(err)
			<-readErr
			return fail(err)
		}
	}
	if err := <-readErr; err != nil {
		return fail(err)
	}
	st.Seconds["read"] = readSecs
	st.Seconds["exchange"] = (time.Since(t) - wait).Seconds()
	st.Seconds["total"] = time.Since(start).Seconds()
	return st, nil
}
