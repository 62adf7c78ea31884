package pyobj

import (
	"reflect"
	"testing"
)

func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		module, name string
		want         bool
	}{
		{"torch._utils", "_rebuild_tensor_v2", true},
		{"torch", "BFloat16Storage", true},
		{"torch", "bfloat16", true},
		{"torch", "load", false},
		{"collections", "OrderedDict", true},
		{"argparse", "Namespace", true},
		{"deepspeed.utils.tensor_fragment", "fragment_address", true},
		{"deepspeed.runtime.zero.config", "ZeroStageEnum", true},
		{"megatron.core.transformer.enums", "AttnBackend", true},
		{"torch.distributed.checkpoint.metadata", "Metadata", true},
		{"os", "system", false},
		{"posix", "system", false},
		{"builtins", "eval", false},
		{"subprocess", "Popen", false},
	} {
		if got := Allowed(tc.module, tc.name); got != tc.want {
			t.Errorf("Allowed(%s, %s) = %v, want %v", tc.module, tc.name, got, tc.want)
		}
	}
}

// TestUnexpectedGlobals: a pickle calling os.system decodes to an inert
// object (nothing runs) and os.system is reported as unexpected.
func TestUnexpectedGlobals(t *testing.T) {
	globals := map[string]int{}
	v, err := Unpickle(p("cos\nsystem\nX\x02\x00\x00\x00ls\x85Rcargparse\nNamespace\n)\x81\x86"), Options{Globals: globals})
	if err != nil {
		t.Fatal(err)
	}
	if got := Repr(v.(Tuple)[0]); got != "os.system(...)" {
		t.Errorf("decoded %s", got)
	}
	if got := Unexpected(globals); !reflect.DeepEqual(got, []string{"os.system"}) {
		t.Errorf("unexpected %v", got)
	}
}
