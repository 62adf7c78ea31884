package atomic

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/multinode"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// nodesDir holds one completion record per node while DST.partial is
// being filled; Finalize removes it (the protocol shared with reshard's
// writers: internal/multinode).
const nodesDir = multinode.Dir

// ErrFinalizing is returned when another node already holds the finalize lock.
var ErrFinalizing = multinode.ErrFinalizing

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
	Path   string        `json:"path"`
	Pieces []sharedPiece `json:"pieces"`
}

// sharedPiece is a contiguous range of a shared file's tensor data that
// the node wrote, with its CRC-32 and the CRC-32s of its parts of the
// BlockSize blocks it touches (PROTOCOL.md, "Node records"). Blocks is
// empty in records of older versions and where a piece inside the range
// crossed a block end.
type sharedPiece struct {
	torchfile.Piece
	Blocks string `json:"block_crc32,omitempty"`
}

// Records is what all nodes wrote, by path (slash-separated, relative to
// DST): the files written whole, and the pieces of the shared files.
type Records struct {
	Files  map[string]FileEntry
	Pieces map[string][]torchfile.Piece
	// Parts are the pieces of a shared file cut at the multiples of
	// BlockSize, from the block CRC-32s of every node; absent when a
	// node's record has none for some of its pieces.
	Parts map[string][]torchfile.Piece
}

func (w *Writer) recordPath(node int) string { return multinode.RecordPath(w.tmp, node) }

// FinishNode writes this node's completion record and reports whether the
// records of all nodes are now present.
func (w *Writer) FinishNode() (bool, error) {
	w.mu.Lock()
	rec := w.rec
	w.mu.Unlock()
	return multinode.WriteRecord(w.tmp, w.opt.Node, w.opt.Nodes, rec, w.opt.NoSync)
}

// Lock elects the finalizing node: it takes an exclusive flock on
// finalize.lock, held until the process ends, and fails with
// ErrFinalizing while another live process holds it. A finalizer that
// died released its lock, so a rerun takes over (a lock file that merely
// exists proves nothing).
func (w *Writer) Lock() error {
	f, err := multinode.LockFinalize(w.tmp, w.opt.Node)
	if err != nil {
		return err
	}
	w.finLock = f
	return nil
}

// readRecords loads every node's record, checks they belong to one plan
// and merges them.
func (w *Writer) readRecords() (*Records, error) {
	out := &Records{Files: map[string]FileEntry{}, Pieces: map[string][]torchfile.Piece{}, Parts: map[string][]torchfile.Piece{}}
	noParts := map[string]bool{}
	for n := 0; n < w.opt.Nodes; n++ {
		path := w.recordPath(n)
		var r nodeRecord
		if err := multinode.ReadRecord(w.tmp, n, w.opt.Nodes, &r); err != nil {
			return nil, err
		}
		if r.Node != n || r.Nodes != w.opt.Nodes || r.Plan != w.opt.PlanID {
			return nil, fmt.Errorf("%s: record of node %d/%d for plan %s, but this is node %d/%d of plan %s (were the nodes run with the same options?)",
				path, r.Node, r.Nodes, r.Plan, n, w.opt.Nodes, w.opt.PlanID)
		}
		for _, f := range r.Files {
			out.Files[f.Path] = f
		}
		for _, s := range r.Shared {
			for _, p := range s.Pieces {
				out.Pieces[s.Path] = append(out.Pieces[s.Path], p.Piece)
				if p.Blocks == "" || p.Len == 0 {
					noParts[s.Path] = noParts[s.Path] || p.Len > 0
					continue
				}
				parts, err := p.parts()
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w (the record is damaged; rerun node %d)", path, s.Path, err, n)
				}
				out.Parts[s.Path] = append(out.Parts[s.Path], parts...)
			}
		}
	}
	for p := range noParts {
		delete(out.Parts, p)
	}
	return out, nil
}

// newSharedPieces turns the pieces a node wrote into a shared file (cut at
// the multiples of BlockSize) into the pieces of its record.
func newSharedPieces(pieces []torchfile.Piece) []sharedPiece {
	var out []sharedPiece
	for _, r := range torchfile.Runs(pieces, BlockSize) {
		out = append(out, sharedPiece{Piece: r.Piece, Blocks: encodeBlocks(r.Blocks)})
	}
	return out
}

// parts decodes the piece's block CRC-32s and cuts it at the block ends,
// checking that they fit the piece and combine to its CRC-32.
func (p sharedPiece) parts() ([]torchfile.Piece, error) {
	crcs, err := decodeBlocks(p.Blocks)
	if err != nil {
		return nil, fmt.Errorf("bytes [%d, %d): %w", p.Off, p.Off+p.Len, err)
	}
	return torchfile.Run{Piece: p.Piece, Blocks: crcs}.Parts(BlockSize)
}
