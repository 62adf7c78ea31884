package megatron

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fsutil"
)

// File and folder names (checkpointing.py get_checkpoint_name,
// get_distributed_optimizer_checkpoint_name, read_metadata).
const (
	trackerFile = "latest_checkpointed_iteration.txt"
	modelFile   = "model_optim_rng.pt"
	distribFile = "distrib_optim.pt"
)

var (
	reRankDir = regexp.MustCompile(`^mp_rank_(\d+)((?:_\d+)*)$`)
)

// rankDir is one mp_rank_* folder: the files one writer saved.
type rankDir struct {
	name    string
	nums    []int // the numbers of the name: tp, then pp and/or ep
	model   string
	distrib string // "" when the folder has no distrib_optim.pt
	tp      int
	pp      int
	ep      int
	etp     int // the expert tensor-parallel rank of its experts (tp when ETP = TP)
}

// resolveIter finds the iteration folder: path itself when it holds
// mp_rank_* folders or a dist_checkpointing metadata.json, the one tag names (an iteration number, "release" or
// a folder name), or the one latest_checkpointed_iteration.txt names.
func resolveIter(path, tag string) (dir, name string, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", "", err
	}
	if !st.IsDir() {
		return "", "", fmt.Errorf("%s: not a folder", path)
	}
	if tag != "" {
		if strings.ContainsAny(tag, "/\\") || tag == ".." || tag == "." {
			return "", "", fmt.Errorf("iteration %q is not a folder name", tag)
		}
		name = tag
		if n, err := strconv.ParseInt(tag, 10, 64); err == nil && n >= 0 {
			name = fmt.Sprintf("iter_%07d", n)
		}
		dir = filepath.Join(path, name)
		if _, err := os.Stat(dir); err != nil {
			return "", "", fmt.Errorf("%s: iteration %q: %w", path, tag, err)
		}
		return dir, name, nil
	}
	if hasRankDirs(path) || hasDistMetadata(path) {
		return path, filepath.Base(path), nil
	}
	tracker := filepath.Join(path, trackerFile)
	b, err := fsutil.ReadFile(tracker)
	if err != nil {
		return "", "", fmt.Errorf("%s: no %s, no mp_rank_* folders and no %s", path, trackerFile, dcp.MegatronMetadataFile)
	}
	s := strings.TrimSpace(string(b))
	switch {
	case s == "release":
		name = "release"
	default:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return "", "", fmt.Errorf("%s: %q is neither an iteration number nor 'release'", tracker, s)
		}
		name = fmt.Sprintf("iter_%07d", n)
	}
	dir = filepath.Join(path, name)
	if _, err := os.Stat(dir); err != nil {
		return "", "", fmt.Errorf("%s names iteration %s, but its folder is missing: %w", tracker, s, err)
	}
	return dir, name, nil
}

func hasRankDirs(dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.IsDir() && reRankDir.MatchString(e.Name()) {
			return true
		}
	}
	return false
}

// Detect reports whether path is a Megatron-LM checkpoint in the legacy
// torch format: a save folder with latest_checkpointed_iteration.txt or an
// iteration folder, holding mp_rank_* folders with model_optim_rng.pt.
// Megatron-DeepSpeed folders (global_step*, mp_rank_*_model_states.pt)
// do not match.
func Detect(path string) bool {
	dir, _, err := resolveIter(path, "")
	if err != nil {
		return false
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.IsDir() && reRankDir.MatchString(e.Name()) {
			if _, err := os.Stat(filepath.Join(dir, e.Name(), modelFile)); err == nil {
				return true
			}
		}
	}
	return false
}

// listRankDirs returns the mp_rank_* folders of an iteration folder in
// name order (mp_rank_00[_000[_000]] first).
func listRankDirs(dir string) ([]*rankDir, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []*rankDir
	for _, e := range ents {
		m := reRankDir.FindStringSubmatch(e.Name())
		if m == nil || !e.IsDir() {
			continue
		}
		rd := &rankDir{name: e.Name()}
		for _, part := range strings.Split(e.Name()[len("mp_rank_"):], "_") {
			n, err := strconv.Atoi(part)
			if err != nil {
				return nil, fmt.Errorf("%s: folder %s has a rank number out of range", dir, e.Name())
			}
			rd.nums = append(rd.nums, n)
		}
		sub := filepath.Join(dir, e.Name())
		rd.model = filepath.Join(sub, modelFile)
		if _, err := os.Stat(rd.model); err != nil {
			return nil, fmt.Errorf("%s: no %s in the folder", sub, modelFile)
		}
		if _, err := os.Stat(filepath.Join(sub, distribFile)); err == nil {
			rd.distrib = filepath.Join(sub, distribFile)
		}
		if lw, _ := filepath.Glob(filepath.Join(sub, "layer_wise_optimizer_*.pt")); len(lw) > 0 {
			return nil, fmt.Errorf("%s: holds %s (layer-wise distributed optimizer), which ucp does not read yet", sub, filepath.Base(lw[0]))
		}
		out = append(out, rd)
	}
	if len(out) == 0 {
		for _, marker := range []string{"metadata.json", ".metadata", "common.pt"} {
			if _, err := os.Stat(filepath.Join(dir, marker)); err == nil {
				return nil, fmt.Errorf("%s: a distributed checkpoint (%s; --ckpt-format torch_dist or torch_dcp), not the legacy torch format with mp_rank_* folders that this reader handles", dir, marker)
			}
		}
		return nil, fmt.Errorf("%s: no mp_rank_* folders", dir)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// assignRanks splits each folder name into tp, pp and ep ranks with the
// degrees from args: _PPP is present iff PP > 1 and _EEE iff EP > 1, so
// mp_rank_00_001 is ambiguous without them. It checks that the folders
// form the full TP x PP x EP grid; with expert TP U != TP, the (TP, EP)
// files some rank of TP x D saves (expertFiles), each holding its experts
// at that rank's expert-TP rank.
func assignRanks(dir string, dirs []*rankDir, T, P, E, U, D int) error {
	want := 1
	if P > 1 {
		want++
	}
	if E > 1 {
		want++
	}
	etp := map[[2]int]int{}
	if U != T {
		fs, err := expertFiles(T, D, E, U)
		if err != nil {
			return fmt.Errorf("%s: args: %w", dir, err)
		}
		for _, f := range fs {
			etp[[2]int{f.t, f.e}] = f.u
		}
	}
	seen := map[[3]int]string{}
	for _, rd := range dirs {
		if len(rd.nums) != want {
			return fmt.Errorf("%s: folder %s does not fit tensor parallel %d x pipeline parallel %d x expert parallel %d (args), which name folders mp_rank_%s",
				dir, rd.name, T, P, E, rankPattern(P, E))
		}
		rd.tp, rd.pp, rd.ep = rd.nums[0], 0, 0
		i := 1
		if P > 1 {
			rd.pp = rd.nums[i]
			i++
		}
		if E > 1 {
			rd.ep = rd.nums[i]
		}
		if rd.tp >= T || rd.pp >= P || rd.ep >= E {
			return fmt.Errorf("%s: folder %s is outside tensor parallel %d x pipeline parallel %d x expert parallel %d (args)", dir, rd.name, T, P, E)
		}
		rd.etp = rd.tp
		if U != T {
			u, ok := etp[[2]int{rd.tp, rd.ep}]
			if !ok {
				return fmt.Errorf("%s: folder %s: no rank of tensor parallel %d x data parallel %d loads TP rank %d with EP rank %d (expert tensor parallel %d, args)", dir, rd.name, T, D, rd.tp, rd.ep, U)
			}
			rd.etp = u
		}
		k := [3]int{rd.tp, rd.pp, rd.ep}
		if prev, dup := seen[k]; dup {
			return fmt.Errorf("%s: folders %s and %s are the same rank", dir, prev, rd.name)
		}
		seen[k] = rd.name
	}
	for p := 0; p < P; p++ {
		for e := 0; e < E; e++ {
			for t := 0; t < T; t++ {
				if _, ok := etp[[2]int{t, e}]; U != T && !ok {
					continue // no rank saves this pair
				}
				if _, ok := seen[[3]int{t, p, e}]; !ok {
					return fmt.Errorf("%s: missing folder %s (tensor parallel %d x pipeline parallel %d x expert parallel %d)",
						dir, rankDirName(t, p, e, P, E), T, P, E)
				}
			}
		}
	}
	return nil
}

func rankDirName(t, p, e, P, E int) string {
	s := fmt.Sprintf("mp_rank_%02d", t)
	if P > 1 {
		s += fmt.Sprintf("_%03d", p)
	}
	if E > 1 {
		s += fmt.Sprintf("_%03d", e)
	}
	return s
}

func rankPattern(P, E int) string {
	s := "TT"
	if P > 1 {
		s += "_PPP"
	}
	if E > 1 {
		s += "_EEE"
	}
	return s
}
