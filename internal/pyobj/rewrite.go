package pyobj

import "fmt"

// Rewrite returns v with values replaced by fn, the one tree rewrite of
// ucp (tensors to references, references to blobs, tensors to their bytes).
// fn is called on every value, parents before children; when it returns
// done, its result takes the value's place and the value's children are not
// visited. Containers are copied only where something below them changed
// (the input is never modified), and a container reached twice gives one
// copy, so shared structure stays shared. Every container is covered: dict
// values and a dict's Attrs, list, tuple and set items, an object's
// arguments and state. Nesting deeper than lim.MaxDepth is an error.
func Rewrite(v Value, lim Limits, fn func(v Value) (out Value, done bool, err error)) (Value, error) {
	rw := &rewriter{fn: fn, max: lim.withDefaults().MaxDepth, done: map[any]Value{}}
	out, _, err := rw.value(v, 0)
	return out, err
}

type rewriter struct {
	fn   func(Value) (Value, bool, error)
	max  int
	done map[any]Value // containers already rewritten, by identity, to their copy
}

// value returns v rewritten and whether it changed (Values are not
// comparable: tuples are slices).
func (rw *rewriter) value(v Value, depth int) (Value, bool, error) {
	if depth > rw.max {
		return nil, false, fmt.Errorf("values nest deeper than %d levels", rw.max)
	}
	out, done, err := rw.fn(v)
	if err != nil || done {
		return out, done && err == nil, err
	}
	id, isContainer := containerID(v)
	if !isContainer {
		return v, false, nil
	}
	if c, ok := rw.done[id]; ok {
		if c == nil {
			return v, false, nil
		}
		return c, true, nil
	}
	nv, changed, err := rw.container(v, depth)
	if err != nil {
		return nil, false, err
	}
	if !changed {
		rw.done[id] = nil
		return v, false, nil
	}
	rw.done[id] = nv
	return nv, true, nil
}

// containerID is a container's identity; ok is false for other values.
func containerID(v Value) (any, bool) {
	switch x := v.(type) {
	case *Dict, *List, *Set, *Object:
		return x, true
	case Tuple:
		if len(x) > 0 {
			return tupleID{&x[0], len(x)}, true
		}
	}
	return nil, false
}

func (rw *rewriter) container(v Value, depth int) (Value, bool, error) {
	switch x := v.(type) {
	case *Dict:
		var out *Dict
		for i := 0; i < x.Len(); i++ {
			k, val := x.Item(i)
			nv, changed, err := rw.value(val, depth+1)
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
			na, changed, err := rw.value(x.Attrs, depth+1)
			if err != nil {
				return nil, false, err
			}
			if changed {
				attrs, ok := na.(*Dict)
				if !ok {
					return nil, false, fmt.Errorf("a dict's attributes rewritten to %s", TypeName(na))
				}
				if out == nil {
					out = x.Clone()
				}
				out.Attrs = attrs
			}
		}
		return out, out != nil, nil
	case *List:
		items, changed, err := rw.seq(x.Items, depth)
		if err != nil || !changed {
			return nil, false, err
		}
		return &List{Items: items}, true, nil
	case Tuple:
		items, changed, err := rw.seq(x, depth)
		if err != nil || !changed {
			return nil, false, err
		}
		return Tuple(items), true, nil
	case *Set:
		items, changed, err := rw.seq(x.Items, depth)
		if err != nil || !changed {
			return nil, false, err
		}
		return &Set{Items: items, Frozen: x.Frozen}, true, nil
	case *Object:
		args, ca, err := rw.seq(x.Args, depth)
		if err != nil {
			return nil, false, err
		}
		state, cs, err := rw.value(x.State, depth+1)
		if err != nil {
			return nil, false, err
		}
		if !ca && !cs {
			return nil, false, nil
		}
		o := *x
		if ca {
			o.Args = args
		}
		o.State = state
		return &o, true, nil
	}
	return nil, false, nil
}

func (rw *rewriter) seq(items []Value, depth int) ([]Value, bool, error) {
	var out []Value
	for i, it := range items {
		nv, changed, err := rw.value(it, depth+1)
		if err != nil {
			return nil, false, err
		}
		if changed && out == nil {
			out = append([]Value(nil), items...)
		}
		if out != nil {
			out[i] = nv
		}
	}
	return out, out != nil, nil
}
