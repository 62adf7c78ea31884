package atomic

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// Pointer is a pointer file written beside a checkpoint (DeepSpeed's
// 'latest' and 'latest_universal' name a folder of their own folder), as
// the summary reports it.
type Pointer struct {
	Path string // the pointer file
	Now  string // what it names now
	Was  string // what it named before ("" when it did not exist)
}

// String says what happened to the pointer, for a summary.
func (p Pointer) String() string {
	switch {
	case p.Was == "":
		return fmt.Sprintf("wrote %s naming %s", p.Path, p.Now)
	case p.Was == p.Now:
		return fmt.Sprintf("%s already names %s", p.Path, p.Now)
	}
	return fmt.Sprintf("changed %s from %s to %s", p.Path, p.Was, p.Now)
}

// WritePointer makes the file path name value (a tag or folder name), where
// target is the folder it leads to: that folder must exist, so that a
// pointer never names a folder that is gone. It reports what the file
// named before; an unchanged pointer is not rewritten.
func WritePointer(path, value, target string, noSync bool) (Pointer, error) {
	p := Pointer{Path: path, Now: value}
	if st, err := os.Stat(target); err != nil || !st.IsDir() {
		return p, fmt.Errorf("not writing %s: %s, which it would name, is not a folder", path, target)
	}
	if b, err := os.ReadFile(path); err == nil {
		p.Was = strings.TrimSpace(string(b))
		if p.Was == "" {
			p.Was = "nothing"
		}
	}
	if p.Was == value {
		return p, nil
	}
	if err := fsutil.WriteFileAtomic(path, []byte(value), noSync); err != nil {
		return p, err
	}
	return p, nil
}

// LatestUniversalOf is the latest_universal pointer beside dst.
func LatestUniversalOf(dst string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dst)), LatestUniversal)
}
