// Package atomic writes and reads ucp's atomic checkpoint: one consolidated
// float32 tensor per parameter and optimizer state, in DeepSpeed's
// universal checkpoint layout, with a manifest. FORMAT.md beside this file
// describes it byte by byte.
//
// The whole checkpoint is built in DST.partial and renamed to DST after the
// manifest, which is written last, so a folder named DST is always complete.
package atomic

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/ucp-project/ucp/dtype"
	"github.com/ucp-project/ucp/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/patterns"
	"github.com/ucp-project/ucp/pyobj"
	"github.com/ucp-project/ucp/torchfile"
)

// File and folder names of the layout.
const (
	ZeroDir         = "zero"
	OptimizerState  = "optimizer_state.pt"
	ExtraState      = "extra_state.pt"
	ManifestName    = "ucp.json"
	LatestUniversal = "latest_universal"
	PartialSuffix   = ".partial"
	ManifestFormat  = "ucp-atomic"
	ManifestVersion = 1
)

// CheckName rejects parameter names that cannot be folder names: they must
// stay inside zero/ and be portable.
func CheckName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty parameter name")
	case name == "." || name == "..":
		return fmt.Errorf("parameter name %q is not a valid folder name", name)
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("parameter name %q contains '/', '\\' or NUL", name)
	case strings.Contains(name, ".."):
		return fmt.Errorf("parameter name %q contains '..'", name)
	}
	return nil
}

// StatePath is the path of a state file relative to the checkpoint folder.
func StatePath(param, state string) string {
	return filepath.Join(ZeroDir, param, state+".pt")
}

// Options configure a Writer.
type Options struct {
	Force bool   // replace an existing DST
	Tool  string // written into the manifest ("ucp v0.1.0")
	// Node and Nodes place this writer in a conversion spread over several
	// processes that share DST.partial; Nodes <= 1 is a single process.
	Node, Nodes int
	// PlanID fingerprints the plan every node follows; records of another
	// plan are refused when finalizing.
	PlanID string
	// NoSync skips syncing the files to disk before the manifest is
	// written (for scratch output, or when the caller syncs).
	NoSync bool
	// FinalizeOnly opens a multi-node DST.partial to finalize it: nothing
	// of what the nodes wrote, their records included, is touched.
	FinalizeOnly bool
}

// Writer builds an atomic checkpoint from a fragment table, alone or as one
// node of several.
type Writer struct {
	Dst   string
	tmp   string
	table *fragment.Table
	opt   Options

	mu       sync.Mutex
	rec      nodeRecord
	finished bool
}

// Create checks the table's names and starts the checkpoint in DST.partial.
// A single process starts from an empty DST.partial; nodes of a multi-node
// run share it and keep what the others wrote.
func Create(dst string, t *fragment.Table, opt Options) (*Writer, error) {
	dst = filepath.Clean(dst)
	if opt.Nodes <= 0 {
		opt.Nodes = 1
	}
	if opt.Node < 0 || opt.Node >= opt.Nodes {
		return nil, fmt.Errorf("node %d of %d", opt.Node, opt.Nodes)
	}
	seen := map[string]bool{}
	for _, p := range t.Params {
		if err := CheckName(p.Name); err != nil {
			return nil, err
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("parameter %s appears twice", p.Name)
		}
		seen[p.Name] = true
		for _, s := range p.States {
			if err := CheckName(s.Name); err != nil {
				return nil, fmt.Errorf("parameter %s: state %w", p.Name, err)
			}
		}
	}
	if _, err := os.Stat(dst); err == nil && !opt.Force {
		return nil, fmt.Errorf("%s already exists (use --force to replace it)", dst)
	}
	tmp := dst + PartialSuffix
	if opt.FinalizeOnly {
		if _, err := os.Stat(filepath.Join(tmp, nodesDir)); err != nil {
			return nil, fmt.Errorf("%s: nothing to finalize: %w", tmp, err)
		}
	} else if opt.Nodes == 1 {
		if err := os.RemoveAll(tmp); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(tmp, nodesDir), 0o755); err != nil {
		return nil, err
	}
	for _, p := range t.Params {
		if err := os.MkdirAll(filepath.Join(tmp, ZeroDir, p.Name), 0o755); err != nil {
			return nil, err
		}
	}
	w := &Writer{Dst: dst, tmp: tmp, table: t, opt: opt,
		rec: nodeRecord{Node: opt.Node, Nodes: opt.Nodes, Plan: opt.PlanID}}
	// A rerun of this node replaces its old record, which no longer holds.
	if !opt.FinalizeOnly {
		if err := os.Remove(w.recordPath(opt.Node)); err != nil && !os.IsNotExist(err) {
			return nil, err
		}
	}
	return w, nil
}

// Dir returns the folder being written (DST.partial).
func (w *Writer) Dir() string { return w.tmp }

// Universal returns the dict DeepSpeed's universal loader reads from a
// state file (deepspeed.md §5.1): the merge keys, then 'param'.
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

// StateFile is one zero/<param>/<state>.pt being written: a float32 tensor
// of the parameter's full shape whose elements arrive in pieces.
type StateFile struct {
	w      *Writer
	pi, si int
	rel    string
	tw     *torchfile.Writer       // the whole file is this node's
	sw     *torchfile.SharedWriter // several nodes fill the file
	closed bool
}

func (w *Writer) stateRoot(pi int) (pyobj.Value, *fragment.Param) {
	p := w.table.Params[pi]
	blob := &torchfile.Blob{DType: dtype.Float32, Shape: append([]int64(nil), p.Shape...)}
	return Universal(p, blob), p
}

// StateFile creates the file of state si of parameter pi, pre-sized, ready
// for concurrent WriteAt of disjoint element ranges. With shared, other
// nodes write parts of the same file and the finalizer completes it.
func (w *Writer) StateFile(pi, si int, shared bool) (*StateFile, error) {
	root, p := w.stateRoot(pi)
	rel := StatePath(p.Name, p.States[si].Name)
	f := &StateFile{w: w, pi: pi, si: si, rel: rel}
	var err error
	if shared {
		f.sw, err = torchfile.OpenShared(filepath.Join(w.tmp, rel), root)
		return f, err
	}
	if f.tw, err = torchfile.Create(filepath.Join(w.tmp, rel), root); err != nil {
		return nil, err
	}
	f.tw.NoSync = true // the folder is synced at once before the manifest
	return f, nil
}

// WriteAt writes little-endian float32 elements starting at element off.
func (f *StateFile) WriteAt(p []byte, off int64) error {
	if f.sw != nil {
		return f.sw.WriteAt(0, p, 4*off)
	}
	return f.tw.WriteAt(0, p, 4*off)
}

// Commit finishes this node's part of the file and records it.
func (f *StateFile) Commit() error {
	p := f.w.table.Params[f.pi]
	state := p.States[f.si].Name
	if f.sw != nil {
		pieces := f.sw.Pieces()
		if err := f.sw.Close(); err != nil {
			return err
		}
		f.closed = true
		f.w.mu.Lock()
		f.w.rec.Shared = append(f.w.rec.Shared, sharedRecord{Param: p.Name, State: state, Pieces: pieces[0]})
		f.w.mu.Unlock()
		return nil
	}
	if err := f.tw.Commit(); err != nil {
		return err
	}
	f.closed = true
	e := FileEntry{Path: filepath.ToSlash(f.rel), Bytes: f.tw.Layout.Size(), CRC32: fmt.Sprintf("%08x", f.tw.CRC32())}
	f.w.mu.Lock()
	f.w.rec.Files = append(f.w.rec.Files, fileRecord{Param: p.Name, State: state, File: e})
	f.w.mu.Unlock()
	return nil
}

// Abort removes this node's unfinished file.
func (f *StateFile) Abort() {
	if f.closed {
		return
	}
	if f.sw != nil {
		f.sw.Close()
		return
	}
	f.tw.Abort()
}

// WriteStep writes zero/<param>/step.pt with the raw step value: an int,
// a float, or a 0-dim tensor given as a Blob.
func (w *Writer) WriteStep(pi int, v pyobj.Value) error {
	p := w.table.Params[pi]
	rel := StatePath(p.Name, fragment.StepState)
	e, err := w.save(rel, v)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.rec.Files = append(w.rec.Files, fileRecord{Param: p.Name, State: fragment.StepState, File: *e})
	w.mu.Unlock()
	return nil
}

func (w *Writer) save(rel string, v pyobj.Value) (*FileEntry, error) {
	v, copies, err := blobsForRefs(v, pyobj.DefaultLimits())
	if err != nil {
		return nil, err
	}
	tw, err := torchfile.Create(filepath.Join(w.tmp, rel), v)
	if err != nil {
		return nil, err
	}
	tw.NoSync = true
	if err := fill(tw, copies); err != nil {
		tw.Abort()
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	if err := tw.Commit(); err != nil {
		return nil, err
	}
	return &FileEntry{Path: filepath.ToSlash(rel), Bytes: tw.Layout.Size(), CRC32: fmt.Sprintf("%08x", tw.CRC32())}, nil
}

// CopyFile copies Table.CopyFiles[i] into the checkpoint unchanged (a
// plan task, so big copies run beside the reducers) and returns its size.
func (w *Writer) CopyFile(i int) (int64, error) {
	e, err := w.copy(i)
	if err != nil {
		return 0, err
	}
	w.mu.Lock()
	w.rec.Copies = append(w.rec.Copies, *e)
	w.mu.Unlock()
	return e.Bytes, nil
}

func (w *Writer) copy(i int) (*FileEntry, error) {
	c := w.table.CopyFiles[i]
	if err := CheckName(filepath.Base(c.Name)); err != nil || filepath.IsAbs(c.Name) || strings.Contains(c.Name, "..") {
		return nil, fmt.Errorf("refusing to copy to %q", c.Name)
	}
	e, err := copyFile(c.Src, filepath.Join(w.tmp, c.Name))
	if err != nil {
		return nil, err
	}
	e.Path = filepath.ToSlash(c.Name)
	return e, nil
}

// Finish completes a single-process conversion: this node's record, then
// Finalize.
func (w *Writer) Finish() (*Manifest, error) {
	if _, err := w.FinishNode(); err != nil {
		return nil, err
	}
	return w.Finalize()
}

// Finalize writes the global files and the manifest from the records of
// all nodes, completes files that several nodes filled, then renames
// DST.partial to DST and writes latest_universal beside it.
func (w *Writer) Finalize() (*Manifest, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return nil, fmt.Errorf("%s: already finished", w.Dst)
	}
	recs, err := w.readRecords()
	if err != nil {
		return nil, err
	}
	files := map[[2]string]FileEntry{}
	pieces := map[[2]string][]torchfile.Piece{}
	for _, r := range recs {
		for _, f := range r.Files {
			files[[2]string{f.Param, f.State}] = f.File
		}
		for _, s := range r.Shared {
			k := [2]string{s.Param, s.State}
			pieces[k] = append(pieces[k], s.Pieces...)
		}
	}
	m := &Manifest{Format: ManifestFormat, Version: ManifestVersion, Tool: w.opt.Tool,
		Source: SourceInfo{Format: w.table.Format, Path: w.table.Source, Tag: w.table.Tag, Degrees: w.table.Degrees,
			DType: w.table.DType, Args: w.table.Args},
		Notes: w.table.Notes}
	for pi, p := range w.table.Params {
		kind, dims := patterns.Classify(p)
		pe := ParamEntry{Name: p.Name, Shape: append([]int64{}, p.Shape...), DType: "float32", Pattern: kind.String(),
			SplitDims: dims, Frozen: p.Frozen, Aliases: p.Info.Aliases}
		if st := p.State(fragment.FP32); p.Frozen && st != nil && len(st.Frags) > 0 && st.Frags[0].Src.T != nil {
			pe.SourceDType = st.Frags[0].Src.DType().String()
		}
		if p.Info.VocabSize > 0 {
			pe.VocabSize, pe.PaddedVocab = p.Info.VocabSize, p.Info.PaddedVocab
		}
		states := []string{}
		for _, s := range p.States {
			states = append(states, s.Name)
		}
		if p.Step != nil {
			states = append(states, fragment.StepState)
		}
		for _, state := range states {
			k := [2]string{p.Name, state}
			e, ok := files[k]
			if !ok && pieces[k] != nil {
				root, _ := w.stateRoot(pi)
				crc, size, err := torchfile.FinishShared(filepath.Join(w.tmp, StatePath(p.Name, state)), root,
					[][]torchfile.Piece{pieces[k]}, true)
				if err != nil {
					return nil, err
				}
				e, ok = FileEntry{Path: filepath.ToSlash(StatePath(p.Name, state)), Bytes: size, CRC32: fmt.Sprintf("%08x", crc)}, true
			}
			if !ok {
				return nil, fmt.Errorf("%s: state %s of %s was not written by any node", w.tmp, state, p.Name)
			}
			pe.Files = append(pe.Files, StateEntry{State: state, FileEntry: e})
		}
		m.Params = append(m.Params, pe)
	}
	if w.table.Optimizer != nil {
		e, err := w.save(filepath.Join(ZeroDir, OptimizerState), w.table.Optimizer)
		if err != nil {
			return nil, err
		}
		m.Files = append(m.Files, *e)
	}
	if w.table.Extra != nil && w.table.Extra.Len() > 0 {
		e, err := w.save(ExtraState, w.table.Extra)
		if err != nil {
			return nil, err
		}
		m.Files = append(m.Files, *e)
	}
	for _, vf := range w.table.WriteFiles {
		if err := CheckName(filepath.Base(vf.Name)); err != nil || filepath.IsAbs(vf.Name) || strings.Contains(vf.Name, "..") {
			return nil, fmt.Errorf("refusing to write %q", vf.Name)
		}
		e, err := w.save(vf.Name, vf.Value)
		if err != nil {
			return nil, err
		}
		m.Files = append(m.Files, *e)
	}
	copied := map[string]FileEntry{}
	for _, r := range recs {
		for _, c := range r.Copies {
			copied[c.Path] = c
		}
	}
	for i, c := range w.table.CopyFiles {
		e, ok := copied[filepath.ToSlash(c.Name)]
		if !ok {
			ce, err := w.copy(i)
			if err != nil {
				return nil, err
			}
			e = *ce
		}
		m.Files = append(m.Files, e)
	}
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Path < m.Files[j].Path })
	if err := os.RemoveAll(filepath.Join(w.tmp, nodesDir)); err != nil {
		return nil, err
	}
	// Everything must be on disk before the manifest says it is complete.
	if !w.opt.NoSync {
		if err := syncTree(w.tmp); err != nil {
			return nil, fmt.Errorf("%s: %w", w.tmp, err)
		}
	}
	if err := writeJSON(filepath.Join(w.tmp, ManifestName), m); err != nil {
		return nil, err
	}
	if err := w.syncDir(w.tmp); err != nil {
		return nil, err
	}
	if w.opt.Force {
		if err := os.RemoveAll(w.Dst); err != nil {
			return nil, err
		}
	}
	if err := os.Rename(w.tmp, w.Dst); err != nil {
		return nil, err
	}
	parent := filepath.Dir(w.Dst)
	if err := fsutil.WriteFileAtomic(filepath.Join(parent, LatestUniversal), []byte(filepath.Base(w.Dst)), w.opt.NoSync); err != nil {
		return nil, err
	}
	w.finished = true
	return m, w.syncDir(parent)
}

func (w *Writer) syncDir(dir string) error {
	if w.opt.NoSync {
		return nil
	}
	return fsutil.SyncDir(dir)
}

// Abort removes DST.partial.
func (w *Writer) Abort() {
	os.RemoveAll(w.tmp)
}

// copyFile copies src to dst in the kernel (copy_file_range), then takes
// the CRC-32 of the copy as it now is in the page cache.
func copyFile(src, dst string) (*FileEntry, error) {
	in, err := fsutil.Open(src)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return nil, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("copying %s: %w", src, err)
	}
	crc, err := fileCRC(dst)
	if err != nil {
		return nil, err
	}
	return &FileEntry{Bytes: n, CRC32: fmt.Sprintf("%08x", crc)}, nil
}

func fileCRC(path string) (uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h := newCRC()
	if _, err := io.Copy(h, f); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return h.Sum32(), nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, append(b, '\n'), false)
}
