// Package multinode is the protocol by which several processes ("nodes")
// write one output folder on a shared file system: every node writes its
// share into DST.partial and leaves a completion record in .ucp-nodes/;
// the node that finds every record present takes the finalize lock and
// finishes the folder. convert's atomic writer (internal/atomic) uses the
// records and the lock; reshard's native writers use Folder (folder.go),
// which adds the plan check and the publishing. internal/atomic/PROTOCOL.md
// describes what is on disk.
package multinode

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// Dir holds one completion record per node while DST.partial is being
// filled; the finalizer removes it.
const Dir = ".ucp-nodes"

// ErrFinalizing is returned when another node already holds the finalize lock.
var ErrFinalizing = errors.New("another node is finalizing")

// RecordPath is node's completion record in the folder tmp (DST.partial).
func RecordPath(tmp string, node int) string {
	return filepath.Join(tmp, Dir, fmt.Sprintf("node-%d.json", node))
}

// WriteJSON writes v as indented JSON, atomically (temporary file, rename),
// synced unless noSync.
func WriteJSON(path string, v any, noSync bool) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, append(b, '\n'), noSync)
}

// WriteRecord writes node's completion record rec and reports whether
// the records of all nodes are now present.
func WriteRecord(tmp string, node, nodes int, rec any, noSync bool) (bool, error) {
	if err := WriteJSON(RecordPath(tmp, node), rec, noSync); err != nil {
		return false, err
	}
	return AllDone(tmp, nodes), nil
}

// AllDone reports whether the records of all nodes are present.
func AllDone(tmp string, nodes int) bool {
	for n := 0; n < nodes; n++ {
		if _, err := os.Stat(RecordPath(tmp, n)); err != nil {
			return false
		}
	}
	return true
}

// LockFinalize elects the finalizing node: it takes an exclusive flock on
// .ucp-nodes/finalize.lock, held until the returned file is closed or the
// process ends, and fails with ErrFinalizing while another live process
// holds it. A finalizer that died released its lock, so a rerun takes
// over (a lock file that merely exists proves nothing).
func LockFinalize(tmp string, node int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(tmp, Dir, "finalize.lock"), os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		return nil, err
	}
	ok, err := fsutil.Flock(f, false)
	if err != nil || !ok {
		f.Close()
		if err == nil {
			err = ErrFinalizing
		}
		return nil, err
	}
	fmt.Fprintf(f, "node %d\n", node)
	return f, nil
}

// ReadRecord reads node's record into v; a missing record is an error
// saying that the node has not finished.
func ReadRecord(tmp string, node, nodes int, v any) error {
	path := RecordPath(tmp, node)
	b, err := fsutil.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("node %d of %d has not finished (no %s); rerun it, then finalize", node, nodes, path)
		}
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
