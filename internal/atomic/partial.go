package atomic

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// The journal (.ucp-nodes/done-<node>.jsonl) lets --resume reuse the files
// a killed run completed. It is append-only JSON lines: first
// {"plan": "<plan id>", "sources": [FileID...]}, then one FileEntry {"path", "bytes", "crc32"} per
// file written whole or copied, appended after the file was renamed into
// place. Lines are not synced: --resume reads every listed file again and
// reuses it only if its size and CRC-32 match its line (a torn last line,
// a file lost with the page cache, or one changed since, is redone).
func (w *Writer) journalPath() string {
	return filepath.Join(w.tmp, nodesDir, fmt.Sprintf("done-%d.jsonl", w.opt.Node))
}

type journalHead struct {
	Plan string `json:"plan"`
	// Sources identify the source files as the run found them (size,
	// mtime, inode, CRC-32 of their ends): a resume from changed sources
	// would mix two inputs.
	Sources []fsutil.FileID `json:"sources"`
}

// openJournal starts this node's journal, keeping the entries given (the
// verified ones of a resumed run).
func (w *Writer) openJournal(keep []FileEntry) error {
	f, err := os.OpenFile(w.journalPath()+".new", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o666)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	err = enc.Encode(journalHead{Plan: w.opt.PlanID, Sources: w.opt.Sources})
	for _, e := range keep {
		if err == nil {
			err = enc.Encode(e)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.journalPath()+".new", w.journalPath())
	}
	if err != nil {
		return err
	}
	w.journal, err = os.OpenFile(w.journalPath(), os.O_WRONLY|os.O_APPEND, 0)
	return err
}

// journalAdd records a completed file (one write, so a kill leaves at
// most a torn last line).
func (w *Writer) journalAdd(e FileEntry) error {
	if w.journal == nil {
		return nil
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = w.journal.Write(append(b, '\n'))
	return err
}

// resume verifies the files the journal of a killed run lists and keeps
// those whose size and CRC-32 match; the others, and temporary files of
// unfinished writes, are removed.
func (w *Writer) resume() ([]FileEntry, error) {
	f, err := fsutil.Open(w.journalPath())
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head, entries, ok := parseJournal(f, w.tmp)
	if !ok {
		return nil, nil // not even the head: nothing to reuse
	}
	if head.Plan != w.opt.PlanID {
		return nil, fmt.Errorf("%s holds a conversion of another plan (%s, this one is %s: another source, tag or options); rerun without --resume to start over",
			w.tmp, head.Plan, w.opt.PlanID)
	}
	if err := sameSources(head.Sources, w.opt.Sources); err != nil {
		return nil, fmt.Errorf("%s: cannot resume: %w since the run that wrote it; rerun without --resume to start over", w.tmp, err)
	}
	var keep []FileEntry
	for _, e := range entries {
		p := filepath.Join(w.tmp, filepath.FromSlash(e.Path))
		if err := VerifyFile(p, e); err != nil {
			os.Remove(p)
			continue
		}
		keep = append(keep, e)
	}
	// Temporary files of writes the kill interrupted.
	filepath.WalkDir(w.tmp, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), ".") && strings.Contains(d.Name(), ".tmp-") {
			os.Remove(p)
		}
		return nil
	})
	return keep, nil
}

// parseJournal decodes a journal: its head (ok false when there is none)
// and the entries worth checking: each a file path inside dir (not the
// folder itself nor ucp's own .ucp-nodes files), listed once, of a size
// that is not negative. Torn, malformed or overlong lines are skipped:
// anything not listed is redone.
func parseJournal(r io.Reader, dir string) (head journalHead, entries []FileEntry, ok bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &head) != nil {
		return head, nil, false
	}
	seen := map[string]bool{}
	for sc.Scan() {
		var e FileEntry
		if json.Unmarshal(sc.Bytes(), &e) != nil || CheckPath(dir, e.Path) != nil || seen[e.Path] || e.Bytes < 0 {
			continue
		}
		c := path.Clean(e.Path)
		if c != e.Path || c == "." || c == nodesDir || strings.HasPrefix(c, nodesDir+"/") {
			continue
		}
		seen[e.Path] = true
		entries = append(entries, e)
	}
	return head, entries, true
}

// sameSources refuses a resume when the source files of the killed run
// (was) are not those of this one or changed meanwhile.
func sameSources(was, now []fsutil.FileID) error {
	if was == nil {
		return fmt.Errorf("its journal records no source files (written by an older ucp), so the source may have changed")
	}
	paths := map[string]bool{}
	for _, f := range was {
		paths[f.Path] = true
	}
	for _, f := range now {
		if !paths[f.Path] {
			return fmt.Errorf("the source file %s is new", f.Path)
		}
		delete(paths, f.Path)
	}
	for p := range paths {
		return fmt.Errorf("the source file %s is no longer read", p)
	}
	why, err := fsutil.ChangedSince(was)
	if err != nil {
		return err
	}
	if why != "" {
		return fmt.Errorf("the source changed: %s", why)
	}
	return nil
}

// Done returns the entry of a file a resumed run reuses.
func (w *Writer) Done(rel string) (FileEntry, bool) {
	e, ok := w.done[filepath.ToSlash(rel)]
	return e, ok
}

// Reused returns how many files, and bytes, the run reuses from the
// killed run's DST.partial.
func (w *Writer) Reused() (files int, bytes int64) {
	for _, e := range w.done {
		files++
		bytes += e.Bytes
	}
	return files, bytes
}
