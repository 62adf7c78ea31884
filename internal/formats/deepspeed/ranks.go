// Ranks checks that the rank files of one checkpoint agree on
// what every rank of one training run shares (configuration, optimizer
// class and hyper-parameters, step, dtypes), so that rank files mixed in
// from another run are refused instead of converted into a checkpoint
// that mixes two runs.

package deepspeed

import (
	"fmt"
	"math"
	"math/big"
	"path/filepath"
	"reflect"
	"strconv"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Ranks collects one value per rank for each field and fails on the
// first rank whose value differs from the first rank's.
type Ranks struct {
	Dir   string // the tag folder, named in errors
	first map[string]seen
}

type seen struct {
	file, rank string
	v          pyobj.Value
}

// Field records rank's value of field, read from file. A value of nil
// stands for an absent field (absent on every rank is agreement).
func (r *Ranks) Field(file, rank, field string, v pyobj.Value) error {
	if r.first == nil {
		r.first = map[string]seen{}
	}
	f, ok := r.first[field]
	if !ok {
		r.first[field] = seen{file, rank, v}
		return nil
	}
	if where, equal := Diff(f.v, v); !equal {
		return fmt.Errorf("%s: the rank files come from different runs: %s differs%s: %s (%s) has %s, but %s (%s) has %s",
			r.Dir, field, where, filepath.Base(f.file), f.rank, show(f.v, where), filepath.Base(file), rank, show(v, where))
	}
	return nil
}

// show renders the part of v that Diff pointed at.
func show(v pyobj.Value, where string) string {
	if where != "" {
		v = at(v, where)
	}
	if v == nil {
		return "nothing"
	}
	switch x := v.(type) {
	case *pyobj.Dict:
		if x.Len() > 4 {
			break
		}
		s := "{"
		for i := 0; i < x.Len(); i++ {
			k, e := x.Item(i)
			if i > 0 {
				s += ", "
			}
			s += pyobj.Repr(k) + ": " + pyobj.Repr(e)
		}
		return s + "}"
	case *pyobj.Object:
		return x.Class.String() + " object"
	case *torchfile.Tensor:
		return fmt.Sprintf("a %s tensor %v", x.DType, x.Shape)
	}
	return pyobj.Repr(v)
}

// at follows the path Diff returned (" at [k1][k2]...") into v; paths are
// only needed for dicts and sequences, so it goes as far as it can.
func at(v pyobj.Value, where string) pyobj.Value {
	for _, k := range splitPath(where) {
		switch x := v.(type) {
		case *pyobj.Dict:
			for i := 0; i < x.Len(); i++ {
				kk, vv := x.Item(i)
				if pyobj.Repr(kk) == k {
					v = vv
					goto next
				}
			}
			return nil
		case *pyobj.Object:
			if a, ok := x.Attr(k); ok {
				v = a
				goto next
			}
			return v
		default:
			if s, ok := pyobj.Seq(v); ok {
				if i, err := strconv.Atoi(k); err == nil && i < len(s) {
					v = s[i]
					goto next
				}
			}
			return v
		}
	next:
	}
	return v
}

func splitPath(where string) []string {
	var out []string
	depth, start := 0, -1
	for i, c := range where {
		switch c {
		case '[':
			if depth == 0 {
				start = i + 1
			}
			depth++
		case ']':
			depth--
			if depth == 0 && start >= 0 {
				out = append(out, where[start:i])
			}
		}
	}
	return out
}

// Diff compares two unpickled values and, when they differ, says where:
// "" for the values themselves, or " at [key][index]..." inside them.
// Tensors compare by dtype and shape (their data is not read); floats
// compare equal when both are NaN.
func Diff(a, b pyobj.Value) (string, bool) {
	return diff(a, b, 0)
}

func diff(a, b pyobj.Value, depth int) (string, bool) {
	if depth > 32 {
		return "", true // deeper than any config; pickles can nest without end
	}
	if reflect.TypeOf(a) != reflect.TypeOf(b) {
		return "", false // values of two types differ, whatever they hold
	}
	// b has a's type from here on: the assertions below cannot fail.
	switch x := a.(type) {
	case *pyobj.Dict:
		y := b.(*pyobj.Dict)
		for i := 0; i < x.Len(); i++ {
			k, xv := x.Item(i)
			yv, ok := y.Get(k)
			if !ok {
				return " at [" + pyobj.Repr(k) + "]", false
			}
			if w, eq := diff(xv, yv, depth+1); !eq {
				return " at [" + pyobj.Repr(k) + "]" + w, false
			}
		}
		for i := 0; i < y.Len(); i++ {
			k, _ := y.Item(i)
			if _, ok := x.Get(k); !ok {
				return " at [" + pyobj.Repr(k) + "]", false
			}
		}
		return "", true
	case *pyobj.Object:
		y := b.(*pyobj.Object)
		if x.Class.String() != y.Class.String() {
			return "", false
		}
		return diff(x.State, y.State, depth+1)
	case *torchfile.Tensor:
		y := b.(*torchfile.Tensor)
		return "", x.DType == y.DType && torchfile.SameShape(x.Shape, y.Shape)
	case float64:
		y := b.(float64)
		return "", x == y || math.IsNaN(x) && math.IsNaN(y)
	case *big.Int:
		return "", x.Cmp(b.(*big.Int)) == 0
	case pyobj.Enum:
		y := b.(pyobj.Enum)
		if x.Class.String() != y.Class.String() || x.ByName != y.ByName || x.Name != y.Name {
			return "", false
		}
		return diff(x.Value, y.Value, depth+1)
	case *pyobj.Global:
		return "", x.String() == b.(*pyobj.Global).String()
	case pyobj.DType:
		return "", x.DType == b.(pyobj.DType).DType
	case nil, bool, int64, string:
		return "", a == b
	case pyobj.Bytes:
		return "", string(x) == string(b.(pyobj.Bytes))
	case pyobj.Size:
		return "", torchfile.SameShape(x, b.(pyobj.Size))
	}
	xs, ok1 := pyobj.Seq(a)
	ys, ok2 := pyobj.Seq(b)
	if ok1 && ok2 && pyobj.TypeName(a) == pyobj.TypeName(b) {
		if len(xs) != len(ys) {
			return "", false
		}
		for i := range xs {
			if w, eq := diff(xs[i], ys[i], depth+1); !eq {
				return fmt.Sprintf(" at [%d]", i) + w, false
			}
		}
		return "", true
	}
	return "", pyobj.TypeName(a) == pyobj.TypeName(b) && pyobj.Repr(a) == pyobj.Repr(b)
}

// Step returns an optimizer step as a number: an int or float as it is, a
// one-element tensor read from the file it was saved in.
func Step(path string, v pyobj.Value) (pyobj.Value, error) {
	var t *torchfile.Tensor
	switch x := v.(type) {
	case *torchfile.Tensor:
		t = x
	case float64:
		return x, nil
	case int64:
		return float64(x), nil
	default:
		return v, nil
	}
	if t.Numel() != 1 {
		return nil, fmt.Errorf("%s: step is a tensor of %d elements", path, t.Numel())
	}
	f, err := torchfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := f.ReadTensor(t)
	if err != nil {
		return nil, fmt.Errorf("%s: step: %w", path, err)
	}
	out := make([]byte, 4)
	if err := dtype.ToFloat32(out, raw, t.DType); err != nil {
		if n, ok := intStep(raw, t.DType); ok {
			return float64(n), nil
		}
		return nil, fmt.Errorf("%s: step: %w", path, err)
	}
	return float64(math.Float32frombits(uint32(out[0]) | uint32(out[1])<<8 | uint32(out[2])<<16 | uint32(out[3])<<24)), nil
}

// intStep reads an integer step tensor (int64/int32) as stored.
func intStep(raw []byte, dt dtype.DType) (int64, bool) {
	var n int64
	switch len(raw) {
	case 8, 4:
		for i := len(raw) - 1; i >= 0; i-- {
			n = n<<8 | int64(raw[i])
		}
		if len(raw) == 4 {
			n = int64(int32(n))
		}
		return n, dt.Size() == len(raw)
	}
	return 0, false
}
