package pyobj

import (
	"bytes"
	"fmt"
	"io"
	"math/big"
	"sort"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"

	"github.com/ucp-project/ucp/internal/dtype"
)

// Callable is implemented by values that a Hooks.Resolve returns for
// functions that build objects (such as torch's _rebuild_tensor_v2). Args
// are already decoded into Values.
type Callable interface {
	CallPy(args []Value) (Value, error)
}

// Hooks give meaning to globals and persistent ids of one pickle dialect.
type Hooks struct {
	// Resolve returns a Callable for module.name, or ok=false to treat the
	// global with the defaults of this package.
	Resolve func(module, name string) (Callable, bool)
	// PersistentLoad turns a decoded persistent id into a value. Without
	// it, a pickle with persistent ids is an error.
	PersistentLoad func(pid Value) (Value, error)
}

// Options configure Unpickle.
type Options struct {
	Hooks  Hooks
	Limits Limits // zero value means DefaultLimits
	// Globals, if not nil, receives every module.name the pickle references.
	Globals map[string]int
}

// FuncRef is a resolved function passed as an argument, as torch's
// _rebuild_from_type_v2 receives the function that builds the tensor.
type FuncRef struct {
	Global *Global
	Callable
}

// StateSetter may be implemented by values that Hooks make, to receive the
// argument of a BUILD opcode applied to them. Hook values without it ignore
// BUILD (torch tensors carry Python attributes that way).
type StateSetter interface {
	SetPyState(state Value) error
}

// Unpickle decodes the pickle at the start of data with gopickle's pickle
// VM. Unknown globals become inert *Object values; nothing in the pickle is
// executed. Before the VM runs, Scan checks every length against the bytes
// present (gopickle allocates whatever a length claims) and prepare checks
// the stack shape, memo keys and MARK nesting, so the VM only sees
// well-formed streams, and estimates the memory decoding takes against
// Limits.MaxBytes (a *BudgetError past it); the decoded values nest at most Limits.MaxDepth deep
// and contain no cycles.
func Unpickle(data []byte, opt Options) (v Value, err error) {
	lim := opt.Limits.withDefaults()
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = SizeBudget(int64(len(data)))
	}
	n, err := Scan(data, lim)
	if err != nil {
		return nil, err
	}
	prog, err := prepare(data[:n], lim)
	if err != nil {
		return nil, err
	}
	d := &decoder{opt: opt, lim: lim}
	cr := &countingReader{r: bytes.NewReader(prog)}
	u := pickle.NewUnpickler(cr)
	u.FindClass = d.findClass
	u.PersistentLoad = d.persistentLoad
	defer func() {
		// prepare rules out what is known to crash gopickle; this turns
		// anything else into an error instead of a crash.
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("pickle: malformed at byte %d (%v)", cr.n, r)
		}
	}()
	raw, err := u.Load()
	if err != nil {
		return nil, fmt.Errorf("pickle: at byte %d: %w", cr.n, err)
	}
	if v, err = newConverter(lim.MaxDepth).conv(raw, 0); err != nil {
		return nil, err
	}
	if err := checkTree(v, lim.MaxDepth); err != nil {
		return nil, err
	}
	return v, nil
}

func (l Limits) withDefaults() Limits {
	if l.MaxOps <= 0 {
		l.MaxOps = DefaultLimits().MaxOps
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultLimits().MaxDepth
	}
	if l.MaxLine <= 0 {
		l.MaxLine = DefaultLimits().MaxLine
	}
	return l
}

// countingReader tells how far the VM has read, for error messages.
type countingReader struct {
	r *bytes.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

var _ io.ByteReader = (*countingReader)(nil)

type decoder struct {
	opt Options
	lim Limits
}

// findClass is gopickle's FindClass: globals the hooks resolve call them,
// torch dtypes are values, everything else is a reference whose calls
// this package interprets (builtinCall) or records as inert objects.
func (d *decoder) findClass(module, name string) (interface{}, error) {
	if module == internalModule && name == "long" {
		return longCall{}, nil
	}
	if d.opt.Globals != nil {
		d.opt.Globals[module+"."+name]++
	}
	g := &Global{Module: module, Name: name}
	if d.opt.Hooks.Resolve != nil {
		if c, ok := d.opt.Hooks.Resolve(module, name); ok {
			return &hookCall{g: g, c: c, lim: d.lim}, nil
		}
	}
	return &globalRef{g: g, lim: d.lim}, nil
}

func (d *decoder) persistentLoad(pid interface{}) (interface{}, error) {
	if d.opt.Hooks.PersistentLoad == nil {
		return nil, fmt.Errorf("persistent id in a pickle that allows none")
	}
	v, err := newConverter(d.lim.MaxDepth).conv(pid, 0)
	if err != nil {
		return nil, err
	}
	out, err := d.opt.Hooks.PersistentLoad(v)
	return &hookValue{v: out}, err
}

// args decodes call arguments with a throwaway converter: they are
// complete when REDUCE runs, but a memoized container could still grow
// later in the pickle, so nothing is cached for the final conversion.
func args(lim Limits, raw []interface{}, funcs bool) ([]Value, error) {
	c := newConverter(lim.MaxDepth)
	c.keepFuncs = funcs
	out := make([]Value, len(raw))
	for i, a := range raw {
		v, err := c.conv(a, 0)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// longCall decodes a big LONG1/LONG4 payload that prepare moved into a
// latin-1 string.
type longCall struct{}

func (longCall) Call(raw ...interface{}) (interface{}, error) {
	s, ok := raw[0].(string)
	if len(raw) != 1 || !ok {
		return nil, fmt.Errorf("malformed integer")
	}
	b := make([]byte, 0, len(s))
	for _, r := range s {
		b = append(b, byte(r))
	}
	return decodeLong(b), nil
}

// hookCall adapts a Callable to gopickle: arguments are decoded first.
type hookCall struct {
	g   *Global
	c   Callable
	lim Limits
}

func (h *hookCall) Call(raw ...interface{}) (interface{}, error) {
	vals, err := args(h.lim, raw, true)
	if err != nil {
		return nil, err
	}
	v, err := h.c.CallPy(vals)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", h.g, err)
	}
	return &hookValue{v: v}, nil
}

// hookValue wraps what a hook returned while the VM runs, so that BUILD on
// it reaches StateSetter or is ignored, as torch ignores a tensor's
// Python attributes.
type hookValue struct{ v Value }

func (h *hookValue) PySetState(state interface{}) error {
	ss, ok := h.v.(StateSetter)
	if !ok {
		return nil
	}
	s, err := newConverter(DefaultLimits().MaxDepth).conv(state, 0)
	if err != nil {
		return err
	}
	return ss.SetPyState(s)
}

// globalRef is a global this package gives a default meaning.
type globalRef struct {
	g   *Global
	lim Limits
}

// rawObject is an *Object whose arguments and state are still gopickle
// values; it receives BUILD.
type rawObject struct {
	class *Global
	via   Construct
	args  []interface{}
	state interface{}
	built bool
}

func (o *rawObject) PySetState(state interface{}) error {
	o.state, o.built = state, true
	return nil
}

func (r *globalRef) PyNew(raw ...interface{}) (interface{}, error) {
	return &rawObject{class: r.g, via: ByNewObj, args: raw}, nil
}

func (r *globalRef) Call(raw ...interface{}) (interface{}, error) {
	if r.g.Module == "torch" {
		if _, ok := dtype.FromTorchName(r.g.Name); ok {
			return nil, fmt.Errorf("cannot call torch.dtype %s", r.g)
		}
	}
	vals, err := args(r.lim, raw, false)
	if err != nil {
		return nil, err
	}
	v, err := builtinCall(r.g, vals)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.g, err)
	}
	if o, ok := v.(*Object); ok && !o.Built {
		// Keep the raw arguments: an inert object may be BUILT later.
		return &rawObject{class: o.Class, via: o.Via, args: raw}, nil
	}
	switch x := v.(type) {
	case *Dict:
		return &rawDict{d: x}, nil
	case Bytes, Size, Tuple, Enum:
		// Slices cannot be Go map keys; gopickle's sets and OrderedDicts
		// are maps, so the VM holds a pointer to the value.
		return &hookValue{v: x}, nil
	}
	return v, nil
}

// rawDict is a dict a call made (dict(...)) that the VM may still fill.
type rawDict struct {
	d     *Dict
	items []interface{}
	state interface{}
}

func (r *rawDict) Set(k, v interface{}) { r.items = append(r.items, k, v) }

func (r *rawDict) PySetState(state interface{}) error {
	r.state = state
	return nil
}

// converter turns gopickle's values into this package's, keeping shared
// references shared and rejecting cycles and excessive nesting.
type converter struct {
	maxDepth  int
	keepFuncs bool // hook arguments may carry functions; final values may not
	done      map[any]Value
	busy      map[any]bool
}

func newConverter(maxDepth int) *converter {
	if maxDepth <= 0 {
		maxDepth = DefaultLimits().MaxDepth
	}
	return &converter{maxDepth: maxDepth, done: map[any]Value{}, busy: map[any]bool{}}
}

// conv is one case per value type the VM produces; it is kept whole (over
// 100 lines) so the mapping from VM values to Values reads in one place.
func (c *converter) conv(v interface{}, depth int) (Value, error) {
	switch x := v.(type) {
	case nil, bool, float64, int64, string, Bytes, Size, DType, Enum, FuncRef, Tuple:
		// Tuple here was made by a builtin call from decoded values.
		return x, nil
	case int:
		return int64(x), nil
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), nil
		}
		return x, nil
	case []byte:
		return Bytes(x), nil
	case *types.ByteArray:
		return Bytes(*x), nil
	case *hookValue:
		return x.v, nil
	}
	if depth >= c.maxDepth {
		return nil, fmt.Errorf("pickle: objects nest deeper than %d levels", c.maxDepth)
	}
	if r, ok := c.done[v]; ok {
		return r, nil
	}
	if c.busy[v] {
		return nil, fmt.Errorf("pickle: %s contains itself (cycles are not supported)", rawTypeName(v))
	}
	c.busy[v] = true
	defer delete(c.busy, v)
	var out Value
	var err error
	switch x := v.(type) {
	case *types.Tuple:
		out, err = c.tuple(*x, depth)
	case *types.List:
		var items []Value
		if items, err = c.seq(*x, depth); err == nil {
			out = &List{Items: items}
		}
	case *List:
		var items []Value
		if items, err = c.seq(x.Items, depth); err == nil {
			x.Items = items
			out = x
		}
	case *types.Dict:
		d := NewDict(PlainDict)
		for _, e := range *x {
			if err = c.setItem(d, e.Key, e.Value, depth); err != nil {
				break
			}
		}
		out = d
	case *types.OrderedDict:
		d := NewDict(OrderedDict)
		for el := x.List.Front(); el != nil && err == nil; el = el.Next() {
			e := el.Value.(*types.OrderedDictEntry)
			err = c.setItem(d, e.Key, e.Value, depth)
		}
		if err == nil && len(x.PyDict) > 0 {
			// BUILD on an OrderedDict: a state_dict's _metadata.
			keys := make([]string, 0, len(x.PyDict))
			for k := range x.PyDict {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			d.Attrs = NewDict(PlainDict)
			for _, k := range keys {
				if err = c.setItem(d.Attrs, k, x.PyDict[k], depth); err != nil {
					break
				}
			}
		}
		out = d
	case *Dict:
		// Made by a builtin call from decoded values; its contents may
		// still hold raw values if the VM filled it.
		out = x
	case *rawDict:
		d := x.d
		for i := 0; i+1 < len(x.items) && err == nil; i += 2 {
			err = c.setItem(d, x.items[i], x.items[i+1], depth)
		}
		if err == nil && x.state != nil {
			var s Value
			if s, err = c.conv(x.state, depth+1); err == nil {
				attrs, ok := s.(*Dict)
				if !ok {
					err = fmt.Errorf("pickle: state of a dict is %s, not a dict", TypeName(s))
				}
				d.Attrs = attrs
			}
		}
		out = d
	case *types.Set:
		s := &Set{}
		for k := range *x {
			var kv Value
			if kv, err = c.conv(k, depth+1); err != nil {
				break
			}
			s.Items = append(s.Items, kv)
		}
		out = s
	case *types.FrozenSet:
		s := &Set{Frozen: true}
		for k := range *x {
			var kv Value
			if kv, err = c.conv(k, depth+1); err != nil {
				break
			}
			s.Items = append(s.Items, kv)
		}
		out = s
	case *Set:
		var items []Value
		if items, err = c.seq(x.Items, depth); err == nil {
			x.Items = items
			out = x
		}
	case *globalRef:
		if x.g.Module == "torch" {
			if dt, ok := dtype.FromTorchName(x.g.Name); ok {
				return DType{dt}, nil
			}
		}
		return x.g, nil
	case *Global:
		return x, nil
	case *hookCall:
		if c.keepFuncs {
			return FuncRef{Global: x.g, Callable: x.c}, nil
		}
		return x.g, nil
	case *rawObject:
		o := &Object{Class: x.class, Via: x.via, Built: x.built}
		if o.Args, err = c.seq(x.args, depth); err == nil && x.built {
			o.State, err = c.conv(x.state, depth+1)
		}
		out = o
	case *Object:
		out = x
	case *types.GenericObject, *types.GenericClass, *types.ObjectClass, *types.Reconstructor, *types.OrderedDictClass, *types.Array:
		return nil, fmt.Errorf("pickle: a %T cannot be used as a value", v)
	default:
		// Values made by Hooks (tensors, storages) are already final.
		return v, nil
	}
	if err != nil {
		return nil, err
	}
	c.done[v] = out
	return out, nil
}

func (c *converter) tuple(items []interface{}, depth int) (Value, error) {
	t, err := c.seq(items, depth)
	if err != nil {
		return nil, err
	}
	return Tuple(t), nil
}

func (c *converter) seq(items []interface{}, depth int) ([]Value, error) {
	out := make([]Value, len(items))
	for i, e := range items {
		v, err := c.conv(e, depth+1)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (c *converter) setItem(d *Dict, k, v interface{}, depth int) error {
	kv, err := c.conv(k, depth+1)
	if err != nil {
		return err
	}
	vv, err := c.conv(v, depth+1)
	if err != nil {
		return err
	}
	d.Set(kv, vv)
	return nil
}

// rawTypeName names a VM value's Python type for messages.
func rawTypeName(v interface{}) string {
	switch x := v.(type) {
	case *types.List, *List:
		return "list"
	case *types.Tuple:
		return "tuple"
	case *types.Dict, *rawDict:
		return "dict"
	case *types.OrderedDict:
		return "OrderedDict"
	case *types.Set, *types.FrozenSet, *Set:
		return "set"
	case *rawObject:
		return x.class.String()
	}
	return TypeName(v)
}
