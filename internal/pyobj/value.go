// Package pyobj holds the Python objects found in checkpoint pickles as plain
// Go values, decodes pickles into them without executing anything, and
// encodes them back as protocol-2 pickles that torch.load reads.
//
// A Value is one of: nil (None), bool, int64, *big.Int, float64, string,
// Bytes, Tuple, *List, *Dict, *Set, *Global, *Object, Enum, Size, DType,
// or a type that a Hooks resolver produced (torch tensors, see torchfile).
//
// Readers take typed values out of a decoded pickle with Dec, which records
// the first missing or mistyped value with its file and key path (checked
// once with Err); Walk visits a value tree and Rewrite replaces values in
// it, both within the Limits their caller passes.
package pyobj

import (
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strings"

	"github.com/ucp-project/ucp/internal/dtype"
)

// Value is any decoded Python object.
type Value = any

// Bytes is a Python bytes or bytearray object.
type Bytes []byte

// Tuple is a Python tuple.
type Tuple []Value

// List is a Python list. It is a pointer type so that shared references
// stay shared.
type List struct{ Items []Value }

// Set is a Python set or frozenset.
type Set struct {
	Items  []Value
	Frozen bool
}

// Global is a reference to a module attribute (a class or function), as
// written by the GLOBAL and STACK_GLOBAL opcodes.
type Global struct{ Module, Name string }

func (g *Global) String() string { return g.Module + "." + g.Name }

// Construct says how a pickled object was created.
type Construct uint8

const (
	// ByNewObj is cls.__new__(cls, *Args) (the NEWOBJ opcode).
	ByNewObj Construct = iota
	// ByReduce is Class(*Args) (the REDUCE opcode).
	ByReduce
)

// Object is an instance of a class ucp does not model: an inert record of
// the class, the constructor arguments and the BUILD state. Nothing is
// executed; the record can be pickled again unchanged.
type Object struct {
	Class *Global
	Via   Construct
	Args  []Value
	State Value // the BUILD argument
	Built bool  // whether the pickle applied BUILD
}

// Attr returns the attribute name from the object's state, which is a dict
// (plain objects, dataclasses, argparse.Namespace) or a (dict, slots) pair.
func (o *Object) Attr(name string) (Value, bool) {
	switch s := o.State.(type) {
	case *Dict:
		return s.Get(name)
	case Tuple:
		for _, part := range s {
			if d, ok := part.(*Dict); ok {
				if v, ok := d.Get(name); ok {
					return v, true
				}
			}
		}
	}
	return nil, false
}

// Enum is a member of a Python Enum class, pickled either by name
// (getattr(Class, Name)) or by value (Class(Value)).
type Enum struct {
	Class  *Global
	Name   string // set when pickled by name
	Value  Value  // set when pickled by value
	ByName bool
}

// Size is a torch.Size.
type Size []int64

// DType is a torch dtype object such as torch.float16.
type DType struct{ DType dtype.DType }

// DictKind distinguishes dict, collections.OrderedDict and other mappings
// so that they can be written back as they were read.
type DictKind uint8

const (
	PlainDict DictKind = iota
	OrderedDict
)

// Dict is an insertion-ordered Python dict. Keys may be any Value; lookups
// of hashable keys (strings, numbers, bools, None, tuples of those) are O(1).
type Dict struct {
	Kind DictKind
	// Attrs holds instance attributes that the pickle set with BUILD, as
	// torch does for a state_dict's _metadata. Usually nil.
	Attrs *Dict
	keys  []Value
	vals  []Value
	index map[any]int
}

// NewDict returns an empty dict of the given kind.
func NewDict(kind DictKind) *Dict { return &Dict{Kind: kind} }

// DictOf builds a plain dict from alternating keys and values.
func DictOf(kv ...Value) *Dict {
	d := NewDict(PlainDict)
	for i := 0; i+1 < len(kv); i += 2 {
		d.Set(kv[i], kv[i+1])
	}
	return d
}

// hashKey maps a key to a comparable Go value following Python equality:
// True == 1, 1.0 == 1. Keys are hashed by content within a small budget;
// larger keys (and mutable ones) are compared by identity instead, so that
// a pickle cannot make every dict insertion expensive.
func hashKey(k Value) (any, bool) {
	budget := maxKeyBytes
	return hashKeyBudget(k, &budget)
}

// maxKeyBytes bounds the work of hashing one key; each tuple element costs
// keyNodeCost besides its bytes. Real keys (names, ints, short tuples) are
// far below it.
const (
	maxKeyBytes = 1 << 10
	keyNodeCost = 16
)

// compositeKey is the hash key of a non-scalar key: a struct, so that it
// never equals the key of a plain string.
type compositeKey struct {
	kind byte
	s    string
}

func hashKeyBudget(k Value, budget *int) (any, bool) {
	if *budget -= keyNodeCost; *budget < 0 {
		return nil, false
	}
	switch x := k.(type) {
	case nil, string, int64:
		return x, true // a string is its own key: no copy, no budget
	case bool:
		if x {
			return int64(1), true
		}
		return int64(0), true
	case float64:
		if x == float64(int64(x)) {
			return int64(x), true
		}
		return x, true
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), true
		}
		if *budget -= x.BitLen() / 8; *budget < 0 {
			return nil, false
		}
		return compositeKey{'i', fmt.Sprintf("%d:%x", x.Sign(), x.Bytes())}, true
	case Bytes:
		if *budget -= len(x); *budget < 0 {
			return nil, false
		}
		return compositeKey{'b', string(x)}, true
	case Tuple:
		var b strings.Builder
		for _, e := range x {
			h, ok := hashKeyBudget(e, budget)
			if !ok {
				return nil, false
			}
			// Every element is written with its kind and, for text, its
			// length, so that different tuples never give one key.
			switch hv := h.(type) {
			case nil:
				b.WriteString("n;")
			case string:
				if *budget -= len(hv); *budget < 0 {
					return nil, false
				}
				fmt.Fprintf(&b, "s%d:%s;", len(hv), hv)
			case int64:
				fmt.Fprintf(&b, "i%d;", hv)
			case float64:
				fmt.Fprintf(&b, "f%x;", math.Float64bits(hv))
			case DType:
				fmt.Fprintf(&b, "d%d;", hv.DType)
			case compositeKey:
				if *budget -= len(hv.s); *budget < 0 {
					return nil, false
				}
				fmt.Fprintf(&b, "k%c%d:%s;", hv.kind, len(hv.s), hv.s)
			default:
				return nil, false
			}
		}
		return compositeKey{'t', b.String()}, true
	case Size:
		t := make(Tuple, len(x))
		for i, n := range x {
			t[i] = n
		}
		return hashKeyBudget(t, budget)
	case DType:
		return x, true
	case *Global:
		return compositeKey{'g', x.Module + "\n" + x.Name}, true
	case Enum:
		if x.ByName {
			return compositeKey{'e', x.Class.Module + "\n" + x.Class.Name + "\n" + x.Name}, true
		}
	}
	return nil, false
}

// identKey is the index key of a key that hashKey cannot hash (a list, a
// tuple beyond the budget, an object): Python would reject or compare such
// keys by identity, and so does Dict.
type identKey struct{ id any }

// dictKey returns the index key of k: its hash, or its identity.
func dictKey(k Value) (any, bool) {
	if h, ok := hashKey(k); ok {
		return h, true
	}
	if t, ok := k.(Tuple); ok && len(t) > 0 {
		return identKey{tupleID{&t[0], len(t)}}, true
	}
	if rv := reflect.ValueOf(k); rv.IsValid() && rv.Kind() == reflect.Pointer {
		return identKey{k}, true
	}
	return nil, false
}

// Set inserts or replaces the value of k, keeping the first insertion position.
func (d *Dict) Set(k, v Value) {
	if h, ok := dictKey(k); ok {
		if d.index == nil {
			d.index = make(map[any]int)
		}
		if i, ok := d.index[h]; ok {
			d.vals[i] = v
			return
		}
		d.index[h] = len(d.keys)
	}
	d.keys = append(d.keys, k)
	d.vals = append(d.vals, v)
}

// Get returns the value of k.
func (d *Dict) Get(k Value) (Value, bool) {
	if d == nil {
		return nil, false
	}
	h, ok := dictKey(k)
	if !ok {
		return nil, false // keys without hash or identity (such as a Size) are never found
	}
	i, ok := d.index[h]
	if !ok {
		return nil, false
	}
	return d.vals[i], true
}

// Delete removes k, keeping the order of the other keys.
func (d *Dict) Delete(k Value) {
	h, ok := dictKey(k)
	if !ok {
		return
	}
	i, ok := d.index[h]
	if !ok {
		return
	}
	d.keys = append(d.keys[:i], d.keys[i+1:]...)
	d.vals = append(d.vals[:i], d.vals[i+1:]...)
	delete(d.index, h)
	for j := i; j < len(d.keys); j++ {
		if hk, ok := dictKey(d.keys[j]); ok {
			d.index[hk] = j
		}
	}
}

// Len returns the number of items.
func (d *Dict) Len() int {
	if d == nil {
		return 0
	}
	return len(d.keys)
}

// Keys returns the keys in insertion order. The slice must not be modified.
func (d *Dict) Keys() []Value { return d.keys }

// Values returns the values in insertion order. The slice must not be modified.
func (d *Dict) Values() []Value { return d.vals }

// Item returns the i-th key and value.
func (d *Dict) Item(i int) (Value, Value) { return d.keys[i], d.vals[i] }

// Clone returns a shallow copy.
func (d *Dict) Clone() *Dict {
	c := NewDict(d.Kind)
	c.Attrs = d.Attrs
	for i := range d.keys {
		c.Set(d.keys[i], d.vals[i])
	}
	return c
}
