package convert

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fsutil"
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

// overlapSuffixes are the work folders convert makes beside DST.
var overlapSuffixes = []string{atomic.PartialSuffix, atomic.OldSuffix}

// checkSourceOverlap is the overlap check before indexing. A DST inside
// SRC is deferred (deferred true): SRC may be a save folder resolved
// through a pointer file ('latest') to one tag folder, and DeepSpeed's own
// layout puts the universal checkpoint beside it (ds_to_universal writes
// <root>/<tag>_universal); checkReadOverlap decides once the folder
// actually read is known.
func checkSourceOverlap(src, dst string) (deferred bool, err error) {
	err = fsutil.CheckOverlap(src, dst, overlapSuffixes...)
	if err == nil {
		return false, nil
	}
	s, rerr := fsutil.Resolve(src)
	if rerr != nil {
		return false, err
	}
	for _, suf := range append([]string{""}, overlapSuffixes...) {
		d, rerr := fsutil.Resolve(dst + suf)
		if rerr != nil || !strictlyInside(d, s) {
			return false, err
		}
	}
	return true, nil
}

// checkReadOverlap refuses a DST inside SRC that overlaps what is read:
// the folder the format indexed (read), or a file directly in SRC such as
// the 'latest' pointer that led to it. Another folder of SRC (a sibling of
// the tag folder) is not read and may hold DST.
func checkReadOverlap(src, dst, read string) error {
	if err := fsutil.CheckOverlap(read, dst, overlapSuffixes...); err != nil {
		return fmt.Errorf("%w (the checkpoint read is %s)", err, read)
	}
	s, err := fsutil.Resolve(src)
	if err != nil {
		return err
	}
	for _, suf := range append([]string{""}, overlapSuffixes...) {
		d, err := fsutil.Resolve(dst + suf)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(s, d)
		if err != nil {
			return err
		}
		top := filepath.Join(s, strings.Split(rel, string(filepath.Separator))[0])
		if st, err := os.Lstat(top); err == nil && !st.IsDir() {
			return fmt.Errorf("refusing to write %s: it is the file %s of the source %s; give another destination", dst+suf, top, src)
		}
	}
	return nil
}

// strictlyInside reports whether p lies inside dir (both resolved).
func strictlyInside(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && !filepath.IsAbs(rel) && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
