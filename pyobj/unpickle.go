package pyobj

import (
	"bytes"
	"fmt"
	"math/big"
	"unicode/utf8"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"

	"github.com/ucp-project/ucp/dtype"
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

// Unpickle decodes the pickle at the start of data. Unknown globals become
// inert *Object values; nothing in the pickle is executed. Every length in
// the pickle is checked against the bytes present before anything is
// allocated, containers nest at most Limits.MaxDepth deep, and cycles are
// rejected.
func Unpickle(data []byte, opt Options) (v Value, err error) {
	lim := opt.Limits
	if lim.MaxOps == 0 {
		lim = DefaultLimits
	}
	n, err := Scan(data, lim)
	if err != nil {
		return nil, err
	}
	d := &decoder{opt: opt, lim: lim}
	u := pickle.NewUnpickler(bytes.NewReader(data[:n]))
	u.FindClass = d.findClass
	u.PersistentLoad = d.persistentLoad
	defer func() {
		// gopickle trusts its input in places; a malformed pickle must
		// still be an error, never a crash.
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("pickle: malformed (%v)", r)
		}
	}()
	raw, err := u.Load()
	if err != nil {
		return nil, fmt.Errorf("pickle: %w", err)
	}
	c := newConverter(lim.MaxDepth)
	return c.conv(raw, 0)
}

type decoder struct {
	opt Options
	lim Limits
}

func (d *decoder) findClass(module, name string) (interface{}, error) {
	if d.opt.Globals != nil {
		d.opt.Globals[module+"."+name]++
	}
	if d.opt.Hooks.Resolve != nil {
		if c, ok := d.opt.Hooks.Resolve(module, name); ok {
			return &hookCall{g: &Global{Module: module, Name: name}, c: c, lim: d.lim}, nil
		}
	}
	return &globalRef{g: &Global{Module: module, Name: name}, lim: d.lim}, nil
}

func (d *decoder) persistentLoad(pid interface{}) (interface{}, error) {
	if d.opt.Hooks.PersistentLoad == nil {
		return nil, fmt.Errorf("persistent id in a pickle that allows none")
	}
	v, err := newConverter(d.lim.MaxDepth).conv(pid, 0)
	if err != nil {
		return nil, err
	}
	return d.opt.Hooks.PersistentLoad(v)
}

// hookCall adapts a Callable to gopickle: arguments are decoded first.
type hookCall struct {
	g   *Global
	c   Callable
	lim Limits
}

// FuncRef is a resolved function passed as an argument, as torch's
// _rebuild_from_type_v2 receives the function that builds the tensor.
type FuncRef struct {
	Global *Global
	Callable
}

func (h *hookCall) Call(args ...interface{}) (interface{}, error) {
	// A throwaway converter: arguments are complete when REDUCE runs, but a
	// memoized container could still grow later in the pickle.
	c := newConverter(h.lim.MaxDepth)
	c.keepFuncs = true
	vals := make([]Value, len(args))
	for i, a := range args {
		v, err := c.conv(a, 0)
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	return h.c.CallPy(vals)
}

// globalRef is a global that this package gives a default meaning: a few
// builtins are understood, everything else is recorded as an inert object.
type globalRef struct {
	g   *Global
	lim Limits
}

// rawObject is an *Object under construction whose arguments and state are
// still gopickle values.
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

// rawSet is a set whose items are still gopickle values.
type rawSet struct {
	items  []interface{}
	frozen bool
}

func (r *globalRef) PyNew(args ...interface{}) (interface{}, error) {
	return &rawObject{class: r.g, via: ByNewObj, args: args}, nil
}

func (r *globalRef) Call(args ...interface{}) (interface{}, error) {
	mod, name := r.g.Module, r.g.Name
	if mod == "builtins" {
		mod = "__builtin__"
	}
	switch mod + "." + name {
	case "__builtin__.getattr":
		// Enum members pickled by name: getattr(EnumClass, 'MEMBER').
		if len(args) == 2 {
			cls, ok1 := args[0].(*globalRef)
			member, ok2 := args[1].(string)
			if ok1 && ok2 {
				return Enum{Class: cls.g, Name: member, ByName: true}, nil
			}
		}
		return nil, fmt.Errorf("getattr: only getattr(class, 'name') is supported")
	case "__builtin__.set", "__builtin__.frozenset":
		rs := &rawSet{frozen: name == "frozenset"}
		if len(args) == 1 {
			items, ok := args[0].(*types.List)
			if !ok {
				return nil, fmt.Errorf("%s: argument is not a list", name)
			}
			rs.items = *items
		} else if len(args) > 1 {
			return nil, fmt.Errorf("%s: too many arguments", name)
		}
		return rs, nil
	case "_codecs.encode":
		// bytes in protocol 2: _codecs.encode('latin-1 text', 'latin1').
		if len(args) != 2 {
			return nil, fmt.Errorf("_codecs.encode: want 2 arguments, got %d", len(args))
		}
		s, ok1 := args[0].(string)
		enc, ok2 := args[1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("_codecs.encode: arguments are not strings")
		}
		return encodeString(s, enc)
	case "__builtin__.bytearray", "__builtin__.bytes":
		switch len(args) {
		case 0:
			return Bytes{}, nil
		case 1:
			if b, ok := args[0].([]byte); ok {
				return Bytes(b), nil
			}
		case 2:
			s, ok1 := args[0].(string)
			enc, ok2 := args[1].(string)
			if ok1 && ok2 {
				return encodeString(s, enc)
			}
		}
		return nil, fmt.Errorf("%s: unsupported arguments", name)
	case "torch.Size":
		if len(args) == 0 {
			return Size{}, nil
		}
		if t, ok := args[0].(*types.Tuple); ok && len(args) == 1 {
			s := make(Size, len(*t))
			for i, e := range *t {
				n, ok := e.(int)
				if !ok {
					return nil, fmt.Errorf("torch.Size: element %d is not an int", i)
				}
				s[i] = int64(n)
			}
			return s, nil
		}
		return nil, fmt.Errorf("torch.Size: unsupported arguments")
	}
	return &rawObject{class: r.g, via: ByReduce, args: args}, nil
}

func encodeString(s, enc string) (Bytes, error) {
	switch enc {
	case "latin1", "latin-1", "iso-8859-1":
		out := make(Bytes, 0, len(s))
		for _, r := range s {
			if r > 0xff {
				return nil, fmt.Errorf("_codecs.encode: %U is not latin-1", r)
			}
			out = append(out, byte(r))
		}
		return out, nil
	case "utf-8", "utf8", "ascii":
		return Bytes(s), nil
	}
	return nil, fmt.Errorf("_codecs.encode: unsupported encoding %q", enc)
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
		maxDepth = DefaultLimits.MaxDepth
	}
	return &converter{maxDepth: maxDepth, done: map[any]Value{}, busy: map[any]bool{}}
}

func (c *converter) conv(v interface{}, depth int) (Value, error) {
	switch x := v.(type) {
	case nil, bool, float64, int64, Bytes, Size, DType, Enum, FuncRef:
		return x, nil
	case int:
		return int64(x), nil
	case string:
		if !utf8.ValidString(x) {
			// Python str holds code points; a pickle may carry lone
			// surrogates. Keep the bytes, they only matter for display.
			return x, nil
		}
		return x, nil
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), nil
		}
		return x, nil
	case []byte:
		return Bytes(x), nil
	case *types.ByteArray:
		return Bytes(*x), nil
	}
	if depth >= c.maxDepth {
		return nil, fmt.Errorf("pickle: objects nest deeper than %d levels", c.maxDepth)
	}
	if r, ok := c.done[v]; ok {
		return r, nil
	}
	if c.busy[v] {
		return nil, fmt.Errorf("pickle: object contains itself (cycles are not supported)")
	}
	c.busy[v] = true
	defer delete(c.busy, v)
	switch x := v.(type) {
	case *types.Tuple:
		t := make(Tuple, len(*x))
		for i, e := range *x {
			ev, err := c.conv(e, depth+1)
			if err != nil {
				return nil, err
			}
			t[i] = ev
		}
		c.done[v] = t
		return t, nil
	case *types.List:
		l := &List{Items: make([]Value, len(*x))}
		for i, e := range *x {
			ev, err := c.conv(e, depth+1)
			if err != nil {
				return nil, err
			}
			l.Items[i] = ev
		}
		c.done[v] = l
		return l, nil
	case *types.Dict:
		d := NewDict(PlainDict)
		for _, e := range *x {
			if err := c.setItem(d, e.Key, e.Value, depth); err != nil {
				return nil, err
			}
		}
		c.done[v] = d
		return d, nil
	case *types.OrderedDict:
		d := NewDict(OrderedDict)
		for el := x.List.Front(); el != nil; el = el.Next() {
			e := el.Value.(*types.OrderedDictEntry)
			if err := c.setItem(d, e.Key, e.Value, depth); err != nil {
				return nil, err
			}
		}
		c.done[v] = d
		return d, nil
	case *types.Set:
		s := &Set{}
		for k := range *x {
			kv, err := c.conv(k, depth+1)
			if err != nil {
				return nil, err
			}
			s.Items = append(s.Items, kv)
		}
		c.done[v] = s
		return s, nil
	case *types.FrozenSet:
		s := &Set{Frozen: true}
		for k := range *x {
			kv, err := c.conv(k, depth+1)
			if err != nil {
				return nil, err
			}
			s.Items = append(s.Items, kv)
		}
		c.done[v] = s
		return s, nil
	case *rawSet:
		s := &Set{Frozen: x.frozen}
		for _, e := range x.items {
			ev, err := c.conv(e, depth+1)
			if err != nil {
				return nil, err
			}
			s.Items = append(s.Items, ev)
		}
		c.done[v] = s
		return s, nil
	case *globalRef:
		if x.g.Module == "torch" {
			if dt, ok := dtype.FromTorchName(x.g.Name); ok {
				return DType{dt}, nil
			}
		}
		return x.g, nil
	case *hookCall:
		if c.keepFuncs {
			return FuncRef{Global: x.g, Callable: x.c}, nil
		}
		return x.g, nil
	case *rawObject:
		o := &Object{Class: x.class, Via: x.via, Args: make([]Value, len(x.args)), Built: x.built}
		for i, a := range x.args {
			av, err := c.conv(a, depth+1)
			if err != nil {
				return nil, err
			}
			o.Args[i] = av
		}
		if x.built {
			sv, err := c.conv(x.state, depth+1)
			if err != nil {
				return nil, err
			}
			o.State = sv
		}
		c.done[v] = o
		return o, nil
	case *types.GenericObject, *types.GenericClass:
		return nil, fmt.Errorf("pickle: unexpected generic object %T", v)
	}
	// Values made by Hooks (tensors, storages) are already final.
	return v, nil
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
