package deepspeed

import (
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// TestLossScalerDynamic: the source's loss_scaler.dynamic is carried when
// it is a bool and refused, naming the file, when it is not (it was read
// as false).
func TestLossScalerDynamic(t *testing.T) {
	scaler := func(dyn ...pyobj.Value) *pyobj.Object {
		st := pyobj.DictOf("cur_scale", 1.0)
		if len(dyn) > 0 {
			st.Set("dynamic", dyn[0])
		}
		return &pyobj.Object{Class: &pyobj.Global{Module: "deepspeed.runtime.fp16.loss_scaler", Name: "LossScaler"},
			Via: pyobj.ByNewObj, State: st, Built: true}
	}
	for _, c := range []struct {
		name string
		s    *pyobj.Object
		want bool
		err  string
	}{
		{"static", scaler(false), false, ""},
		{"dynamic", scaler(true), true, ""},
		{"absent", scaler(), false, ""},
		{"a string", scaler("yes"), false, `ckpt/zero/optimizer_state.pt: loss_scaler.dynamic is "yes", not a bool`},
		{"an int", scaler(int64(1)), false, "loss_scaler.dynamic is 1, not a bool"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &plan{r: &atomic.Reader{Dir: "ckpt"}, dt: dtype.Float32, optim: pyobj.DictOf("loss_scaler", c.s)}
			got, dyn, err := p.lossScaler()
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.s || dyn != c.want {
				t.Fatalf("got %v %v %v, want the source's scaler and dynamic %v", got, dyn, err, c.want)
			}
		})
	}
}
