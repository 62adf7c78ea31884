package atomic

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// tmpOverhead is what the temporary names of an output file add to its
// name: "." + name + ".tmp-" + 12 hex digits (torchfile, fsutil), or
// name + ".partial" for files several nodes fill.
const tmpOverhead = 1 + 5 + 12

// CheckPaths validates the output paths (relative to dst, slash-separated)
// before anything is written: each name within the destination file system's name limit
// (with room for the temporary names), no two outputs on one path, no file
// where another output needs a folder (a parameter named
// optimizer_state.pt), and, where the destination folds case, no two
// outputs that differ only in case.
func CheckPaths(dst string, paths []string) error {
	base, err := fsutil.Resolve(dst + PartialSuffix)
	if err != nil {
		return err
	}
	nameMax, pathMax := limits(fsutil.Existing(base))
	// The probe goes beside DST.partial, never into it: a DST.partial that
	// exists may be another live run's, which would publish the probe file.
	fold := foldsCase(fsutil.Existing(filepath.Dir(base)))
	if n := len(filepath.Base(dst)) + len(PartialSuffix); n > nameMax {
		return fmt.Errorf("%s: the destination's name is too long for its file system (%d bytes with %s, at most %d)", dst, n, PartialSuffix, nameMax)
	}
	files := map[string]string{} // path (case-folded where needed) -> as written
	dirs := map[string]string{}
	key := func(p string) string {
		if fold {
			return strings.ToLower(p)
		}
		return p
	}
	for _, p := range paths {
		parts := strings.Split(p, "/")
		for i, part := range parts {
			limit := nameMax
			if i == len(parts)-1 {
				limit -= tmpOverhead
			}
			if len(part) > limit {
				return fmt.Errorf("output %s: the name %.40q... is %d bytes, longer than the %d the destination file system allows (%d less room for ucp's temporary names); rename the parameter or shorten it",
					p, part, len(part), limit, nameMax)
			}
		}
		if full := len(base) + 1 + len(p) + tmpOverhead; full >= pathMax {
			return fmt.Errorf("output %s: the path %s/%s is %d bytes, more than the destination allows (%d)", p, base, p, full, pathMax)
		}
		if prev, ok := files[key(p)]; ok {
			return fmt.Errorf("outputs %s and %s would be the same file%s", prev, p, foldNote(fold))
		}
		files[key(p)] = p
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/")
			dirs[key(d)] = d
		}
	}
	sorted := append([]string(nil), paths...)
	sort.Strings(sorted)
	for _, p := range sorted {
		if d, ok := dirs[key(p)]; ok {
			return fmt.Errorf("output file %s would have the path of the folder %s that other outputs need (a parameter named like one of ucp's own files?)%s", p, d, foldNote(fold))
		}
	}
	return nil
}

func foldNote(fold bool) string {
	if fold {
		return " on this case-insensitive destination"
	}
	return ""
}

// limits returns the longest name and path the file system of dir takes.
func limits(dir string) (name, path int) {
	_, name, err := fsutil.FSInfo(dir)
	if err != nil {
		name = 255
	}
	return name, 4096
}

// foldsCase reports whether names in dir are case-insensitive, by
// creating a lower-case probe file and looking for its upper-case name.
func foldsCase(dir string) bool {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return false
	}
	name := filepath.Join(dir, ".ucp-case-probe-"+hex.EncodeToString(b[:]))
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false
	}
	f.Close()
	defer os.Remove(name)
	_, err = os.Stat(filepath.Join(dir, strings.ToUpper(filepath.Base(name))))
	return err == nil
}
