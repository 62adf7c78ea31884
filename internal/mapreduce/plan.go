// Package mapreduce converts a fragment table into an atomic checkpoint:
// NewPlan lists the output files (state, step, value and copied files,
// with their manifest entries) and splits the work on them into typed
// tasks (a byte range of one state file, a step, a copy) balanced over
// nodes and cores by bytes; Run executes a node's share with reducers that
// pread exactly the source ranges they need, convert to float32 (frozen
// parameters and buffers: copy in their own dtype) and write
// at offsets of pre-sized output files; Finalize turns the nodes' records
// into the manifest. The atomic writer underneath knows only paths, byte
// ranges and node records.
package mapreduce

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// OutputKind says what an output file holds and how it is written.
type OutputKind int

const (
	// StateFile is zero/<param>/<state>.pt: a tensor of the parameter's
	// full shape (float32, or a frozen parameter's or buffer's own dtype),
	// filled by the reduce tasks of its ranges.
	StateFile OutputKind = iota
	// StepFile is zero/<param>/step.pt: the raw step value.
	StepFile
	// ValueFile is a torch file written from a value of the table
	// (optimizer state, extra state, model states) by one ValueTask, its
	// tensor references streamed from the source.
	ValueFile
	// CopyFile is a source file copied unchanged.
	CopyFile
)

// Output is one file of the atomic checkpoint.
type Output struct {
	Kind OutputKind
	Path string // relative to the checkpoint folder
	// Param is the index in the table of the parameter whose manifest
	// entry lists the file, and State the index of its state (StateFile):
	// -1 when there is none.
	Param, State int
	// Name is the state's name in the manifest (StateFile, StepFile).
	Name string
	// Shape and DType are a state file's tensor (see StateDType).
	Shape []int64
	DType dtype.DType
	// Value is a value file's content, its tensors *fragment.TensorRefs.
	Value pyobj.Value
	// Src and Size are a copied file's source and size.
	Src  string
	Size int64
	// Shared marks a state file whose tasks lie on more than one node:
	// each fills its part and the finalizer completes it.
	Shared bool
	// Bare makes a state file hold the bare tensor instead of the
	// universal dict (PlanOptions.BareStates).
	Bare bool
}

// TaskKind says what a task does.
type TaskKind int

const (
	// ReduceTask gathers elements [Start, End) of a state file.
	ReduceTask TaskKind = iota
	// StepTask writes a step file.
	StepTask
	// CopyTask copies bytes [Start, End) of a copied file.
	CopyTask
	// ValueTask writes a whole value file. It runs with the other tasks
	// rather than in the finalizer: a DeepSpeed model-state file written
	// again holds every module weight (0.5 GB of a 3.5 GB checkpoint),
	// which written after the reducers kept one core idle.
	ValueTask
)

// Task is one unit of work on output Output of the plan.
type Task struct {
	Kind   TaskKind `json:"kind"`
	Output int      `json:"output"`
	Start  int64    `json:"start"`
	End    int64    `json:"end"`
	Bytes  int64    `json:"bytes"` // source bytes read plus output bytes written: the balancing weight
	Node   int      `json:"node"`
	Chunk  int      `json:"chunk"` // index of this range within its file
	Of     int      `json:"of"`    // number of ranges of its file
}

// Plan is the deterministic list of output files and the assignment of
// the tasks that write them to nodes: a pure function of the table and
// the options, so every node computes the same plan.
type Plan struct {
	Nodes      int
	Cores      int
	ChunkElems int64
	Outputs    []Output // per parameter its states then its step, then value files, then copies
	Tasks      []Task   // sorted by node, then largest first
	NodeBytes  []int64  // total weight per node
	// Manifest is ucp.json as far as the table decides it: the source and
	// per parameter its entry without files, which the finalizer adds
	// from the records of the nodes.
	Manifest atomic.Manifest

	t *fragment.Table
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
	// BareStates writes every state file as a bare tensor, as DeepSpeed's
	// ds_to_universal does for ZeRO-3 at TP 1 and as the ZeRO-3 universal
	// loaders of DeepSpeed 0.14 to 0.19.2 require (atomic/FORMAT.md).
	BareStates bool
}

// BytesPerChunkElem is what the memory budget allows per element of a
// task: the float32 output, the raw source read (up to 8 bytes for
// float64 sources), its float32 conversion and a replica buffer. Reducers
// now work in pieces of Options.PieceBytes, so their memory no longer
// grows with the task; the budget still sizes the tasks, as before.
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
	pl := &Plan{Nodes: opt.Nodes, Cores: opt.Cores, ChunkElems: chunk, NodeBytes: make([]int64, opt.Nodes), t: t,
		Manifest: atomic.Manifest{Format: atomic.ManifestFormat, Version: atomic.ManifestVersion,
			Source: atomic.SourceInfo{Format: t.Format, Path: t.Source, Tag: t.Tag, Degrees: atomic.Degrees(t.Degrees),
				DType: t.DType, Args: t.Args, Model: t.Model},
			Notes: t.Notes}}
	tasks, err := pl.paramTasks(t, opt, chunk)
	if err != nil {
		return nil, err
	}
	tasks = append(tasks, pl.fileTasks(t, chunk)...)
	pl.assign(tasks)
	pl.markShared()
	return pl, nil
}

func (pl *Plan) add(o Output) int {
	pl.Outputs = append(pl.Outputs, o)
	return len(pl.Outputs) - 1
}

// paramTasks adds every parameter's state and step files with their
// manifest entries, and returns their tasks: row ranges of about chunk
// elements per state file, one task per step.
func (pl *Plan) paramTasks(t *fragment.Table, opt PlanOptions, chunk int64) ([]Task, error) {
	var tasks []Task
	for pi, p := range t.Params {
		pl.Manifest.Params = append(pl.Manifest.Params, paramEntry(p))
		numel := p.Numel()
		row := int64(1)
		if len(p.Shape) > 1 {
			row = numel / max(p.Shape[0], 1)
		}
		for si, st := range p.States {
			dt, err := StateDType(p, st)
			if err != nil {
				return nil, err
			}
			if si == 0 {
				pl.Manifest.Params[pi].DType = dt.String()
			}
			oi := pl.add(Output{Kind: StateFile, Path: atomic.StatePath(p.Name, st.Name), Param: pi, State: si, Name: st.Name,
				Shape: p.Shape, DType: dt, Bare: opt.BareStates})
			srcPerElem := srcBytesPerElem(p, st, numel)
			es := int64(dt.Size())
			ranges := splitRows(numel, row, chunk)
			for ci, r := range ranges {
				n := r[1] - r[0]
				tasks = append(tasks, Task{Kind: ReduceTask, Output: oi, Start: r[0], End: r[1],
					Bytes: es*n + int64(float64(n)*srcPerElem), Chunk: ci, Of: len(ranges)})
			}
		}
		if p.Step != nil {
			oi := pl.add(Output{Kind: StepFile, Path: atomic.StatePath(p.Name, fragment.StepState), Param: pi, State: -1,
				Name: fragment.StepState})
			tasks = append(tasks, Task{Kind: StepTask, Output: oi, Bytes: 1, Of: 1})
		}
	}
	return tasks, nil
}

// fileTasks adds the value files (optimizer state, extra state, written
// files) and the copied files, and returns their tasks: one per value
// file, byte ranges of the copies.
func (pl *Plan) fileTasks(t *fragment.Table, chunk int64) []Task {
	var tasks []Task
	if t.Optimizer != nil {
		pl.add(Output{Kind: ValueFile, Path: filepath.Join(atomic.ZeroDir, atomic.OptimizerState), Param: -1, State: -1,
			Value: t.Optimizer})
	}
	if t.Extra != nil && t.Extra.Len() > 0 {
		pl.add(Output{Kind: ValueFile, Path: atomic.ExtraState, Param: -1, State: -1, Value: t.Extra})
	}
	for _, vf := range t.WriteFiles {
		pl.add(Output{Kind: ValueFile, Path: vf.Name, Param: -1, State: -1, Value: vf.Value})
	}
	for oi := range pl.Outputs {
		if o := &pl.Outputs[oi]; o.Kind == ValueFile {
			tasks = append(tasks, Task{Kind: ValueTask, Output: oi, Bytes: 2*refBytes(o.Value) + 1, Of: 1})
		}
	}
	for _, c := range t.CopyFiles {
		oi := pl.add(Output{Kind: CopyFile, Path: c.Name, Param: -1, State: -1, Src: c.Src, Size: c.Size})
		// Byte ranges as big as a reduce task's output, so a big
		// model-state file is shared by the workers like a big tensor.
		ranges := splitRows(c.Size, 1, 4*chunk)
		for ci, r := range ranges {
			tasks = append(tasks, Task{Kind: CopyTask, Output: oi, Start: r[0], End: r[1], Bytes: 2 * (r[1] - r[0]),
				Chunk: ci, Of: len(ranges)})
		}
	}
	return tasks
}

// assign orders the tasks and gives each to a node, then sets pl.Tasks.
// LPT: biggest first. Equal tasks are ordered by chunk index first, so
// concurrent workers start on different files (writes to one file
// serialize on its inode lock), then by position: the plan is
// deterministic.
func (pl *Plan) assign(tasks []Task) {
	sort.SliceStable(tasks, func(i, j int) bool {
		if tasks[i].Bytes != tasks[j].Bytes {
			return tasks[i].Bytes > tasks[j].Bytes
		}
		return tasks[i].Chunk < tasks[j].Chunk
	})
	copyNode := map[int]int{} // a copied or value file stays on one node: only state files are shared
	for i := range tasks {
		n := 0
		for k := 1; k < pl.Nodes; k++ {
			if pl.NodeBytes[k] < pl.NodeBytes[n] {
				n = k
			}
		}
		if tasks[i].Kind == CopyTask || tasks[i].Kind == ValueTask {
			if c, ok := copyNode[tasks[i].Output]; ok {
				n = c
			}
			copyNode[tasks[i].Output] = n
		}
		tasks[i].Node = n
		pl.NodeBytes[n] += tasks[i].Bytes
	}
	sort.SliceStable(tasks, func(i, j int) bool { return tasks[i].Node < tasks[j].Node })
	pl.Tasks = tasks
}

// paramEntry is a parameter's manifest entry without its files.
func paramEntry(p *fragment.Param) atomic.ParamEntry {
	kind, dims := fragment.Classify(p)
	pe := atomic.ParamEntry{Name: p.Name, Shape: append([]int64{}, p.Shape...), DType: "float32", Pattern: kind.String(),
		SplitDims: dims, Frozen: p.Frozen, Aliases: p.Info.Aliases}
	if p.Info.TPKnown {
		pe.TPLayout = atomic.TPFromSource
	}
	if st := p.State(fragment.FP32); p.Frozen && st != nil && len(st.Frags) > 0 && st.Frags[0].Src.T != nil {
		pe.SourceDType = st.Frags[0].Src.DType().String()
	}
	if p.Info.VocabSize > 0 {
		pe.VocabSize, pe.PaddedVocab = p.Info.VocabSize, p.Info.PaddedVocab
	}
	return pe
}

// StateDType is the dtype of a state file: float32 for trained parameters
// and their optimizer states (the atomic format), the stored dtype for
// frozen parameters and buffers, whose elements are copied bit for bit (an
// int64 counter or a bf16 frozen weight is not widened). An averaged frozen
// parameter stays float32: its value is a computed mean, not a copy.
func StateDType(p *fragment.Param, st *fragment.State) (dtype.DType, error) {
	if !p.Frozen || p.Average || len(st.Frags) == 0 {
		return dtype.Float32, nil
	}
	dt := st.Frags[0].Src.DType()
	for _, f := range st.Frags[1:] {
		if d := f.Src.DType(); d != dt {
			return dtype.Invalid, fmt.Errorf("frozen parameter %s: %s stores it as %v but %s as %v; its shards must agree on one dtype",
				p.Name, st.Frags[0].Src.Path, dt, f.Src.Path, d)
		}
	}
	if !dt.Valid() || dt.Size() == 0 {
		return dtype.Invalid, fmt.Errorf("frozen parameter %s: %s stores it as %v, which ucp cannot write", p.Name, st.Frags[0].Src.Path, dt)
	}
	return dt, nil
}

// IO splits a task's planning weight into the bytes it reads and writes:
// state chunks write their elements in the file's dtype and read the rest,
// copies read and write the file, steps are too small to count.
func (p *Plan) IO(tk Task) (read, written int64) {
	switch tk.Kind {
	case CopyTask:
		return tk.Bytes / 2, tk.Bytes / 2
	case StepTask:
		return 0, 0
	case ValueTask:
		return 0, 0 // outside the table's figures (see Run)
	}
	written = int64(p.Outputs[tk.Output].DType.Size()) * (tk.End - tk.Start)
	return tk.Bytes - written, written
}

// srcBytesPerElem is the source bytes read per output element of a state,
// replicas included (they are read for checking or averaging).
func srcBytesPerElem(p *fragment.Param, st *fragment.State, numel int64) float64 {
	if numel == 0 {
		return 0
	}
	return float64(p.SrcBytes(st)) / float64(numel)
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
	bare := false
	for _, o := range p.Outputs {
		bare = bare || o.Bare
	}
	b, _ := json.Marshal(struct {
		Nodes, Cores int
		Chunk        int64
		Tasks        []Task
		Bare         bool `json:",omitempty"`
	}{p.Nodes, p.Cores, p.ChunkElems, p.Tasks, bare})
	h := sha256.Sum256(b)
	return fmt.Sprintf("%x", h[:8])
}

// stateRoot is the value of a state file: DeepSpeed's universal dict with
// a tensor of the parameter's full shape in the file's dtype.
func stateRoot(p *fragment.Param, o *Output) pyobj.Value {
	t := &torchfile.Blob{DType: o.DType, Shape: append([]int64(nil), o.Shape...)}
	if o.Bare {
		return t
	}
	return Universal(p, t)
}

// Universal returns the dict DeepSpeed's universal loader reads from a
// state file (atomic/FORMAT.md): the merge keys, then 'param'.
func Universal(p *fragment.Param, param pyobj.Value) *pyobj.Dict {
	d := pyobj.NewDict(pyobj.PlainDict)
	in := p.Info
	switch {
	case in.CatDim < 0:
		// replicated or averaged: no cat_dim
	case in.NSubParams > 1 && in.SubParamWidths == nil:
		d.Set("cat_dim", int64(in.CatDim))
		d.Set("param_n_sub_params", int64(in.NSubParams))
	case in.SubParamShape != nil:
		d.Set("sub_param_shape", in.SubParamShape)
	default:
		d.Set("cat_dim", int64(in.CatDim))
	}
	if in.VocabSize > 0 {
		d.Set("vocab_tensor", true)
	}
	d.Set("param", param)
	return d
}

// markShared marks the state files whose tasks lie on more than one node.
func (p *Plan) markShared() {
	nodes := map[int]int{}
	for _, t := range p.Tasks {
		if t.Kind != ReduceTask {
			continue
		}
		if n, ok := nodes[t.Output]; ok && n != t.Node {
			p.Outputs[t.Output].Shared = true
		}
		nodes[t.Output] = t.Node
	}
}

// Label names a task for the timeline and errors.
func (p *Plan) Label(tk Task) string {
	o := &p.Outputs[tk.Output]
	switch tk.Kind {
	case CopyTask:
		if tk.Of > 1 {
			return fmt.Sprintf("copy %s [%d/%d]", o.Path, tk.Chunk+1, tk.Of)
		}
		return "copy " + o.Path
	case StepTask:
		return p.t.Params[o.Param].Name + "/step"
	case ValueTask:
		return "write " + o.Path
	}
	s := p.t.Params[o.Param].Name + "/" + o.Name
	if tk.Of > 1 {
		s += fmt.Sprintf(" [%d/%d]", tk.Chunk+1, tk.Of)
	}
	return s
}
