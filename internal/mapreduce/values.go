package mapreduce

import (
	"fmt"
	atomic32 "sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// refCopy is a source tensor to stream into a blob of a file being written.
type refCopy struct {
	blob *torchfile.Blob
	ref  *fragment.TensorRef
}

// blobsForRefs returns v with every *fragment.TensorRef replaced by an
// empty Blob of its dtype and shape (one per reference), and the copies that
// fill them: tensors found in source pickles (a ZeRO-3 step, DCP extra
// state, a model state's module weights) are written again, streamed,
// whatever their size. Containers holding no reference are shared, not copied.
func blobsForRefs(v pyobj.Value, lim pyobj.Limits) (pyobj.Value, []refCopy, error) {
	var copies []refCopy
	seen := map[*fragment.TensorRef]*torchfile.Blob{}
	out, err := pyobj.Rewrite(v, lim, func(v pyobj.Value) (pyobj.Value, bool, error) {
		ref, ok := v.(*fragment.TensorRef)
		if !ok {
			return nil, false, nil
		}
		bl, ok := seen[ref]
		if !ok {
			bl = &torchfile.Blob{DType: ref.T.DType, Shape: append([]int64(nil), ref.T.Shape...)}
			seen[ref] = bl
			copies = append(copies, refCopy{blob: bl, ref: ref})
		}
		return bl, true, nil
	})
	return out, copies, err
}

// refBytes is the bytes of the distinct tensors v references: what
// writing it reads and writes, its task's planning weight. A value that
// cannot be rewritten counts 0; writing it reports the error.
func refBytes(v pyobj.Value) int64 {
	_, copies, err := blobsForRefs(v, pyobj.DefaultLimits())
	if err != nil {
		return 0
	}
	var n int64
	for _, c := range copies {
		n += c.ref.T.NBytes()
	}
	return n
}

// copyChunk bounds the memory of streaming one source tensor.
const copyChunk = 16 << 20

// writeValue writes the torch file rel holding v, its tensor references
// streamed from the source, and returns its entry.
func writeValue(w *atomic.Writer, rel string, v pyobj.Value, workers int) (atomic.FileEntry, error) {
	v, copies, err := blobsForRefs(v, pyobj.DefaultLimits())
	if err != nil {
		return atomic.FileEntry{}, err
	}
	f, err := w.CreateFile(rel, v, false)
	if err != nil {
		return atomic.FileEntry{}, err
	}
	if err := fill(f, copies, workers); err != nil {
		f.Abort()
		return atomic.FileEntry{}, fmt.Errorf("%s: %w", rel, err)
	}
	return f.Commit()
}

// fill streams every copy's source elements into its blob of w, the
// copies shared by workers goroutines: a tensor stored contiguously is
// copied in the kernel, a strided view is gathered through a buffer.
func fill(w *atomic.File, copies []refCopy, workers int) error {
	index := map[*torchfile.Blob]int{}
	for i, bl := range w.Blobs() {
		index[bl] = i
	}
	src := newSources()
	defer src.close()
	var next atomic32.Int64
	var g errgroup.Group
	for range max(min(workers, len(copies)), 1) {
		g.Go(func() error {
			var cp fsutil.Copier
			var buf []byte
			for {
				i := int(next.Add(1) - 1)
				if i >= len(copies) {
					return nil
				}
				c := copies[i]
				f, err := src.get(c.ref.Path)
				if err != nil {
					return err
				}
				es := int64(c.ref.T.DType.Size())
				n := c.ref.T.Numel()
				if c.ref.T.IsContiguous() && c.ref.T.Storage.Offset >= 0 {
					if err := w.CopyFrom(&cp, index[c.blob], f, c.ref.T.FileOffset(), 0, n*es); err != nil {
						return err
					}
					continue
				}
				step := max(copyChunk/max(es, 1), 1)
				if int64(len(buf)) < min(n, step)*es {
					buf = make([]byte, min(n, step)*es)
				}
				for start := int64(0); start < n; start += step {
					k := min(step, n-start)
					if err := torchfile.ReadRange(f, c.ref.T, start, k, buf[:k*es]); err != nil {
						return fmt.Errorf("%s: %w", c.ref.Path, err)
					}
					if err := w.WriteAt(index[c.blob], buf[:k*es], start*es); err != nil {
						return err
					}
				}
			}
		})
	}
	return g.Wait()
}
