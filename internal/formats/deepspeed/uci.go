package deepspeed

import (
	"fmt"
	"regexp"
	"sort"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Rules are the parameter classification lists of a checkpoint's
// universal_checkpoint_info (formats/deepspeed/FORMAT.md), compiled.
type Rules struct {
	version       float64
	vocabSize     int64
	paddedVocab   int64
	vocab         []*pattern
	pipeReplica   []*pattern
	tpReplicated  []*pattern
	average       []*pattern
	rowParallel   []*pattern
	twoSubParams  []*pattern
	subParams     []subParamRule
	shardWidths   map[string][][]int64
	unsupported   map[string]string
	present       bool
	inferred      []string // parameters placed from their shard shapes alone
	matched       map[*pattern]bool
	split         bool // some parameter had several tensor-parallel shards
	allPatterns   []*pattern
	patternByText map[string]*pattern
}

type pattern struct {
	text string
	re   *regexp.Regexp
}

type subParamRule struct {
	patterns []*pattern
	shape    pyobj.Value // the 'shape' entry as saved: list/tuple of ints and tuples
	partDim  int
}

// ReadRules compiles the universal_checkpoint_info of a model state
// (model is its root), if it has one (a missing key or None: plain
// DeepSpeed). A value that is present but malformed is an error naming the
// file and the key, never taken for "absent".
// Python's re.match anchors at the start only, hence ^(?:...).
func ReadRules(model pyobj.Dec) (*Rules, error) {
	uci, present := model.OptDict("universal_checkpoint_info")
	r := &Rules{matched: map[*pattern]bool{}, patternByText: map[string]*pattern{}, present: present}
	if !present {
		return r, model.Err()
	}
	r.version = uci.OptFloat("universal_checkpoint_version", 0)
	r.vocabSize = uci.OptInt("original_vocab_size", 0)
	r.paddedVocab = uci.OptInt("padded_vocab_size", 0)
	for _, l := range []struct {
		key string
		dst *[]*pattern
	}{
		{"vocabulary_parameter_patterns", &r.vocab},
		{"pipeline_replicated_parameter_patterns", &r.pipeReplica},
		{"tp_replicated_parameter_patterns", &r.tpReplicated},
		{"parameter_to_average_patterns", &r.average},
		{"parameter_with_row_parallelism_patterns", &r.rowParallel},
		{"parameter_with_2_sub_params_cat_dim_0", &r.twoSubParams},
	} {
		if v, ok := uci.Opt(l.key); ok {
			*l.dst = r.compile(v, v.AsStrings())
		}
	}
	if v, ok := uci.Opt("parameter_with_sub_params"); ok {
		for _, d := range v.AsList() {
			pv := d.Key("patterns")
			cps := r.compile(pv, pv.AsStrings())
			shape := d.Key("shape")
			shape.AsList()
			pd := d.Int("partition_dim")
			r.subParams = append(r.subParams, subParamRule{patterns: cps, shape: shape.Value(), partDim: int(pd)})
		}
	}
	if v, ok := uci.OptDict("sub_param_shard_widths"); ok {
		r.shardWidths = map[string][][]int64{}
		for _, it := range v.Items() {
			for _, row := range it.AsList() {
				r.shardWidths[it.Key] = append(r.shardWidths[it.Key], row.AsInts())
			}
		}
	}
	if d, ok := uci.OptDict("autotp_unsupported_parameter_patterns"); ok && d.AsDict().Len() > 0 {
		r.unsupported = map[string]string{}
		m := d.AsDict()
		for i := 0; i < m.Len(); i++ {
			k, val := m.Item(i)
			r.unsupported[fmt.Sprint(k)] = fmt.Sprint(val)
		}
	}
	if err := model.Err(); err != nil {
		return nil, err
	}
	return r, nil
}

// compile compiles the patterns read at at; a pattern Go's regexp cannot
// compile is a failure of at.
func (r *Rules) compile(at pyobj.Dec, ss []string) []*pattern {
	var out []*pattern
	for _, s := range ss {
		re, err := regexp.Compile("^(?:" + s + ")")
		if err != nil {
			at.Failf("pattern %q is not supported: %v", s, err)
			return nil
		}
		p := &pattern{text: s, re: re}
		out = append(out, p)
		r.allPatterns = append(r.allPatterns, p)
		if _, ok := r.patternByText[s]; !ok {
			r.patternByText[s] = p
		}
	}
	return out
}

// match returns the one pattern of list that matches name; two matches are
// an error, as in ds_to_universal.
func (r *Rules) match(list []*pattern, name string) (*pattern, error) {
	var found *pattern
	for _, p := range list {
		if p.re.MatchString(name) {
			if found != nil {
				return nil, fmt.Errorf("parameter %s matches two patterns of one list: %q and %q", name, found.text, p.text)
			}
			found = p
		}
	}
	if found != nil {
		r.matched[found] = true
	}
	return found, nil
}

func (r *Rules) matchSubParams(name string) *subParamRule {
	for i := range r.subParams {
		for _, p := range r.subParams[i].patterns {
			if p.re.MatchString(name) {
				r.matched[p] = true
				return &r.subParams[i]
			}
		}
	}
	return nil
}

// Unmatched lists patterns that matched no parameter. At tensor-parallel
// size 1 no parameter is matched against them (a single shard is the
// whole tensor), so none is listed.
func (r *Rules) Unmatched() []string {
	if !r.split {
		return nil
	}
	var out []string
	for _, p := range r.allPatterns {
		if !r.matched[p] {
			out = append(out, p.text)
		}
	}
	sort.Strings(out)
	return out
}

// Placement is how one parameter's TP shards rebuild it.
type Placement struct {
	Pattern fragment.Pattern
	Full    []int64 // full shape (before vocabulary stripping)
	Info    fragment.Info
	Average bool
}

// Shards builds the T shards of the parameter and its atomic shape, with
// vocabulary padding stripped.
func (pl *Placement) Shards(name string, T int) ([]fragment.Shard, []int64, error) {
	shards, err := fragment.Shards(pl.Pattern, pl.Full, T)
	if err != nil {
		return nil, nil, fmt.Errorf("parameter %s: %w", name, err)
	}
	shape := clone(pl.Full)
	if pl.Info.VocabSize > 0 {
		shape[0] = pl.Info.VocabSize
		for t := range shards {
			shards[t] = fragment.StripPad(shards[t], pl.Full, 0, pl.Info.VocabSize)
		}
	}
	return shards, shape, nil
}

// Param returns an empty parameter for this placement.
func (pl *Placement) Param(name string, shape []int64) *fragment.Param {
	return &fragment.Param{Name: name, Shape: shape, Average: pl.Average, Info: pl.Info}
}

// Frozen returns the frozen parameter (requires_grad=False) of this
// placement over T tensor-parallel ranks, with its one state (fp32)
// sharded and still without fragments.
func (pl *Placement) Frozen(name string, T int) (*fragment.Param, *fragment.State, error) {
	shards, shape, err := pl.Shards(name, T)
	if err != nil {
		return nil, nil, err
	}
	p := pl.Param(name, shape)
	p.Frozen = true
	st := p.AddState(fragment.FP32)
	st.Shards = shards
	return p, st, nil
}

// Classify applies the first matching rule (formats/deepspeed/FORMAT.md, universal_checkpoint_info) to a parameter whose
// tensor-parallel shards have the given shapes.
func (r *Rules) Classify(name string, shapes [][]int64) (*Placement, error) {
	T := len(shapes)
	for t := 1; t < T; t++ {
		if len(shapes[t]) != len(shapes[0]) {
			return nil, fmt.Errorf("parameter %s has shapes %v on tensor-parallel ranks", name, shapes)
		}
	}
	pl := &Placement{Info: fragment.Info{CatDim: -1}}
	sameShapes := true
	for t := 1; t < T; t++ {
		sameShapes = sameShapes && torchfile.SameShape(shapes[t], shapes[0])
	}
	r.split = r.split || T > 1
	if T == 1 {
		pl.Pattern, pl.Full, pl.Info.CatDim = fragment.Whole{}, clone(shapes[0]), 0
	} else if !r.present {
		// Without universal_checkpoint_info only the shapes speak: shards
		// that differ in exactly one dim can only be its concatenation;
		// equal shapes could be a replica or an even split.
		d, ok := onlyDifferingDim(shapes)
		if !ok {
			return nil, fmt.Errorf("parameter %s has shards %v on %d tensor-parallel ranks and the checkpoint has no universal_checkpoint_info: "+
				"ucp cannot tell whether it is replicated or split, and does not guess", name, shapes, T)
		}
		if err := concatPlacement(name, d, shapes, pl); err != nil {
			return nil, err
		}
		r.inferred = append(r.inferred, fmt.Sprintf("%s (dim %d)", name, d))
	} else if p, err := r.match(r.tpReplicated, name); err != nil {
		return nil, err
	} else if p != nil {
		if !sameShapes {
			return nil, fmt.Errorf("parameter %s is marked TP-replicated but its shards have shapes %v", name, shapes)
		}
		pl.Pattern, pl.Full = fragment.Replicated{}, clone(shapes[0])
	} else if p, err := r.match(r.average, name); err != nil {
		return nil, err
	} else if p != nil {
		if !sameShapes {
			return nil, fmt.Errorf("parameter %s is marked averaged but its shards have shapes %v", name, shapes)
		}
		pl.Pattern, pl.Full, pl.Average = fragment.Averaged{}, clone(shapes[0]), true
	} else if p, err := r.match(r.twoSubParams, name); err != nil {
		return nil, err
	} else if p != nil {
		// torch.chunk(slice, 2, dim 0): the first half gets the ceiling.
		w := [][]int64{make([]int64, T), make([]int64, T)}
		full := clone(shapes[0])
		full[0] = 0
		for t, s := range shapes {
			if len(s) == 0 {
				return nil, fmt.Errorf("parameter %s: a 0-dim tensor cannot hold 2 sub-parameters", name)
			}
			w[0][t], w[1][t] = (s[0]+1)/2, s[0]/2
			full[0] += s[0]
		}
		pl.Pattern, pl.Full = fragment.SubParams{Dim: 0, Widths: w}, full
		pl.Info.CatDim, pl.Info.NSubParams = 0, 2
	} else if sp := r.matchSubParams(name); sp != nil {
		if err := r.subParamPlacement(name, sp, shapes, pl); err != nil {
			return nil, err
		}
	} else {
		p, err := r.match(r.rowParallel, name)
		if err != nil {
			return nil, err
		}
		dim := 0
		if p != nil {
			dim = 1
		}
		if err := concatPlacement(name, dim, shapes, pl); err != nil {
			return nil, err
		}
	}
	if p, err := r.match(r.vocab, name); err != nil {
		return nil, err
	} else if p != nil {
		if len(pl.Full) != 2 {
			return nil, fmt.Errorf("vocabulary parameter %s has shape %v; only 2-D vocabularies are supported", name, pl.Full)
		}
		if r.vocabSize <= 0 {
			return nil, fmt.Errorf("parameter %s matches a vocabulary pattern but universal_checkpoint_info has no original_vocab_size", name)
		}
		if r.vocabSize > pl.Full[0] {
			return nil, fmt.Errorf("vocabulary parameter %s has %d rows, fewer than original_vocab_size %d", name, pl.Full[0], r.vocabSize)
		}
		pl.Info.VocabSize, pl.Info.PaddedVocab = r.vocabSize, pl.Full[0]
	}
	// Only shards of several TP ranks show the cut (at TP 1 the keys are
	// DeepSpeed's defaults for an unsplit tensor).
	pl.Info.TPKnown = T > 1
	return pl, nil
}

// onlyDifferingDim returns the one dim in which the shard shapes differ.
func onlyDifferingDim(shapes [][]int64) (int, bool) {
	dim := -1
	for d := range shapes[0] {
		for _, s := range shapes[1:] {
			if len(s) != len(shapes[0]) {
				return 0, false
			}
			if s[d] != shapes[0][d] {
				if dim >= 0 && dim != d {
					return 0, false
				}
				dim = d
			}
		}
	}
	return dim, dim >= 0
}

// Inferred lists the parameters placed from their shard shapes alone.
func (r *Rules) Inferred() []string { return r.inferred }

// concatPlacement splits along dim with the ranks' own lengths.
func concatPlacement(name string, dim int, shapes [][]int64, pl *Placement) error {
	full := clone(shapes[0])
	if dim >= len(full) {
		return fmt.Errorf("parameter %s of shape %v cannot be concatenated along dim %d", name, full, dim)
	}
	sizes := make([]int64, len(shapes))
	full[dim] = 0
	for t, s := range shapes {
		for d := range s {
			if d != dim && s[d] != shapes[0][d] {
				return fmt.Errorf("parameter %s: shards %v differ outside the concatenation dim %d", name, shapes, dim)
			}
		}
		sizes[t] = s[dim]
		full[dim] += s[dim]
	}
	pl.Pattern, pl.Full, pl.Info.CatDim = fragment.Split{Dim: dim, Sizes: sizes}, full, dim
	return nil
}

// subParamPlacement handles parameter_with_sub_params (SubparamShape): the
// shape spec gives the sub-parameter sizes at partition_dim, and
// sub_param_shard_widths (UCI >= 0.4) each rank's share of each.
func (r *Rules) subParamPlacement(name string, sp *subParamRule, shapes [][]int64, pl *Placement) error {
	spec, ok := pyobj.Seq(sp.shape)
	if !ok || sp.partDim < 0 || sp.partDim >= len(spec) {
		return fmt.Errorf("parameter %s: sub-parameter shape %s with partition_dim %d is malformed", name, pyobj.Repr(sp.shape), sp.partDim)
	}
	sizes, err := subParamSizes(name, sp, spec, shapes)
	if err != nil {
		return err
	}
	logical, err := subParamLogical(name, sp, spec, sizes, shapes)
	if err != nil {
		return err
	}
	widths, err := r.subParamWidths(name, sp, sizes, len(shapes))
	if err != nil {
		return err
	}
	for t, s := range shapes {
		var local int64
		for k := range widths {
			local += widths[k][t]
		}
		want := clone(logical)
		want[sp.partDim] = local
		if torchfile.Numel(want) != torchfile.Numel(s) {
			return fmt.Errorf("parameter %s: rank %d holds shape %v, but its sub-parameter widths need %v", name, t, s, want)
		}
	}
	pl.Pattern, pl.Full = fragment.SubParams{Dim: sp.partDim, Widths: widths}, logical
	pl.Info.CatDim, pl.Info.SubParamWidths = sp.partDim, sizes
	pl.Info.SubParamShape = subparamShapeObject(sp, sizes)
	return nil
}

// subParamSizes returns the sub-parameter sizes at partition_dim: the
// spec's tuple, or an int count of equal sub-parameters of the shards' rows.
func subParamSizes(name string, sp *subParamRule, spec []pyobj.Value, shapes [][]int64) ([]int64, error) {
	var sizes []int64
	switch x := spec[sp.partDim].(type) {
	case pyobj.Tuple:
		s, ok := pyobj.Ints(x)
		if !ok {
			return nil, fmt.Errorf("parameter %s: sub-parameter sizes %s are not ints", name, pyobj.Repr(x))
		}
		sizes = s
	default:
		n, ok := pyobj.Int(x)
		if !ok || n <= 0 {
			return nil, fmt.Errorf("parameter %s: sub-parameter count %s is not a positive int", name, pyobj.Repr(x))
		}
		var total int64
		for _, s := range shapes {
			if sp.partDim >= len(s) {
				return nil, fmt.Errorf("parameter %s: shard shape %v has no partition dim %d", name, s, sp.partDim)
			}
			total += s[sp.partDim]
		}
		if total%n != 0 {
			return nil, fmt.Errorf("parameter %s: %d rows do not hold %d equal sub-parameters", name, total, n)
		}
		for k := int64(0); k < n; k++ {
			sizes = append(sizes, total/n)
		}
	}
	return sizes, nil
}

// subParamLogical is the logical full shape: sums at tuple entries, the
// sizes at partition_dim, one -1 resolved from the shards' numel.
func subParamLogical(name string, sp *subParamRule, spec []pyobj.Value, sizes []int64, shapes [][]int64) ([]int64, error) {
	logical := make([]int64, len(spec))
	neg := -1
	for d, e := range spec {
		if d == sp.partDim {
			for _, s := range sizes {
				logical[d] += s
			}
			continue
		}
		switch x := e.(type) {
		case pyobj.Tuple:
			ints, ok := pyobj.Ints(x)
			if !ok {
				return nil, fmt.Errorf("parameter %s: sub-parameter shape entry %s is not a tuple of ints", name, pyobj.Repr(x))
			}
			for _, v := range ints {
				logical[d] += v
			}
		default:
			v, ok := pyobj.Int(x)
			if !ok {
				return nil, fmt.Errorf("parameter %s: sub-parameter shape entry %s is not an int", name, pyobj.Repr(x))
			}
			if v == -1 {
				if neg >= 0 {
					return nil, fmt.Errorf("parameter %s: sub-parameter shape has two -1 entries", name)
				}
				neg = d
			}
			logical[d] = v
		}
	}
	var total int64
	for _, s := range shapes {
		total += torchfile.Numel(s)
	}
	if neg >= 0 {
		rest := int64(1)
		for d, v := range logical {
			if d != neg {
				rest *= v
			}
		}
		if rest == 0 || total%rest != 0 {
			return nil, fmt.Errorf("parameter %s: cannot resolve -1 in sub-parameter shape", name)
		}
		logical[neg] = total / rest
	}
	if torchfile.Numel(logical) != total {
		return nil, fmt.Errorf("parameter %s: sub-parameter shape %v holds %d elements but the shards hold %d", name, logical, torchfile.Numel(logical), total)
	}
	return logical, nil
}

// subParamWidths is each rank's width of each sub-parameter: recorded in
// sub_param_shard_widths, else (before UCI 0.4) an even split over T.
func (r *Rules) subParamWidths(name string, sp *subParamRule, sizes []int64, T int) ([][]int64, error) {
	widths := make([][]int64, len(sizes))
	if ws, ok := r.lookupWidths(sp); ok {
		if len(ws) != len(sizes) {
			return nil, fmt.Errorf("parameter %s: sub_param_shard_widths has %d rows for %d sub-parameters", name, len(ws), len(sizes))
		}
		for k := range ws {
			if len(ws[k]) != T {
				return nil, fmt.Errorf("parameter %s: sub_param_shard_widths row %d has %d ranks, not %d", name, k, len(ws[k]), T)
			}
			var s int64
			for _, w := range ws[k] {
				s += w
			}
			if s != sizes[k] {
				return nil, fmt.Errorf("parameter %s: shard widths %v of sub-parameter %d add up to %d, not %d", name, ws[k], k, s, sizes[k])
			}
			widths[k] = ws[k]
		}
	} else {
		if r.version >= 0.4 && T > 1 {
			return nil, fmt.Errorf("parameter %s: universal_checkpoint_version %v needs sub_param_shard_widths for its sub-parameters", name, r.version)
		}
		for k, s := range sizes {
			if s%int64(T) != 0 {
				return nil, fmt.Errorf("parameter %s: sub-parameter %d of size %d does not split evenly over %d ranks", name, k, s, T)
			}
			widths[k] = make([]int64, T)
			for t := range widths[k] {
				widths[k][t] = s / int64(T)
			}
		}
	}
	return widths, nil
}

func (r *Rules) lookupWidths(sp *subParamRule) ([][]int64, bool) {
	for _, p := range sp.patterns {
		if ws, ok := r.shardWidths[p.text]; ok {
			return ws, true
		}
	}
	return nil, false
}

// subparamShapeObject builds the SubparamShape dataclass that
// ds_to_universal stores under 'sub_param_shape', with the sizes at
// partition_dim always a tuple (pitfall P8).
func subparamShapeObject(sp *subParamRule, sizes []int64) pyobj.Value {
	spec, _ := pyobj.Seq(sp.shape)
	items := append([]pyobj.Value(nil), spec...)
	t := make(pyobj.Tuple, len(sizes))
	for i, s := range sizes {
		t[i] = s
	}
	items[sp.partDim] = t
	// Keep the outer container as the checkpoint wrote it (list or tuple).
	var shape pyobj.Value = pyobj.Tuple(items)
	if _, isList := sp.shape.(*pyobj.List); isList {
		shape = &pyobj.List{Items: items}
	}
	pats := make([]pyobj.Value, len(sp.patterns))
	for i, p := range sp.patterns {
		pats[i] = p.text
	}
	state := pyobj.DictOf("patterns", &pyobj.List{Items: pats}, "shape", shape, "partition_dim", int64(sp.partDim))
	return &pyobj.Object{Class: &pyobj.Global{Module: "deepspeed.checkpoint.universal_checkpoint", Name: "SubparamShape"},
		Via: pyobj.ByNewObj, State: state, Built: true}
}

func clone(s []int64) []int64 { return append([]int64(nil), s...) }

// Present reports whether the model state had universal_checkpoint_info.
func (r *Rules) Present() bool { return r.present }

// Unsupported returns autotp_unsupported_parameter_patterns (nil: none).
func (r *Rules) Unsupported() map[string]string { return r.unsupported }

// PipeReplicated reports whether name matches a
// pipeline_replicated_parameter_patterns entry.
func (r *Rules) PipeReplicated(name string) (bool, error) {
	pat, err := r.match(r.pipeReplica, name)
	return pat != nil, err
}
