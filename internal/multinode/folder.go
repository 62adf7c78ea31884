package multinode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// Place is a process's place in a multi-node run.
type Place struct {
	Node, Nodes int
	// Finalize only finishes a folder whose nodes have all finished (for
	// when the elected finalizer died).
	Finalize bool
	// AfterPhase, when set, is called after each phase (the kill tests'
	// hook): "node-wrote" (this node's files written, no record yet),
	// "node-done" (record written), "finalize-locked", "last-written".
	AfterPhase func(phase string)
}

// Multi says whether the folder is written by the multi-node protocol.
func (p Place) Multi() bool { return p.Nodes > 1 || p.Finalize }

func (p Place) after(phase string) {
	if p.AfterPhase != nil {
		p.AfterPhase(phase)
	}
}

// Unit is one part of a folder that a node writes alone (one or a few
// files): its name and its estimated size, by which the units are shared
// out.
type Unit struct {
	Name  string
	Bytes int64
}

// Folder is an output folder written by several nodes: each writes its
// share of the units into Dst.partial, the finalizer writes what marks
// the folder complete (Last) and renames it to Dst.
type Folder struct {
	Dst string
	Place
	// Plan says everything that decides the folder's bytes (the writer,
	// its options, the source), the same on every node; with the node
	// count and the units it makes the plan's fingerprint. Options says
	// the options in words, for the error when nodes disagree.
	Plan, Options string
	Units         []Unit
	Force, NoSync bool
	// Write writes the units given (indices into Units) into tmp and
	// returns the files it wrote, relative to tmp.
	Write func(ctx context.Context, tmp string, units []int) ([]string, error)
	// Last, run by the finalizer once every node's files are in place,
	// writes what marks the folder complete (may be nil).
	Last func(ctx context.Context, tmp string) error
}

// Result is what Run did.
type Result struct {
	Units []int // this node's units
	Total int   // the folder's units
	// NodeDone: this node's share is written and its record left.
	NodeDone bool
	// AllDone: every node's record was present when this one finished.
	AllDone bool
	// OtherFinalizing: another live node holds the finalize lock (or
	// finished the folder meanwhile).
	OtherFinalizing bool
	// Finalized: this process finished the folder; Dst is complete.
	Finalized bool
}

// planFile holds the plan the first node started DST.partial with.
const planFile = "plan.json"

type planRecord struct {
	Nodes   int    `json:"nodes"`
	Plan    string `json:"plan"`
	Options string `json:"options"`
}

// FileSize is a file a node wrote and its size.
type FileSize struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

// folderRecord is a node's completion record.
type folderRecord struct {
	Node  int        `json:"node"`
	Nodes int        `json:"nodes"`
	Plan  string     `json:"plan"`
	Units []int      `json:"units"`
	Files []FileSize `json:"files"`
}

// ID is the plan's fingerprint: 16 hex digits of a SHA-256 over the
// plan, the node count and the units.
func (f *Folder) ID() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00", f.Plan, f.Nodes)
	for _, u := range f.Units {
		fmt.Fprintf(h, "%s\x00%d\x00", u.Name, u.Bytes)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Assign shares the units out among n nodes by their sizes: largest
// first, each to the node with the fewest bytes so far (the lowest rank
// on a tie). It is a pure function of sizes and n: every node computes
// the same shares.
func Assign(units []Unit, n int) [][]int {
	order := make([]int, len(units))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return units[order[a]].Bytes > units[order[b]].Bytes })
	load := make([]int64, n)
	out := make([][]int, n)
	for _, i := range order {
		best := 0
		for k := 1; k < n; k++ {
			if load[k] < load[best] {
				best = k
			}
		}
		load[best] += max(units[i].Bytes, 1)
		out[best] = append(out[best], i)
	}
	for _, s := range out {
		sort.Ints(s)
	}
	return out
}

// Run writes this node's share into Dst.partial and, when it is the last
// node to finish (or with Finalize), finishes the folder. A rerun of a
// node writes its share again; a node of another plan (other options or
// node count) is refused before it writes anything.
func (f *Folder) Run(ctx context.Context) (*Result, error) {
	dst := filepath.Clean(f.Dst)
	tmp := dst + fsutil.PartialSuffix
	if f.Nodes < 1 || f.Node < 0 || f.Node >= f.Nodes {
		return nil, fmt.Errorf("%s: node rank %d is not below the node count %d", dst, f.Node, f.Nodes)
	}
	if err := fsutil.CheckOutputDir(dst); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(dst); err == nil && !f.Force {
		return nil, fmt.Errorf("%s exists; use --force to replace it", dst)
	}
	if f.Finalize {
		if _, err := os.Stat(filepath.Join(tmp, Dir)); err != nil {
			return nil, fmt.Errorf("%s: nothing to finalize: %w", tmp, err)
		}
	}
	// Shared by the nodes, so that a single-process run (which locks it
	// exclusively) is refused while any node lives.
	lock, err := fsutil.LockDir(tmp, true)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := os.MkdirAll(filepath.Join(tmp, Dir), 0o755); err != nil {
		return nil, err
	}
	id := f.ID()
	if err := f.checkPlan(tmp, id); err != nil {
		return nil, err
	}
	res := &Result{Units: Assign(f.Units, f.Nodes)[f.Node], Total: len(f.Units)}
	if f.Finalize {
		fin, err := LockFinalize(tmp, f.Node)
		if err != nil {
			return res, fmt.Errorf("%s: %w", tmp, err)
		}
		defer fin.Close()
		return res, f.finalize(ctx, tmp, id, res)
	}
	// A rerun of this node replaces its old record, which no longer holds.
	if err := os.Remove(RecordPath(tmp, f.Node)); err != nil && !os.IsNotExist(err) {
		return res, err
	}
	files, err := f.Write(ctx, tmp, res.Units)
	if err != nil {
		return res, err
	}
	f.after("node-wrote")
	rec := folderRecord{Node: f.Node, Nodes: f.Nodes, Plan: id, Units: res.Units}
	for _, p := range files {
		st, err := os.Stat(filepath.Join(tmp, p))
		if err != nil {
			return res, err
		}
		rec.Files = append(rec.Files, FileSize{Path: filepath.ToSlash(p), Bytes: st.Size()})
	}
	all, err := WriteRecord(tmp, f.Node, f.Nodes, rec, f.NoSync)
	if err != nil {
		return res, err
	}
	res.NodeDone, res.AllDone = true, all
	f.after("node-done")
	if !all {
		return res, nil
	}
	fin, err := LockFinalize(tmp, f.Node)
	switch {
	case errors.Is(err, ErrFinalizing) || errors.Is(err, os.ErrNotExist):
		// Another node finished at the same moment and finalizes (or has
		// already renamed the folder).
		res.OtherFinalizing = true
		return res, nil
	case err != nil:
		return res, err
	}
	defer fin.Close()
	if _, err := os.Stat(RecordPath(tmp, f.Node)); os.IsNotExist(err) {
		// The records went with a finalizer that finished meanwhile.
		res.OtherFinalizing = true
		return res, nil
	}
	f.after("finalize-locked")
	return res, f.finalize(ctx, tmp, id, res)
}

// checkPlan refuses a node of another plan than the one DST.partial was
// started with (the first node to start writes it).
func (f *Folder) checkPlan(tmp, id string) error {
	path := filepath.Join(tmp, Dir, planFile)
	want := planRecord{Nodes: f.Nodes, Plan: id, Options: f.Options}
	if !f.Finalize {
		// Written under a temporary name and linked: the first node wins,
		// the others read what it wrote.
		part := fmt.Sprintf("%s.node-%d", path, f.Node)
		if err := WriteJSON(part, want, f.NoSync); err != nil {
			return err
		}
		err := os.Link(part, path)
		os.Remove(part)
		if err == nil {
			return nil
		}
		if !os.IsExist(err) {
			return err
		}
	}
	var got planRecord
	b, err := fsutil.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &got)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if got != want {
		return fmt.Errorf("%s was started by nodes of another plan (%d nodes, plan %s: %s), but this is node %d of %d with plan %s (%s): "+
			"give every node the same options and --num-nodes, or remove %s to start again",
			tmp, got.Nodes, got.Plan, got.Options, f.Node, f.Nodes, id, f.Options, tmp)
	}
	return nil
}

// finalize checks every node's record against the plan and the files on
// disk, writes Last, removes the records and renames the folder to Dst.
func (f *Folder) finalize(ctx context.Context, tmp, id string, res *Result) error {
	shares := Assign(f.Units, f.Nodes)
	listed := map[string]bool{}
	for n := 0; n < f.Nodes; n++ {
		var r folderRecord
		if err := ReadRecord(tmp, n, f.Nodes, &r); err != nil {
			return err
		}
		path := RecordPath(tmp, n)
		if r.Node != n || r.Nodes != f.Nodes || r.Plan != id || fmt.Sprint(r.Units) != fmt.Sprint(shares[n]) {
			return fmt.Errorf("%s: record of node %d/%d for plan %s, but this is node %d/%d of plan %s (were the nodes run with the same options?)",
				path, r.Node, r.Nodes, r.Plan, n, f.Nodes, id)
		}
		for _, fs := range r.Files {
			st, err := os.Stat(filepath.Join(tmp, filepath.FromSlash(fs.Path)))
			if err != nil || st.Size() != fs.Bytes {
				return fmt.Errorf("%s: %s is not as node %d wrote it (%d bytes): rerun node %d, then finalize", tmp, fs.Path, n, fs.Bytes, n)
			}
			listed[fs.Path] = true
		}
	}
	if err := removeUnlisted(tmp, listed); err != nil {
		return err
	}
	if f.Last != nil {
		if err := f.Last(ctx, tmp); err != nil {
			return err
		}
	}
	f.after("last-written")
	if err := os.RemoveAll(filepath.Join(tmp, Dir)); err != nil {
		return err
	}
	if err := fsutil.PublishDir(tmp, filepath.Clean(f.Dst), f.Force, f.NoSync); err != nil {
		return err
	}
	res.Finalized = true
	return nil
}

// SetPlan sets f's Plan and Options for the writer that --to names
// format, with the options key (less what may differ between the nodes of
// one plan: their place and write settings) and the source's manifest;
// it returns f.
func (f *Folder) SetPlan(format string, key, manifest any) *Folder {
	f.Plan = fmt.Sprintf("%s %+v source %s", format, key, Fingerprint(manifest))
	f.Options = fmt.Sprintf("--to %s %+v", format, key)
	return f
}

// Units is one unit per item, named and sized by name and size.
func Units[T any](items []T, name func(T) string, size func(T) int64) []Unit {
	units := make([]Unit, len(items))
	for i, it := range items {
		units[i] = Unit{Name: name(it), Bytes: size(it)}
	}
	return units
}

// Fingerprint is 16 hex digits of a SHA-256 over v as JSON (a source's
// manifest, for Folder.Plan).
func Fingerprint(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(fmt.Sprintf("%#v", v))
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// removeUnlisted removes from tmp what no record lists: temporary files
// of writes a killed node left (its rerun wrote the files again), then
// folders left empty. The records' folder stays.
func removeUnlisted(tmp string, listed map[string]bool) error {
	var dirs []string
	err := filepath.WalkDir(tmp, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(tmp, path)
		if err != nil || rel == "." {
			return err
		}
		switch {
		case d.IsDir() && rel == Dir:
			return filepath.SkipDir
		case d.IsDir():
			dirs = append(dirs, path)
		case !listed[filepath.ToSlash(rel)]:
			return os.Remove(path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if ents, err := os.ReadDir(dirs[i]); err == nil && len(ents) == 0 {
			if err := os.Remove(dirs[i]); err != nil {
				return err
			}
		}
	}
	return nil
}
