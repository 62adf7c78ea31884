package pyobj

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// MaxVisits bounds Walk: pickles can share containers so that the number
// of paths grows exponentially with the pickle's size.
const MaxVisits = 10_000_000

// ErrSkip returned by a Walk callback skips the children of that value.
var ErrSkip = errors.New("skip")

// Walk calls fn for v and everything inside it, depth first in stored
// order. path holds dict keys as they are and list/tuple indices as int64;
// an object's attributes appear under their names. Nesting deeper than
// lim.MaxDepth is an error.
func Walk(v Value, lim Limits, fn func(path []Value, v Value) error) error {
	maxDepth := lim.withDefaults().MaxDepth
	visits := 0
	var walk func(path []Value, v Value, depth int) error
	walk = func(path []Value, v Value, depth int) error {
		visits++
		if visits > MaxVisits {
			return fmt.Errorf("more than %d values to walk", MaxVisits)
		}
		if depth > maxDepth {
			return fmt.Errorf("values nest deeper than %d levels", maxDepth)
		}
		if err := fn(path, v); err != nil {
			if err == ErrSkip {
				return nil
			}
			return err
		}
		child := func(k, c Value) error {
			return walk(append(path[:len(path):len(path)], k), c, depth+1)
		}
		switch x := v.(type) {
		case *Dict:
			for i := 0; i < x.Len(); i++ {
				k, c := x.Item(i)
				if err := child(k, c); err != nil {
					return err
				}
			}
		case *List:
			for i, c := range x.Items {
				if err := child(int64(i), c); err != nil {
					return err
				}
			}
		case Tuple:
			for i, c := range x {
				if err := child(int64(i), c); err != nil {
					return err
				}
			}
		case *Object:
			if d, ok := x.State.(*Dict); ok {
				for i := 0; i < d.Len(); i++ {
					k, c := d.Item(i)
					if err := child(k, c); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	return walk(nil, v, 0)
}

// Repr returns a short Python-like rendering of scalars and a summary of
// containers, for listings.
func Repr(v Value) string { return repr(v, 0) }

// reprDepth bounds how deep Repr renders nested tuples: a pickle can share
// tuples so that their full rendering doubles with every level.
const reprDepth = 4

func repr(v Value, depth int) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case *big.Int:
		if x.BitLen() > 1024 {
			// Decimal conversion of a huge int is slow; say its size.
			return fmt.Sprintf("<int of %d bits>", x.BitLen())
		}
		return x.String()
	case float64:
		return formatFloat(x)
	case string:
		if len(x) > 80 {
			return strconv.Quote(x[:77] + "...")
		}
		return strconv.Quote(x)
	case Bytes:
		return fmt.Sprintf("bytes[%d]", len(x))
	case Tuple:
		if depth >= reprDepth && len(x) > 0 {
			return "(...)"
		}
		parts := make([]string, 0, len(x))
		for i, e := range x {
			if i == 8 {
				parts = append(parts, "...")
				break
			}
			parts = append(parts, repr(e, depth+1))
		}
		if len(x) == 1 {
			return "(" + parts[0] + ",)"
		}
		return "(" + strings.Join(parts, ", ") + ")"
	case *List:
		return fmt.Sprintf("list[%d]", len(x.Items))
	case *Dict:
		return fmt.Sprintf("%s[%d]", TypeName(x), x.Len())
	case *Set:
		return fmt.Sprintf("set[%d]", len(x.Items))
	case *Global:
		return x.String()
	case DType:
		return "torch." + x.DType.String()
	case Size:
		parts := make([]string, len(x))
		for i, d := range x {
			parts[i] = strconv.FormatInt(d, 10)
		}
		return "torch.Size([" + strings.Join(parts, ", ") + "])"
	case Enum:
		if x.ByName {
			return x.Class.Name + "." + x.Name
		}
		return x.Class.Name + "(" + repr(x.Value, depth+1) + ")"
	case *Object:
		return x.Class.String() + "(...)"
	}
	return TypeName(v)
}

func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eE") {
		s += ".0"
	}
	return s
}

// PathString renders a Walk path as a Python subscript chain: ['a'][0].
func PathString(path []Value) string {
	var b strings.Builder
	for _, k := range path {
		switch x := k.(type) {
		case attrName:
			b.WriteByte('.')
			b.WriteString(string(x))
			continue
		case seqPos:
			fmt.Fprintf(&b, ".%s()[%d]", x.of, x.i)
			continue
		}
		b.WriteByte('[')
		b.WriteString(Repr(k))
		b.WriteByte(']')
	}
	return b.String()
}

// SortedKeys returns the string keys of d sorted; other keys are skipped.
func SortedKeys(d *Dict) []string {
	var ks []string
	for _, k := range d.Keys() {
		if s, ok := k.(string); ok {
			ks = append(ks, s)
		}
	}
	sort.Strings(ks)
	return ks
}
