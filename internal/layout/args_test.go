package layout_test

import (
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
)

func namespace(kv ...any) *pyobj.Object {
	return &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}, State: pyobj.DictOf(kv...), Built: true}
}

// TestMegatronModel: the target geometry from Megatron's args; a value of
// the wrong type is an error naming the file and the argument (a
// group_query_attention of "yes" was read as false before).
func TestMegatronModel(t *testing.T) {
	const file = "ckpt/extra_state.pt"
	cases := []struct {
		name string
		ns   *pyobj.Object
		want layout.Model
		err  string
	}{
		{"defaults", namespace("num_attention_heads", int64(8)), layout.Model{Megatron: true, Heads: 8, QueryGroups: 8, VocabDivisor: 128}, ""},
		{"gqa", namespace("num_attention_heads", int64(8), "group_query_attention", true, "num_query_groups", int64(2),
			"make_vocab_size_divisible_by", int64(64)), layout.Model{Megatron: true, Heads: 8, QueryGroups: 2, VocabDivisor: 64}, ""},
		{"no gqa keeps heads", namespace("num_attention_heads", int64(8), "group_query_attention", false, "num_query_groups", int64(1)),
			layout.Model{Megatron: true, Heads: 8, QueryGroups: 8, VocabDivisor: 128}, ""},
		{"None is absent", namespace("num_attention_heads", int64(4), "group_query_attention", nil, "make_vocab_size_divisible_by", nil),
			layout.Model{Megatron: true, Heads: 4, QueryGroups: 4, VocabDivisor: 128}, ""},
		{"gqa not a bool", namespace("num_attention_heads", int64(8), "group_query_attention", "yes"), layout.Model{},
			file + `: args.group_query_attention is "yes", not a bool`},
		{"heads not an int", namespace("num_attention_heads", "8"), layout.Model{}, file + `: args.num_attention_heads is "8", not an int`},
		{"groups not an int", namespace("num_attention_heads", int64(8), "group_query_attention", true, "num_query_groups", 2.5), layout.Model{},
			file + ": args.num_query_groups is 2.5, not an int"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := layout.MegatronModel(layout.Args{Path: file, NS: c.ns})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || m != c.want {
				t.Fatalf("got %+v, %v; want %+v", m, err, c.want)
			}
		})
	}
}
