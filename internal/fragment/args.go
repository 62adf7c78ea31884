package fragment

import (
	"fmt"
	"math"

	"github.com/ucp-project/ucp/internal/pyobj"
)

// ScalarArgs returns the attributes of a saved argparse.Namespace whose
// values are bools, ints, finite floats or strings, by name (None, lists and
// objects such as torch dtypes are left out; listArgs keep their lists
// as []any); nil for None. Anything else
// than a Namespace-like object is an error naming path: a malformed args
// entry is never read as "no arguments".
func ScalarArgs(path string, v pyobj.Value) (map[string]any, error) {
	if v == nil {
		return nil, nil
	}
	o, ok := v.(*pyobj.Object)
	if !ok {
		return nil, fmt.Errorf("%s: args is %s, not an argparse.Namespace", path, pyobj.Repr(v))
	}
	d, ok := o.State.(*pyobj.Dict)
	if !ok {
		return nil, fmt.Errorf("%s: args (%s) holds no attribute dict", path, o.Class)
	}
	out := map[string]any{}
	for i := 0; i < d.Len(); i++ {
		k, val := d.Item(i)
		name, ok := k.(string)
		if !ok {
			return nil, fmt.Errorf("%s: args has an attribute named %s, not a string", path, pyobj.Repr(k))
		}
		switch x := val.(type) {
		case bool, int64, string:
			out[name] = x
		case float64:
			if !math.IsInf(x, 0) && !math.IsNaN(x) {
				out[name] = x
			}
		case *pyobj.List:
			kind, ok := listArgs[name]
			if !ok {
				continue
			}
			items := make([]any, len(x.Items))
			for j, it := range x.Items {
				if _, isInt := it.(int64); kind == "an int" && !isInt || kind == "a string" && !isString(it) {
					return nil, fmt.Errorf("%s: args.%s holds %s, not %s", path, name, pyobj.Repr(it), kind)
				}
				items[j] = it
			}
			out[name] = items
		}
	}
	return out, nil
}

// listArgs are the arguments whose list values change the model's math,
// by the type of their items; dropping them would read the model as
// another. Megatron's moe_layer_freq pattern [0]*k + [1]*n is k dense
// layers before n MoE layers; core 0.19 saves moe_router_load_balancing_type
// as a list of strings (one per layer group), earlier cores as a string.
var listArgs = map[string]string{"moe_layer_freq": "an int", "moe_router_load_balancing_type": "a string"}

func isString(v pyobj.Value) bool { _, ok := v.(string); return ok }

// TrainingDType reads the training dtype from Megatron-style arguments
// (bf16, fp16 flags): "bfloat16", "float16", "float32", or "" when
// neither flag is recorded. A flag that is not a bool is an error.
func TrainingDType(path string, args map[string]any) (string, error) {
	flag := func(name string) (bool, bool, error) {
		v, ok := args[name]
		if !ok || v == nil {
			return false, false, nil
		}
		b, ok := v.(bool)
		if !ok {
			return false, false, fmt.Errorf("%s: args.%s is %v, not a bool", path, name, v)
		}
		return b, true, nil
	}
	bf, hasBF, err := flag("bf16")
	if err != nil {
		return "", err
	}
	fp, hasFP, err := flag("fp16")
	if err != nil {
		return "", err
	}
	switch {
	case bf:
		return "bfloat16", nil
	case fp:
		return "float16", nil
	case hasBF || hasFP:
		return "float32", nil
	}
	return "", nil
}
