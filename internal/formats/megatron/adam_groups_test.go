package megatron

import (
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
)

// absent marks a key adamGroups must remove.
type absentKey struct{}

var absent = absentKey{}

func TestAdamGroups(t *testing.T) {
	torchGroup := func(kv ...any) *pyobj.Dict {
		d := pyobj.NewDict(pyobj.PlainDict)
		d.Set("lr", 0.01)
		d.Set("weight_decay", 0.01)
		for _, k := range torchAdamOnly {
			d.Set(k, false)
		}
		d.Set("foreach", nil)
		d.Set("wd_mult", 1.0)
		for i := 0; i < len(kv); i += 2 {
			d.Set(kv[i].(string), kv[i+1])
		}
		return d
	}
	fusedGroup := func(bc bool) *pyobj.Dict {
		d := pyobj.NewDict(pyobj.PlainDict)
		d.Set("lr", 0.01)
		d.Set("bias_correction", bc)
		d.Set("wd_mult", 1.0)
		return d
	}
	cases := []struct {
		name     string
		in       *pyobj.Dict
		style    stepStyle
		want     map[string]any // key -> value, or absent
		refusing string
	}{
		{"torch to fused", torchGroup(), stepFused,
			map[string]any{"bias_correction": true, "amsgrad": absent, "foreach": absent, "fused": absent, "lr": 0.01, "wd_mult": 1.0}, ""},
		{"torch amsgrad to fused", torchGroup("amsgrad", true), stepFused, nil, "amsgrad=true"},
		{"torch maximize to fused", torchGroup("maximize", true), stepFused, nil, "maximize=true"},
		{"torch stays torch", torchGroup(), stepTorch, map[string]any{"amsgrad": false, "foreach": nil, "bias_correction": absent}, ""},
		{"fused to torch", fusedGroup(true), stepTorch, map[string]any{"bias_correction": absent, "lr": 0.01}, ""},
		{"fused without bias correction to torch", fusedGroup(false), stepTorch, nil, "bias_correction=false"},
		{"fused stays fused", fusedGroup(false), stepFused, map[string]any{"bias_correction": false}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := c.in.Len()
			out, err := adamGroups("SRC", []*pyobj.Dict{c.in}, c.style)
			if c.refusing != "" {
				if err == nil || !strings.Contains(err.Error(), c.refusing) || !strings.Contains(err.Error(), "SRC") {
					t.Fatalf("err %v, want one naming SRC and %q", err, c.refusing)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.in.Len() != before {
				t.Errorf("the source group was changed")
			}
			for k, want := range c.want {
				got, ok := out[0].Get(k)
				if want == absent {
					if ok {
						t.Errorf("%s = %v, want absent", k, got)
					}
					continue
				}
				if !ok || got != want {
					t.Errorf("%s = %v (%v), want %v", k, got, ok, want)
				}
			}
		})
	}
}
