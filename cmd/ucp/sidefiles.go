package main

import (
	"github.com/ucp-project/ucp/internal/arrowtable"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/report"
)

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
