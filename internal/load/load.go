// Package load shares the reading of an atomic checkpoint among the ranks
// of a data-parallel group at resume time: an ownership plan (Owners,
// Balance) gives each rank about 1/N of the bytes to read from storage
// (through internal/layout) and the group gives every rank the rest:
// LoadGroup over a TCP ring (TCPComm) straight into the destinations'
// memory, LoadGroupCUDA (cuda build tag) through pinned host buffers and
// NCCL into CUDA device memory.
package load

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sort"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Request is a tensor one rank needs: elements [Start, Start+N) of a shard
// of a parameter's state (N = 0: the whole shard).
type Request struct {
	Param, State string
	Shard        fragment.Shard
	Start, N     int64
}

func (r Request) count() int64 {
	if r.N > 0 {
		return r.N
	}
	return torchfile.Numel(r.Shard.Shape)
}

// LoadStats tell how the reading was shared.
type LoadStats struct {
	BytesRead     int64 // read from storage by this rank
	BytesReceived int64 // received from the other ranks
}

// Owners assigns requests to n ranks by Balance: each rank reads about 1/n
// of the bytes. Every rank computes the same assignment from the same
// requests.
func Owners(reqs []Request, n int) []int {
	w := make([]int64, len(reqs))
	for i, q := range reqs {
		w[i] = q.count()
	}
	return Balance(w, n)
}

// Balance assigns items of the given weights to n ranks, heaviest first
// to the least loaded rank (ties: the lowest rank), so no rank carries
// more than 1/n of the total plus one item. It is deterministic.
func Balance(weights []int64, n int) []int {
	order := make([]int, len(weights))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return weights[order[a]] > weights[order[b]] })
	load := make([]int64, n)
	owner := make([]int, len(weights))
	for _, i := range order {
		k := 0
		for j := 1; j < n; j++ {
			if load[j] < load[k] {
				k = j
			}
		}
		owner[i] = k
		load[k] += weights[i]
	}
	return owner
}

// LoadShared returns every request's float32 values on every rank of comm,
// while each rank reads only the requests it owns from storage: the ranks
// of a data-parallel group need the same tensors, so reading them N times
// would be redundant. All ranks must pass the same requests.
func LoadShared(ctx context.Context, comm Comm, r *atomic.Reader, reqs []Request) ([][]float32, LoadStats, error) {
	var st LoadStats
	owner := Owners(reqs, comm.Size())
	var block []byte
	for i, q := range reqs {
		if owner[i] != comm.Rank() {
			continue
		}
		v, err := load(r, q)
		if err != nil {
			return nil, st, err
		}
		block = binary.LittleEndian.AppendUint32(block, uint32(i))
		for _, f := range v {
			block = binary.LittleEndian.AppendUint32(block, math.Float32bits(f))
		}
		st.BytesRead += 4 * int64(len(v))
	}
	blocks, err := comm.AllGather(ctx, block)
	if err != nil {
		return nil, st, err
	}
	out := make([][]float32, len(reqs))
	for rank, b := range blocks {
		if rank != comm.Rank() {
			st.BytesReceived += int64(len(b))
		}
		for len(b) > 0 {
			if len(b) < 4 {
				return nil, st, fmt.Errorf("rank %d sent a truncated block", rank)
			}
			i := int(binary.LittleEndian.Uint32(b))
			if i >= len(reqs) || owner[i] != rank || out[i] != nil {
				return nil, st, fmt.Errorf("rank %d sent request %d, which is not its own", rank, i)
			}
			n := reqs[i].count()
			if int64(len(b)-4) < 4*n {
				return nil, st, fmt.Errorf("rank %d sent a truncated block", rank)
			}
			v := make([]float32, n)
			for k := range v {
				v[k] = math.Float32frombits(binary.LittleEndian.Uint32(b[4+4*k:]))
			}
			out[i] = v
			b = b[4+4*n:]
		}
	}
	for i, v := range out {
		if v == nil {
			return nil, st, fmt.Errorf("no rank sent request %d (%s/%s)", i, reqs[i].Param, reqs[i].State)
		}
	}
	return out, st, nil
}

func load(r *atomic.Reader, q Request) ([]float32, error) {
	s, err := r.OpenState(q.Param, q.State)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	v := make([]float32, q.count())
	return v, layout.ReadLocal(s, q.Shard, q.Start, q.count(), v)
}
