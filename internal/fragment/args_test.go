package fragment

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
)

func TestScalarArgs(t *testing.T) {
	ns := func(kv ...pyobj.Value) pyobj.Value {
		return &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}, State: pyobj.DictOf(kv...)}
	}
	cases := []struct {
		name  string
		args  pyobj.Value
		dtype string
		err   string // "" : no error
	}{
		{"bf16", ns("bf16", true, "fp16", false, "hidden_size", int64(8)), "bfloat16", ""},
		{"fp16", ns("bf16", false, "fp16", true), "float16", ""},
		{"fp32", ns("bf16", false, "fp16", false), "float32", ""},
		{"no flags", ns("hidden_size", int64(8)), "", ""},
		{"None flag", ns("bf16", nil), "", ""},
		{"None args", nil, "", ""},
		{"bf16 not a bool", ns("bf16", int64(1)), "", "args.bf16 is 1, not a bool"},
		{"fp16 not a bool", ns("fp16", "yes"), "", "args.fp16 is yes, not a bool"},
		{"args a dict", pyobj.DictOf("bf16", true), "", "not an argparse.Namespace"},
		{"args a string", "Namespace(bf16=True)", "", "not an argparse.Namespace"},
		{"no attribute dict", &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}}, "", "holds no attribute dict"},
		{"attribute not a string", ns(int64(3), true), "", "not a string"},
		{"layer pattern not ints", ns("moe_layer_freq", &pyobj.List{Items: []pyobj.Value{int64(0), "1"}}), "", "args.moe_layer_freq holds \"1\", not an int"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args, err := ScalarArgs("ckpt/model.pt", c.args)
			var dt string
			if err == nil {
				dt, err = TrainingDType("ckpt/model.pt", args)
			}
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("error %v", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "ckpt/model.pt")):
				t.Fatalf("error %v, want one naming the file and %q", err, c.err)
			case c.err == "" && dt != c.dtype:
				t.Fatalf("dtype %q, want %q", dt, c.dtype)
			}
		})
	}
}

// TestScalarArgsLists: moe_layer_freq's list (leading dense layers) and
// core 0.19's list of router load-balancing types are kept; other lists are
// left out; a kept list holding another type is an error naming it.
func TestScalarArgsLists(t *testing.T) {
	ns := func(kv ...any) *pyobj.Object {
		return &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}, State: pyobj.DictOf(kv...)}
	}
	args, err := ScalarArgs("ckpt/model.pt", ns(
		"moe_layer_freq", &pyobj.List{Items: []pyobj.Value{int64(0), int64(1), int64(1)}},
		"moe_router_load_balancing_type", &pyobj.List{Items: []pyobj.Value{"sinkhorn"}},
		"moe_aux_loss_coeff", &pyobj.List{Items: []pyobj.Value{0.0}}, "num_layers", int64(3)))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"moe_layer_freq": []any{int64(0), int64(1), int64(1)},
		"moe_router_load_balancing_type": []any{"sinkhorn"}, "num_layers": int64(3)}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("%v, want %v", args, want)
	}
	for _, c := range []struct {
		name string
		item pyobj.Value
		want string
	}{
		{"moe_layer_freq", "1", `args.moe_layer_freq holds "1", not an int`},
		{"moe_router_load_balancing_type", int64(1), "args.moe_router_load_balancing_type holds 1, not a string"},
	} {
		_, err := ScalarArgs("ckpt/model.pt", ns(c.name, &pyobj.List{Items: []pyobj.Value{c.item}}))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "ckpt/model.pt") {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
