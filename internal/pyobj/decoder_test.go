package pyobj

import (
	"errors"
	"testing"
)

func TestDecReads(t *testing.T) {
	root := NewDec("f.pt", DictOf(
		"osd", DictOf("count", int64(3), "flag", true, "name", "adam", "lr", 0.5, "none", nil),
		"groups", &List{Items: []Value{DictOf("n", int64(1)), DictOf("n", int64(2))}},
		"shape", Size{2, 3},
		"names", Tuple{"a", "b"},
	))
	osd := root.Dict("osd")
	if n := osd.Int("count"); n != 3 {
		t.Errorf("Int: %d", n)
	}
	if !osd.Bool("flag") || osd.Str("name") != "adam" || osd.Float("lr") != 0.5 {
		t.Error("Bool/Str/Float")
	}
	if osd.OptInt("none", 9) != 9 || osd.OptInt("missing", 8) != 8 || osd.OptStr("missing", "d") != "d" {
		t.Error("Opt defaults")
	}
	if absent, ok := osd.OptDict("missing"); ok || absent.Items() != nil || absent.AsInt() != 0 {
		t.Error("OptDict of a missing key")
	}
	var sum int64
	for _, g := range root.List("groups") {
		sum += g.Int("n")
	}
	if sum != 3 {
		t.Errorf("List: %d", sum)
	}
	if s := root.Key("shape").AsInts(); len(s) != 2 || s[1] != 3 {
		t.Errorf("AsInts: %v", s)
	}
	if s := root.Key("names").AsStrings(); len(s) != 2 {
		t.Errorf("AsStrings: %v", s)
	}
	if items := osd.Items(); len(items) != 5 || items[0].Key != "count" || items[0].AsInt() != 3 {
		t.Errorf("Items: %v", items)
	}
	if err := root.Err(); err != nil {
		t.Fatal(err)
	}
}

// Every malformed value fails with the file, the path and what was wanted;
// the first failure sticks.
func TestDecFailures(t *testing.T) {
	v := DictOf(
		"osd", DictOf("count", "3", "groups", &List{Items: []Value{DictOf("n", 1.5)}}),
		"info", "not a dict",
		"ints", Tuple{int64(1), "x"},
		1.5, "float key",
	)
	cases := []struct {
		name string
		read func(d Dec)
		want string
	}{
		{"str for int", func(d Dec) { d.Dict("osd").Int("count") }, `f.pt: ["osd"]["count"]: got str, want int`},
		{"missing", func(d Dec) { d.Dict("osd").Int("size") }, `f.pt: ["osd"]: missing key "size"`},
		{"opt dict of a str", func(d Dec) { d.OptDict("info") }, `f.pt: ["info"]: got str, want dict`},
		{"opt int of a str", func(d Dec) { d.Dict("osd").OptInt("count", 0) }, `f.pt: ["osd"]["count"]: got str, want int`},
		{"nested list", func(d Dec) { d.Dict("osd").List("groups")[0].Int("n") }, `f.pt: ["osd"]["groups"][0]["n"]: got float, want int`},
		{"list of a str", func(d Dec) { d.List("info") }, `f.pt: ["info"]: got str, want list`},
		{"index", func(d Dec) { d.Dict("osd").Key("groups").Index(3) }, `f.pt: ["osd"]["groups"]: no item 3 (length 1)`},
		{"ints", func(d Dec) { d.Key("ints").AsInts() }, `f.pt: ["ints"]: got tuple, want a list of ints`},
		{"key type", func(d Dec) { d.Items() }, `f.pt: key 1.5 is float, want str`},
		{"first sticks", func(d Dec) {
			d.Int("info")
			d.Dict("osd").Int("count")
			d.Str("info")
		}, `f.pt: ["info"]: got str, want int`},
		{"calls after a failure", func(d Dec) {
			d.Dict("missing").Dict("more").List("x")
			if d.Dict("osd").Value() != nil {
				panic("a value after a failure")
			}
		}, `f.pt: missing key "missing"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := NewDec("f.pt", v)
			c.read(d)
			err := d.Err()
			if err == nil || err.Error() != c.want {
				t.Fatalf("got %v\nwant %s", err, c.want)
			}
			var de *DecodeError
			if !errors.As(err, &de) || de.Name != "f.pt" {
				t.Errorf("not a DecodeError naming the file: %#v", err)
			}
		})
	}
}

// Objects: attributes read like keys, rendered .name in the path.
func TestDecObjects(t *testing.T) {
	obj := &Object{Class: &Global{"m", "Meta"}, State: DictOf("size", Size{2}, "chunks", &List{Items: []Value{
		&Object{Class: &Global{"m", "Chunk"}, State: DictOf("offsets", "x")}}}, "none", nil)}
	root := NewDec("f.pt", DictOf("meta", obj))
	m := root.Key("meta").Object("Meta")
	if s := m.Attr("size").AsInts(); len(s) != 1 || s[0] != 2 {
		t.Errorf("Attr: %v", s)
	}
	if _, ok := m.OptAttr("none"); ok {
		t.Error("OptAttr of None")
	}
	if _, ok := m.OptAttr("missing"); ok {
		t.Error("OptAttr of a missing attribute")
	}
	if err := root.Err(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		read func(d Dec)
		want string
	}{
		{"attr type", func(d Dec) {
			d.Key("meta").Object("Meta").Attr("chunks").Index(0).Object("Chunk").Attr("offsets").AsInts()
		},
			`f.pt: ["meta"].chunks[0].offsets: got str, want a list of ints`},
		{"class", func(d Dec) { d.Key("meta").Object("Chunk") }, `f.pt: ["meta"]: got m.Meta, want Chunk`},
		{"not an object", func(d Dec) { d.Object("Meta") }, `f.pt: got dict, want Meta`},
		{"missing attr", func(d Dec) { d.Key("meta").Attr("sizes") }, `f.pt: ["meta"]: m.Meta has no attribute sizes`},
		{"at", func(d Dec) { d.Key("meta").At(int64(1), "s").AsInt() }, `f.pt: ["meta"][1]: got str, want int`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := NewDec("f.pt", DictOf("meta", obj))
			c.read(d)
			if err := d.Err(); err == nil || err.Error() != c.want {
				t.Fatalf("got %v\nwant %s", err, c.want)
			}
		})
	}
}
