package atomic

import (
	"fmt"
	"os"

	"github.com/ucp-project/ucp/fragment"
	"github.com/ucp-project/ucp/pyobj"
	"github.com/ucp-project/ucp/torchfile"
)

// maxCarried bounds a source tensor carried inside a global file (a step
// tensor, an RNG state): those are small; big tensors are parameters.
const maxCarried = 64 << 20

// materialize returns v with every *fragment.TensorRef replaced by a Blob
// holding the referenced tensor's bytes, so that tensors found in source
// pickles (a ZeRO-3 step, DCP extra state) can be written again. Containers
// holding none are shared, not copied.
func materialize(v pyobj.Value) (pyobj.Value, error) {
	m := &materializer{files: map[string]*os.File{}}
	defer m.close()
	out, _, err := m.value(v, 0)
	return out, err
}

type materializer struct {
	files map[string]*os.File
}

func (m *materializer) close() {
	for _, f := range m.files {
		f.Close()
	}
}

// value returns v with references replaced, and whether anything changed
// (values are not comparable: tuples are slices).
func (m *materializer) value(v pyobj.Value, depth int) (pyobj.Value, bool, error) {
	if depth > pyobj.DefaultLimits.MaxDepth {
		return nil, false, fmt.Errorf("values nest deeper than %d levels", pyobj.DefaultLimits.MaxDepth)
	}
	switch x := v.(type) {
	case *fragment.TensorRef:
		b, err := m.blob(x)
		return b, true, err
	case *pyobj.Dict:
		var out *pyobj.Dict
		for i := 0; i < x.Len(); i++ {
			k, val := x.Item(i)
			nv, changed, err := m.value(val, depth+1)
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
		if out != nil {
			return out, true, nil
		}
	case *pyobj.List:
		items, changed, err := m.seq(x.Items, depth)
		if err != nil || !changed {
			return x, false, err
		}
		return &pyobj.List{Items: items}, true, nil
	case pyobj.Tuple:
		items, changed, err := m.seq(x, depth)
		if err != nil || !changed {
			return x, false, err
		}
		return pyobj.Tuple(items), true, nil
	}
	return v, false, nil
}

func (m *materializer) seq(items []pyobj.Value, depth int) ([]pyobj.Value, bool, error) {
	var out []pyobj.Value
	for i, it := range items {
		nv, changed, err := m.value(it, depth+1)
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

func (m *materializer) blob(r *fragment.TensorRef) (pyobj.Value, error) {
	if r.T.NBytes() > maxCarried {
		return nil, fmt.Errorf("%s: a %d-byte tensor inside global state is too big to carry", r.Path, r.T.NBytes())
	}
	f, ok := m.files[r.Path]
	if !ok {
		var err error
		if f, err = os.Open(r.Path); err != nil {
			return nil, err
		}
		m.files[r.Path] = f
	}
	raw := make([]byte, r.T.NBytes())
	if err := torchfile.ReadRange(f, r.T, 0, r.T.Numel(), raw); err != nil {
		return nil, fmt.Errorf("%s: %w", r.Path, err)
	}
	return torchfile.NewBlob(r.T.DType, r.T.Shape, raw), nil
}
