package pyobj

import "fmt"

// checkTree rejects cycles and nesting deeper than maxDepth containers.
// Shared containers are checked once (with their height remembered), so a
// pickle that references one list from many places costs linear time.
func checkTree(v Value, maxDepth int) error {
	c := &treeCheck{max: maxDepth, height: map[any]int{}, busy: map[any]bool{}}
	_, err := c.check(v, 0)
	return err
}

type treeCheck struct {
	max    int
	height map[any]int
	busy   map[any]bool
}

// tupleID identifies a tuple by its backing array: memoized tuples are
// the same slice.
type tupleID struct {
	p *Value
	n int
}

func (c *treeCheck) check(v Value, depth int) (int, error) {
	var id any
	var kids func(func(Value) error) error
	switch x := v.(type) {
	case *List:
		id = x
		kids = func(f func(Value) error) error { return each(x.Items, f) }
	case Tuple:
		if len(x) == 0 {
			return 0, nil
		}
		id = tupleID{&x[0], len(x)}
		kids = func(f func(Value) error) error { return each(x, f) }
	case *Dict:
		id = x
		kids = func(f func(Value) error) error {
			if err := each(x.keys, f); err != nil {
				return err
			}
			if err := each(x.vals, f); err != nil {
				return err
			}
			if x.Attrs != nil {
				return f(x.Attrs)
			}
			return nil
		}
	case *Set:
		id = x
		kids = func(f func(Value) error) error { return each(x.Items, f) }
	case *Object:
		id = x
		kids = func(f func(Value) error) error {
			if err := each(x.Args, f); err != nil {
				return err
			}
			return f(x.State)
		}
	default:
		return 0, nil
	}
	if h, ok := c.height[id]; ok {
		if depth+h > c.max {
			return 0, fmt.Errorf("pickle: objects nest deeper than %d levels", c.max)
		}
		return h, nil
	}
	if depth >= c.max {
		return 0, fmt.Errorf("pickle: objects nest deeper than %d levels", c.max)
	}
	if c.busy[id] {
		return 0, fmt.Errorf("pickle: %s contains itself (cycles are not supported)", TypeName(v))
	}
	c.busy[id] = true
	h := 1
	err := kids(func(k Value) error {
		kh, err := c.check(k, depth+1)
		h = max(h, kh+1)
		return err
	})
	delete(c.busy, id)
	if err != nil {
		return 0, err
	}
	c.height[id] = h
	return h, nil
}

func each(vs []Value, f func(Value) error) error {
	for _, v := range vs {
		if err := f(v); err != nil {
			return err
		}
	}
	return nil
}
