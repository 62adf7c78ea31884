// Package mapreduce converts a fragment table into an atomic checkpoint:
// Plan splits the work into tasks (a byte range of one output file) and
// balances them over nodes and cores by bytes; Run executes a node's share
// with reducers that pread exactly the source ranges they need, convert to
// float32 and write at offsets of pre-sized output files.
package mapreduce

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/ucp-project/ucp/fragment"
)

// Task is one unit of reduce work: elements [Start, End) of state State of
// parameter Param, or (State == StepTask) the parameter's step file.
type Task struct {
	Param int   `json:"param"`
	State int   `json:"state"`
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	Bytes int64 `json:"bytes"` // source bytes read plus output bytes written: the balancing weight
	Node  int   `json:"node"`
	Chunk int   `json:"chunk"` // index of this range within its file
	Of    int   `json:"of"`    // number of ranges of its file
}

// StepTask marks a Task that writes a step file; CopyTask one that copies
// the source file Table.CopyFiles[Param] (its weight is the file's size).
const (
	StepTask = -1
	CopyTask = -2
)

// Plan is the deterministic assignment of tasks to nodes: a pure function
// of the table and the options, so every node computes the same plan.
type Plan struct {
	Nodes      int
	Cores      int
	ChunkElems int64
	Tasks      []Task  // sorted by node, then largest first
	NodeBytes  []int64 // total weight per node
}

// PlanOptions set the shape of the plan.
type PlanOptions struct {
	Nodes int
	Cores int
	// ChunkElems caps the elements of one task. 0 derives it from the
	// table and the memory budget: at most 1/(4·Nodes·Cores) of all output
	// (so big parameters spread over workers), at most what Memory allows
	// per core, and at most MaxChunkElems.
	ChunkElems int64
	// Memory is the budget of one node's reducers in bytes (0: no limit
	// beyond MaxChunkElems). All nodes must use the same value.
	Memory int64
}

// BytesPerChunkElem is a reducer's peak memory per output element of its
// task: the float32 output, the raw source read (up to 8 bytes for
// float64 sources), its float32 conversion and a replica buffer.
const BytesPerChunkElem = 20

// MaxChunkElems bounds one task's output buffer (64 MB of float32).
const MaxChunkElems = 16 << 20

// NewPlan splits every state file into row-aligned ranges no bigger than
// the chunk size (so a giant embedding is spread over many reducers) and
// assigns them longest-processing-time first to the least loaded node.
func NewPlan(t *fragment.Table, opt PlanOptions) (*Plan, error) {
	if opt.Nodes <= 0 || opt.Cores <= 0 {
		return nil, fmt.Errorf("plan needs at least one node and one core, got %d x %d", opt.Nodes, opt.Cores)
	}
	_, out := t.Bytes()
	chunk := opt.ChunkElems
	if chunk <= 0 {
		workers := int64(opt.Nodes * opt.Cores)
		chunk = max(out/4/(4*workers), 1<<16)
		chunk = min(chunk, MaxChunkElems)
		if opt.Memory > 0 {
			chunk = min(chunk, max(opt.Memory/int64(opt.Cores)/BytesPerChunkElem, 1<<12))
		}
	}
	pl := &Plan{Nodes: opt.Nodes, Cores: opt.Cores, ChunkElems: chunk, NodeBytes: make([]int64, opt.Nodes)}
	var tasks []Task
	for pi, p := range t.Params {
		numel := p.Numel()
		row := int64(1)
		if len(p.Shape) > 1 {
			row = numel / max(p.Shape[0], 1)
		}
		for si, st := range p.States {
			srcPerElem := srcBytesPerElem(st, numel)
			ranges := splitRows(numel, row, chunk)
			for ci, r := range ranges {
				n := r[1] - r[0]
				tasks = append(tasks, Task{Param: pi, State: si, Start: r[0], End: r[1],
					Bytes: 4*n + int64(float64(n)*srcPerElem), Chunk: ci, Of: len(ranges)})
			}
		}
		if p.Step != nil {
			tasks = append(tasks, Task{Param: pi, State: StepTask, Bytes: 1, Of: 1})
		}
	}
	for ci, c := range t.CopyFiles {
		tasks = append(tasks, Task{Param: ci, State: CopyTask, Bytes: 2 * c.Size, Of: 1})
	}
	// LPT: biggest first. Equal tasks are ordered by chunk index first, so
	// concurrent workers start on different files (writes to one file
	// serialize on its inode lock), then by position: the plan is
	// deterministic.
	sort.SliceStable(tasks, func(i, j int) bool {
		if tasks[i].Bytes != tasks[j].Bytes {
			return tasks[i].Bytes > tasks[j].Bytes
		}
		return tasks[i].Chunk < tasks[j].Chunk
	})
	for i := range tasks {
		n := 0
		for k := 1; k < opt.Nodes; k++ {
			if pl.NodeBytes[k] < pl.NodeBytes[n] {
				n = k
			}
		}
		tasks[i].Node = n
		pl.NodeBytes[n] += tasks[i].Bytes
	}
	sort.SliceStable(tasks, func(i, j int) bool { return tasks[i].Node < tasks[j].Node })
	pl.Tasks = tasks
	return pl, nil
}

// srcBytesPerElem is the source bytes read per output element of a state,
// replicas included (they are read for checking or averaging).
func srcBytesPerElem(st *fragment.State, numel int64) float64 {
	if numel == 0 {
		return 0
	}
	var b int64
	for _, f := range st.Frags {
		b += f.Len * int64(f.Src.DType().Size())
	}
	return float64(b) / float64(numel)
}

// splitRows cuts [0, numel) into ranges of at most chunk elements, on row
// boundaries when a row fits in a chunk.
func splitRows(numel, row, chunk int64) [][2]int64 {
	if numel == 0 {
		return [][2]int64{{0, 0}}
	}
	step := chunk
	if row > 0 && row <= chunk {
		step = chunk / row * row
	}
	var out [][2]int64
	for a := int64(0); a < numel; a += step {
		out = append(out, [2]int64{a, min(a+step, numel)})
	}
	return out
}

// NodeTasks returns the tasks of one node.
func (p *Plan) NodeTasks(node int) []Task {
	var out []Task
	for _, t := range p.Tasks {
		if t.Node == node {
			out = append(out, t)
		}
	}
	return out
}

// WorkerShares simulates a node's cores pulling tasks largest first, and
// returns each core's tasks: what --dry-run shows and what to expect.
func (p *Plan) WorkerShares(node int) [][]Task {
	shares := make([][]Task, p.Cores)
	load := make([]int64, p.Cores)
	for _, t := range p.NodeTasks(node) {
		w := 0
		for k := 1; k < p.Cores; k++ {
			if load[k] < load[w] {
				w = k
			}
		}
		shares[w] = append(shares[w], t)
		load[w] += t.Bytes
	}
	return shares
}

// ID fingerprints the plan: nodes of one conversion must agree on it.
func (p *Plan) ID() string {
	b, _ := json.Marshal(struct {
		Nodes, Cores int
		Chunk        int64
		Tasks        []Task
	}{p.Nodes, p.Cores, p.ChunkElems, p.Tasks})
	h := sha256.Sum256(b)
	return fmt.Sprintf("%x", h[:8])
}

// SharedFiles returns the (param, state) files whose tasks lie on more
// than one node: each node fills its part and the finalizer completes them.
func (p *Plan) SharedFiles() map[[2]int]bool {
	nodes := map[[2]int]int{}
	shared := map[[2]int]bool{}
	for _, t := range p.Tasks {
		if t.State < 0 {
			continue
		}
		k := [2]int{t.Param, t.State}
		if n, ok := nodes[k]; ok && n != t.Node {
			shared[k] = true
		}
		nodes[k] = t.Node
	}
	return shared
}
