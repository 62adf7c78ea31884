// Package fragment is ucp's one data model for every source format: a
// table of parameters whose optimizer states are assembled from fragments
// of stored tensors. Format readers (formats/*) build the table without
// reading tensor bytes; everything after that works on the table alone:
// the sharding patterns (patterns.go) and the coverage proof (geometry.go)
// here, then the plan, the reducers and inspect.
//
// Two levels describe where a stored element goes:
//
//   - A Shard is one local tensor of a state: a tensor-parallel slice, a
//     DCP chunk, or the whole tensor. Its BoxMaps place boxes of the shard
//     into the full tensor by translation. Elements of a shard outside every
//     map are padding (vocabulary padding) and are dropped.
//   - A Fragment is a run of elements of a stored tensor (Src) that are the
//     elements [LocalStart, LocalStart+Len) of a shard in row-major order:
//     a ZeRO flat-partition slice, or a whole stored shard.
package fragment

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Standard state names, as DeepSpeed's universal checkpoint names files.
const (
	FP32      = "fp32"
	ExpAvg    = "exp_avg"
	ExpAvgSq  = "exp_avg_sq"
	StepState = "step"
)

// TensorRef is a stored tensor: a lazy torch view whose storage lies at an
// absolute offset of the file Path.
type TensorRef struct {
	Path string
	T    *torchfile.Tensor
}

// DType returns the element type of the stored tensor.
func (r TensorRef) DType() dtype.DType { return r.T.DType }

// Numel returns the number of elements of the view.
func (r TensorRef) Numel() int64 { return r.T.Numel() }

// Ref returns the TensorRef of t found in file path; base is added to the
// storage offsets when the torch.save stream starts inside a larger file
// (DCP items).
func Ref(path string, t *torchfile.Tensor, base int64) TensorRef {
	if base != 0 {
		st := *t.Storage
		st.Offset += base
		tc := *t
		tc.Storage = &st
		t = &tc
	}
	return TensorRef{Path: path, T: t}
}

// BoxMap places the box [From, From+Size) of a shard at [To, To+Size) of
// the full tensor.
type BoxMap struct {
	From, To, Size []int64
}

// Shard is one local tensor of a state.
type Shard struct {
	Shape   []int64
	Maps    []BoxMap // nil: the shard is the full tensor
	Replica int      // 0: placed; >0: a duplicate (checked equal, or averaged for Partial params)
	Label   string   // where it came from, for listings ("tp1", "chunk 3")
}

// Fragment says that elements [SrcStart, SrcStart+Len) of Src, in
// row-major order, are elements [LocalStart, LocalStart+Len) of shard
// Shard of its state.
type Fragment struct {
	Shard      int
	LocalStart int64
	Len        int64
	Src        TensorRef
	SrcStart   int64
}

// State is one optimizer state (or the fp32 weight) of a parameter.
type State struct {
	Name   string
	Shards []Shard
	Frags  []Fragment
}

// Step is the optimizer step count of a parameter: a Python value (int or
// float) or a 0-dim tensor whose bytes are read when writing.
type Step struct {
	Value  pyobj.Value
	Tensor *TensorRef
}

// Info is what a format knows about how a parameter was split, kept for the
// universal checkpoint's dict keys and the manifest.
type Info struct {
	// CatDim is the dim tensor-parallel shards concatenate along, or -1
	// when the parameter is replicated or averaged.
	CatDim int
	// NSubParams > 1 with SubParamWidths nil: that many equal fused
	// sub-parameters along CatDim (SwiGLU's gate and up projections).
	NSubParams int
	// SubParamWidths: widths of fused sub-parameters of different sizes
	// along CatDim (fused QKV with GQA), and SubParamShape the
	// SubparamShape object DeepSpeed's loader reads, when known.
	SubParamWidths []int64
	SubParamShape  pyobj.Value
	// VocabSize > 0 marks a vocabulary parameter whose rows were cut from
	// PaddedVocab (as saved) to VocabSize.
	VocabSize   int64
	PaddedVocab int64
	// Aliases are other names of the same tensor (tied weights).
	Aliases []string
	// Padding counts stored elements of this parameter that no fragment
	// reads (ZeRO-3's per-parameter partition padding).
	Padding int64
	// Replicas > 1 says that many ranks held identical copies of which the
	// source stored one (DCP deduplicates them): the pattern is Replicate.
	Replicas int
	// TPKnown says the source records how this parameter is cut across
	// tensor-parallel ranks (CatDim, the sub-parameters and the vocabulary
	// keys come from its TP layout: Megatron's parameter kinds, DeepSpeed
	// shards at TP > 1); otherwise CatDim 0 is only DeepSpeed's default for
	// an unsplit tensor and says nothing (atomic ParamEntry.TPLayout).
	TPKnown bool
}

// Param is one parameter of the full model.
type Param struct {
	Name    string
	Shape   []int64 // full shape of the atomic tensors
	Average bool    // Partial: the atomic value is the mean of all replicas
	Frozen  bool    // not trained: only the weight, from the model state
	States  []*State
	Step    *Step
	Info    Info
}

// State returns the state with the given name, or nil.
func (p *Param) State(name string) *State {
	for _, s := range p.States {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// AddState appends an empty state and returns it.
func (p *Param) AddState(name string) *State {
	s := &State{Name: name}
	p.States = append(p.States, s)
	return s
}

// StateWith returns the state with the given name, adding it with a copy
// of shards when the parameter does not have it yet.
func (p *Param) StateWith(name string, shards []Shard) *State {
	if st := p.State(name); st != nil {
		return st
	}
	st := p.AddState(name)
	st.Shards = append([]Shard(nil), shards...)
	return st
}

// SrcBytes is what converting state s reads of the source: its fragments'
// bytes, less the vocabulary padding rows they hold (the rows from
// Info.VocabSize to Info.PaddedVocab are stored but never read).
func (p *Param) SrcBytes(s *State) int64 {
	var b, n int64
	for _, f := range s.Frags {
		b += f.Len * int64(f.Src.DType().Size())
		n += f.Len
	}
	v, pv := p.Info.VocabSize, p.Info.PaddedVocab
	if v > 0 && pv > v && len(p.Shape) > 0 && p.Shape[0] == v {
		// The fragments hold whole copies of the padded parameter.
		if padded := p.Numel() / v * pv; padded > 0 && n%padded == 0 {
			return b / pv * v
		}
	}
	return b
}

// Numel returns the number of elements of the full parameter.
func (p *Param) Numel() int64 { return torchfile.Numel(p.Shape) }

// Degrees are the parallel degrees of the source checkpoint. The atomic
// manifest records the same fields (atomic.Degrees, converted from this
// type where the manifest is built): a type of its own keeps the table
// free of the output format, and the conversion stops compiling if the two
// ever differ. The JSON names are the manifest's (inspect and --arrow
// print them).
type Degrees struct {
	TP   int `json:"tp"`
	PP   int `json:"pp"`
	DP   int `json:"dp"`
	EP   int `json:"ep"`
	VPP  int `json:"vpp"`
	ZeRO int `json:"zero"` // ZeRO stage, 0 for none
}

// Table is the fragment table of one source checkpoint.
type Table struct {
	Format  string // "deepspeed", "megatron", "dcp", ...
	Source  string // the folder that was indexed
	Tag     string // checkpoint tag or iteration
	Degrees Degrees
	Params  []*Param
	// Optimizer is the global optimizer state for the universal
	// zero/optimizer_state.pt (param groups, loss scaler ...), or nil.
	Optimizer *pyobj.Dict
	// Extra holds non-tensor state to carry along (DCP bytes items,
	// client state), by key.
	Extra *pyobj.Dict
	// CopyFiles lists source files copied byte for byte into the atomic
	// checkpoint (DeepSpeed model states), relative name -> source path.
	CopyFiles []CopyFile
	// WriteFiles are torch files written from values, their tensors
	// *TensorRefs streamed from the source (model states given the
	// universal_checkpoint_info they lacked).
	WriteFiles []ValueFile
	// Notes are facts the reader wants the user to see (padding kept, ...).
	Notes []string
	// DType is the model's training dtype ("bfloat16", ...) when the
	// source tells it, and Args its saved training arguments (scalar
	// values by name, see ScalarArgs), for exports that need the model's
	// geometry (Hugging Face config.json).
	DType string
	Args  map[string]any
	// Model is the model family and configuration (formats.Index detects
	// it from Args when the reader does not set it).
	Model *family.Config
	// Scratch lists temporary folders the reader made that hold source
	// data (DCP items decoded from zstd); Close removes them.
	Scratch []string
}

// Close removes the table's scratch folders; call it when the sources are
// no longer read.
func (t *Table) Close() error {
	var first error
	for _, d := range t.Scratch {
		if err := os.RemoveAll(d); err != nil && first == nil {
			first = err
		}
	}
	t.Scratch = nil
	return first
}

// CopyFile is a file copied unchanged into the output.
type CopyFile struct {
	Name string // path relative to the output folder
	Src  string
	Size int64 // bytes, for planning
}

// ValueFile is a torch file written into the output from a value.
type ValueFile struct {
	Name  string // path relative to the output folder
	Value pyobj.Value
}

// RefTree returns v with every *torchfile.Tensor replaced by a
// *TensorRef into path (one reference per tensor), containers copied where
// they hold one, so that a decoded source file can be written again with
// its tensors streamed.
func RefTree(path string, v pyobj.Value, lim pyobj.Limits) (pyobj.Value, error) {
	refs := map[*torchfile.Tensor]*TensorRef{}
	return pyobj.Rewrite(v, lim, func(v pyobj.Value) (pyobj.Value, bool, error) {
		t, ok := v.(*torchfile.Tensor)
		if !ok {
			return nil, false, nil
		}
		r, ok := refs[t]
		if !ok {
			r = &TensorRef{Path: path, T: t}
			refs[t] = r
		}
		return r, true, nil
	})
}

// NewCopyFile describes src, copied as name into the output.
func NewCopyFile(name, src string) (CopyFile, error) {
	st, err := os.Stat(src)
	if err != nil {
		return CopyFile{}, err
	}
	return CopyFile{Name: name, Src: src, Size: st.Size()}, nil
}

// Param returns the parameter with the given name, or nil.
func (t *Table) Param(name string) *Param {
	for _, p := range t.Params {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// SortParams orders parameters by name; readers keep the model's order
// where it is meaningful, so this is only for tables that have none.
func (t *Table) SortParams() {
	sort.Slice(t.Params, func(i, j int) bool { return t.Params[i].Name < t.Params[j].Name })
}

// Bytes returns the source bytes that the fragments of the table read.
func (t *Table) Bytes() (src int64, out int64) {
	for _, p := range t.Params {
		for _, s := range p.States {
			src += p.SrcBytes(s)
			out += 4 * p.Numel()
		}
	}
	return src, out
}

func (f Fragment) String() string {
	return fmt.Sprintf("shard %d [%d,%d) <- %s %v@%d", f.Shard, f.LocalStart, f.LocalStart+f.Len, f.Src.Path, f.Src.T.Shape, f.SrcStart)
}

// StateOrder sorts state names with the standard states first (fp32,
// exp_avg, exp_avg_sq), then the others by name, in place.
func StateOrder(keys []string) []string {
	rank := map[string]int{FP32: 0, ExpAvg: 1, ExpAvgSq: 2}
	sort.SliceStable(keys, func(i, j int) bool {
		ri, oki := rank[keys[i]]
		rj, okj := rank[keys[j]]
		switch {
		case oki && okj:
			return ri < rj
		case oki != okj:
			return oki
		}
		return keys[i] < keys[j]
	})
	return keys
}

// SourceFiles lists the source files the table reads: those its
// fragments, steps, written values and copies refer to. Files the reader
// decoded into its scratch folders are replaced by the regular files of
// the source folder they came from (the decoded copies change every run).
func (t *Table) SourceFiles() ([]string, error) {
	seen := map[string]bool{}
	scratch := false
	add := func(p string) {
		for _, d := range t.Scratch {
			if rel, err := filepath.Rel(d, p); err == nil && !strings.HasPrefix(rel, "..") {
				scratch = true
				return
			}
		}
		seen[p] = true
	}
	for _, p := range t.Params {
		for _, st := range p.States {
			for _, f := range st.Frags {
				add(f.Src.Path)
			}
		}
		if p.Step != nil && p.Step.Tensor != nil {
			add(p.Step.Tensor.Path)
		}
	}
	for _, c := range t.CopyFiles {
		add(c.Src)
	}
	for _, vf := range t.WriteFiles {
		err := pyobj.Walk(vf.Value, pyobj.DefaultLimits(), func(_ []pyobj.Value, v pyobj.Value) error {
			if r, ok := v.(*TensorRef); ok {
				add(r.Path)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", vf.Name, err)
		}
	}
	if scratch && t.Source != "" {
		ents, err := os.ReadDir(t.Source)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if e.Type().IsRegular() {
				seen[filepath.Join(t.Source, e.Name())] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}
