package pyobj

import (
	"fmt"
	"strings"
)

// Dec reads typed values out of a decoded pickle, as a binary decoder reads
// fields out of a buffer: each call returns the value or, when the value is
// missing or of another type, a zero value, and the first such failure is
// kept with the file name and the subscript path where it happened. Every
// later call on any Dec of the same root returns zero values, so a reader
// makes its calls in a row and checks Err once:
//
//	root := pyobj.NewDec(path, f.Root)
//	osd := root.Dict("optimizer_state_dict")
//	count := osd.Int("partition_count")
//	if err := root.Err(); err != nil { ... }
//
// The Opt* calls accept a missing key (or None) and still fail on a value of
// another type: a malformed value is an error, never "absent".
type Dec struct {
	st   *decState
	path []Value
	v    Value
	none bool // absent (an Opt miss) or after a failure: reads give zero values
}

type decState struct {
	name string
	err  error
}

// NewDec returns a Dec of v, whose errors name name (a file; "" when the
// caller names it).
func NewDec(name string, v Value) Dec {
	return Dec{st: &decState{name: name}, v: v}
}

// Err returns the first failure of any Dec of this root, or nil.
func (d Dec) Err() error { return d.st.err }

// Value returns the value d stands for (nil after a failure).
func (d Dec) Value() Value { return d.v }

// Path renders d's position as a Python subscript chain: ['a'][0].
func (d Dec) Path() string { return PathString(d.path) }

// Failf records a failure at d's position (unless one is recorded), for
// checks the typed calls do not make.
func (d Dec) Failf(format string, a ...any) {
	d.failAt(d.path, fmt.Sprintf(format, a...))
}

func (d Dec) failAt(path []Value, msg string) {
	if d.st.err != nil {
		return
	}
	var parts []string
	if d.st.name != "" {
		parts = append(parts, d.st.name)
	}
	if len(path) > 0 {
		parts = append(parts, PathString(path))
	}
	parts = append(parts, msg)
	d.st.err = &DecodeError{Name: d.st.name, Path: PathString(path), msg: strings.Join(parts, ": ")}
}

// DecodeError is the failure a Dec records.
type DecodeError struct {
	Name string // the file
	Path string // subscript chain of the offending value
	msg  string
}

func (e *DecodeError) Error() string { return e.msg }

func (d Dec) child(k, v Value) Dec {
	return Dec{st: d.st, path: append(d.path[:len(d.path):len(d.path)], k), v: v}
}

// failed is the Dec of an absent value or of one after a failure: its
// reads return zero values and record nothing.
func (d Dec) failed() Dec { return Dec{st: d.st, path: d.path, none: true} }

func (d Dec) ok() bool { return d.st.err == nil && !d.none }

// AsDict returns d's value as a dict.
func (d Dec) AsDict() *Dict {
	if !d.ok() {
		return nil
	}
	x, ok := d.v.(*Dict)
	if !ok {
		d.Failf("got %s, want dict", TypeName(d.v))
	}
	return x
}

// Opt returns d[key] and whether it is present and not None; d must be a dict.
func (d Dec) Opt(key Value) (Dec, bool) {
	m := d.AsDict()
	if m == nil {
		return d.failed(), false
	}
	v, ok := m.Get(key)
	if !ok || v == nil {
		return d.failed(), false
	}
	return d.child(key, v), true
}

// Has reports whether d (a dict) has key, None or not.
func (d Dec) Has(key Value) bool {
	m := d.AsDict()
	if m == nil {
		return false
	}
	_, ok := m.Get(key)
	return ok
}

// Key returns d[key], failing when d is no dict or key is missing.
func (d Dec) Key(key Value) Dec {
	m := d.AsDict()
	if m == nil {
		return d.failed()
	}
	v, ok := m.Get(key)
	if !ok {
		d.Failf("missing key %s", Repr(key))
		return d.failed()
	}
	return d.child(key, v)
}

// Index returns item i of d (a list or tuple).
func (d Dec) Index(i int) Dec {
	items := d.items()
	if !d.ok() {
		return d.failed()
	}
	if i < 0 || i >= len(items) {
		d.Failf("no item %d (length %d)", i, len(items))
		return d.failed()
	}
	return d.child(int64(i), items[i])
}

func (d Dec) items() []Value {
	if !d.ok() {
		return nil
	}
	items, ok := Seq(d.v)
	if !ok {
		d.Failf("got %s, want list", TypeName(d.v))
	}
	return items
}

// AsList returns the items of d (a list or tuple).
func (d Dec) AsList() []Dec {
	items := d.items()
	if items == nil {
		return nil
	}
	out := make([]Dec, len(items))
	for i, it := range items {
		out[i] = d.child(int64(i), it)
	}
	return out
}

// Items returns the string keys and values of d (a dict), in order;
// a key of another type is a failure.
func (d Dec) Items() []DecItem {
	m := d.AsDict()
	if m == nil {
		return nil
	}
	out := make([]DecItem, 0, m.Len())
	for i := 0; i < m.Len(); i++ {
		k, v := m.Item(i)
		s, ok := k.(string)
		if !ok {
			d.Failf("key %s is %s, want str", Repr(k), TypeName(k))
			return nil
		}
		out = append(out, DecItem{Key: s, Dec: d.child(k, v)})
	}
	return out
}

// DecItem is one item of a dict with string keys.
type DecItem struct {
	Key string
	Dec
}

// AsInt returns d's value as an int (a Python int or bool that fits int64).
func (d Dec) AsInt() int64 {
	if !d.ok() {
		return 0
	}
	n, ok := Int(d.v)
	if !ok {
		d.Failf("got %s, want int", TypeName(d.v))
	}
	return n
}

// AsFloat returns d's value as a float (a Python float or int).
func (d Dec) AsFloat() float64 {
	if !d.ok() {
		return 0
	}
	f, ok := Float(d.v)
	if !ok {
		d.Failf("got %s, want float", TypeName(d.v))
	}
	return f
}

// AsStr returns d's value as a string.
func (d Dec) AsStr() string { return As[string](d, "str") }

// AsBool returns d's value as a bool.
func (d Dec) AsBool() bool { return As[bool](d, "bool") }

// AsInts returns d's value as a list, tuple or torch.Size of ints.
func (d Dec) AsInts() []int64 {
	if !d.ok() {
		return nil
	}
	ns, ok := Ints(d.v)
	if !ok {
		d.Failf("got %s, want a list of ints", TypeName(d.v))
	}
	return ns
}

// AsStrings returns d's value as a list or tuple of strings.
func (d Dec) AsStrings() []string {
	if !d.ok() {
		return nil
	}
	ss, ok := Strings(d.v)
	if !ok {
		d.Failf("got %s, want a list of str", TypeName(d.v))
	}
	return ss
}

// As returns d's value as a T, naming the wanted type want in the failure
// (for types of other packages, such as torch tensors).
func As[T any](d Dec, want string) T {
	var zero T
	if !d.ok() {
		return zero
	}
	x, ok := d.v.(T)
	if !ok {
		d.Failf("got %s, want %s", TypeName(d.v), want)
	}
	return x
}

// Dict returns d[key] as a dict Dec.
func (d Dec) Dict(key Value) Dec {
	c := d.Key(key)
	if c.AsDict() == nil {
		return d.failed()
	}
	return c
}

// OptDict returns d[key] as a dict Dec, and false when key is missing or None.
func (d Dec) OptDict(key Value) (Dec, bool) {
	c, ok := d.Opt(key)
	if !ok || c.AsDict() == nil {
		return d.failed(), false
	}
	return c, true
}

// List returns the items of d[key] (a list or tuple).
func (d Dec) List(key Value) []Dec { return d.Key(key).AsList() }

// Int returns d[key] as an int.
func (d Dec) Int(key Value) int64 { return d.Key(key).AsInt() }

// Str returns d[key] as a string.
func (d Dec) Str(key Value) string { return d.Key(key).AsStr() }

// Bool returns d[key] as a bool.
func (d Dec) Bool(key Value) bool { return d.Key(key).AsBool() }

// Float returns d[key] as a float.
func (d Dec) Float(key Value) float64 { return d.Key(key).AsFloat() }

// OptInt returns d[key] as an int, or def when key is missing or None.
func (d Dec) OptInt(key Value, def int64) int64 {
	if c, ok := d.Opt(key); ok {
		return c.AsInt()
	}
	return def
}

// OptFloat returns d[key] as a float, or def when key is missing or None.
func (d Dec) OptFloat(key Value, def float64) float64 {
	if c, ok := d.Opt(key); ok {
		return c.AsFloat()
	}
	return def
}

// OptStr returns d[key] as a string, or def when key is missing or None.
func (d Dec) OptStr(key Value, def string) string {
	if c, ok := d.Opt(key); ok {
		return c.AsStr()
	}
	return def
}

// OptBool returns d[key] as a bool, or def when key is missing or None.
func (d Dec) OptBool(key Value, def bool) bool {
	if c, ok := d.Opt(key); ok {
		return c.AsBool()
	}
	return def
}

// AsObject returns d's value as an object of the class named class (the
// name without its module; "" accepts any class).
func (d Dec) AsObject(class string) *Object {
	if !d.ok() {
		return nil
	}
	o, ok := d.v.(*Object)
	switch {
	case !ok:
		d.Failf("got %s, want %s", TypeName(d.v), orAny(class, "an object"))
	case class != "" && (o.Class == nil || o.Class.Name != class):
		d.Failf("got %s, want %s", TypeName(d.v), class)
		return nil
	}
	return o
}

func orAny(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Object returns d as a Dec of an object of class (see AsObject), whose
// attributes Attr and OptAttr read.
func (d Dec) Object(class string) Dec {
	if d.AsObject(class) == nil {
		return d.failed()
	}
	return d
}

// OptAttr returns attribute name of d (an object) and whether it is
// present and not None.
func (d Dec) OptAttr(name string) (Dec, bool) {
	o := d.AsObject("")
	if o == nil {
		return d.failed(), false
	}
	v, ok := o.Attr(name)
	if !ok || v == nil {
		return d.failed(), false
	}
	return d.child(attrName(name), v), true
}

// Attr returns attribute name of d (an object), failing when it is missing.
func (d Dec) Attr(name string) Dec {
	o := d.AsObject("")
	if o == nil {
		return d.failed()
	}
	v, ok := o.Attr(name)
	if !ok {
		d.Failf("%s has no attribute %s", TypeName(o), name)
		return d.failed()
	}
	return d.child(attrName(name), v)
}

// At returns a Dec of v at d's position extended by key, for values a
// caller took apart itself (an object's state tuple, its call arguments).
func (d Dec) At(key, v Value) Dec {
	if !d.ok() {
		return d.failed()
	}
	return d.child(key, v)
}

// Pairs returns the items of d (a dict) whose keys may be of any type
// (objects as keys): item i's key sits at .keys()[i], its value at
// .values()[i].
func (d Dec) Pairs() []DecPair {
	m := d.AsDict()
	if m == nil {
		return nil
	}
	out := make([]DecPair, m.Len())
	for i := range out {
		k, v := m.Item(i)
		out[i] = DecPair{Key: d.child(seqPos{"keys", i}, k), Val: d.child(seqPos{"values", i}, v)}
	}
	return out
}

// DecPair is one item of a dict read by Pairs.
type DecPair struct{ Key, Val Dec }

// attrName is an attribute in a Dec path, rendered .name.
type attrName string

// seqPos is item i of a dict's keys() or values() in a Dec path.
type seqPos struct {
	of string
	i  int
}
