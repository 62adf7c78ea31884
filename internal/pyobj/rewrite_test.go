package pyobj

import (
	"strings"
	"testing"
)

// marker stands for a tensor: the value a rewrite replaces.
type marker struct{ n int }

func markerToInt(v Value) (Value, bool, error) {
	if m, ok := v.(*marker); ok {
		return int64(m.n), true, nil
	}
	return nil, false, nil
}

func TestRewriteCoversEveryContainer(t *testing.T) {
	m := &marker{7}
	attrs := DictOf("a", m)
	d := DictOf("x", m)
	d.Attrs = attrs
	obj := &Object{Class: &Global{"m", "C"}, Args: []Value{m}, State: DictOf("s", m)}
	set := &Set{Items: []Value{m}, Frozen: true}
	in := &List{Items: []Value{d, Tuple{m, "t"}, obj, set}}
	out, err := Rewrite(in, DefaultLimits(), markerToInt)
	if err != nil {
		t.Fatal(err)
	}
	var markers int
	if err := Walk(in, DefaultLimits(), func(_ []Value, v Value) error {
		if _, ok := v.(*marker); ok {
			markers++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if markers == 0 {
		t.Fatal("the input lost its markers: Rewrite modified it")
	}
	l := out.(*List)
	od := l.Items[0].(*Dict)
	if v, _ := od.Get("x"); v != int64(7) {
		t.Errorf("dict value: %v", v)
	}
	if v, _ := od.Attrs.Get("a"); v != int64(7) {
		t.Errorf("dict attrs: %v", v)
	}
	if tu := l.Items[1].(Tuple); tu[0] != int64(7) || tu[1] != "t" {
		t.Errorf("tuple: %v", tu)
	}
	oo := l.Items[2].(*Object)
	if oo.Args[0] != int64(7) || oo.Class != obj.Class {
		t.Errorf("object args: %v", oo.Args)
	}
	if v, _ := oo.State.(*Dict).Get("s"); v != int64(7) {
		t.Errorf("object state: %v", v)
	}
	if os := l.Items[3].(*Set); os.Items[0] != int64(7) || !os.Frozen {
		t.Errorf("set: %+v", os)
	}
}

func TestRewriteSharing(t *testing.T) {
	plain := DictOf("k", "v")
	holder := &List{Items: []Value{&marker{1}}}
	in := Tuple{plain, holder, holder, plain}
	out, err := Rewrite(in, DefaultLimits(), markerToInt)
	if err != nil {
		t.Fatal(err)
	}
	o := out.(Tuple)
	if o[0] != plain || o[3] != plain {
		t.Error("a container without replacements was copied")
	}
	if o[1] == holder {
		t.Error("a container with a replacement was not copied")
	}
	if o[1] != o[2] {
		t.Error("a container reached twice gave two copies")
	}
	same, err := Rewrite(plain, DefaultLimits(), markerToInt)
	if err != nil || same != plain {
		t.Errorf("nothing to replace: got %v, %v", same, err)
	}
}

func TestRewriteErrors(t *testing.T) {
	var deep Value = &marker{1}
	for i := 0; i < 20; i++ {
		deep = &List{Items: []Value{deep}}
	}
	cases := []struct {
		name string
		v    Value
		lim  Limits
		fn   func(Value) (Value, bool, error)
		want string
	}{
		{"too deep", deep, Limits{MaxDepth: 10}, markerToInt, "nest deeper than 10"},
		{"fn fails", DictOf("a", &marker{1}), DefaultLimits(), func(v Value) (Value, bool, error) {
			if _, ok := v.(*marker); ok {
				return nil, false, errString("no")
			}
			return nil, false, nil
		}, "no"},
		{"attrs not a dict", func() Value { d := NewDict(PlainDict); d.Attrs = DictOf(); return d }(), DefaultLimits(),
			func(v Value) (Value, bool, error) {
				if d, ok := v.(*Dict); ok && d.Attrs == nil {
					return "x", true, nil
				}
				return nil, false, nil
			}, "attributes rewritten to str"},
	}
	for _, c := range cases {
		_, err := Rewrite(c.v, c.lim, c.fn)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestWalkLimits(t *testing.T) {
	var deep Value = int64(1)
	for i := 0; i < 20; i++ {
		deep = &List{Items: []Value{deep}}
	}
	visit := func([]Value, Value) error { return nil }
	if err := Walk(deep, Limits{MaxDepth: 10}, visit); err == nil || !strings.Contains(err.Error(), "deeper than 10") {
		t.Errorf("Walk past MaxDepth 10: %v", err)
	}
	if err := Walk(deep, Limits{MaxDepth: 30}, visit); err != nil {
		t.Errorf("Walk within MaxDepth 30: %v", err)
	}
}
