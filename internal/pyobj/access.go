package pyobj

import (
	"fmt"
	"math/big"
)

// Int returns v as an int64 if it is a Python int (or bool) that fits.
func Int(v Value) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), true
		}
	}
	return 0, false
}

// Float returns v as a float64 if it is a Python float or int.
func Float(v Value) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	}
	return 0, false
}

// Str returns v as a string if it is one.
func Str(v Value) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

// Seq returns the items of a list or tuple.
func Seq(v Value) ([]Value, bool) {
	switch x := v.(type) {
	case *List:
		return x.Items, true
	case Tuple:
		return x, true
	}
	return nil, false
}

// Ints returns the items of a list, tuple or torch.Size of ints.
func Ints(v Value) ([]int64, bool) {
	if s, ok := v.(Size); ok {
		return append([]int64(nil), s...), true
	}
	items, ok := Seq(v)
	if !ok {
		return nil, false
	}
	out := make([]int64, len(items))
	for i, it := range items {
		n, ok := Int(it)
		if !ok {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

// Strings returns the items of a list or tuple of strings.
func Strings(v Value) ([]string, bool) {
	items, ok := Seq(v)
	if !ok {
		return nil, false
	}
	out := make([]string, len(items))
	for i, it := range items {
		s, ok := it.(string)
		if !ok {
			return nil, false
		}
		out[i] = s
	}
	return out, true
}

// TypeName describes v's Python type for error messages.
func TypeName(v Value) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case Bytes:
		return "bytes"
	case Tuple:
		return "tuple"
	case *List:
		return "list"
	case *Dict:
		if x.Kind == OrderedDict {
			return "OrderedDict"
		}
		return "dict"
	case *Set:
		return "set"
	case *Global:
		return x.String()
	case *Object:
		return x.Class.String()
	case Enum:
		return x.Class.String()
	case Size:
		return "torch.Size"
	case DType:
		return "torch.dtype"
	case interface{ PyTypeName() string }:
		return x.PyTypeName()
	}
	return fmt.Sprintf("%T", v)
}

// Path walks nested dicts by string keys, failing with the path so far.
func Path(v Value, keys ...string) (Value, error) {
	for i, k := range keys {
		d, ok := v.(*Dict)
		if !ok {
			return nil, fmt.Errorf("%v: got %s, want dict", keys[:i], TypeName(v))
		}
		v, ok = d.Get(k)
		if !ok {
			return nil, fmt.Errorf("missing key %v", keys[:i+1])
		}
	}
	return v, nil
}
