package mapreduce

import (
	"fmt"
	"os"
	atomic32 "sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// refCopy is a source tensor to stream into a blob of a file being
// written, or with whole the source's entire storage record (the blob is
// that storage, its tensors views of it).
type refCopy struct {
	blob  *torchfile.Blob
	ref   *fragment.TensorRef
	whole bool
}

// bytes is what the copy reads and writes.
func (c refCopy) bytes() int64 {
	if c.whole {
		return c.ref.T.Storage.NBytes()
	}
	return c.ref.T.NBytes()
}

// blobsForRefs returns v with every *fragment.TensorRef replaced by a
// tensor to write and the copies that fill them: tensors found in source
// pickles (a ZeRO-3 step, DCP extra state, a model state's module weights)
// are written again, streamed, whatever their size. A tensor of a storage
// whose record CRC the source's zip states (torchfile.Storage.CRC32) and
// that has a typed storage class becomes a View of that storage, written
// once whole as the source stores it: DeepSpeed's ZeRO-1/2 module weights
// are views of one flat buffer, which is then copied in the kernel and
// never read back (its CRC is the source's). Any other tensor becomes an
// empty Blob of its dtype and shape (one per reference). Containers holding
// no reference are shared, not copied.
func blobsForRefs(v pyobj.Value, lim pyobj.Limits) (pyobj.Value, []refCopy, error) {
	var copies []refCopy
	seen := map[*fragment.TensorRef]pyobj.Value{}
	type storageKey struct {
		path string
		st   *torchfile.Storage
	}
	// A storage is written whole when v's tensors cover at least half of
	// it: a small tensor of a big storage is copied alone.
	covered := map[storageKey]int64{}
	counted := map[*fragment.TensorRef]bool{}
	err := pyobj.Walk(v, lim, func(_ []pyobj.Value, v pyobj.Value) error {
		if ref, ok := v.(*fragment.TensorRef); ok && !counted[ref] {
			counted[ref] = true
			covered[storageKey{ref.Path, ref.T.Storage}] += ref.T.NBytes()
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	bases := map[storageKey]*torchfile.Blob{}
	out, err := pyobj.Rewrite(v, lim, func(v pyobj.Value) (pyobj.Value, bool, error) {
		ref, ok := v.(*fragment.TensorRef)
		if !ok {
			return nil, false, nil
		}
		if t, ok := seen[ref]; ok {
			return t, true, nil
		}
		st := ref.T.Storage
		k := storageKey{ref.Path, st}
		if st.CRC32 != 0 && st.Offset >= 0 && 2*covered[k] >= st.NBytes() && st.DType == ref.T.DType && st.DType.StorageClass() != "" &&
			len(ref.T.Stride) == len(ref.T.Shape) {
			base, ok := bases[k]
			if !ok {
				base = &torchfile.Blob{DType: st.DType, Shape: []int64{st.Numel}}
				bases[k] = base
				copies = append(copies, refCopy{blob: base, ref: ref, whole: true})
			}
			t := &torchfile.View{Base: base, Offset: ref.T.StorageOffset, Shape: append([]int64(nil), ref.T.Shape...),
				Stride: append([]int64(nil), ref.T.Stride...)}
			seen[ref] = t
			return t, true, nil
		}
		bl := &torchfile.Blob{DType: ref.T.DType, Shape: append([]int64(nil), ref.T.Shape...)}
		seen[ref] = bl
		copies = append(copies, refCopy{blob: bl, ref: ref})
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
		n += c.bytes()
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

// copyRef copies n elements of the contiguous tensor ref from its element
// src to element off of blob i of w, in the kernel. When they are its
// whole storage record, the record's CRC-32 from the source's zip central
// directory stands for theirs and they are not read back: DeepSpeed's
// model-state module weights written again, Megatron and DCP tensors
// stored one per record. A source record whose stored CRC is wrong then
// gives an output file that fails verification, where reading back
// would have given a valid file of the corrupt bytes.
func copyRef(w *atomic.File, c *fsutil.Copier, i int, f *os.File, ref *fragment.TensorRef, src, off, n int64) error {
	es := int64(ref.T.DType.Size())
	st := ref.T.Storage
	if st.CRC32 != 0 && ref.T.StorageOffset+src == 0 && n*es == st.NBytes() {
		return w.CopyFromCRC(c, i, f, st.Offset, es*off, es*n, st.CRC32)
	}
	return w.CopyFrom(c, i, f, ref.T.FileOffset()+es*src, es*off, es*n)
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
				if c.whole {
					st := c.ref.T.Storage
					if err := w.CopyFromCRC(&cp, index[c.blob], f, st.Offset, 0, st.NBytes(), st.CRC32); err != nil {
						return err
					}
					continue
				}
				es := int64(c.ref.T.DType.Size())
				n := c.ref.T.Numel()
				if c.ref.T.IsContiguous() && c.ref.T.Storage.Offset >= 0 {
					if err := copyRef(w, &cp, index[c.blob], f, c.ref, 0, 0, n); err != nil {
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
