// Package family is the model-family table: one row per model family
// (llama, mistral, qwen2, qwen3; MoE families are more rows) saying the
// model's configuration, the role of every parameter, each role's
// tensor-parallel rule, and its names and fused layouts in Megatron-core
// (local and Transformer Engine specs), legacy Megatron, Megatron-DeepSpeed,
// Hugging Face transformers and torchtitan. Every mapping between those
// frameworks goes through this table; nothing else in ucp spells a
// framework's parameter names for a model family. FAMILIES.md documents
// the rows and cites the frameworks' source.
//
// The package is pure data and functions of it: it reads no files and
// imports no other ucp package, so readers, writers and the manifest can
// all use it.
package family

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// TP is how a role's tensor is split over tensor-parallel ranks.
type TP uint8

const (
	Replicated TP = iota // every rank holds the whole tensor (norms, row-parallel biases)
	Column               // dim 0 split (fused parts: per part, see Fuse)
	Row                  // dim 1 split
	Vocab                // dim 0 split of the vocabulary padded to a multiple of the TP size
)

var tpNames = [...]string{"replicated", "column", "row", "vocabulary"}

func (t TP) String() string { return tpNames[t] }

// Fuse says how roles share one Megatron tensor.
type Fuse uint8

const (
	NoFuse Fuse = iota
	// QKV: Megatron's linear_qkv / query_key_value, rows per query group
	// [q (heads/groups heads); k (1 head); v (1 head)] (Megatron-DeepSpeed
	// with GQA: [Q; K; V], see Stacked). Part 0 q, 1 k, 2 v.
	QKV
	// GateUp: SwiGLU fc1, rows [gate; up]; a TP rank holds [gate_r; up_r].
	GateUp
)

// Scope says where a role occurs.
type Scope uint8

const (
	Global Scope = iota // once per model
	Layer               // once per transformer layer: names hold {L}
	Expert              // once per layer and routed expert: names hold {L} and {E}
)

// Naming is a framework's way of naming parameters.
type Naming uint8

const (
	HF     Naming = iota // Hugging Face transformers (state dict of XForCausalLM)
	Titan                // torchtitan model FQNs (its DCP keys)
	Core                 // megatron-core GPTModel, local spec
	CoreTE               // megatron-core GPTModel, Transformer Engine spec (norms fused into the next linear)
	Legacy               // legacy Megatron (language_model.*) and Megatron-DeepSpeed after PipeNames
	numNamings
)

var namingNames = [...]string{"hf", "torchtitan", "megatron-core", "megatron-core-te", "megatron-legacy"}

func (n Naming) String() string { return namingNames[n] }

// Role is one kind of parameter of a family.
type Role struct {
	Name  string // "q_proj", ...; unique within a family
	Scope Scope
	TP    TP
	// Norm marks norm weights: Megatron's apply_layernorm_1p stores them
	// minus one.
	Norm bool
	// When says whether the role exists in a model of the config (nil:
	// always); Layers whether a per-layer role exists at layer l (nil:
	// at every layer; deepseek_v3's dense and MoE layers).
	When   func(c *Config) bool
	Layers func(c *Config, l int) bool
	// TEReplicated: megatron-core's TE spec holds the role whole on
	// every tensor-parallel rank (MLA's down projections, TELinear
	// 'duplicated'), where the local spec splits it by TP.
	TEReplicated bool
	// Names per naming: a template with {L} (layer) and {E} (expert),
	// alternatives that older versions wrote after a '|' (the first is
	// written, all are read); "" where the framework has no such
	// parameter. Megatron names of fused roles name the fused tensor.
	Names [numNamings]string
	// Fuse and Part: the role is part Part of a fused Megatron tensor.
	Fuse Fuse
	Part int
}

// Family is one row of the table.
type Family struct {
	Name        string // the --arch value
	HFArch      string // config.json architectures[0]
	HFModelType string // config.json model_type
	// TitanInterleaved: torchtitan's model applies RoPE to adjacent pairs
	// (complex multiplication, as Megatron's rotary_interleaved), so its
	// q/k rows are in the interleaved order.
	TitanInterleaved bool
	Roles            []Role
	// Check refuses a configuration the family's Hugging Face model
	// cannot compute exactly, naming the option.
	Check func(c *Config) error
	// ToHF returns config.json's fields, FromHF reads them.
	ToHF   func(c *Config) (map[string]any, error)
	FromHF func(m map[string]any, c *Config) error
}

// All returns the table, a row per family.
func All() []*Family {
	return []*Family{llama(), mistral(), qwen2(), qwen3(), mixtral(), qwen2MoE(), qwen3MoE(), deepseekV3()}
}

// Names lists the families.
func Names() []string {
	var out []string
	for _, f := range All() {
		out = append(out, f.Name)
	}
	return out
}

// Get returns a family by name.
func Get(name string) (*Family, error) {
	for _, f := range All() {
		if f.Name == name {
			return f, nil
		}
	}
	return nil, fmt.Errorf("unknown model family %q (known: %s)", name, strings.Join(Names(), ", "))
}

// ByHFModelType returns the family of a config.json model_type.
func ByHFModelType(mt string) (*Family, error) {
	for _, f := range All() {
		if f.HFModelType == mt {
			return f, nil
		}
	}
	return nil, fmt.Errorf("Hugging Face model_type %q is not a known model family (known: %s)", mt, strings.Join(Names(), ", "))
}

// Present lists the roles a model of config c has, in table order.
func (f *Family) Present(c *Config) []Role {
	var out []Role
	for _, r := range f.Roles {
		if r.When == nil || r.When(c) {
			out = append(out, r)
		}
	}
	return out
}

// At reports whether role r exists at layer l (-1: a global role) of a
// model of config c.
func (r Role) At(c *Config, l int) bool {
	return r.Layers == nil || l < 0 || r.Layers(c, l)
}

// TPIn is the role's tensor-parallel rule in naming n.
func (r Role) TPIn(n Naming) TP {
	if n == CoreTE && r.TEReplicated {
		return Replicated
	}
	return r.TP
}

// Role returns a role by name.
func (f *Family) Role(name string) (Role, bool) {
	for _, r := range f.Roles {
		if r.Name == name {
			return r, true
		}
	}
	return Role{}, false
}

// NameIn returns the parameter name of the role in naming n at a layer
// and expert ("" when the naming has none).
func (r Role) NameIn(n Naming, layer, expert int) string {
	return expand(first(r.Names[n]), layer, expert)
}

func first(t string) string {
	if i := strings.IndexByte(t, '|'); i >= 0 {
		return t[:i]
	}
	return t
}

func expand(t string, layer, expert int) string {
	t = strings.ReplaceAll(t, "{L}", strconv.Itoa(layer))
	return strings.ReplaceAll(t, "{E}", strconv.Itoa(expert))
}

// Match is a parameter name recognised as a role.
type Match struct {
	Role          Role
	Naming        Naming
	Layer, Expert int // -1 when the role has none
}

// matcher holds a family's compiled name templates.
type matcher struct {
	re    *regexp.Regexp
	role  int
	n     Naming
	layer int // submatch index of {L}, 0 for none
	exp   int
}

func compile(t string) (*regexp.Regexp, int, int) {
	var b strings.Builder
	b.WriteByte('^')
	layer, exp, k := 0, 0, 0
	for len(t) > 0 {
		switch {
		case strings.HasPrefix(t, "{L}"):
			k++
			layer = k
			b.WriteString(`(\d+)`)
			t = t[3:]
		case strings.HasPrefix(t, "{E}"):
			k++
			exp = k
			b.WriteString(`(\d+)`)
			t = t[3:]
		default:
			b.WriteString(regexp.QuoteMeta(t[:1]))
			t = t[1:]
		}
	}
	b.WriteByte('$')
	return regexp.MustCompile(b.String()), layer, exp
}

func (f *Family) matchers() []matcher {
	var out []matcher
	for i, r := range f.Roles {
		for n := Naming(0); n < numNamings; n++ {
			for _, alt := range strings.Split(r.Names[n], "|") {
				if alt == "" {
					continue
				}
				re, l, e := compile(alt)
				out = append(out, matcher{re, i, n, l, e})
			}
		}
	}
	return out
}

// Matcher recognises parameter names of a family in every naming.
type Matcher struct {
	f  *Family
	ms []matcher
}

// NewMatcher compiles the family's names.
func (f *Family) NewMatcher() *Matcher { return &Matcher{f, f.matchers()} }

// Lookup returns the role of a parameter name in any naming. Names that
// two namings share (a Megatron-core name identical in both specs) match
// the first naming listed.
func (m *Matcher) Lookup(name string) (Match, bool) {
	return m.lookup(name, -1)
}

// LookupIn returns the role of a parameter name in one naming.
func (m *Matcher) LookupIn(name string, n Naming) (Match, bool) { return m.lookup(name, int(n)) }

func (m *Matcher) lookup(name string, only int) (Match, bool) {
	for _, x := range m.ms {
		if only >= 0 && int(x.n) != only {
			continue
		}
		s := x.re.FindStringSubmatch(name)
		if s == nil {
			continue
		}
		mt := Match{Role: m.f.Roles[x.role], Naming: x.n, Layer: -1, Expert: -1}
		if x.layer > 0 {
			mt.Layer, _ = strconv.Atoi(s[x.layer])
		}
		if x.exp > 0 {
			mt.Expert, _ = strconv.Atoi(s[x.exp])
		}
		return mt, true
	}
	return Match{}, false
}

// Span is a run of rows of one part of a fused tensor, in the part's own
// (Hugging Face) row order.
type Span struct {
	Part   int
	Row, N int64
}

// FusedRows lists, in order, the rows of tensor-parallel rank t's (of T)
// local Megatron fused tensor as runs of rows of its parts in Hugging Face
// order: QKV per query group (stacked: [Q; K; V], Megatron-DeepSpeed with
// GQA), gate/up as [gate_t; up_t]. interleaved is Megatron's
// rotary_interleaved (or torchtitan's complex RoPE): each head's q and k
// rows are in adjacent-pair order, Hugging Face row i of a head being
// row 2i and row d/2+i row 2i+1. T must divide the query groups (QKV) or
// the FFN size (GateUp). Biases (1-D) use the same runs with one element
// per row.
func FusedRows(c *Config, fuse Fuse, stacked, interleaved bool, T, t int) ([]Span, error) {
	if T < 1 || t < 0 || t >= T {
		return nil, fmt.Errorf("tensor-parallel rank %d of %d", t, T)
	}
	var out []Span
	add := func(part int, row, n int64) {
		if k := len(out) - 1; k >= 0 && out[k].Part == part && out[k].Row+out[k].N == row {
			out[k].N += n
			return
		}
		out = append(out, Span{part, row, n})
	}
	switch fuse {
	case GateUp:
		if c.FFN <= 0 || c.FFN%int64(T) != 0 {
			return nil, fmt.Errorf("tensor-parallel size %d does not divide the FFN size %d", T, c.FFN)
		}
		n := c.FFN / int64(T)
		add(0, int64(t)*n, n)
		add(1, int64(t)*n, n)
		return out, nil
	case QKV:
	default:
		return nil, fmt.Errorf("no fused layout %d", fuse)
	}
	G, H, d := c.QueryGroups, c.Heads, c.HeadDim
	if G <= 0 || H%G != 0 || d <= 0 {
		return nil, fmt.Errorf("%d heads in %d query groups of dim %d", H, G, d)
	}
	if G%int64(T) != 0 {
		return nil, fmt.Errorf("tensor-parallel size %d does not divide the %d query groups", T, G)
	}
	if interleaved && d%2 != 0 {
		return nil, fmt.Errorf("interleaved rotary embeddings need an even head dim, not %d", d)
	}
	head := func(part int, h int64, rope bool) {
		if !rope || !interleaved {
			add(part, h*d, d)
			return
		}
		for i := int64(0); i < d/2; i++ {
			add(part, h*d+i, 1)
			add(part, h*d+d/2+i, 1)
		}
	}
	qpg := H / G
	g0, g1 := int64(t)*G/int64(T), int64(t+1)*G/int64(T)
	if stacked {
		for g := g0; g < g1; g++ {
			for h := g * qpg; h < (g+1)*qpg; h++ {
				head(0, h, true)
			}
		}
		for g := g0; g < g1; g++ {
			head(1, g, true)
		}
		for g := g0; g < g1; g++ {
			head(2, g, false)
		}
		return out, nil
	}
	for g := g0; g < g1; g++ {
		for h := g * qpg; h < (g+1)*qpg; h++ {
			head(0, h, true)
		}
		head(1, g, true)
		head(2, g, false)
	}
	return out, nil
}

// PartRows inverts FusedRows for one part: the runs of the fused tensor's
// rows (start in the fused tensor, count) that give the part's rows in
// Hugging Face order.
func PartRows(spans []Span, part int) [][2]int64 {
	type run struct{ row, at, n int64 }
	var runs []run
	var at int64
	for _, s := range spans {
		if s.Part == part {
			runs = append(runs, run{s.Row, at, s.N})
		}
		at += s.N
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].row < runs[j].row })
	var out [][2]int64
	for _, r := range runs {
		if k := len(out) - 1; k >= 0 && out[k][0]+out[k][1] == r.at {
			out[k][1] += r.n
			continue
		}
		out = append(out, [2]int64{r.at, r.n})
	}
	return out
}

// PartRowCount is the number of rows of a fused role's part in the full
// model.
func PartRowCount(c *Config, fuse Fuse, part int) int64 {
	switch fuse {
	case QKV:
		if part == 0 {
			return c.Heads * c.HeadDim
		}
		return c.QueryGroups * c.HeadDim
	case GateUp:
		return c.FFN
	}
	return 0
}

// Parts returns a family's roles fused into the same Megatron tensor as
// role r (r included), ordered by Part.
func (f *Family) Parts(c *Config, r Role) []Role {
	if r.Fuse == NoFuse {
		return []Role{r}
	}
	var out []Role
	for _, x := range f.Present(c) {
		if x.Fuse == r.Fuse && x.Names[Core] == r.Names[Core] {
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b Role) int { return a.Part - b.Part })
	return out
}
