package layout

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/pyobj"
)

// Args reads the argparse.Namespace Megatron-LM saves as 'args'
// (model_optim_rng.pt; extra_state.pt of an atomic checkpoint converted
// from Megatron) strictly: an attribute that is there must have the type
// asked for, and every error names the file. It is the one reader of
// Megatron's args: formats/megatron's reader and writers read theirs with
// it, and MegatronModel takes a target's geometry from it.
type Args struct {
	Path string // the file, named in errors
	NS   *pyobj.Object
}

// Attr returns args.name, or false when the Namespace has no such attribute.
func (a Args) Attr(name string) (pyobj.Value, bool) { return a.NS.Attr(name) }

// Int reads an int attribute; absent or None gives def.
func (a Args) Int(name string, def int64) (int64, error) {
	v, ok := a.Attr(name)
	if !ok || v == nil {
		return def, nil
	}
	n, ok := pyobj.Int(v)
	if !ok {
		return 0, fmt.Errorf("%s: args.%s is %s, not an int", a.Path, name, pyobj.Repr(v))
	}
	return n, nil
}

// Bool reads a bool attribute; absent or None gives def.
func (a Args) Bool(name string, def bool) (bool, error) {
	v, ok := a.Attr(name)
	if !ok || v == nil {
		return def, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("%s: args.%s is %s, not a bool", a.Path, name, pyobj.Repr(v))
	}
	return b, nil
}

// MegatronModel is the target geometry Megatron-LM's args give: attention
// heads, query groups (num_query_groups with group_query_attention, else
// the heads: the argparse default of num_query_groups is 1 without GQA)
// and make_vocab_size_divisible_by (default 128).
func MegatronModel(a Args) (Model, error) {
	m := Model{Megatron: true}
	var err error
	if m.Heads, err = a.Int("num_attention_heads", 0); err != nil {
		return m, err
	}
	m.QueryGroups = m.Heads
	gqa, err := a.Bool("group_query_attention", false)
	if err != nil {
		return m, err
	}
	if gqa {
		if m.QueryGroups, err = a.Int("num_query_groups", m.Heads); err != nil {
			return m, err
		}
	}
	if m.VocabDivisor, err = a.Int("make_vocab_size_divisible_by", 128); err != nil {
		return m, err
	}
	return m, nil
}
