package deepspeed

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// File name patterns (formats/deepspeed/FORMAT.md, "Finding the files").
// DeepSpeed sorts some of these lexicographically; ucp parses the ranks and
// sorts by number. ModelStatesFile and Zero3ModelFile name model-state
// files (mp rank; dp and mp rank).
var (
	ModelStatesFile = regexp.MustCompile(`^mp_rank_(\d+)_model_states\.pt$`)
	reOptimStates   = regexp.MustCompile(`^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_?optim_states\.pt$`)
	Zero3ModelFile  = regexp.MustCompile(`^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$`)
	reLayer         = regexp.MustCompile(`^layer_(\d+)-model_(\d+)-model_states\.pt$`)
	reLayerNoTP     = regexp.MustCompile(`^layer_(\d+)-model_states\.pt$`)
)

// Files are the checkpoint files of one tag folder, by rank.
type Files struct {
	Dir    string
	Tag    string
	Model  map[int]string    // mp rank -> mp_rank_XX_model_states.pt
	Optim  map[[2]int]string // (dp, mp) -> *_optim_states.pt
	Layers map[[2]int]string // (layer index, tp) -> layer file
	Zero3  map[[2]int]string // (dp, mp) -> zero_pp_rank_D_mp_rank_XX_model_states.pt
}

// Scan lists each folder once for one walk over a checkpoint: the
// registry's Detect calls, its partly-claimed check and Index share it
// (formats.Index makes one per call). A nil *Scan lists every time.
type Scan struct {
	mu   sync.Mutex
	dirs map[string]listing
}

type listing struct {
	ents []os.DirEntry
	err  error
}

// readDir is os.ReadDir, once per folder for a non-nil s.
func (s *Scan) readDir(dir string) ([]os.DirEntry, error) {
	if s == nil {
		return os.ReadDir(dir)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.dirs[dir]
	if !ok {
		l.ents, l.err = os.ReadDir(dir)
		if s.dirs == nil {
			s.dirs = map[string]listing{}
		}
		s.dirs[dir] = l
	}
	return l.ents, l.err
}

// Files resolves the tag folder of path (ResolveTag) and classifies its
// rank files (ListFiles).
func (s *Scan) Files(path, tag string) (*Files, error) {
	dir, name, err := s.ResolveTag(path, tag)
	if err != nil {
		return nil, err
	}
	return s.ListFiles(dir, name)
}

// ResolveTag finds the folder holding the rank files: path itself, or the
// tag named by tag, or by the "latest" file in path.
func (s *Scan) ResolveTag(path, tag string) (dir, name string, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", "", err
	}
	if !st.IsDir() {
		return "", "", fmt.Errorf("%s: not a folder", path)
	}
	if tag != "" {
		dir = filepath.Join(path, tag)
		if _, err := os.Stat(dir); err != nil {
			return "", "", fmt.Errorf("tag %q: %w", tag, err)
		}
		return dir, tag, nil
	}
	if s.HasRankFiles(path) {
		return path, filepath.Base(path), nil
	}
	b, err := fsutil.ReadFile(filepath.Join(path, "latest"))
	if err != nil {
		return "", "", fmt.Errorf("%s: no DeepSpeed rank files and no 'latest' tag file", path)
	}
	tag = strings.TrimSpace(string(b))
	if tag == "" || strings.ContainsAny(tag, "/\\") || tag == ".." {
		return "", "", fmt.Errorf("%s: 'latest' names an invalid tag %q", filepath.Join(path, "latest"), tag)
	}
	dir = filepath.Join(path, tag)
	if _, err := os.Stat(dir); err != nil {
		return "", "", fmt.Errorf("%s names tag %q: %w", filepath.Join(path, "latest"), tag, err)
	}
	return dir, tag, nil
}

// HasRankFiles reports whether dir holds DeepSpeed rank files.
func (s *Scan) HasRankFiles(dir string) bool {
	ents, err := s.readDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		n := e.Name()
		if ModelStatesFile.MatchString(n) || reOptimStates.MatchString(n) || Zero3ModelFile.MatchString(n) {
			return true
		}
	}
	return false
}

// ListFiles classifies the rank files of a tag folder. Two files for the
// same rank (say bf16_ and plain optimizer files, or mp_rank_1 and
// mp_rank_01) are an error that names both.
func (s *Scan) ListFiles(dir, tag string) (*Files, error) {
	ents, err := s.readDir(dir)
	if err != nil {
		return nil, err
	}
	f := &Files{Dir: dir, Tag: tag, Model: map[int]string{}, Optim: map[[2]int]string{},
		Layers: map[[2]int]string{}, Zero3: map[[2]int]string{}}
	put := func(m map[[2]int]string, k [2]int, name string) error {
		if prev, dup := m[k]; dup {
			return fmt.Errorf("%s: duplicated rank file: %s and %s are the same rank", dir, filepath.Base(prev), name)
		}
		m[k] = filepath.Join(dir, name)
		return nil
	}
	for _, e := range ents {
		n := e.Name()
		var err error
		switch {
		case ModelStatesFile.MatchString(n):
			mp := Atoi(ModelStatesFile.FindStringSubmatch(n)[1])
			if prev, dup := f.Model[mp]; dup {
				err = fmt.Errorf("%s: duplicated rank file: %s and %s are the same rank", dir, filepath.Base(prev), n)
			}
			f.Model[mp] = filepath.Join(dir, n)
		case reOptimStates.MatchString(n):
			m := reOptimStates.FindStringSubmatch(n)
			err = put(f.Optim, [2]int{Atoi(m[2]), Atoi(m[3])}, n)
		case Zero3ModelFile.MatchString(n):
			m := Zero3ModelFile.FindStringSubmatch(n)
			err = put(f.Zero3, [2]int{Atoi(m[1]), Atoi(m[2])}, n)
		case reLayer.MatchString(n):
			m := reLayer.FindStringSubmatch(n)
			err = put(f.Layers, [2]int{Atoi(m[1]), Atoi(m[2])}, n)
		case reLayerNoTP.MatchString(n):
			m := reLayerNoTP.FindStringSubmatch(n)
			err = put(f.Layers, [2]int{Atoi(m[1]), 0}, n)
		}
		if err != nil {
			return nil, err
		}
	}
	return f, nil
}

// Atoi parses a rank number the file-name patterns matched.
func Atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// OptimName is the name DeepSpeed gives the optimizer file of a rank, for
// "missing file" errors.
func (f *Files) OptimName(dp, mp int) string {
	prefix := ""
	for _, p := range f.Optim {
		if strings.HasPrefix(filepath.Base(p), "bf16_") {
			prefix = "bf16_"
		}
		break
	}
	return fmt.Sprintf("%szero_pp_rank_%d_mp_rank_%02d_optim_states.pt", prefix, dp, mp)
}
