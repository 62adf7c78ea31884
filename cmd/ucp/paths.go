package main

import (
	"fmt"
	"path/filepath"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/mapreduce"
)

// outputPaths lists every file the atomic checkpoint of the plan will
// hold, relative to DST: the plan's outputs and the manifest.
func outputPaths(plan *mapreduce.Plan) []string {
	var out []string
	for _, o := range plan.Outputs {
		out = append(out, filepath.ToSlash(o.Path))
	}
	return append(out, atomic.ManifestName)
}

// checkOutputs validates every output path before DST.partial is
// created, so a refused run leaves nothing behind.
func checkOutputs(dst string, plan *mapreduce.Plan) error {
	if err := atomic.CheckPaths(dst, outputPaths(plan)); err != nil {
		return fmt.Errorf("%s: nothing written: %w", dst, err)
	}
	return nil
}
