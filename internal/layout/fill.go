package layout

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// StateFill is a tensor to stream into a torch.save file being written (the
// resharding writers): pieces of atomic states at increasing element
// offsets, zeros elsewhere.
type StateFill struct {
	Blob   *torchfile.Blob
	Pieces []StatePiece
}

// StatePiece is elements [Local, Local+N) of a parameter's shard of one atomic
// state, written at element At of the blob.
type StatePiece struct {
	Param, State string
	Shard        fragment.Shard
	Local, N, At int64
}

// fillChunk bounds the elements read from the atomic checkpoint at once.
const fillChunk = 1 << 20

// WriteFile writes root to path (not synced: the callers sync a whole
// folder before publishing it), streaming each fill's pieces cast to its
// blob's dtype; blobs with Data are written as they are. It returns the
// file's size.
func WriteFile(r *atomic.Reader, path string, root pyobj.Value, fills []StateFill) (int64, error) {
	w, err := torchfile.Create(path, root)
	if err != nil {
		return 0, err
	}
	w.NoSync = true
	index := map[*torchfile.Blob]int{}
	for i, b := range w.Layout.Blobs {
		index[b] = i
	}
	for _, f := range fills {
		i, ok := index[f.Blob]
		if !ok {
			continue // a tensor the pickle does not reference
		}
		if err := fillBlob(r, w, i, f); err != nil {
			w.Abort()
			return 0, fmt.Errorf("%s: %w", path, err)
		}
	}
	if err := w.Commit(); err != nil {
		return 0, err
	}
	return w.Layout.Size(), nil
}

func fillBlob(r *atomic.Reader, w *torchfile.Writer, i int, f StateFill) error {
	es := int64(f.Blob.DType.Size())
	total := torchfile.Numel(f.Blob.Shape)
	var at int64
	buf := make([]byte, min(max(total, 1), fillChunk)*es)
	zeros := func(upto int64) error {
		for at < upto {
			n := min(upto-at, fillChunk)
			clear(buf[:n*es])
			if err := w.WriteAt(i, buf[:n*es], at*es); err != nil {
				return err
			}
			at += n
		}
		return nil
	}
	for _, pc := range f.Pieces {
		if pc.At < at || pc.At+pc.N > total {
			return fmt.Errorf("%s/%s: piece [%d,%d) outside or overlapping a tensor of %d", pc.Param, pc.State, pc.At, pc.At+pc.N, total)
		}
		if err := zeros(pc.At); err != nil {
			return err
		}
		s, err := r.OpenState(pc.Param, pc.State)
		if err != nil {
			return err
		}
		for done := int64(0); done < pc.N; {
			n := min(pc.N-done, fillChunk)
			if _, err := ReadLocalAs(s, pc.Shard, pc.Local+done, n, f.Blob.DType, buf[:n*es]); err != nil {
				s.Close()
				return err
			}
			if err := w.WriteAt(i, buf[:n*es], at*es); err != nil {
				s.Close()
				return err
			}
			done += n
			at += n
		}
		s.Close()
	}
	return zeros(total)
}
