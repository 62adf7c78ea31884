package megatron

import (
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
)

// Only args that say transformer_impl 'local' with no custom spec give the
// module names; otherwise the checkpoint does not tell, and the saved (TE)
// names stay.
func TestDistLocalSpec(t *testing.T) {
	ns := func(kv ...pyobj.Value) *pyobj.Object {
		d := pyobj.NewDict(pyobj.PlainDict)
		for i := 0; i+1 < len(kv); i += 2 {
			d.Set(kv[i], kv[i+1])
		}
		return &pyobj.Object{State: d}
	}
	cases := []struct {
		name    string
		args    *pyobj.Object
		local   bool
		wantErr bool
	}{
		{"no args", nil, false, false},
		{"args without transformer_impl", ns("tensor_model_parallel_size", int64(2)), false, false},
		{"local", ns("transformer_impl", "local"), true, false},
		{"local, spec None", ns("transformer_impl", "local", "spec", nil), true, false},
		{"local with a custom spec", ns("transformer_impl", "local", "spec", &pyobj.List{Items: []pyobj.Value{"my.module", "spec"}}), false, false},
		{"local with an attention variant", ns("transformer_impl", "local", "experimental_attention_variant", "dsa"), false, false},
		{"transformer_engine", ns("transformer_impl", "transformer_engine"), false, false},
		{"not a string", ns("transformer_impl", int64(1)), false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &distReader{dir: "ckpt", args: c.args}
			local, err := r.localSpec()
			if (err != nil) != c.wantErr || local != c.local {
				t.Errorf("localSpec() = %v, %v; want %v, error %v", local, err, c.local, c.wantErr)
			}
		})
	}
	for saved, want := range map[string]string{
		"decoder.layers.3.self_attention.linear_qkv.layer_norm_weight": "decoder.layers.3.input_layernorm.weight",
		"decoder.layers.0.self_attention.linear_qkv.layer_norm_bias":   "decoder.layers.0.input_layernorm.bias",
		"decoder.layers.1.mlp.linear_fc1.layer_norm_weight":            "decoder.layers.1.pre_mlp_layernorm.weight",
		"decoder.layers.1.mlp.linear_fc1.weight":                       "decoder.layers.1.mlp.linear_fc1.weight",
		"decoder.final_layernorm.weight":                               "decoder.final_layernorm.weight",
	} {
		if got := moduleName(saved); got != want {
			t.Errorf("moduleName(%s) = %s, want %s", saved, got, want)
		}
	}
}
