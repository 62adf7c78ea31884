package deepspeed

import (
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// GroupShapes is param_shapes[g] of a model state: parameter names in
// flat-buffer order and their shapes.
type GroupShapes struct {
	Names []string
	Shape map[string][]int64
}

// ParamShapes reads param_shapes (a list of dicts of name -> torch.Size);
// failures are recorded in v.
func ParamShapes(v pyobj.Dec) []GroupShapes {
	var out []GroupShapes
	for _, g := range v.AsList() {
		gs := GroupShapes{Shape: map[string][]int64{}}
		for _, it := range g.Items() {
			gs.Names = append(gs.Names, it.Key)
			gs.Shape[it.Key] = it.AsInts()
		}
		out = append(out, gs)
	}
	return out
}

// ZeroStage reads ZeroStageEnum pickled by name or by value (-1 when
// it is neither).
func ZeroStage(v pyobj.Value) int {
	switch x := v.(type) {
	case pyobj.Enum:
		if x.ByName {
			return map[string]int{"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3, "max_stage": 3}[x.Name]
		}
		n, _ := pyobj.Int(x.Value)
		return int(n)
	case *pyobj.Object:
		if len(x.Args) == 1 {
			n, _ := pyobj.Int(x.Args[0])
			return int(n)
		}
	}
	n, ok := pyobj.Int(v)
	if !ok {
		return -1
	}
	return int(n)
}

// FlatStates returns the states of one flat optimizer partition in
// standard order: fp32 (the master partition) and every tensor of the
// torch optimizer state with the partition's size (exp_avg, exp_avg_sq,
// or another optimizer's), the step excepted. A key that is not a string
// is a failure of state (check state.Err()).
func FlatStates(fp32 *torchfile.Tensor, state pyobj.Dec, size int64) ([]string, map[string]*torchfile.Tensor) {
	srcs := map[string]*torchfile.Tensor{fragment.FP32: fp32}
	for _, it := range state.Items() {
		// Other values (a step, an optimizer's scalars) are not flat states.
		switch tt := it.Value().(type) {
		case *torchfile.Tensor:
			if it.Key != fragment.StepState && tt.Numel() == size {
				srcs[it.Key] = tt
			}
		}
	}
	var names []string
	for k := range srcs {
		names = append(names, k)
	}
	return fragment.StateOrder(names), srcs
}
