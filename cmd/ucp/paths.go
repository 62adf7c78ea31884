package main

import (
	"fmt"
	"path/filepath"

	"github.com/ucp-project/ucp/internal/arrowtable"
	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/report"
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

// reportFiles are the files --report FILE writes ("": none).
func reportFiles(path string) []string {
	if path == "" {
		return nil
	}
	return []string{path, report.SVGPath(path)}
}

// arrowFiles are the files --arrow FILE writes ("": none).
func arrowFiles(path string) []string {
	if path == "" {
		return nil
	}
	return []string{path, arrowtable.PlanPath(path)}
}

// checkSideFiles refuses, before anything is read or written, a report or
// Arrow file inside the checkpoint read or the DST written (folders), one
// where a folder, link or FIFO is, and an existing file without --force.
func checkSideFiles(force bool, folders []string, files ...[]string) error {
	for _, fs := range files {
		for _, f := range fs {
			if err := fsutil.CheckOutputFile(f, force, folders...); err != nil {
				return err
			}
		}
	}
	return nil
}
