package fragment

import (
	"math"

	"github.com/ucp-project/ucp/internal/pyobj"
)

// ScalarArgs returns the attributes of a saved argparse.Namespace whose
// values are bools, ints, finite floats or strings, by name (None, lists and
// objects such as torch dtypes are left out); nil when v is not an object.
func ScalarArgs(v pyobj.Value) map[string]any {
	o, ok := v.(*pyobj.Object)
	if !ok {
		return nil
	}
	d, ok := o.State.(*pyobj.Dict)
	if !ok {
		return nil
	}
	out := map[string]any{}
	for i := 0; i < d.Len(); i++ {
		k, val := d.Item(i)
		name, ok := k.(string)
		if !ok {
			continue
		}
		switch x := val.(type) {
		case bool, int64, string:
			out[name] = x
		case float64:
			if !math.IsInf(x, 0) && !math.IsNaN(x) {
				out[name] = x
			}
		}
	}
	return out
}

// TrainingDType reads the training dtype from Megatron-style arguments
// (bf16, fp16 flags): "bfloat16", "float16", "float32", or "" when
// neither flag is recorded.
func TrainingDType(args map[string]any) string {
	bf, hasBF := args["bf16"].(bool)
	fp, hasFP := args["fp16"].(bool)
	switch {
	case bf:
		return "bfloat16"
	case fp:
		return "float16"
	case hasBF || hasFP:
		return "float32"
	}
	return ""
}
