package torchfile

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// fixtureDir holds files written by real torch.save and, beside each, the
// values torch read back (testdata/gen/torch_fixtures.py).
const fixtureDir = "../../testdata/fixtures/torch"

// jv is one value of the generator's typed JSON encoding.
type jv struct {
	T      string          `json:"t"`
	V      json.RawMessage `json:"v"`
	Bits   string          `json:"bits"`
	Hex    string          `json:"hex"`
	Items  json.RawMessage `json:"items"`
	Kind   string          `json:"kind"`
	Attrs  *jv             `json:"attrs"`
	Frozen bool            `json:"frozen"`
	Class  string          `json:"class"`
	Name   string          `json:"name"`
	Via    string          `json:"via"`
	Args   []jv            `json:"args"`
	State  *jv             `json:"state"`

	DType        string  `json:"dtype"`
	Shape        []int64 `json:"shape"`
	Stride       []int64 `json:"stride"`
	Offset       int64   `json:"offset"`
	Key          string  `json:"key"`
	StorageNumel int64   `json:"storage_numel"`
	RequiresGrad bool    `json:"requires_grad"`
	Parameter    bool    `json:"parameter"`
	Float32Hex   *string `json:"float32_hex"`
}

type fixture struct {
	File     string `json:"file"`
	Format   string `json:"format"`
	Prefix   string `json:"prefix"`
	Root     jv     `json:"root"`
	Storages map[string]struct {
		DType string `json:"dtype"`
		Numel int64  `json:"numel"`
		Hex   string `json:"hex"`
	} `json:"storages"`
}

func loadFixtures(t testing.TB) []fixture {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(fixtureDir, "*.json"))
	if err != nil || len(paths) < 10 {
		t.Fatalf("fixtures missing in %s (run /usr/bin/python3 testdata/gen/torch_fixtures.py): %v", fixtureDir, err)
	}
	var out []fixture
	for _, p := range paths {
		if b := filepath.Base(p); b == "convert.json" || b == "cast.json" || b == "pickles.json" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var fx fixture
		if err := json.Unmarshal(b, &fx); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out = append(out, fx)
	}
	return out
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFixtures opens every torch-written fixture and checks the format,
// prefix, every value and every tensor byte against what torch read.
func TestFixtures(t *testing.T) {
	for _, fx := range loadFixtures(t) {
		t.Run(fx.File, func(t *testing.T) {
			f, err := Open(filepath.Join(fixtureDir, fx.File))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if string(f.Format) != fx.Format || f.Prefix != fx.Prefix {
				t.Errorf("format %q prefix %q, want %q %q", f.Format, f.Prefix, fx.Format, fx.Prefix)
			}
			c := &comparer{t: t, f: f, byKey: map[string]*Storage{}}
			c.value("root", fx.Root, f.Root)
			if c.tensors == 0 && len(fx.Storages) > 0 {
				t.Errorf("no tensors compared")
			}
			// Storages: exactly torch's, with torch's bytes.
			if len(f.Storages) != len(fx.Storages) {
				t.Errorf("%d storages, want %d", len(f.Storages), len(fx.Storages))
			}
			for _, st := range f.Storages {
				want, ok := fx.Storages[st.Key]
				if !ok {
					t.Errorf("unexpected storage %q", st.Key)
					continue
				}
				if st.DType.String() != want.DType || st.Numel != want.Numel {
					t.Errorf("storage %s: %v[%d], want %s[%d]", st.Key, st.DType, st.Numel, want.DType, want.Numel)
				}
				if p := c.byKey[st.Key]; p != nil && p != st {
					t.Errorf("storage %s: tensors point to a different *Storage than File.Storages", st.Key)
				}
				buf := make([]byte, st.NBytes())
				if _, err := readFull(f.ReaderAt(), buf, st.Offset); err != nil {
					t.Errorf("storage %s: %v", st.Key, err)
				} else if !bytes.Equal(buf, unhex(t, want.Hex)) {
					t.Errorf("storage %s: bytes differ from torch's", st.Key)
				}
			}
		})
	}
}

type comparer struct {
	t       *testing.T
	f       *File
	byKey   map[string]*Storage
	tensors int
}

func (c *comparer) errorf(path, format string, args ...any) {
	c.t.Helper()
	c.t.Errorf("%s: %s", path, fmt.Sprintf(format, args...))
}

func (c *comparer) items(path string, raw json.RawMessage) []jv {
	var items []jv
	if err := json.Unmarshal(raw, &items); err != nil {
		c.t.Fatalf("%s: %v", path, err)
	}
	return items
}

func (c *comparer) value(path string, want jv, got pyobj.Value) {
	c.t.Helper()
	switch want.T {
	case "none":
		if got != nil {
			c.errorf(path, "got %s, want None", pyobj.Repr(got))
		}
	case "bool":
		var b bool
		json.Unmarshal(want.V, &b)
		if g, ok := got.(bool); !ok || g != b {
			c.errorf(path, "got %s, want %v", pyobj.Repr(got), b)
		}
	case "int":
		var s string
		json.Unmarshal(want.V, &s)
		w, _ := new(big.Int).SetString(s, 10)
		switch g := got.(type) {
		case int64:
			if !w.IsInt64() || w.Int64() != g {
				c.errorf(path, "got %d, want %s", g, s)
			}
		case *big.Int:
			if w.IsInt64() {
				c.errorf(path, "got *big.Int for %s, want int64", s)
			} else if g.Cmp(w) != 0 {
				c.errorf(path, "got %s, want %s", g, s)
			}
		default:
			c.errorf(path, "got %s, want int %s", pyobj.TypeName(got), s)
		}
	case "float":
		wb := binaryBE64(c.t, want.Bits)
		g, ok := got.(float64)
		if !ok || math.Float64bits(g) != wb {
			c.errorf(path, "got %s, want float bits %s", pyobj.Repr(got), want.Bits)
		}
	case "str":
		var s string
		json.Unmarshal(want.V, &s)
		if g, ok := got.(string); !ok || g != s {
			c.errorf(path, "got %s, want %q", pyobj.Repr(got), s)
		}
	case "bytes":
		if g, ok := got.(pyobj.Bytes); !ok || !bytes.Equal(g, unhex(c.t, want.Hex)) {
			c.errorf(path, "got %s, want bytes %s", pyobj.Repr(got), want.Hex)
		}
	case "size":
		var s []int64
		json.Unmarshal(want.V, &s)
		if g, ok := got.(pyobj.Size); !ok || fmt.Sprint([]int64(g)) != fmt.Sprint(s) {
			c.errorf(path, "got %s, want torch.Size(%v)", pyobj.Repr(got), s)
		}
	case "dtype":
		var s string
		json.Unmarshal(want.V, &s)
		if g, ok := got.(pyobj.DType); !ok || g.DType.String() != s {
			c.errorf(path, "got %s, want torch.%s", pyobj.Repr(got), s)
		}
	case "list", "tuple":
		items := c.items(path, want.Items)
		var gs []pyobj.Value
		ok := false
		if want.T == "list" {
			if l, isList := got.(*pyobj.List); isList {
				gs, ok = l.Items, true
			}
		} else {
			gs, ok = got.(pyobj.Tuple)
		}
		if !ok || len(gs) != len(items) {
			c.errorf(path, "got %s, want %s of %d", pyobj.Repr(got), want.T, len(items))
			return
		}
		for i, w := range items {
			c.value(fmt.Sprintf("%s[%d]", path, i), w, gs[i])
		}
	case "set":
		items := c.items(path, want.Items)
		g, ok := got.(*pyobj.Set)
		if !ok || g.Frozen != want.Frozen || len(g.Items) != len(items) {
			c.errorf(path, "got %s, want set of %d (frozen %v)", pyobj.Repr(got), len(items), want.Frozen)
			return
		}
		for i, w := range items {
			c.value(fmt.Sprintf("%s{%d}", path, i), w, g.Items[i])
		}
	case "dict":
		var pairs [][2]jv
		if err := json.Unmarshal(want.Items, &pairs); err != nil {
			c.t.Fatalf("%s: %v", path, err)
		}
		g, ok := got.(*pyobj.Dict)
		if !ok {
			c.errorf(path, "got %s, want %s", pyobj.TypeName(got), want.Kind)
			return
		}
		wantKind := pyobj.PlainDict
		if want.Kind == "OrderedDict" {
			wantKind = pyobj.OrderedDict
		}
		if g.Kind != wantKind || g.Len() != len(pairs) {
			c.errorf(path, "got %s of %d, want %s of %d", pyobj.TypeName(g), g.Len(), want.Kind, len(pairs))
			return
		}
		for i, p := range pairs {
			k, v := g.Item(i)
			kp := fmt.Sprintf("%s<key %d>", path, i)
			c.value(kp, p[0], k)
			c.value(path+"["+pyobj.Repr(k)+"]", p[1], v)
		}
		if want.Attrs != nil {
			if g.Attrs == nil {
				c.errorf(path, "attributes missing")
			} else {
				c.value(path+".__dict__", *want.Attrs, g.Attrs)
			}
		} else if g.Attrs != nil {
			c.errorf(path, "unexpected attributes %s", pyobj.Repr(g.Attrs))
		}
	case "enum":
		g, ok := got.(pyobj.Enum)
		if !ok || !g.ByName || g.Class.String() != want.Class || g.Name != want.Name {
			c.errorf(path, "got %s, want %s.%s", pyobj.Repr(got), want.Class, want.Name)
		}
	case "object":
		g, ok := got.(*pyobj.Object)
		if !ok || g.Class.String() != want.Class {
			c.errorf(path, "got %s, want %s object", pyobj.TypeName(got), want.Class)
			return
		}
		wantVia := pyobj.ByReduce
		if want.Via == "newobj" {
			wantVia = pyobj.ByNewObj
		}
		if g.Via != wantVia || len(g.Args) != len(want.Args) {
			c.errorf(path, "constructed via %d with %d args, want %s with %d", g.Via, len(g.Args), want.Via, len(want.Args))
			return
		}
		for i, a := range want.Args {
			c.value(fmt.Sprintf("%s.args[%d]", path, i), a, g.Args[i])
		}
		if want.State != nil {
			if !g.Built {
				c.errorf(path, "state missing")
			} else {
				c.value(path+".state", *want.State, g.State)
			}
		}
	case "tensor":
		c.tensor(path, want, got)
	default:
		c.t.Fatalf("%s: unknown fixture type %q", path, want.T)
	}
}

func binaryBE64(t testing.TB, h string) uint64 {
	b := unhex(t, h)
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v
}

func (c *comparer) tensor(path string, want jv, got pyobj.Value) {
	c.t.Helper()
	g, ok := got.(*Tensor)
	if !ok {
		c.errorf(path, "got %s, want tensor", pyobj.TypeName(got))
		return
	}
	c.tensors++
	if g.DType.String() != want.DType || fmt.Sprint(g.Shape) != fmt.Sprint(want.Shape) ||
		fmt.Sprint(g.Stride) != fmt.Sprint(want.Stride) || g.StorageOffset != want.Offset {
		c.errorf(path, "got %v%v stride %v offset %d, want %s%v stride %v offset %d",
			g.DType, g.Shape, g.Stride, g.StorageOffset, want.DType, want.Shape, want.Stride, want.Offset)
		return
	}
	if g.Storage.Key != want.Key || g.Storage.Numel != want.StorageNumel {
		c.errorf(path, "storage %s[%d], want %s[%d]", g.Storage.Key, g.Storage.Numel, want.Key, want.StorageNumel)
	}
	if prev, ok := c.byKey[want.Key]; ok && prev != g.Storage {
		c.errorf(path, "storage %s is not the same *Storage as another tensor's", want.Key)
	}
	c.byKey[want.Key] = g.Storage
	if g.RequiresGrad != want.RequiresGrad || g.Parameter != want.Parameter {
		c.errorf(path, "requires_grad %v parameter %v, want %v %v", g.RequiresGrad, g.Parameter, want.RequiresGrad, want.Parameter)
	}
	data := unhex(c.t, want.Hex)
	all, err := c.f.ReadTensor(g)
	if err != nil {
		c.errorf(path, "ReadTensor: %v", err)
		return
	}
	if !bytes.Equal(all, data) {
		c.errorf(path, "ReadTensor gives %x, torch %x", all, data)
	}
	// Every sub-range, across rows of strided views included.
	es := int64(g.DType.Size())
	n := g.Numel()
	for start := int64(0); start <= n; start++ {
		for cnt := int64(0); start+cnt <= n; cnt++ {
			buf := make([]byte, cnt*es)
			if err := c.f.ReadRange(g, start, cnt, buf); err != nil {
				c.errorf(path, "ReadRange(%d, %d): %v", start, cnt, err)
				return
			}
			if !bytes.Equal(buf, data[start*es:(start+cnt)*es]) {
				c.errorf(path, "ReadRange(%d, %d) gives %x, want %x", start, cnt, buf, data[start*es:(start+cnt)*es])
				return
			}
		}
	}
	if err := c.f.ReadRange(g, 0, n+1, make([]byte, (n+1)*es)); err == nil {
		c.errorf(path, "ReadRange past the end did not fail")
	}
	if want.Float32Hex != nil {
		fl, err := c.f.ReadFloat32(g, 0, n)
		if err != nil {
			c.errorf(path, "ReadFloat32: %v", err)
		} else if got, want := dtype.Float32Bytes(fl), unhex(c.t, *want.Float32Hex); !bytes.Equal(got, want) {
			c.errorf(path, "ReadFloat32 gives %x, torch's .float() %x", got, want)
		}
	}
}

// TestFixtureSharing checks identities that the JSON cannot express: a list
// referenced twice is one *pyobj.List, views of one flat buffer share one
// *Storage, and the legacy and zip files of one object decode alike.
func TestFixtureSharing(t *testing.T) {
	for _, name := range []string{"values.pt", "legacy_values.pt"} {
		f, err := Open(filepath.Join(fixtureDir, name))
		if err != nil {
			t.Fatal(err)
		}
		a, _ := pyobj.Path(f.Root, "shared_a")
		b, _ := pyobj.Path(f.Root, "shared_b")
		if la, ok := a.(*pyobj.List); !ok || la != b {
			t.Errorf("%s: shared_a and shared_b are not one list", name)
		}
		f.Close()
	}
	f, err := Open(filepath.Join(fixtureDir, "views.pt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var sts []*Storage
	for _, k := range []string{"p0", "p1", "p2", "p2t"} {
		v, err := pyobj.Path(f.Root, k)
		if err != nil {
			t.Fatal(err)
		}
		sts = append(sts, v.(*Tensor).Storage)
	}
	for _, s := range sts[1:] {
		if s != sts[0] {
			t.Errorf("views of the flat buffer do not share one *Storage")
		}
	}
	if len(f.Storages) != 7 {
		t.Errorf("%d storages, want 7", len(f.Storages))
	}
	// The same objects saved in both formats decode to the same tree.
	for _, name := range []string{"dtypes", "views", "values", "objects", "empty", "special"} {
		z, err := Open(filepath.Join(fixtureDir, name+".pt"))
		if err != nil {
			t.Fatal(err)
		}
		l, err := Open(filepath.Join(fixtureDir, "legacy_"+name+".pt"))
		if err != nil {
			t.Fatal(err)
		}
		if zs, ls := render(t, z), render(t, l); zs != ls {
			t.Errorf("%s: zip and legacy files decode differently:\n%s\n---\n%s", name, zs, ls)
		}
		z.Close()
		l.Close()
	}
}

// render lists a file's values with tensor data but without storage keys.
func render(t *testing.T, f *File) string {
	var b strings.Builder
	err := pyobj.Walk(f.Root, pyobj.DefaultLimits(), func(path []pyobj.Value, v pyobj.Value) error {
		s := pyobj.Repr(v)
		if x, ok := v.(*Tensor); ok {
			data, err := f.ReadTensor(x)
			if err != nil {
				return err
			}
			s = fmt.Sprintf("%v%v %v+%d %x", x.DType, x.Shape, x.Stride, x.StorageOffset, data)
		}
		fmt.Fprintf(&b, "%s %s\n", pyobj.PathString(path), s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
