package dcp

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Top-level state-dict keys trainers use for the model and the optimizer.
var (
	modelGroups = []string{"model", "module", "model_state_dict", "state_dict", "models", ""}
	optimGroups = []string{"optim", "optimizer", "optim_state_dict", "optimizer_state_dict", "optimizers"}
)

// place is where a flattened key sits: its top-level group (the app-state
// key, "" for a key at the top) and the path below it.
type place struct {
	group string
	rest  []pyobj.Value
}

// placeOf splits a key's planner_data path. Without planner_data (saves
// with flatten_state_dict=False) keys are flat strings: a known group
// name before the first dot is taken as the group.
func (c *Checkpoint) placeOf(key string, path []pyobj.Value) place {
	if len(path) >= 2 {
		if g, ok := field(path[0]); ok {
			return place{group: g, rest: path[1:]}
		}
	}
	if _, planned := c.Meta.PlannerData[key]; !planned {
		for _, g := range append(append([]string(nil), modelGroups...), optimGroups...) {
			if g != "" && strings.HasPrefix(key, g+".") {
				return place{group: g, rest: []pyobj.Value{key[len(g)+1:]}}
			}
		}
	}
	return place{rest: path}
}

// field returns a planner path element as a dict key, false for a list
// position (parsePlannerData admits only the two).
func field(e pyobj.Value) (string, bool) {
	switch x := e.(type) {
	case string:
		return x, true
	}
	return "", false
}

// joinPath renders path elements as the flattened key does.
func joinPath(p []pyobj.Value) string {
	parts := make([]string, len(p))
	for i, e := range p {
		switch x := e.(type) {
		case string:
			parts[i] = x
		case int64:
			parts[i] = strconv.FormatInt(x, 10)
		default:
			parts[i] = fmt.Sprint(x)
		}
	}
	return strings.Join(parts, ".")
}

// isOptimizerEntry reports whether a path below a group has the shape of
// an optimizer state dict: state.<id>.<name> (nested, or flattened into
// one string by torchtitan's flatten_optimizer_state_dict) or param_groups.
func isOptimizerEntry(rest []pyobj.Value) bool {
	first, ok := field(rest[0])
	if !ok {
		return false
	}
	switch {
	case first == "param_groups":
		return true
	case first == "state" && len(rest) >= 3:
		return true
	case len(rest) == 1 && strings.HasPrefix(first, "param_groups."):
		return true
	}
	return false
}

// optState splits an optimizer entry into the parameter id (an FQN or an
// integer id as a string) and the state name.
func optState(rest []pyobj.Value) (id, state string, ok bool) {
	first, ok := field(rest[0])
	if !ok {
		return "", "", false // an integer position: no optimizer entry
	}
	if first == "state" && len(rest) >= 3 {
		id = joinPath(rest[1:2])
		state = joinPath(rest[2:])
		return id, state, id != "" && state != ""
	}
	if len(rest) == 1 && strings.HasPrefix(first, "state.") {
		r := first[len("state."):]
		i := strings.LastIndexByte(r, '.')
		if i <= 0 || i == len(r)-1 {
			return "", "", false
		}
		return r[:i], r[i+1:], true
	}
	return "", "", false
}

// preferred orders names by a preference list, then alphabetically.
func preferred(names []string, prefs []string) []string {
	rank := map[string]int{}
	for i, p := range prefs {
		rank[p] = i
	}
	out := append([]string(nil), names...)
	sort.SliceStable(out, func(i, j int) bool {
		ri, oki := rank[out[i]]
		rj, okj := rank[out[j]]
		switch {
		case oki && okj:
			return ri < rj
		case oki != okj:
			return oki
		}
		return out[i] < out[j]
	})
	return out
}

func isID(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// mapIDs assigns integer optimizer ids, in param-group order, to model
// parameters in model order: torch numbers the parameters of its groups
// consecutively, and the groups are built from model.parameters(), which
// skips buffers. The assignment is monotone and must match every known
// state shape; it is an error when there is none or more than one.
func mapIDs(ids []string, idShape map[string][]int64, params []string, shapes map[string][]int64) (map[string]string, error) {
	n, m := len(ids), len(params)
	if n > m {
		return nil, fmt.Errorf("the optimizer has %d parameter ids but the model only %d tensors", n, m)
	}
	ok := func(i, j int) bool {
		s, known := idShape[ids[i]]
		return !known || torchfile.SameShape(s, shapes[params[j]])
	}
	// ways[i][k]: assignments of ids[i:] to params[i+k:], capped at 2.
	// Only m-n parameters can be skipped, so k stays within [0, m-n].
	b := m - n
	ways := make([][]uint8, n+1)
	for i := range ways {
		ways[i] = make([]uint8, b+2)
	}
	for k := 0; k <= b; k++ {
		ways[n][k] = 1
	}
	for i := n - 1; i >= 0; i-- {
		for k := b; k >= 0; k-- {
			w := ways[i][k+1] // skip param i+k (a buffer)
			if ok(i, i+k) {
				w += ways[i+1][k]
			}
			ways[i][k] = min(w, 2)
		}
	}
	switch ways[0][0] {
	case 0:
		return nil, fmt.Errorf("optimizer state ids cannot be matched to the model's tensors in order with equal shapes")
	case 2:
		return nil, fmt.Errorf("optimizer state ids match the model's tensors in more than one way (buffers have the shapes of parameters); save the optimizer state by FQN (get_state_dict) to convert it")
	}
	out := make(map[string]string, n)
	for i, k := 0, 0; i < n; {
		if ok(i, i+k) && ways[i+1][k] == 1 {
			out[ids[i]] = params[i+k]
			i++
		} else {
			k++
		}
	}
	return out, nil
}

// setElement stores v at path in root as torch's _traverse.set_element
// does: str elements are dict keys, int elements list positions (lists
// are padded with None).
func setElement(root *pyobj.Dict, path []pyobj.Value, v pyobj.Value) error {
	var cur pyobj.Value = root
	for i := range path {
		last := i == len(path)-1
		var child pyobj.Value
		if !last {
			if _, isInt := path[i+1].(int64); isInt {
				child = &pyobj.List{}
			} else {
				child = pyobj.NewDict(pyobj.PlainDict)
			}
		}
		switch c := cur.(type) {
		case *pyobj.Dict:
			k := path[i]
			if last {
				c.Set(k, v)
				return nil
			}
			have, ok := c.Get(k)
			if !ok || have == nil {
				c.Set(k, child)
				have = child
			}
			cur = have
		case *pyobj.List:
			idx, isInt := path[i].(int64)
			if !isInt {
				return fmt.Errorf("path %s: %q indexes a list", joinPath(path), path[i])
			}
			if idx > 1<<20 {
				return fmt.Errorf("path %s: list position %d is too large", joinPath(path), idx)
			}
			for int64(len(c.Items)) <= idx {
				c.Items = append(c.Items, nil)
			}
			if last {
				c.Items[idx] = v
				return nil
			}
			if c.Items[idx] == nil {
				c.Items[idx] = child
			}
			cur = c.Items[idx]
		default:
			return fmt.Errorf("path %s: element %d is inside a %s", joinPath(path), i, pyobj.TypeName(cur))
		}
	}
	return nil
}
