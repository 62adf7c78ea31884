package mapreduce_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// TestUniversal pins the merge keys DeepSpeed's universal loader reads,
// in order, for each way a parameter can have been split.
func TestUniversal(t *testing.T) {
	sps := pyobj.NewDict(pyobj.PlainDict) // stands in for a SubparamShape
	tests := []struct {
		name string
		info fragment.Info
		want string
	}{
		{"replicated", fragment.Info{CatDim: -1}, "param=P"},
		{"row parallel", fragment.Info{CatDim: 1}, "cat_dim=1 param=P"},
		{"swiglu", fragment.Info{CatDim: 0, NSubParams: 2}, "cat_dim=0 param_n_sub_params=2 param=P"},
		{"grouped mlp weight1", fragment.Info{CatDim: 1, NSubParams: 8}, "cat_dim=1 param_n_sub_params=8 param=P"},
		{"one sub-param is a plain split", fragment.Info{CatDim: 0, NSubParams: 1}, "cat_dim=0 param=P"},
		{"gqa qkv", fragment.Info{CatDim: 0, NSubParams: 3, SubParamWidths: []int64{8, 2, 2}, SubParamShape: sps}, "sub_param_shape={} param=P"},
		{"vocab", fragment.Info{CatDim: 0, VocabSize: 100, PaddedVocab: 128}, "cat_dim=0 vocab_tensor=true param=P"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := mapreduce.Universal(&fragment.Param{Name: "p", Info: tt.info}, "P")
			var got []string
			for i := 0; i < d.Len(); i++ {
				k, v := d.Item(i)
				s := fmt.Sprint(v)
				if dv, ok := v.(*pyobj.Dict); ok && dv.Len() == 0 {
					s = "{}"
				}
				got = append(got, fmt.Sprintf("%v=%s", k, s))
			}
			if g := strings.Join(got, " "); g != tt.want {
				t.Errorf("keys = %q, want %q", g, tt.want)
			}
		})
	}
}
