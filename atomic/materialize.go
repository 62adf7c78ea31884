package atomic

import (
	"fmt"
	"os"

	"github.com/ucp-project/ucp/fragment"
	"github.com/ucp-project/ucp/pyobj"
	"github.com/ucp-project/ucp/torchfile"
)

// refCopy is a source tensor to stream into a blob of a file being written.
type refCopy struct {
	blob *torchfile.Blob
	ref  *fragment.TensorRef
}

// blobsForRefs returns v with every *fragment.TensorRef replaced by an
// empty Blob of its dtype and shape, and the copies that fill them: tensors
// found in source pickles (a ZeRO-3 step, DCP extra state, a model state's
// module weights) are written again, streamed, whatever their size.
// Containers holding no reference are shared, not copied.
func blobsForRefs(v pyobj.Value) (pyobj.Value, []refCopy, error) {
	b := &refBlobs{}
	out, _, err := b.value(v, 0)
	return out, b.copies, err
}

type refBlobs struct {
	copies []refCopy
	seen   map[*fragment.TensorRef]*torchfile.Blob
}

// value returns v with references replaced, and whether anything changed
// (values are not comparable: tuples are slices).
func (b *refBlobs) value(v pyobj.Value, depth int) (pyobj.Value, bool, error) {
	if depth > pyobj.DefaultLimits.MaxDepth {
		return nil, false, fmt.Errorf("values nest deeper than %d levels", pyobj.DefaultLimits.MaxDepth)
	}
	switch x := v.(type) {
	case *fragment.TensorRef:
		if b.seen == nil {
			b.seen = map[*fragment.TensorRef]*torchfile.Blob{}
		}
		if bl, ok := b.seen[x]; ok {
			return bl, true, nil
		}
		bl := &torchfile.Blob{DType: x.T.DType, Shape: append([]int64(nil), x.T.Shape...)}
		b.seen[x] = bl
		b.copies = append(b.copies, refCopy{blob: bl, ref: x})
		return bl, true, nil
	case *pyobj.Dict:
		var out *pyobj.Dict
		for i := 0; i < x.Len(); i++ {
			k, val := x.Item(i)
			nv, changed, err := b.value(val, depth+1)
			if err != nil {
				return nil, false, err
			}
			if changed && out == nil {
				out = x.Clone()
			}
			if out != nil {
				out.Set(k, nv)
			}
		}
		if x.Attrs != nil {
			na, changed, err := b.value(x.Attrs, depth+1)
			if err != nil {
				return nil, false, err
			}
			if changed {
				if out == nil {
					out = x.Clone()
				}
				out.Attrs = na.(*pyobj.Dict)
			}
		}
		if out != nil {
			return out, true, nil
		}
	case *pyobj.List:
		items, changed, err := b.seq(x.Items, depth)
		if err != nil || !changed {
			return x, false, err
		}
		return &pyobj.List{Items: items}, true, nil
	case pyobj.Tuple:
		items, changed, err := b.seq(x, depth)
		if err != nil || !changed {
			return x, false, err
		}
		return pyobj.Tuple(items), true, nil
	case *pyobj.Object:
		args, ca, err := b.seq(x.Args, depth)
		if err != nil {
			return nil, false, err
		}
		state, cs, err := b.value(x.State, depth+1)
		if err != nil {
			return nil, false, err
		}
		if ca || cs {
			o := *x
			if ca {
				o.Args = args
			}
			o.State = state
			return &o, true, nil
		}
	}
	return v, false, nil
}

func (b *refBlobs) seq(items []pyobj.Value, depth int) ([]pyobj.Value, bool, error) {
	var out []pyobj.Value
	for i, it := range items {
		nv, changed, err := b.value(it, depth+1)
		if err != nil {
			return nil, false, err
		}
		if changed && out == nil {
			out = append([]pyobj.Value(nil), items...)
		}
		if out != nil {
			out[i] = nv
		}
	}
	return out, out != nil, nil
}

// copyChunk bounds the memory of streaming one source tensor.
const copyChunk = 16 << 20

// fill streams every copy's source elements into its blob of w.
func fill(w *torchfile.Writer, copies []refCopy) error {
	index := map[*torchfile.Blob]int{}
	for i, bl := range w.Layout.Blobs {
		index[bl] = i
	}
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, c := range copies {
		f, ok := files[c.ref.Path]
		if !ok {
			var err error
			if f, err = os.Open(c.ref.Path); err != nil {
				return err
			}
			files[c.ref.Path] = f
		}
		es := int64(c.ref.T.DType.Size())
		n := c.ref.T.Numel()
		step := max(copyChunk/max(es, 1), 1)
		buf := make([]byte, min(n, step)*es)
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
	return nil
}
