package dcp

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

func TestPlaceOf(t *testing.T) {
	planned := &Checkpoint{Meta: &Metadata{PlannerData: map[string][]pyobj.Value{
		"model.a.w":               {"model", "a.w"},
		"optim.state.a.w.exp_avg": {"optim", "state", "a.w", "exp_avg"},
		"step":                    {"step"},
	}}}
	flat := &Checkpoint{Meta: &Metadata{}}
	tests := []struct {
		c     *Checkpoint
		key   string
		group string
		rest  string
	}{
		{planned, "model.a.w", "model", "a.w"},
		{planned, "optim.state.a.w.exp_avg", "optim", "state.a.w.exp_avg"},
		{planned, "step", "", "step"},
		// Without planner_data (flatten_state_dict=False) a known group
		// name before the first dot is the group.
		{flat, "model.a.w", "model", "a.w"},
		{flat, "optimizer.state.a.w.exp_avg", "optimizer", "state.a.w.exp_avg"},
		{flat, "layers.0.w", "", "layers.0.w"},
	}
	for _, tc := range tests {
		p := tc.c.placeOf(tc.key, tc.c.Meta.Path(tc.key))
		if p.group != tc.group || joinPath(p.rest) != tc.rest {
			t.Errorf("%s: group %q rest %q, want %q %q", tc.key, p.group, joinPath(p.rest), tc.group, tc.rest)
		}
	}
}

func TestOptState(t *testing.T) {
	tests := []struct {
		rest      []pyobj.Value
		id, state string
		ok        bool
	}{
		{[]pyobj.Value{"state", "layers.0.w", "exp_avg"}, "layers.0.w", "exp_avg", true},
		{[]pyobj.Value{"state", "3", "step"}, "3", "step", true},
		{[]pyobj.Value{"state", int64(3), "step"}, "3", "step", true},
		{[]pyobj.Value{"state.layers.0.w.exp_avg_sq"}, "layers.0.w", "exp_avg_sq", true},
		{[]pyobj.Value{"param_groups", int64(0), "lr"}, "", "", false},
		{[]pyobj.Value{"state."}, "", "", false},
		{[]pyobj.Value{"state.x"}, "", "", false},
	}
	for _, tc := range tests {
		id, st, ok := optState(tc.rest)
		if id != tc.id || st != tc.state || ok != tc.ok {
			t.Errorf("%v: %q %q %v, want %q %q %v", tc.rest, id, st, ok, tc.id, tc.state, tc.ok)
		}
	}
}

func TestMapIDs(t *testing.T) {
	shapes := map[string][]int64{"w1": {4, 3}, "buf": {3}, "b1": {3}, "w2": {2, 3}, "norm": {3}}
	tests := []struct {
		name    string
		ids     []string
		idShape map[string][]int64
		params  []string
		want    string
		err     string
	}{
		{"no buffers", []string{"0", "1"}, map[string][]int64{"0": {4, 3}, "1": {3}}, []string{"w1", "b1"}, "0:w1 1:b1", ""},
		{"a trailing buffer", []string{"0", "1", "2"}, map[string][]int64{"0": {4, 3}, "1": {3}, "2": {2, 3}},
			[]string{"w1", "b1", "w2", "norm"}, "0:w1 1:b1 2:w2", ""},
		{"a buffer of another shape", []string{"0", "1"}, map[string][]int64{"0": {4, 3}, "1": {2, 3}},
			[]string{"w1", "buf", "w2"}, "0:w1 1:w2", ""},
		{"the buffer has the shape of the next parameter", []string{"0", "1"}, map[string][]int64{"0": {4, 3}, "1": {3}},
			[]string{"w1", "buf", "b1"}, "", "more than one way"},
		{"an id without state fills in", []string{"0", "1", "2"}, map[string][]int64{"0": {4, 3}, "2": {2, 3}},
			[]string{"w1", "b1", "w2"}, "0:w1 1:b1 2:w2", ""},
		{"shapes do not fit", []string{"0"}, map[string][]int64{"0": {5}}, []string{"w1", "b1"}, "", "cannot be matched"},
		{"more ids than tensors", []string{"0", "1", "2"}, nil, []string{"w1"}, "", "only 1 tensors"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mapIDs(tc.ids, tc.idShape, tc.params, shapes)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var parts []string
			for _, id := range tc.ids {
				parts = append(parts, id+":"+got[id])
			}
			if s := strings.Join(parts, " "); s != tc.want {
				t.Errorf("%s, want %s", s, tc.want)
			}
		})
	}
}

func TestSetElement(t *testing.T) {
	root := pyobj.NewDict(pyobj.PlainDict)
	for _, e := range []struct {
		path []pyobj.Value
		v    pyobj.Value
	}{
		{[]pyobj.Value{"optim", "param_groups", int64(1), "lr"}, 0.1},
		{[]pyobj.Value{"optim", "param_groups", int64(0), "lr"}, 0.2},
		{[]pyobj.Value{"step"}, int64(3)},
	} {
		if err := setElement(root, e.path, e.v); err != nil {
			t.Fatal(err)
		}
	}
	pg, _ := pyobj.Path(root, "optim", "param_groups")
	items, _ := pyobj.Seq(pg)
	if len(items) != 2 || fmt.Sprint(pyobj.Repr(items[0].(*pyobj.Dict).Values()[0])) != "0.2" {
		t.Errorf("param_groups %s", pyobj.Repr(pg))
	}
	// A list position into a dict of str keys, a str key into a list.
	if err := setElement(root, []pyobj.Value{"optim", "param_groups", "x"}, 1); err == nil {
		t.Error("str key into a list")
	}
	if err := setElement(root, []pyobj.Value{"step", "x"}, 1); err == nil || !strings.Contains(err.Error(), "inside a int") {
		t.Errorf("path through an int: %v", err)
	}
	if err := setElement(root, []pyobj.Value{"big", int64(1 << 40)}, 1); err == nil {
		t.Error("huge list position")
	}
}

func TestFlatten(t *testing.T) {
	d := pyobj.DictOf(
		"optim", pyobj.DictOf("param_groups", &pyobj.List{Items: []pyobj.Value{pyobj.DictOf("lr", 0.1, "betas", pyobj.Tuple{0.9, 0.95})}}),
		"sched", pyobj.DictOf("lr_lambdas", &pyobj.List{Items: []pyobj.Value{pyobj.NewDict(pyobj.PlainDict)}}, "base_lrs", &pyobj.List{Items: []pyobj.Value{0.1}}),
		int64(3), "int key")
	leaves, err := flatten(d)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, l := range leaves {
		keys = append(keys, joinPath(l.path))
	}
	// As torch >= 2.4: the empty dict in lr_lambdas vanishes, the list of
	// floats and the tuple are leaves, int keys become str.
	want := "optim.param_groups.0.lr optim.param_groups.0.betas sched.base_lrs 3"
	if s := strings.Join(keys, " "); s != want {
		t.Errorf("keys %s, want %s", s, want)
	}
	if _, ok := leaves[3].path[0].(string); !ok {
		t.Errorf("int key path element is %T", leaves[3].path[0])
	}
}

func TestLayouts(t *testing.T) {
	tests := []struct {
		c, model, optim string
		byID, flat      bool
	}{
		{"fsdp2_w2", "model", "optim", false, false},
		{"optim_ids_w2", "model", "optim", true, false},
		{"torchtitan_w2", "model", "optimizer", false, true},
		{"emptyrank_w4", "model", "", false, false},
	}
	for _, tc := range tests {
		ck, err := Open(context.Background(), testkit.Fixture("dcp", tc.c, "checkpoint"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		l, err := ck.Layout()
		if err != nil {
			t.Fatal(err)
		}
		if l.ModelGroup != tc.model || l.OptimGroup != tc.optim || l.ByID != tc.byID || l.Flattened != tc.flat {
			t.Errorf("%s: layout %+v", tc.c, l)
		}
		if tc.byID && (l.IDs["0"] != "embed.weight" || l.IDs["5"] != "norm.weight" || len(l.IDs) != 6) {
			t.Errorf("%s: ids %v", tc.c, l.IDs)
		}
	}
}
