package torchfile

import (
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// TestRequiresGradStrict: requires_grad of _rebuild_tensor_v2 and
// _rebuild_parameter must be a bool; anything else is an error (it was
// read as false). Open wraps these errors with the file's path.
func TestRequiresGradStrict(t *testing.T) {
	h := &torchHooks{}
	call := func(name string, args ...pyobj.Value) (pyobj.Value, error) {
		f, ok := h.resolve("torch._utils", name)
		if !ok {
			t.Fatalf("torch._utils.%s not resolved", name)
		}
		return f.CallPy(args)
	}
	tensor := func(rg pyobj.Value) []pyobj.Value {
		return []pyobj.Value{&Storage{DType: dtype.Float32, Numel: 2}, int64(0), pyobj.Tuple{int64(2)}, pyobj.Tuple{int64(1)}, rg, pyobj.NewDict(pyobj.PlainDict)}
	}
	good, err := call("_rebuild_tensor_v2", tensor(false)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, fn string
		args     []pyobj.Value
		want     string // "" for no error; else what the error says
		grad     bool
	}{
		{"tensor true", "_rebuild_tensor_v2", tensor(true), "", true},
		{"tensor false", "_rebuild_tensor_v2", tensor(false), "", false},
		{"tensor int", "_rebuild_tensor_v2", tensor(int64(1)), "_rebuild_tensor: requires_grad is int, not a bool", false},
		{"tensor None", "_rebuild_tensor_v2", tensor(nil), "requires_grad is None, not a bool", false},
		{"parameter true", "_rebuild_parameter", []pyobj.Value{good, true, pyobj.NewDict(pyobj.PlainDict)}, "", true},
		{"parameter str", "_rebuild_parameter", []pyobj.Value{good, "True", pyobj.NewDict(pyobj.PlainDict)},
			"_rebuild_parameter: requires_grad is str, not a bool", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := call(c.fn, c.args...)
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %v, want %q", err, c.want)
				}
				return
			}
			if err != nil || v.(*Tensor).RequiresGrad != c.grad {
				t.Fatalf("got %v, %v; want requires_grad %v", v, err, c.grad)
			}
		})
	}
}
