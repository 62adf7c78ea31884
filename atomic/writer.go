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
}

// Writer builds an atomic checkpoint from a fragment table.
type Writer struct {
	Dst   string
	tmp   string
	table *fragment.Table
	opt   Options

	mu       sync.Mutex
	states   map[[2]int]*FileEntry // (param, state) -> written file
	steps    map[int]*FileEntry
	finished bool
}

// Create checks the table's names and starts the checkpoint in DST.partial.
func Create(dst string, t *fragment.Table, opt Options) (*Writer, error) {
	dst = filepath.Clean(dst)
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
	if err := os.RemoveAll(tmp); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(tmp, ZeroDir), 0o755); err != nil {
		return nil, err
	}
	for _, p := range t.Params {
		if err := os.MkdirAll(filepath.Join(tmp, ZeroDir, p.Name), 0o755); err != nil {
			return nil, err
		}
	}
	return &Writer{Dst: dst, tmp: tmp, table: t, opt: opt,
		states: map[[2]int]*FileEntry{}, steps: map[int]*FileEntry{}}, nil
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
	case in.NSubParams == 2 && in.SubParamWidths == nil:
		d.Set("cat_dim", int64(in.CatDim))
		d.Set("param_n_sub_params", int64(2))
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
	key    [2]int
	path   string
	tw     *torchfile.Writer
	numel  int64
	closed bool
}

// StateFile creates the file of state si of parameter pi, pre-sized, ready
// for concurrent WriteAt of disjoint element ranges.
func (w *Writer) StateFile(pi, si int) (*StateFile, error) {
	p := w.table.Params[pi]
	st := p.States[si]
	rel := StatePath(p.Name, st.Name)
	blob := &torchfile.Blob{DType: dtype.Float32, Shape: append([]int64(nil), p.Shape...)}
	tw, err := torchfile.Create(filepath.Join(w.tmp, rel), Universal(p, blob))
	if err != nil {
		return nil, err
	}
	tw.NoSync = true // Finish syncs the whole folder before the manifest
	return &StateFile{w: w, key: [2]int{pi, si}, path: rel, tw: tw, numel: p.Numel()}, nil
}

// WriteAt writes little-endian float32 elements starting at element off.
func (f *StateFile) WriteAt(p []byte, off int64) error {
	return f.tw.WriteAt(0, p, 4*off)
}

// Commit finishes the file and records it for the manifest.
func (f *StateFile) Commit() error {
	if err := f.tw.Commit(); err != nil {
		return err
	}
	f.closed = true
	e := &FileEntry{Path: filepath.ToSlash(f.path), Bytes: f.tw.Layout.Size(), CRC32: fmt.Sprintf("%08x", f.tw.CRC32())}
	f.w.mu.Lock()
	f.w.states[f.key] = e
	f.w.mu.Unlock()
	return nil
}

// Abort removes the partial file.
func (f *StateFile) Abort() {
	if !f.closed {
		f.tw.Abort()
	}
}

// WriteStep writes zero/<param>/step.pt with the raw step value: an int,
// a float, or a 0-dim tensor given as its dtype and bytes.
func (w *Writer) WriteStep(pi int, v pyobj.Value) error {
	p := w.table.Params[pi]
	rel := StatePath(p.Name, fragment.StepState)
	e, err := w.save(rel, v)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.steps[pi] = e
	w.mu.Unlock()
	return nil
}

func (w *Writer) save(rel string, v pyobj.Value) (*FileEntry, error) {
	v, err := materialize(v)
	if err != nil {
		return nil, err
	}
	tw, err := torchfile.Create(filepath.Join(w.tmp, rel), v)
	if err != nil {
		return nil, err
	}
	tw.NoSync = true
	if err := tw.Commit(); err != nil {
		return nil, err
	}
	return &FileEntry{Path: filepath.ToSlash(rel), Bytes: tw.Layout.Size(), CRC32: fmt.Sprintf("%08x", tw.CRC32())}, nil
}

// Finish writes the global files and the manifest, then renames
// DST.partial to DST and writes latest_universal beside it.
func (w *Writer) Finish() (*Manifest, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return nil, fmt.Errorf("%s: already finished", w.Dst)
	}
	m := &Manifest{Format: ManifestFormat, Version: ManifestVersion, Tool: w.opt.Tool,
		Source: SourceInfo{Format: w.table.Format, Path: w.table.Source, Tag: w.table.Tag, Degrees: w.table.Degrees},
		Notes:  w.table.Notes}
	for pi, p := range w.table.Params {
		kind, dims := patterns.Classify(p)
		pe := ParamEntry{Name: p.Name, Shape: append([]int64{}, p.Shape...), DType: "float32", Pattern: kind.String(),
			SplitDims: dims, Frozen: p.Frozen, Aliases: p.Info.Aliases}
		if p.Info.VocabSize > 0 {
			pe.VocabSize, pe.PaddedVocab = p.Info.VocabSize, p.Info.PaddedVocab
		}
		for si, s := range p.States {
			e := w.states[[2]int{pi, si}]
			if e == nil {
				return nil, fmt.Errorf("%s: state %s of %s was not written", w.Dst, s.Name, p.Name)
			}
			pe.Files = append(pe.Files, StateEntry{State: s.Name, FileEntry: *e})
		}
		if e := w.steps[pi]; e != nil {
			pe.Files = append(pe.Files, StateEntry{State: fragment.StepState, FileEntry: *e})
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
	for _, c := range w.table.CopyFiles {
		if err := CheckName(filepath.Base(c.Name)); err != nil || filepath.IsAbs(c.Name) || strings.Contains(c.Name, "..") {
			return nil, fmt.Errorf("refusing to copy to %q", c.Name)
		}
		e, err := copyFile(c.Src, filepath.Join(w.tmp, c.Name))
		if err != nil {
			return nil, err
		}
		e.Path = filepath.ToSlash(c.Name)
		m.Files = append(m.Files, *e)
	}
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Path < m.Files[j].Path })
	// Everything must be on disk before the manifest says it is complete.
	if err := syncTree(w.tmp); err != nil {
		return nil, fmt.Errorf("%s: %w", w.tmp, err)
	}
	if err := writeJSON(filepath.Join(w.tmp, ManifestName), m); err != nil {
		return nil, err
	}
	if err := syncDir(w.tmp); err != nil {
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
	if err := writeFileAtomic(filepath.Join(parent, LatestUniversal), []byte(filepath.Base(w.Dst))); err != nil {
		return nil, err
	}
	w.finished = true
	return m, syncDir(parent)
}

// Abort removes DST.partial.
func (w *Writer) Abort() {
	os.RemoveAll(w.tmp)
}

func copyFile(src, dst string) (*FileEntry, error) {
	in, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return nil, err
	}
	h := newCRC()
	// io.Copy between files uses copy_file_range; the CRC needs the bytes,
	// so tee them (model-state files are small).
	n, err := io.Copy(io.MultiWriter(out, h), in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("copying %s: %w", src, err)
	}
	return &FileEntry{Bytes: n, CRC32: fmt.Sprintf("%08x", h.Sum32())}, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(b, '\n'))
}

// writeFileAtomic writes through a temporary name, fsyncs and renames.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
