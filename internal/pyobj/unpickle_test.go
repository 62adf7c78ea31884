package pyobj

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
)

const fixtureDir = "../../testdata/fixtures/torch"

// typed renders a value in the JSON encoding of testdata/gen/torch_fixtures.py.
func typed(v Value) any {
	out, _ := typedLimited(v, -1)
	return out
}

// typedLimited is typed with at most limit nodes (no limit if negative):
// shared values are rendered at every reference, which can be exponential.
func typedLimited(v Value, limit int) (any, bool) {
	n := 0
	var out any
	func() {
		defer func() {
			if r := recover(); r != nil && r != errTooBig {
				panic(r)
			}
		}()
		out = typedN(v, &n, limit)
	}()
	return out, limit < 0 || n <= limit
}

var errTooBig = fmt.Errorf("too big")

func typedN(v Value, n *int, limit int) any {
	if *n++; limit >= 0 && *n > limit {
		panic(errTooBig)
	}
	typed := func(v Value) any { return typedN(v, n, limit) }
	m := func(kv ...any) map[string]any {
		out := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	items := func(vs []Value) []any {
		out := make([]any, len(vs))
		for i, x := range vs {
			out[i] = typed(x)
		}
		return out
	}
	switch x := v.(type) {
	case nil:
		return m("t", "none")
	case bool:
		return m("t", "bool", "v", x)
	case int64:
		return m("t", "int", "v", strconv.FormatInt(x, 10))
	case *big.Int:
		if x.IsInt64() {
			return m("t", "error", "v", "small *big.Int "+x.String())
		}
		return m("t", "int", "v", x.String())
	case float64:
		return m("t", "float", "bits", fmt.Sprintf("%016x", math.Float64bits(x)))
	case string:
		return m("t", "str", "v", x)
	case Bytes:
		return m("t", "bytes", "hex", hex.EncodeToString(x))
	case Tuple:
		return m("t", "tuple", "items", items(x))
	case *List:
		return m("t", "list", "items", items(x.Items))
	case *Set:
		// Python's iteration order is not the pickle's: compare sorted.
		its := items(x.Items)
		sort.Slice(its, func(i, j int) bool { return canon(its[i]) < canon(its[j]) })
		return m("t", "set", "frozen", x.Frozen, "items", its)
	case *Dict:
		kind := "dict"
		if x.Kind == OrderedDict {
			kind = "OrderedDict"
		}
		pairs := make([]any, x.Len())
		for i := range pairs {
			k, val := x.Item(i)
			pairs[i] = []any{typed(k), typed(val)}
		}
		out := m("t", "dict", "kind", kind, "items", pairs)
		if x.Attrs != nil {
			out["attrs"] = typed(x.Attrs)
		}
		return out
	case Enum:
		return m("t", "enum", "class", x.Class.String(), "name", x.Name)
	case *Object:
		via := "reduce"
		if x.Via == ByNewObj {
			via = "newobj"
		}
		out := m("t", "object", "class", x.Class.String(), "via", via, "args", items(x.Args))
		if x.Built {
			out["state"] = typed(x.State)
		}
		return out
	case Size:
		return m("t", "size", "v", []int64(x))
	case DType:
		return m("t", "dtype", "v", x.DType.String())
	}
	return m("t", "unsupported", "v", fmt.Sprintf("%T", v))
}

// canon is the JSON of v with sets sorted, for comparisons.
func canon(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// normalize re-encodes fixture JSON so that map keys sort like canon's
// and set items are sorted.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		if x["t"] == "set" {
			its := x["items"].([]any)
			sort.Slice(its, func(i, j int) bool { return canon(its[i]) < canon(its[j]) })
		}
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
	}
	return v
}

// TestCPythonProtocols decodes the same object pickled by CPython with
// protocols 0 to 5 and compares with what CPython itself read back.
func TestCPythonProtocols(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(fixtureDir, "pickles.json"))
	if err != nil {
		t.Fatalf("%v (run /usr/bin/python3 testdata/gen/torch_fixtures.py)", err)
	}
	var fx struct {
		Pickles []struct {
			Proto int    `json:"proto"`
			File  string `json:"file"`
		} `json:"pickles"`
		Value any `json:"value"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	want := canon(normalize(fx.Value))
	if len(fx.Pickles) != 6 {
		t.Fatalf("%d pickles, want protocols 0-5", len(fx.Pickles))
	}
	for _, p := range fx.Pickles {
		t.Run(fmt.Sprint("protocol", p.Proto), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(fixtureDir, p.File))
			if err != nil {
				t.Fatal(err)
			}
			v, err := Unpickle(data, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := canon(typed(v)); got != want {
				t.Errorf("decoded differently from CPython:\n got %s\nwant %s", firstDiff(got, want), firstDiff(want, got))
			}
			a, _ := Path(v, "shared1")
			b, _ := Path(v, "shared2")
			if la, ok := a.(*List); !ok || la != b {
				t.Errorf("shared1 and shared2 are not one list")
			}
			// Encoding what was decoded (protocol 2) and decoding again
			// gives the same value.
			enc, err := Marshal(v, nil)
			if err != nil {
				t.Fatal(err)
			}
			v2, err := Unpickle(enc, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := canon(typed(v2)); got != want {
				t.Errorf("re-encoded pickle decodes differently:\n got %s\nwant %s", firstDiff(got, want), firstDiff(want, got))
			}
		})
	}
}

func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-80)
	return "..." + a[lo:min(len(a), i+80)] + "..."
}

// p builds a protocol-2 pickle from parts: strings are raw bytes.
func p(parts ...string) []byte { return []byte("\x80\x02" + strings.Join(parts, "") + ".") }

func u32(v uint32) string { return string(binary.LittleEndian.AppendUint32(nil, v)) }

func u64(v uint64) string { return string(binary.LittleEndian.AppendUint64(nil, v)) }

// TestUnpickleValues covers opcodes and builtins one at a time.
func TestUnpickleValues(t *testing.T) {
	cases := []struct {
		name string
		pkl  []byte
		want string // Repr of the result, or canon(typed) when it starts with '{'
	}{
		{"LONG1 empty is 0", p("\x8a\x00"), "0"},
		{"LONG4 empty is 0", p("\x8b" + u32(0)), "0"},
		{"LONG1 -128", p("\x8a\x01\x80"), "-128"},
		{"LONG1 2^63", p("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00"), "9223372036854775808"},
		{"LONG1 -2^63 fits int64", p("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"), "-9223372036854775808"},
		{"LONG text", []byte("L-12345678901234567890L\n."), "-12345678901234567890"},
		{"INT text bool", []byte("I01\n."), "True"},
		{"INT text big", []byte("I123456789012345678901234\n."), "123456789012345678901234"},
		{"FLOAT text nan", []byte("Fnan\n."), "nan"},
		{"BINFLOAT", p("G\x3f\xf8\x00\x00\x00\x00\x00\x00"), "1.5"},
		{"STRING escapes", []byte("S'a\\'b\\\\c\\x41\\n\\101'\n."), `"a'b\\cA\nA"`},
		{"UNICODE raw escape", []byte("V\\u00e9\\U0001f680\xe9\n."), `"é🚀é"`},
		{"SHORT_BINUNICODE", p("\x8c\x02hi"), `"hi"`},
		{"BINUNICODE8", p("\x8d" + u64(2) + "hi"), `"hi"`},
		{"BINBYTES", p("B" + u32(2) + "\x00\xff"), "bytes[2]"},
		{"SHORT_BINBYTES", p("C\x01x"), "bytes[1]"},
		{"BYTEARRAY8", p("\x96" + u64(1) + "x"), "bytes[1]"},
		{"bytes via _codecs", p("c_codecs\nencode\nX\x02\x00\x00\x00\xc3\xbfX\x06\x00\x00\x00latin1\x86R"), "bytes[1]"},
		{"FRAME", []byte("\x80\x04\x95" + u64(3) + "K\x07." + ""), "7"},
		{"MEMOIZE and GET", p("]\x94h\x00\x86"), "(list[0], list[0])"},
		{"DUP", p("K\x052\x86"), "(5, 5)"},
		{"POP", p("K\x01K\x020"), "1"},
		{"POP_MARK", p("K\x09(K\x01K\x021"), "9"},
		{"POP of a mark", p("K\x09(0"), "9"},
		{"PUT/GET text", []byte("(lp7\nI1\nag7\n."), "list[1]"},
		{"TUPLE", p("(K\x01K\x02K\x03K\x04t"), "(1, 2, 3, 4)"},
		{"LIST", p("(K\x01l"), "list[1]"},
		{"DICT", p("(K\x01K\x02d"), "dict[1]"},
		{"EMPTY_SET ADDITEMS", p("\x8f(K\x01K\x02\x90"), "set[2]"},
		{"FROZENSET", p("(K\x01\x91"), "set[1]"},
		{"STACK_GLOBAL", p("\x8c\x05torch\x8c\x07float16\x93"), "torch.float16"},
		{"GLOBAL dtype alias", p("ctorch\nhalf\n"), "torch.float16"},
		{"GLOBAL other", p("cos\nsystem\n"), "os.system"},
		{"REDUCE unknown is inert", p("cos\nsystem\nX\x02\x00\x00\x00ls\x85R"), "os.system(...)"},
		{"INST", []byte("(I1\nimy.mod\nCls\n."), "my.mod.Cls(...)"},
		{"OBJ", p("(cmy.mod\nCls\nK\x01o"), "my.mod.Cls(...)"},
		{"NEWOBJ_EX", p("cmy.mod\nCls\n)}\x92"), "my.mod.Cls(...)"},
		{"torch.Size", p("ctorch\nSize\nK\x02K\x03\x86\x85R"), "torch.Size([2, 3])"},
		{"getattr enum", p("c__builtin__\ngetattr\ncm\nColor\nX\x03\x00\x00\x00RED\x86R"), "Color.RED"},
		{"builtins set", p("cbuiltins\nset\n]K\x01a\x85R"), "set[1]"},
		{"copy_reg reconstructor", []byte("ccopy_reg\n_reconstructor\n(cargparse\nNamespace\nc__builtin__\nobject\nNtR(dS'a'\nI1\nsb."), "argparse.Namespace(...)"},
		{"BUILD on OrderedDict", p("ccollections\nOrderedDict\n)R}X\x01\x00\x00\x00aK\x01sb"), "OrderedDict[0]"},
		{"bytes key in OrderedDict", p("ccollections\nOrderedDict\n)RC\x01kK\x01s"), "OrderedDict[1]"},
		{"bytes in set", p("\x8f(C\x01kC\x01k\x90"), "set[2]"},
		{"Size as dict key", p("}ctorch\nSize\nK\x02\x85\x85RK\x01s"), "dict[1]"},
		{"list as dict key", p("}]K\x01s"), "dict[1]"},
		{"tuple with list as dict key", p("}]\x85K\x01s]\x85K\x02s"), "dict[2]"},
		{"READONLY_BUFFER", p("K\x01\x98"), "1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := Unpickle(c.pkl, Options{})
			if err != nil {
				t.Fatal(err)
			}
			got := Repr(v)
			if strings.HasPrefix(c.want, "{") {
				got = canon(typed(v))
			}
			if got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
		})
	}
}

// TestUnpickleErrors: malformed pickles give errors naming the opcode and
// byte, never a panic.
func TestUnpickleErrors(t *testing.T) {
	cases := []struct {
		name string
		pkl  []byte
		opt  Options
		want string
	}{
		{"empty", nil, Options{}, "no STOP opcode"},
		{"unknown opcode", []byte("\x80\x02\xff."), Options{}, "invalid opcode 0xff at byte 2"},
		{"stack underflow", p("\x86"), Options{}, "TUPLE2 at byte 2: stack underflow"},
		{"underflow past mark", p("K\x01(a"), Options{}, "APPEND at byte 5: stack underflow"},
		{"STOP on empty", []byte("."), Options{}, "STOP at byte 0: stack underflow"},
		{"no mark", p("e"), Options{}, "APPENDS at byte 2: no MARK to pop to"},
		{"odd SETITEMS", p("}(K\x01u"), Options{}, "odd number of items (1)"},
		{"memo missing", p("j" + u32(70000)), Options{}, "memo key 70000 was never stored"},
		{"PUT on empty stack", p("q\x01"), Options{}, "BINPUT at byte 2: stack underflow"},
		{"GET bad text index", []byte("gx\n."), Options{}, `bad memo index "x"`},
		{"SETITEM on list", p("]K\x01K\x02s"), Options{}, "SETITEM requires DictSetter"},
		{"ADDITEMS on frozenset", p("(\x91(K\x01\x90"), Options{}, "ADDITEMS requires SetAdder"},
		{"BUILD on int", p("K\x01}b"), Options{}, "BUILD requires a PyDictSettable instance"},
		{"BUILD on a list", p("]}b"), Options{}, "BUILD requires a PyDictSettable instance"},
		{"OrderedDict with arguments", p("ccollections\nOrderedDict\n]K\x01K\x02\x86a\x85R"), Options{}, "OrderedDictClass.Call args not supported"},
		{"REDUCE on dtype", p("ctorch\nfloat32\n)R"), Options{}, "cannot call torch.dtype"},
		{"REDUCE args not tuple", p("cos\nsystem\n]R"), Options{}, "REDUCE args must be *Tuple"},
		{"NEWOBJ on int", p("K\x01)\x81"), Options{}, "NEWOBJ requires a PyNewable object"},
		{"STACK_GLOBAL not strings", p("K\x01K\x02\x93"), Options{}, "STACK_GLOBAL requires str name"},
		{"getattr misuse", p("c__builtin__\ngetattr\nK\x01\x85R"), Options{}, "only getattr(class, 'name')"},
		{"torch.Size of strings", p("ctorch\nSize\nX\x00\x00\x00\x00\x85\x85R"), Options{}, "element 0 is str"},
		{"_codecs bad encoding", p("c_codecs\nencode\nX\x00\x00\x00\x00X\x03\x00\x00\x00rot\x86R"), Options{}, `unsupported encoding "rot"`},
		{"EXT1", p("\x82\x01"), Options{}, "unsupported extension code"},
		{"NEXT_BUFFER", p("\x97"), Options{}, "refers to out-of-band data"},
		{"persistent id without hook", p("X\x00\x00\x00\x00Q"), Options{}, "persistent id in a pickle that allows none"},
		{"PERSID text without hook", []byte("Pid\n."), Options{}, "persistent id in a pickle that allows none"},
		{"protocol 6", []byte("\x80\x06N."), Options{}, "unsupported pickle protocol: 6"},
		{"bad float text", []byte("Fx\n."), Options{}, `bad float "x"`},
		{"bad int text", []byte("I1x\n."), Options{}, `bad integer "1x"`},
		{"STRING unquoted", []byte("Sabc\n."), Options{}, "the STRING argument must be quoted"},
		{"bad raw unicode", []byte("V\\u12\n."), Options{}, "truncated"},
		{"BINUNICODE8 2^60", p("\x8d" + u64(1<<60) + "ab"), Options{}, "BINUNICODE8 at byte 2 claims 1152921504606846976 bytes but only 3 are left"},
		{"BINBYTES8 2^64-1", p("\x8e" + u64(math.MaxUint64)), Options{}, "claims 18446744073709551615 bytes"},
		{"FRAME 2^60", []byte("\x80\x04\x95" + u64(1<<60) + "N."), Options{}, "FRAME at byte 2 claims"},
		{"LONG4 negative", p("\x8b\xff\xff\xff\xff"), Options{}, "LONG4 at byte 2 has negative length"},
		{"BINSTRING negative", p("T\xff\xff\xff\xff"), Options{}, "BINSTRING at byte 2 has negative length"},
		{"line too long", []byte("c" + strings.Repeat("m", 100) + "\nx\n."), Options{Limits: Limits{MaxOps: 100, MaxDepth: 10, MaxLine: 50}}, "argument line missing or longer than 50 bytes"},
		{"too many ops", p(strings.Repeat("N0", 100)), Options{Limits: Limits{MaxOps: 50}}, "more than 50 opcodes"},
		{"depth limit", p("]]]]aaa"), Options{Limits: Limits{MaxDepth: 3}}, "objects nest deeper than 3 levels"},
		{"mark limit", p(strings.Repeat("(", 30) + "N"), Options{Limits: Limits{MaxDepth: 2}}, "more than 24 nested MARKs"},
		{"memory budget", p(strings.Repeat("N0", 100)), Options{Limits: Limits{MaxBytes: 4096}}, "memory budget of 4096 bytes (31 opcodes by byte 32"},
		// 3 MB of opcodes would take ~400 MB as Go values: past the default
		// budget of a 3 MB pickle (16 times its size, at least 256 MiB).
		{"default memory budget", p(strings.Repeat("N0", 1_500_000)), Options{}, "more than its memory budget of 256 MiB"},
		{"cycle via list", p("]q\x00h\x00a"), Options{}, "list contains itself"},
		{"cycle via object state", p("cm\nC\n)\x81q\x00}X\x01\x00\x00\x00sh\x00sb"), Options{}, "m.C contains itself"},
		{"cycle via dict attrs", p("ccollections\nOrderedDict\n)Rq\x00}X\x01\x00\x00\x00ah\x00sb"), Options{}, "OrderedDict contains itself"},
		{"hook error", p("cm\nf\n)R"), Options{Hooks: Hooks{Resolve: func(m, n string) (Callable, bool) { return failing{}, true }}}, "pickle: at byte 9: m.f: boom"},
		{"persistent hook error", p("N\x85Q"), Options{Hooks: Hooks{PersistentLoad: func(Value) (Value, error) { return nil, fmt.Errorf("no such storage") }}}, "pickle: at byte 5: no such storage"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := Unpickle(c.pkl, c.opt)
			if err == nil {
				t.Fatalf("no error, got %s", Repr(v))
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), "malformed") {
				t.Errorf("caught by recover: %v", err)
			}
		})
	}
}

type failing struct{}

func (failing) CallPy([]Value) (Value, error) { return nil, fmt.Errorf("boom") }

// TestHooksReceiveValues: hooks get decoded arguments, resolved functions
// among them as FuncRef, and persistent ids as decoded tuples.
func TestHooksReceiveValues(t *testing.T) {
	var gotArgs []Value
	var pid Value
	rec := recorder(func(a []Value) (Value, error) { gotArgs = a; return "made", nil })
	opt := Options{
		Hooks: Hooks{
			Resolve: func(m, n string) (Callable, bool) {
				if m == "lib" {
					return rec, true
				}
				return nil, false
			},
			PersistentLoad: func(v Value) (Value, error) { pid = v; return "storage", nil },
		},
		Globals: map[string]int{},
	}
	// lib.f(lib.g, (1, 'x'), persistent(('storage', 7)))
	pkl := p("clib\nf\n(clib\ng\nK\x01X\x01\x00\x00\x00x\x86X\x07\x00\x00\x00storageK\x07\x86QtR")
	v, err := Unpickle(pkl, opt)
	if err != nil {
		t.Fatal(err)
	}
	if v != "made" || len(gotArgs) != 3 {
		t.Fatalf("got %v with args %v", v, gotArgs)
	}
	if fr, ok := gotArgs[0].(FuncRef); !ok || fr.Global.String() != "lib.g" {
		t.Errorf("argument 0 is %T, want FuncRef lib.g", gotArgs[0])
	}
	if Repr(gotArgs[1]) != `(1, "x")` || gotArgs[2] != "storage" || Repr(pid) != `("storage", 7)` {
		t.Errorf("args %s %v, pid %s", Repr(gotArgs[1]), gotArgs[2], Repr(pid))
	}
	if opt.Globals["lib.f"] != 1 || opt.Globals["lib.g"] != 1 {
		t.Errorf("globals %v", opt.Globals)
	}
}

type recorder func([]Value) (Value, error)

func (r recorder) CallPy(a []Value) (Value, error) { return r(a) }

// TestSharedBombs: pickles whose values share sub-objects so that their
// expansion doubles per level must decode, hash, print and walk in
// bounded time.
func TestSharedBombs(t *testing.T) {
	// t0 = ('s'*256, 's'*256); t_{i+1} = (t_i, t_i); 60 levels; used as a
	// dict key and as a value.
	b := "}X\x00\x01\x00\x00" + strings.Repeat("s", 256) + "q\x000"
	for i := 0; i < 60; i++ {
		b += "h" + string(rune(i)) + "h" + string(rune(i)) + "\x86q" + string(rune(i+1)) + "0"
	}
	b += "h<Ns" + "X\x01\x00\x00\x00vh<s"
	v, err := Unpickle(p(b), Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := v.(*Dict)
	if d.Len() != 2 {
		t.Fatalf("%d items", d.Len())
	}
	k, _ := d.Item(0)
	if _, ok := d.Get(k); !ok {
		t.Errorf("unhashable key not found by identity")
	}
	if r := Repr(k); len(r) > 200 {
		t.Errorf("Repr of the shared tuple is %d bytes", len(r))
	}
	if testing.Short() {
		return
	}
	// Walk follows every path, so it stops at MaxVisits.
	err = Walk(v, DefaultLimits(), func([]Value, Value) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "values to walk") {
		t.Errorf("Walk: %v", err)
	}
}

// TestDictKeys: Python equality for hashable keys, identity otherwise,
// and no panics on uncomparable keys.
func TestDictKeys(t *testing.T) {
	d := NewDict(PlainDict)
	d.Set(int64(1), "int")
	d.Set(true, "bool") // True == 1 in Python
	d.Set(1.0, "float") // 1.0 == 1
	d.Set(Tuple{int64(1), "a"}, "tuple")
	d.Set(Bytes("k"), "bytes")
	d.Set(Size{2, 3}, "size")
	l := &List{}
	d.Set(l, "list")
	d.Set(Tuple{l}, "tuple with list")
	if d.Len() != 6 {
		t.Errorf("%d keys, want 6", d.Len())
	}
	for _, c := range []struct {
		k    Value
		want string
	}{
		{int64(1), "float"}, {Tuple{int64(1), "a"}, "tuple"}, {Bytes("k"), "bytes"}, {l, "list"},
		{DType{dtype.Float16}, ""}, {Size{2, 3}, "size"}, {Tuple{int64(2), int64(3)}, "size"}, {&List{}, ""}, {Tuple{&List{}}, ""},
	} {
		v, ok := d.Get(c.k)
		if got, _ := v.(string); got != c.want || ok != (c.want != "") {
			t.Errorf("Get(%s) = %v %v, want %q", Repr(c.k), v, ok, c.want)
		}
	}
	d.Delete(Bytes("k"))
	if _, ok := d.Get(Bytes("k")); ok || d.Len() != 5 {
		t.Errorf("Delete did not remove bytes key")
	}
}

// TestMarshalAttrs: an OrderedDict with attributes (a state_dict's
// _metadata) encodes as CPython does, items then BUILD.
func TestMarshalAttrs(t *testing.T) {
	sd := NewDict(OrderedDict)
	sd.Set("w", int64(1))
	sd.Attrs = DictOf("_metadata", DictOf("", DictOf("version", int64(1))))
	b, err := Marshal(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "\x80\x02ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00wK\x01u}(X\t\x00\x00\x00_metadata}(X\x00\x00\x00\x00}(X\x07\x00\x00\x00versionK\x01uuub."
	if string(b) != want {
		t.Errorf("got %q\nwant %q", b, want)
	}
	v, err := Unpickle(b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, wantC := canon(typed(v)), canon(typed(sd)); got != wantC {
		t.Errorf("round trip: %s, want %s", got, wantC)
	}
}

// TestScanNeed: a truncated pickle tells how many bytes it claims.
func TestScanNeed(t *testing.T) {
	_, err := Scan(p("X"+u32(100)+"abc"), DefaultLimits())
	var te *TruncatedError
	if !asTruncated(err, &te) || te.Need != 2+1+4+100 {
		t.Fatalf("got %v", err)
	}
	if _, err := Scan(bytes.Repeat([]byte("N"), 10), DefaultLimits()); !asTruncated(err, &te) {
		t.Fatalf("no-STOP pickle: %v", err)
	}
}

func asTruncated(err error, te **TruncatedError) bool {
	x, ok := err.(*TruncatedError)
	*te = x
	return ok
}

// TestMarshalShared: shared containers are written once and stay shared;
// unshared trees carry no memo opcodes.
func TestMarshalShared(t *testing.T) {
	l := &List{Items: []Value{int64(1)}}
	tup := Tuple{"a", "b"}
	b, err := Marshal(DictOf("x", l, "y", l, "t1", tup, "t2", tup, "u", &List{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "\x80\x02}(X\x01\x00\x00\x00x]q\x00(K\x01eX\x01\x00\x00\x00yh\x00" +
		"X\x02\x00\x00\x00t1X\x01\x00\x00\x00aX\x01\x00\x00\x00b\x86q\x01X\x02\x00\x00\x00t2h\x01" +
		"X\x01\x00\x00\x00u]u."
	if string(b) != want {
		t.Errorf("got  %q\nwant %q", b, want)
	}
	v, err := Unpickle(b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	x, _ := Path(v, "x")
	y, _ := Path(v, "y")
	if x.(*List) != y.(*List) {
		t.Errorf("shared list decoded as two lists")
	}
	// A doubling DAG of 60 levels encodes in linear size.
	var bomb Value = Tuple{"s", "s"}
	for i := 0; i < 60; i++ {
		bomb = Tuple{bomb, bomb}
	}
	b, err = Marshal(&List{Items: []Value{bomb}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 2000 {
		t.Errorf("shared tuples encoded in %d bytes", len(b))
	}
	if _, err := Unpickle(b, Options{}); err != nil {
		t.Fatal(err)
	}
}

// TestSharedScalars: a long string referenced many times is written once,
// and a dict with many keys that are one big shared tuple decodes in
// linear time (each key's hash is bounded).
func TestSharedScalars(t *testing.T) {
	long := strings.Repeat("x", 100_000)
	items := make([]Value, 1000)
	for i := range items {
		items[i] = long
	}
	b, err := Marshal(&List{Items: items}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 110_000 {
		t.Errorf("1000 references to one string take %d bytes", len(b))
	}
	v, err := Unpickle(b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if l := v.(*List); len(l.Items) != 1000 || l.Items[999] != long {
		t.Errorf("decoded %s", Repr(v))
	}
	// {(s,): k for k in 0..} with s a 2000-byte string, 200k times.
	pkl := "}X" + u32(2000) + strings.Repeat("s", 2000) + "\x85q\x000(" + strings.Repeat("h\x00N", 200_000) + "u"
	v, err = Unpickle(p(pkl), Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The key is beyond the hash budget, so it is compared by identity:
	// one object, one entry.
	if d := v.(*Dict); d.Len() != 1 {
		t.Errorf("%d entries, want 1", d.Len())
	}
	// String keys and tuple keys never collide.
	d := NewDict(PlainDict)
	d.Set("a", int64(1))
	d.Set(Tuple{"a"}, int64(2))
	d.Set("s1:a;", int64(3))
	if d.Len() != 3 {
		t.Errorf("keys collide: %d entries", d.Len())
	}
}
