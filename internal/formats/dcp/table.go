package dcp

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// maxExtraTensor bounds a tensor outside the model and the optimizer that
// is carried inside extra_state.pt; bigger ones become frozen parameters.
const maxExtraTensor = 16 << 20

// Index builds the fragment table of the DCP folder at path.
func Index(ctx context.Context, path string, opt Options) (*fragment.Table, error) {
	if isMegatron(path) {
		return nil, refuseMegatron(path)
	}
	c, err := Open(ctx, path, opt)
	if err != nil {
		return nil, err
	}
	t, err := c.Table()
	if err != nil {
		c.Close()
		return nil, err
	}
	return t, nil
}

// Layout is how the keys of a checkpoint map onto parameters.
type Layout struct {
	ModelGroup string // top-level key of the model state ("model"; "" when keys are bare FQNs)
	OptimGroup string // top-level key of the optimizer state, "" when there is none
	// ByID is true when the optimizer state is keyed by integer ids
	// (a plain optimizer.state_dict()) rather than by FQN.
	ByID bool
	// Flattened is true for torchtitan's flatten_optimizer_state_dict keys
	// (state.<fqn>.<name> and param_groups.<fqn>.<name> in one path element).
	Flattened bool
	// IDs maps optimizer ids to parameter names when ByID.
	IDs map[string]string
}

type keyed struct {
	t  *Tensor
	at place
}

// assembly is the state of Table while it maps keys.
type assembly struct {
	c       *Checkpoint
	lay     Layout
	used    map[string]bool // tensor keys placed into parameters
	notes   []string
	params  []*fragment.Param
	byName  map[string]*fragment.Param
	optKeys map[string]map[string]*Tensor // id -> state -> tensor
	optIDs  []string                      // ids in first-seen order
	steps   map[string]pyobj.Value        // id -> non-tensor step
}

// Table maps the checkpoint's keys onto a fragment table: model tensors
// become fp32 weights, optimizer states (exp_avg, exp_avg_sq, any other
// state of the parameter's shape) their states, 0-dim step tensors the
// step, tensors without optimizer state frozen parameters (buffers), and
// every non-tensor value (and small stray tensors) the extra state.
func (c *Checkpoint) Table() (*fragment.Table, error) {
	a := &assembly{c: c, used: map[string]bool{}, byName: map[string]*fragment.Param{},
		optKeys: map[string]map[string]*Tensor{}, steps: map[string]pyobj.Value{}}
	if err := a.layout(); err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, err)
	}
	if err := a.build(); err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, err)
	}
	format := c.Format
	if format == "" {
		format = "dcp"
	}
	t := &fragment.Table{Format: format, Source: c.Dir,
		Degrees: fragment.Degrees{TP: 1, PP: 1, DP: c.World, EP: 1}, Params: a.params}
	extra, err := a.extra()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, err)
	}
	t.Extra = extra
	if t.Optimizer, err = a.optimizer(extra); err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, err)
	}
	t.Notes = append(append(a.describe(), c.Notes...), a.notes...)
	if c.Scratch != "" {
		t.Scratch = []string{c.Scratch}
	}
	return t, nil
}

// Layout returns how the keys map onto parameters.
func (c *Checkpoint) Layout() (Layout, error) {
	a := &assembly{c: c, used: map[string]bool{}, optKeys: map[string]map[string]*Tensor{}, steps: map[string]pyobj.Value{}}
	err := a.layout()
	return a.lay, err
}

func (a *assembly) describe() []string {
	c, l := a.c, a.lay
	md := c.Meta
	s := fmt.Sprintf("DCP metadata fields %v", md.Fields)
	if md.Version != "" {
		s += ", version " + md.Version
	}
	if c.Format == "hf" {
		s = fmt.Sprintf("weights files %v", c.MetaFiles)
	}
	s += fmt.Sprintf("; %d rank(s); model under %q", c.World, l.ModelGroup)
	if l.OptimGroup != "" {
		kind := "by FQN"
		if l.ByID {
			kind = "by integer id"
		}
		if l.Flattened {
			kind += ", flattened"
		}
		s += fmt.Sprintf(", optimizer under %q (%s)", l.OptimGroup, kind)
	}
	return []string{s}
}

// layout finds the model and optimizer groups and maps optimizer ids.
func (a *assembly) layout() error {
	c := a.c
	places := map[string]place{}
	for _, t := range c.Tensors {
		places[t.Key] = c.placeOf(t.Key, t.Path)
	}
	a.pickOptimGroup(places)
	groupsWithTensors := a.placeTensors(places)
	// Integer ids: every id is a number and none is a model FQN.
	allIDs := len(a.optIDs) > 0
	for _, id := range a.optIDs {
		if !isID(id) {
			allIDs = false
		}
	}
	for _, fq := range groupsWithTensors {
		for _, id := range a.optIDs {
			if fq[id] != nil {
				allIDs = false
			}
		}
	}
	a.lay.ByID = allIDs
	if err := a.pickModelGroup(groupsWithTensors); err != nil {
		return err
	}
	if a.lay.ByID {
		return a.mapIDs()
	}
	return nil
}

// pickOptimGroup sets the optimizer's group. A group is an optimizer when
// it has param_groups or nested state entries; torchtitan's flattened form
// always saves param_groups too.
func (a *assembly) pickOptimGroup(places map[string]place) {
	seen := map[string]bool{}
	var opts []string
	consider := func(p place) {
		if !seen[p.group] && isOptimizerEntry(p.rest) {
			seen[p.group] = true
			opts = append(opts, p.group)
		}
	}
	for _, p := range places {
		consider(p)
	}
	for _, v := range a.c.Values {
		consider(a.c.placeOf(v.Key, v.Path))
	}
	opts = preferred(opts, optimGroups)
	if len(opts) > 0 {
		a.lay.OptimGroup = opts[0]
		if len(opts) > 1 {
			a.notes = append(a.notes, fmt.Sprintf("several optimizer state dicts (%v): only %q is mapped onto parameters", opts, opts[0]))
		}
	}
}

// placeTensors files the optimizer group's states and steps by parameter
// id and returns the other tensors by group and path.
func (a *assembly) placeTensors(places map[string]place) map[string]map[string]*Tensor {
	groupsWithTensors := map[string]map[string]*Tensor{} // group -> fqn -> tensor
	for _, t := range a.c.Tensors {
		p := places[t.Key]
		if a.lay.OptimGroup != "" && p.group == a.lay.OptimGroup {
			id, st, ok := optState(p.rest)
			if ok {
				if len(p.rest) == 1 {
					a.lay.Flattened = true
				}
				if a.optKeys[id] == nil {
					a.optKeys[id] = map[string]*Tensor{}
					a.optIDs = append(a.optIDs, id)
				}
				a.optKeys[id][st] = t
				continue
			}
		}
		if groupsWithTensors[p.group] == nil {
			groupsWithTensors[p.group] = map[string]*Tensor{}
		}
		groupsWithTensors[p.group][joinPath(p.rest)] = t
	}
	for _, v := range a.c.Values {
		p := a.c.placeOf(v.Key, v.Path)
		if a.lay.OptimGroup != "" && p.group == a.lay.OptimGroup {
			if id, st, ok := optState(p.rest); ok && st == fragment.StepState {
				a.steps[id] = v.V
			}
			if f, ok := field(p.rest[0]); ok && len(p.rest) == 1 && strings.HasPrefix(f, "param_groups.") {
				a.lay.Flattened = true
			}
		}
	}
	return groupsWithTensors
}

// pickModelGroup sets the model's group: the one holding the optimizer's
// FQNs, else the preferred one.
func (a *assembly) pickModelGroup(groupsWithTensors map[string]map[string]*Tensor) error {
	var groups []string
	for g := range groupsWithTensors {
		if a.lay.OptimGroup == "" || g != a.lay.OptimGroup {
			groups = append(groups, g)
		}
	}
	groups = preferred(groups, modelGroups)
	switch {
	case len(groups) == 0:
	case len(a.optIDs) > 0 && !a.lay.ByID:
		best, bestN := -1, 0
		var tied []string
		for i, g := range groups {
			n := 0
			for _, id := range a.optIDs {
				if groupsWithTensors[g][id] != nil {
					n++
				}
			}
			switch {
			case n > bestN:
				best, bestN, tied = i, n, []string{g}
			case n == bestN && n > 0:
				tied = append(tied, g)
			}
		}
		if best < 0 {
			a.lay.ModelGroup = groups[0]
			a.notes = append(a.notes, fmt.Sprintf("no model tensor has the FQN of an optimizer state; model taken from %q", groups[0]))
			break
		}
		if len(tied) > 1 && !knownModel(tied[0]) {
			return fmt.Errorf("the optimizer's parameter names are found under several top-level keys %v; cannot tell which is the model", tied)
		}
		a.lay.ModelGroup = groups[best]
	default:
		a.lay.ModelGroup = groups[0]
		if len(groups) > 1 && !knownModel(groups[0]) {
			a.notes = append(a.notes, fmt.Sprintf("tensors under several top-level keys %v and none is a known model key: model taken from %q", groups, groups[0]))
		}
	}
	return nil
}

func knownModel(g string) bool {
	for _, m := range modelGroups {
		if g == m {
			return true
		}
	}
	return false
}

// modelTensors returns the model group's tensors in state-dict order.
func (a *assembly) modelTensors() []keyed {
	c := a.c
	pos := map[string]int{}
	for i, k := range c.PlannerOrder {
		pos[k] = i
	}
	var out []keyed
	for _, t := range c.Tensors {
		p := c.placeOf(t.Key, t.Path)
		if p.group != a.lay.ModelGroup {
			continue
		}
		if a.lay.OptimGroup != "" && p.group == a.lay.OptimGroup {
			continue
		}
		out = append(out, keyed{t, p})
	}
	sort.SliceStable(out, func(i, j int) bool { return pos[out[i].t.Key] < pos[out[j].t.Key] })
	return out
}

// mapIDs maps integer optimizer ids onto model parameter names through the
// param groups' params lists and the model's parameter order.
func (a *assembly) mapIDs() error {
	order, err := a.groupIDs()
	if err != nil {
		return err
	}
	if order == nil {
		order = append([]string(nil), a.optIDs...)
		sort.Slice(order, func(i, j int) bool { return idLess(order[i], order[j]) })
	}
	listed := map[string]bool{}
	for _, id := range order {
		if listed[id] {
			return fmt.Errorf("optimizer param_groups list parameter id %s twice", id)
		}
		listed[id] = true
	}
	for _, id := range a.optIDs {
		if !listed[id] {
			return fmt.Errorf("optimizer state id %s is in no param group", id)
		}
	}
	idShape := map[string][]int64{}
	for id, sts := range a.optKeys {
		names := make([]string, 0, len(sts))
		for n := range sts {
			names = append(names, n)
		}
		for _, n := range fragment.StateOrder(names) {
			if n != fragment.StepState {
				idShape[id] = sts[n].Size
				break
			}
		}
	}
	var names []string
	shapes := map[string][]int64{}
	for _, k := range a.modelTensors() {
		name := joinPath(k.at.rest)
		names = append(names, name)
		shapes[name] = k.t.Size
	}
	ids, err := mapIDs(order, idShape, names, shapes)
	if err != nil {
		return fmt.Errorf("%q: %w", a.lay.OptimGroup, err)
	}
	a.lay.IDs = ids
	return nil
}

func idLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// groupIDs returns the parameter ids of the optimizer's param groups in
// order, or nil when the checkpoint has no param groups.
func (a *assembly) groupIDs() ([]string, error) {
	root := pyobj.NewDict(pyobj.PlainDict)
	found := false
	for _, v := range a.c.Values {
		p := a.c.placeOf(v.Key, v.Path)
		if p.group != a.lay.OptimGroup || len(p.rest) == 0 || p.rest[0] != "param_groups" {
			continue
		}
		if err := setElement(root, p.rest, v.V); err != nil {
			return nil, fmt.Errorf("%q: %w", v.Key, err)
		}
		found = true
	}
	if !found {
		return nil, nil
	}
	d := pyobj.NewDec(fmt.Sprintf("%q", a.lay.OptimGroup), root)
	var out []string
	for _, g := range d.List("param_groups") {
		for _, it := range g.List("params") {
			if n := it.AsInt(); n < 0 {
				it.Failf("%d is not a parameter id", n)
			} else {
				out = append(out, fmt.Sprint(n))
			}
		}
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// build creates the parameters.
func (a *assembly) build() error {
	c := a.c
	nameOf := func(id string) string {
		if a.lay.ByID {
			return a.lay.IDs[id]
		}
		return id
	}
	byName := map[string]string{} // parameter name -> optimizer id
	for _, id := range a.optIDs {
		n := nameOf(id)
		if n == "" {
			return fmt.Errorf("optimizer state id %s maps onto no model tensor", id)
		}
		byName[n] = id
	}
	for id := range a.steps {
		if n := nameOf(id); n != "" {
			if _, ok := byName[n]; !ok {
				byName[n] = id
			}
		}
	}
	for _, k := range a.modelTensors() {
		name := joinPath(k.at.rest)
		p := &fragment.Param{Name: name, Shape: clone(k.t.Size), Info: fragment.Info{Replicas: a.replicas(k.t)}}
		p.States = append(p.States, a.state(fragment.FP32, k.t))
		a.used[k.t.Key] = true
		if id, ok := byName[name]; ok {
			if err := a.addOptimizer(p, id); err != nil {
				return err
			}
			delete(byName, name)
		}
		p.Frozen = len(p.States) == 1 && p.Step == nil
		a.add(p)
	}
	// Optimizer state of parameters the checkpoint has no weight for.
	var orphans []string
	for _, id := range a.optIDs {
		if n := nameOf(id); byName[n] == id {
			orphans = append(orphans, n)
		}
	}
	for _, name := range orphans {
		id := byName[name]
		var shape []int64
		for _, st := range fragment.StateOrder(keysOf(a.optKeys[id])) {
			if st != fragment.StepState {
				shape = a.optKeys[id][st].Size
				break
			}
		}
		if shape == nil {
			continue // only a step: kept in the extra state
		}
		p := &fragment.Param{Name: name, Shape: clone(shape)}
		if err := a.addOptimizer(p, id); err != nil {
			return err
		}
		if len(p.States) == 0 {
			continue
		}
		a.notes = append(a.notes, fmt.Sprintf("%s has optimizer state but no model weight in the checkpoint (no fp32 file)", name))
		a.add(p)
	}
	// Tensors outside the model and the optimizer's states: carried in the
	// extra state when small and whole, else frozen parameters by key.
	for _, t := range c.Tensors {
		if a.used[t.Key] || (t.Whole() && t.Numel()*int64(t.DType.Size()) <= maxExtraTensor) {
			continue
		}
		if _, dup := a.byName[t.Key]; dup {
			return fmt.Errorf("%q is both a model parameter and another tensor's key", t.Key)
		}
		p := &fragment.Param{Name: t.Key, Shape: clone(t.Size), Frozen: true, Info: fragment.Info{Replicas: a.replicas(t)}}
		p.States = append(p.States, a.state(fragment.FP32, t))
		a.used[t.Key] = true
		a.notes = append(a.notes, fmt.Sprintf("%s is neither a model weight nor an optimizer state: kept as a frozen parameter", t.Key))
		a.add(p)
	}
	return nil
}

// add appends a parameter. DCP chunks are not tensor-parallel slices and
// the atomic tensors must not depend on how the source was sharded, so
// every parameter gets the universal keys of an unsplit tensor (cat_dim 0),
// as DeepSpeed sources without tensor parallelism do.
func (a *assembly) add(p *fragment.Param) {
	p.Info.CatDim = 0
	a.params = append(a.params, p)
	a.byName[p.Name] = p
}

// addOptimizer adds the states and step of optimizer id to p.
func (a *assembly) addOptimizer(p *fragment.Param, id string) error {
	sts := a.optKeys[id]
	for _, name := range fragment.StateOrder(keysOf(sts)) {
		t := sts[name]
		if name == fragment.StepState && t.Numel() == 1 && t.Whole() {
			ref := t.Chunks[0].Ref
			p.Step = &fragment.Step{Tensor: &ref}
			a.used[t.Key] = true
			continue
		}
		if !torchfile.SameShape(t.Size, p.Shape) {
			a.notes = append(a.notes, fmt.Sprintf("%s: optimizer state %q has shape %v, not the parameter's %v: kept in the extra state",
				p.Name, name, t.Size, p.Shape))
			continue
		}
		if p.State(name) != nil || name == fragment.FP32 {
			return fmt.Errorf("%s: optimizer state %q clashes with another state of the parameter", t.Key, name)
		}
		p.States = append(p.States, a.state(name, t))
		a.used[t.Key] = true
	}
	if p.Step == nil {
		if v, ok := a.steps[id]; ok {
			p.Step = &fragment.Step{Value: v}
		}
	}
	return nil
}

// state builds one state from a tensor's chunks: each chunk is a shard
// placed by its box. Repeated boxes (saved by several ranks) are replicas
// when each repetition tiles the tensor, so the reducer compares them.
func (a *assembly) state(name string, t *Tensor) *fragment.State {
	st := &fragment.State{Name: name}
	copies := map[int][]int{}
	distinct := 0
	for i, ch := range t.Chunks {
		copies[ch.Copy] = append(copies[ch.Copy], i)
		if ch.Copy == 0 {
			distinct++
		}
	}
	addChunk := func(i, replica int, label string) {
		ch := t.Chunks[i]
		sh := fragment.Shard{Shape: clone(ch.Sizes), Replica: replica, Label: label}
		if !torchfile.SameShape(ch.Sizes, t.Size) {
			sh.Maps = []fragment.BoxMap{{From: make([]int64, len(t.Size)), To: clone(ch.Offsets), Size: clone(ch.Sizes)}}
		}
		st.Shards = append(st.Shards, sh)
		if n := torchfile.Numel(ch.Sizes); n > 0 {
			st.Frags = append(st.Frags, fragment.Fragment{Shard: len(st.Shards) - 1, Len: n, Src: ch.Ref})
		}
	}
	for _, i := range copies[0] {
		addChunk(i, 0, t.Chunks[i].Item)
	}
	dropped := 0
	for k := 1; len(copies[k]) > 0; k++ {
		if len(copies[k]) != distinct {
			dropped += len(copies[k])
			continue
		}
		for _, i := range copies[k] {
			addChunk(i, k, t.Chunks[i].Item)
		}
	}
	if dropped > 0 && name == fragment.FP32 {
		a.notes = append(a.notes, fmt.Sprintf("%s: %d repeated chunks do not form whole copies and are not compared", t.Key, dropped))
	}
	return st
}

// replicas returns how many ranks held a whole tensor that a multi-rank
// save stored once: DCP deduplicates identical copies, so the pattern is
// Replicate although one copy is on disk.
func (a *assembly) replicas(t *Tensor) int {
	if a.c.World > 1 && len(t.Chunks) == 1 && t.Whole() && t.Numel() > 0 {
		return a.c.World
	}
	return 0
}

// extra nests every non-tensor value and every tensor left outside the
// parameters at its planner_data path, as dcp_to_torch_save does.
func (a *assembly) extra() (*pyobj.Dict, error) {
	root := pyobj.NewDict(pyobj.PlainDict)
	type entry struct {
		key  string
		path []pyobj.Value
		v    pyobj.Value
	}
	var all []entry
	for _, v := range a.c.Values {
		all = append(all, entry{v.Key, v.Path, v.V})
	}
	for _, t := range a.c.Tensors {
		if a.used[t.Key] {
			continue
		}
		ref := t.Chunks[0].Ref
		all = append(all, entry{t.Key, t.Path, &ref})
	}
	pos := map[string]int{}
	for i, k := range a.c.PlannerOrder {
		pos[k] = i
	}
	sort.SliceStable(all, func(i, j int) bool { return pos[all[i].key] < pos[all[j].key] })
	for _, e := range all {
		if err := setElement(root, e.path, e.v); err != nil {
			return nil, fmt.Errorf("%q: %w", e.key, err)
		}
	}
	return root, nil
}

// optimizer returns zero/optimizer_state.pt's dict: the param groups.
// torchtitan's flattened groups (param_groups.<fqn>.<name>, one copy per
// parameter) are folded back into groups of parameters with equal values.
func (a *assembly) optimizer(extra *pyobj.Dict) (*pyobj.Dict, error) {
	if a.lay.OptimGroup == "" {
		return nil, nil
	}
	x := pyobj.NewDec("extra state", extra)
	o, ok := x.OptDict(a.lay.OptimGroup)
	if !ok {
		return nil, x.Err() // no optimizer values, or not a dict
	}
	if o.Has("param_groups") {
		return pyobj.DictOf("param_groups", o.Key("param_groups").Value()), nil
	}
	od := o.AsDict()
	type group struct {
		sig    string
		values *pyobj.Dict
		params []pyobj.Value
	}
	var groups []*group
	for _, p := range a.params {
		prefix := "param_groups." + p.Name + "."
		vals := pyobj.NewDict(pyobj.PlainDict)
		var sig strings.Builder
		for i := 0; i < od.Len(); i++ {
			k, v := od.Item(i)
			ks, isStr := field(k) // list positions are no group values
			if name, ok := strings.CutPrefix(ks, prefix); isStr && ok && !strings.Contains(name, ".") {
				vals.Set(name, v)
				fmt.Fprintf(&sig, "%s=%s;", name, pyobj.Repr(v))
			}
		}
		if vals.Len() == 0 {
			continue
		}
		if n := len(groups); n > 0 && groups[n-1].sig == sig.String() {
			groups[n-1].params = append(groups[n-1].params, p.Name)
			continue
		}
		groups = append(groups, &group{sig: sig.String(), values: vals, params: []pyobj.Value{p.Name}})
	}
	if len(groups) == 0 {
		return nil, nil
	}
	list := &pyobj.List{}
	for _, g := range groups {
		d := g.values.Clone()
		d.Set("params", &pyobj.List{Items: g.params})
		list.Items = append(list.Items, d)
	}
	return pyobj.DictOf("param_groups", list), nil
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func clone(s []int64) []int64 { return append([]int64{}, s...) }
