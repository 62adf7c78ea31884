package main

import (
	"fmt"
	"path/filepath"

	"github.com/ucp-project/ucp/atomic"
	"github.com/ucp-project/ucp/fragment"
)

// outputPaths lists every file the atomic checkpoint of t will hold,
// relative to DST: the state files, the global files, the copies and the
// manifest.
func outputPaths(t *fragment.Table) []string {
	var out []string
	for _, p := range t.Params {
		for _, s := range p.States {
			out = append(out, filepath.ToSlash(atomic.StatePath(p.Name, s.Name)))
		}
		if p.Step != nil {
			out = append(out, filepath.ToSlash(atomic.StatePath(p.Name, fragment.StepState)))
		}
	}
	if t.Optimizer != nil {
		out = append(out, atomic.ZeroDir+"/"+atomic.OptimizerState)
	}
	if t.Extra != nil && t.Extra.Len() > 0 {
		out = append(out, atomic.ExtraState)
	}
	for _, f := range t.WriteFiles {
		out = append(out, filepath.ToSlash(f.Name))
	}
	for _, f := range t.CopyFiles {
		out = append(out, filepath.ToSlash(f.Name))
	}
	return append(out, atomic.ManifestName)
}

// checkOutputs validates every output path before DST.partial is
// created, so a refused run leaves nothing behind.
func checkOutputs(dst string, t *fragment.Table) error {
	if err := atomic.CheckPaths(dst, outputPaths(t)); err != nil {
		return fmt.Errorf("%s: nothing written: %w", dst, err)
	}
	return nil
}
