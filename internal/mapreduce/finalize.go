package mapreduce

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
)

// Create checks that every parameter and state name of the plan can be a
// folder name, then starts the plan's checkpoint in DST.partial (see
// atomic.Create) with a folder per parameter.
func Create(dst string, p *Plan, opt atomic.Options) (*atomic.Writer, error) {
	seen := map[string]bool{}
	for _, prm := range p.t.Params {
		if err := atomic.CheckName(prm.Name); err != nil {
			return nil, err
		}
		if seen[prm.Name] {
			return nil, fmt.Errorf("parameter %s appears twice", prm.Name)
		}
		seen[prm.Name] = true
		for _, s := range prm.States {
			if err := atomic.CheckName(s.Name); err != nil {
				return nil, fmt.Errorf("parameter %s: state %w", prm.Name, err)
			}
		}
	}
	opt.Dirs = nil
	for _, prm := range p.t.Params {
		opt.Dirs = append(opt.Dirs, filepath.Join(atomic.ZeroDir, prm.Name))
	}
	opt.PlanID = p.ID()
	return atomic.Create(dst, opt)
}

// Finalize completes the checkpoint once every node has finished: the
// shared state files, the value files and the manifest.
func Finalize(p *Plan, w *atomic.Writer) (*atomic.Manifest, error) {
	return w.Finalize(p.complete(w))
}

// complete turns the nodes' records into the manifest: it finishes the
// state files several nodes filled, writes the value files, copies a file
// no node copied, and adds every file's entry.
func (p *Plan) complete(w *atomic.Writer) func(*atomic.Records) (*atomic.Manifest, error) {
	return func(recs *atomic.Records) (*atomic.Manifest, error) {
		m := p.Manifest
		m.Params = append([]atomic.ParamEntry(nil), p.Manifest.Params...)
		m.Files = nil
		for i := range p.Outputs {
			o := &p.Outputs[i]
			rel := filepath.ToSlash(o.Path)
			switch o.Kind {
			case StateFile, StepFile:
				prm := p.t.Params[o.Param]
				e, ok := recs.Files[rel]
				if !ok && recs.Pieces[rel] != nil {
					var err error
					if e, err = w.FinishShared(o.Path, stateRoot(prm, o), recs.Pieces[rel], recs.Parts[rel]); err != nil {
						return nil, err
					}
					ok = true
				}
				if !ok {
					return nil, fmt.Errorf("%s: state %s of %s was not written by any node", w.Dir(), o.Name, prm.Name)
				}
				pe := &m.Params[o.Param]
				pe.Files = append(pe.Files, atomic.StateEntry{State: o.Name, FileEntry: e})
			case ValueFile:
				if err := atomic.CheckName(filepath.Base(o.Path)); err != nil || filepath.IsAbs(o.Path) || strings.Contains(o.Path, "..") {
					return nil, fmt.Errorf("refusing to write %q", o.Path)
				}
				if e, ok := recs.Files[rel]; ok { // a node's ValueTask
					m.Files = append(m.Files, e)
					continue
				}
				if e, ok := w.Done(o.Path); ok { // a resumed run's
					m.Files = append(m.Files, e)
					continue
				}
				// No node recorded it: write it here.
				e, err := writeValue(w, o.Path, o.Value, p.Cores)
				if err != nil {
					return nil, err
				}
				m.Files = append(m.Files, e)
			case CopyFile:
				e, ok := recs.Files[rel]
				if !ok {
					var err error
					if e, err = w.CopyFile(o.Path, o.Src); err != nil {
						return nil, err
					}
				}
				m.Files = append(m.Files, e)
			}
		}
		sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Path < m.Files[j].Path })
		return &m, nil
	}
}
