// Package torchfile reads and writes the files of torch.save: the zip
// format (torch 1.6 and later) and the legacy pickle-stream format. Reading
// is lazy: opening a file decodes only its pickle; tensors are descriptions
// of byte ranges that are read separately through io.ReaderAt.
//
// FORMAT.md beside this file describes the bytes ucp writes.
package torchfile

import (
	"fmt"
	"math/bits"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// Storage is one torch storage: a run of bytes in the file that one or
// more tensors view. Tensors that share a storage share the *Storage.
type Storage struct {
	Key      string      // record name data/<Key> (zip) or key (legacy)
	DType    dtype.DType // element type of the storage class (uint8 for UntypedStorage)
	Location string      // device at save time, such as "cpu" or "cuda:0"
	Numel    int64       // elements of DType in the storage
	Offset   int64       // file offset of the first byte; -1 until resolved
	// CRC32 is the CRC-32 of the storage's zip record as the archive's
	// central directory states it: a copy of the whole record can take
	// it instead of reading the bytes back. 0 means unknown (legacy
	// files; torch 2.6 and later write 0 when compute_crc32 is off).
	CRC32 uint32
}

// NBytes returns the storage size in bytes.
func (s *Storage) NBytes() int64 { return s.Numel * int64(s.DType.Size()) }

// PyTypeName implements the pyobj type naming.
func (s *Storage) PyTypeName() string { return "torch.storage" }

// Tensor is a strided view of a Storage, as torch's _rebuild_tensor_v2
// describes it. No element is read until asked for.
type Tensor struct {
	Storage       *Storage
	DType         dtype.DType
	StorageOffset int64 // in elements of DType
	Shape         []int64
	Stride        []int64
	RequiresGrad  bool
	Parameter     bool // saved as torch.nn.Parameter
}

// PyTypeName implements the pyobj type naming.
func (t *Tensor) PyTypeName() string { return "torch.Tensor" }

// Numel returns the number of elements.
func (t *Tensor) Numel() int64 { return Numel(t.Shape) }

// NBytes returns the size of the tensor's elements in bytes.
func (t *Tensor) NBytes() int64 { return t.Numel() * int64(t.DType.Size()) }

// Numel returns the product of shape (1 for a 0-dim shape).
func Numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// SameShape reports whether two shapes are equal.
func SameShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ContiguousStrides returns the row-major strides of shape.
func ContiguousStrides(shape []int64) []int64 {
	st := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= max(shape[i], 1)
	}
	return st
}

// IsContiguous reports whether the elements are stored row-major without
// gaps, so that they occupy one byte range of the storage.
func (t *Tensor) IsContiguous() bool {
	if t.Numel() == 0 {
		return true // as torch: an empty tensor is contiguous whatever its strides
	}
	want := int64(1)
	for i := len(t.Shape) - 1; i >= 0; i-- {
		if t.Shape[i] != 1 && t.Stride[i] != want {
			return false
		}
		want *= t.Shape[i]
	}
	return true
}

// FileOffset returns the file offset of the tensor's first element. It is
// the start of the tensor's byte range when IsContiguous.
func (t *Tensor) FileOffset() int64 {
	return t.Storage.Offset + t.StorageOffset*int64(t.DType.Size())
}

// validate checks that every element of the view lies inside its storage,
// with overflow-safe arithmetic.
func (t *Tensor) validate() error {
	if len(t.Shape) != len(t.Stride) {
		return fmt.Errorf("tensor has %d sizes but %d strides", len(t.Shape), len(t.Stride))
	}
	if t.StorageOffset < 0 {
		return fmt.Errorf("tensor has negative storage offset %d", t.StorageOffset)
	}
	es := int64(t.DType.Size())
	if es == 0 {
		return fmt.Errorf("tensor has unknown dtype")
	}
	var numel uint64 = 1
	last := uint64(t.StorageOffset)
	for i, d := range t.Shape {
		if d < 0 || t.Stride[i] < 0 {
			return fmt.Errorf("tensor has negative size or stride in dim %d", i)
		}
		hi, lo := bits.Mul64(numel, uint64(d))
		if hi != 0 || lo > 1<<62 {
			return fmt.Errorf("tensor shape %v overflows", t.Shape)
		}
		numel = lo
		if d > 0 {
			hi, span := bits.Mul64(uint64(d-1), uint64(t.Stride[i]))
			if hi != 0 || span > 1<<62 {
				return fmt.Errorf("tensor stride %v overflows", t.Stride)
			}
			last += span
			if last > 1<<62 {
				return fmt.Errorf("tensor extent overflows")
			}
		}
	}
	if numel > (1<<62)/uint64(es) {
		return fmt.Errorf("tensor shape %v overflows", t.Shape)
	}
	if numel == 0 {
		return nil
	}
	// The storage is counted in its own elements; the view in its dtype's.
	storageBytes := uint64(t.Storage.NBytes())
	if (last+1)*uint64(es) > storageBytes {
		return fmt.Errorf("tensor view (offset %d, shape %v, stride %v) reaches past its storage of %d bytes",
			t.StorageOffset, t.Shape, t.Stride, storageBytes)
	}
	return nil
}

// torchHooks give meaning to torch's tensor globals and persistent ids.
type torchHooks struct {
	storages map[string]*Storage
	legacy   bool
}

type tensorFunc func(args []pyobj.Value) (pyobj.Value, error)

func (f tensorFunc) CallPy(args []pyobj.Value) (pyobj.Value, error) { return f(args) }

func (h *torchHooks) hooks() pyobj.Hooks {
	return pyobj.Hooks{Resolve: h.resolve, PersistentLoad: h.persistentLoad}
}

func (h *torchHooks) resolve(module, name string) (pyobj.Callable, bool) {
	if module == "torch.tensor" {
		module = "torch._tensor" // torch.load remaps this old module name
	}
	switch module + "." + name {
	case "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor":
		return tensorFunc(func(a []pyobj.Value) (pyobj.Value, error) { return rebuildTensor(a, dtype.Invalid) }), true
	case "torch._utils._rebuild_tensor_v3":
		return tensorFunc(func(a []pyobj.Value) (pyobj.Value, error) {
			if len(a) < 7 {
				return nil, fmt.Errorf("_rebuild_tensor_v3: want at least 7 arguments, got %d", len(a))
			}
			dt, ok := a[6].(pyobj.DType)
			if !ok {
				return nil, fmt.Errorf("_rebuild_tensor_v3: argument 7 is %s, not a dtype", pyobj.TypeName(a[6]))
			}
			return rebuildTensor(a, dt.DType)
		}), true
	case "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state":
		return tensorFunc(func(a []pyobj.Value) (pyobj.Value, error) {
			if len(a) < 2 {
				return nil, fmt.Errorf("%s: want at least 2 arguments", name)
			}
			t, ok := a[0].(*Tensor)
			if !ok {
				return nil, fmt.Errorf("%s: data is %s, not a tensor", name, pyobj.TypeName(a[0]))
			}
			p := *t
			p.Parameter = true
			var ok2 bool
			if p.RequiresGrad, ok2 = a[1].(bool); !ok2 {
				return nil, fmt.Errorf("%s: requires_grad is %s, not a bool", name, pyobj.TypeName(a[1]))
			}
			return &p, nil
		}), true
	case "torch._tensor._rebuild_from_type_v2":
		// (func, cls, args, state): the tensor is func(*args); the class and
		// the Python attributes in state do not change the data.
		return tensorFunc(func(a []pyobj.Value) (pyobj.Value, error) {
			if len(a) != 4 {
				return nil, fmt.Errorf("_rebuild_from_type_v2: want 4 arguments, got %d", len(a))
			}
			fn, ok := a[0].(pyobj.FuncRef)
			if !ok {
				return nil, fmt.Errorf("_rebuild_from_type_v2: %s is not a known rebuild function", pyobj.TypeName(a[0]))
			}
			args, ok := a[2].(pyobj.Tuple)
			if !ok {
				return nil, fmt.Errorf("_rebuild_from_type_v2: arguments are %s, not a tuple", pyobj.TypeName(a[2]))
			}
			return fn.CallPy(args)
		}), true
	}
	return nil, false
}

// rebuildTensor implements _rebuild_tensor(_v2|_v3):
// (storage, storage_offset, size, stride, [requires_grad, hooks, [dtype], [metadata]]).
func rebuildTensor(a []pyobj.Value, dt dtype.DType) (pyobj.Value, error) {
	if len(a) < 4 {
		return nil, fmt.Errorf("_rebuild_tensor: want at least 4 arguments, got %d", len(a))
	}
	st, ok := a[0].(*Storage)
	if !ok {
		return nil, fmt.Errorf("_rebuild_tensor: storage argument is %s", pyobj.TypeName(a[0]))
	}
	off, ok := pyobj.Int(a[1])
	if !ok {
		return nil, fmt.Errorf("_rebuild_tensor: storage offset is %s, not an int", pyobj.TypeName(a[1]))
	}
	shape, ok1 := pyobj.Ints(a[2])
	stride, ok2 := pyobj.Ints(a[3])
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("_rebuild_tensor: size or stride is not a tuple of ints")
	}
	if dt == dtype.Invalid {
		dt = st.DType
	}
	t := &Tensor{Storage: st, DType: dt, StorageOffset: off, Shape: shape, Stride: stride}
	if len(a) > 4 {
		var ok bool
		if t.RequiresGrad, ok = a[4].(bool); !ok {
			return nil, fmt.Errorf("_rebuild_tensor: requires_grad is %s, not a bool", pyobj.TypeName(a[4]))
		}
	}
	if err := t.validate(); err != nil {
		return nil, err
	}
	return t, nil
}

func (h *torchHooks) persistentLoad(pid pyobj.Value) (pyobj.Value, error) {
	t, ok := pid.(pyobj.Tuple)
	if !ok || len(t) == 0 {
		return nil, fmt.Errorf("persistent id is %s, not a tuple", pyobj.TypeName(pid))
	}
	if kind, _ := t[0].(string); kind != "storage" {
		if kind == "module" {
			return &pyobj.Object{Class: &pyobj.Global{Module: "torch.serialization", Name: "module_source"}, Via: pyobj.ByReduce, Args: []pyobj.Value(t[1:])}, nil
		}
		// Repr, not %q: a pickled value can share parts so that fmt's
		// recursive printing of it grows exponentially.
		return nil, fmt.Errorf("persistent id of kind %s, want 'storage'", pyobj.Repr(t[0]))
	}
	want := 5
	if h.legacy {
		want = 6
	}
	if len(t) != want {
		return nil, fmt.Errorf("storage persistent id has %d elements, want %d", len(t), want)
	}
	var dt dtype.DType
	switch c := t[1].(type) {
	case *pyobj.Global:
		if c.Name == "UntypedStorage" {
			dt = dtype.Uint8
		} else if d, ok := dtype.FromStorageClass(c.Name); ok {
			dt = d
		} else {
			return nil, fmt.Errorf("unknown storage class %s", c)
		}
	case pyobj.DType:
		dt = c.DType
	default:
		return nil, fmt.Errorf("storage class is %s", pyobj.TypeName(t[1]))
	}
	key, ok1 := t[2].(string)
	loc, ok2 := t[3].(string)
	numel, ok3 := pyobj.Int(t[4])
	if !ok1 || !ok2 || !ok3 || numel < 0 || numel > 1<<56 {
		return nil, fmt.Errorf("storage persistent id has bad key, location or size")
	}
	st, err := h.storage(key, dt, loc, numel)
	if err != nil {
		return nil, err
	}
	if h.legacy && t[5] != nil {
		// Only torch < 0.4 wrote storage views here.
		return nil, fmt.Errorf("storage %s: pre-0.4 storage views are not supported", key)
	}
	return st, nil
}

func (h *torchHooks) storage(key string, dt dtype.DType, loc string, numel int64) (*Storage, error) {
	if st, ok := h.storages[key]; ok {
		if st.DType != dt || st.Numel != numel {
			return nil, fmt.Errorf("storage %s is referenced as %v[%d] and as %v[%d]", key, st.DType, st.Numel, dt, numel)
		}
		return st, nil
	}
	st := &Storage{Key: key, DType: dt, Location: loc, Numel: numel, Offset: -1}
	h.storages[key] = st
	return st, nil
}
