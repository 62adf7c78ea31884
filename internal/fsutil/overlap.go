package fsutil

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Resolve returns the absolute path of p with every symbolic link of its
// existing part resolved; the part that does not exist yet is kept as
// written (cleaned).
func Resolve(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	var rest []string
	for {
		r, err := filepath.EvalSymlinks(abs)
		if err == nil {
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		if !os.IsNotExist(err) {
			return "", err
		}
		parent := filepath.Dir(abs)
		if parent == abs {
			return filepath.Join(append([]string{abs}, rest...)...), nil
		}
		rest = append([]string{filepath.Base(abs)}, rest...)
		abs = parent
	}
}

// within reports whether p is inside dir (both resolved and clean).
func within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// CheckOverlap refuses an output folder dst (and the work folders beside
// it, given as suffixes like ".partial") that is the input src, contains
// it or lies inside it, after resolving symbolic links: replacing or
// writing such a dst would destroy or alter the input.
func CheckOverlap(src, dst string, suffixes ...string) error {
	s, err := Resolve(src)
	if err != nil {
		return err
	}
	for _, suf := range append([]string{""}, suffixes...) {
		d, err := Resolve(dst + suf)
		if err != nil {
			return err
		}
		switch {
		case d == s:
			return fmt.Errorf("refusing to write %s: it is the source %s itself (%s); give another destination", dst+suf, src, s)
		case within(s, d):
			return fmt.Errorf("refusing to write %s: it contains the source %s (%s inside %s); give a destination outside the source", dst+suf, src, s, d)
		case within(d, s):
			return fmt.Errorf("refusing to write %s: it is inside the source %s (%s); give a destination outside the source", dst+suf, src, s)
		}
	}
	return nil
}

// Existing returns the nearest folder of p (p itself or a parent) that
// exists.
func Existing(p string) string {
	for {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
		parent := filepath.Dir(p)
		if parent == p {
			return p
		}
		p = parent
	}
}

// DiskUsage returns the bytes of the regular files under dir (0 when it
// does not exist).
func DiskUsage(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if st, err := d.Info(); err == nil {
				n += st.Size()
			}
		}
		return nil
	})
	return n
}

// CheckOutputFile refuses a file ucp is about to write (a report, an
// Arrow table) at path when it lies inside, or is, one of the folders
// given (the source being read, the DST being written: writing there
// would replace input or publish a foreign file as output), when
// something other than a regular file is there (a folder, a link, a
// FIFO), and when a regular file is there and replace is false.
func CheckOutputFile(path string, replace bool, folders ...string) error {
	p, err := Resolve(path)
	if err != nil {
		return err
	}
	for _, f := range folders {
		if f == "" {
			continue
		}
		d, err := Resolve(f)
		if err != nil {
			return err
		}
		if p == d || within(p, d) {
			return fmt.Errorf("refusing to write %s: it is inside %s, which this run reads or writes; give a path outside it", path, f)
		}
	}
	st, err := os.Lstat(path)
	switch {
	case os.IsNotExist(err):
		return nil
	case err != nil:
		return err
	case !st.Mode().IsRegular():
		what := kind(st.Mode())
		if st.Mode()&os.ModeSymlink != 0 {
			what = "a symbolic link"
		}
		return fmt.Errorf("refusing to write %s: it is %s, not a regular file", path, what)
	case !replace:
		return fmt.Errorf("%s already exists (use --force to replace it)", path)
	}
	return nil
}
