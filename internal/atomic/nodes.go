package atomic

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// nodesDir holds one completion record per node while DST.partial is
// being filled; Finalize removes it.
const nodesDir = ".ucp-nodes"

// ErrFinalizing is returned when another node already holds the finalize lock.
var ErrFinalizing = errors.New("another node is finalizing")

// nodeRecord is what one node wrote, saved as .ucp-nodes/node-<i>.json when
// the node is done.
type nodeRecord struct {
	Node   int            `json:"node"`
	Nodes  int            `json:"nodes"`
	Plan   string         `json:"plan"`
	Files  []FileEntry    `json:"files"`  // files this node wrote whole or copied, with CRCs
	Shared []sharedRecord `json:"shared"` // pieces of files several nodes fill
}

type sharedRecord struct {
	Path   string            `json:"path"`
	Pieces []torchfile.Piece `json:"pieces"`
}

// Records is what all nodes wrote, by path (slash-separated, relative to
// DST): the files written whole, and the pieces of the shared files.
type Records struct {
	Files  map[string]FileEntry
	Pieces map[string][]torchfile.Piece
}

func (w *Writer) recordPath(node int) string {
	return filepath.Join(w.tmp, nodesDir, fmt.Sprintf("node-%d.json", node))
}

// FinishNode writes this node's completion record and reports whether the
// records of all nodes are now present.
func (w *Writer) FinishNode() (bool, error) {
	w.mu.Lock()
	rec := w.rec
	w.mu.Unlock()
	if err := writeJSON(w.recordPath(w.opt.Node), rec, w.opt.NoSync); err != nil {
		return false, err
	}
	for n := 0; n < w.opt.Nodes; n++ {
		if _, err := os.Stat(w.recordPath(n)); err != nil {
			return false, nil
		}
	}
	return true, nil
}

// Lock elects the finalizing node: it takes an exclusive flock on
// finalize.lock, held until the process ends, and fails with
// ErrFinalizing while another live process holds it. A finalizer that
// died released its lock, so a rerun takes over (a lock file that merely
// exists proves nothing).
func (w *Writer) Lock() error {
	f, err := os.OpenFile(filepath.Join(w.tmp, nodesDir, "finalize.lock"), os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		return err
	}
	ok, err := fsutil.Flock(f, false)
	if err != nil || !ok {
		f.Close()
		if err == nil {
			err = ErrFinalizing
		}
		return err
	}
	fmt.Fprintf(f, "node %d\n", w.opt.Node)
	w.finLock = f
	return nil
}

// readRecords loads every node's record, checks they belong to one plan
// and merges them.
func (w *Writer) readRecords() (*Records, error) {
	out := &Records{Files: map[string]FileEntry{}, Pieces: map[string][]torchfile.Piece{}}
	for n := 0; n < w.opt.Nodes; n++ {
		path := w.recordPath(n)
		b, err := fsutil.ReadFile(path)
		if err != nil {
			if os.IsNotExist(err) {
				return nil, fmt.Errorf("node %d of %d has not finished (no %s); rerun it, then finalize", n, w.opt.Nodes, path)
			}
			return nil, err
		}
		var r nodeRecord
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if r.Node != n || r.Nodes != w.opt.Nodes || r.Plan != w.opt.PlanID {
			return nil, fmt.Errorf("%s: record of node %d/%d for plan %s, but this is node %d/%d of plan %s (were the nodes run with the same options?)",
				path, r.Node, r.Nodes, r.Plan, n, w.opt.Nodes, w.opt.PlanID)
		}
		for _, f := range r.Files {
			out.Files[f.Path] = f
		}
		for _, s := range r.Shared {
			out.Pieces[s.Path] = append(out.Pieces[s.Path], s.Pieces...)
		}
	}
	return out, nil
}
