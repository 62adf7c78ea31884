package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fsutil"
)

// Arch values besides the family names (internal/family).
const (
	ArchAuto = "auto" // the family the manifest records (or its args tell)
	ArchNone = "none" // the atomic names, no config.json
)

// ConfigCopy is where an atomic checkpoint converted from a Hugging Face
// folder keeps the source's config.json, so an export to the same family
// writes it back with every field (token ids, initializer range ...).
const ConfigCopy = "hf_config.json"

// ModelConfig returns the family and config an export with arch uses:
// for auto, the manifest's source.model, else the one its args give
// (family.Detect, for manifests written before ucp recorded it); a
// family name overrides the family and checks that it computes the
// model. The error names --arch and the families.
func ModelConfig(r *atomic.Reader, arch string) (*family.Config, error) {
	how := fmt.Sprintf("name one with --arch (%s) or keep the source names with --arch none", strings.Join(family.Names(), ", "))
	if arch != ArchAuto {
		// --arch names the family only; the geometry (heads, groups,
		// RoPE ...) must still come from the checkpoint.
		how = fmt.Sprintf("--arch %s names the family only: its config (heads, query groups, RoPE, norms) comes from the checkpoint's training arguments; --arch none keeps the source names", arch)
	}
	if src := r.Manifest.Source; src.Model == nil && src.Args == nil || arch != ArchAuto {
		how += "; a checkpoint that records no usable config (torchtitan DCP, args without the model's geometry) takes a transformers config.json of the model at convert: ucp convert --model-config config.json"
	}
	c, err := r.Model()
	if err != nil {
		return nil, fmt.Errorf("%w; %s", err, how)
	}
	if arch != ArchAuto {
		if _, err := family.Get(arch); err != nil {
			return nil, fmt.Errorf("--arch: %w (or auto, none)", err)
		}
		c.Family = arch
	}
	if err := c.Check(); err != nil {
		return nil, fmt.Errorf("%s: the model cannot be exported as %s: %w", r.Dir, c.Family, err)
	}
	return c, nil
}

// mapFamily renames and splits the tensors for the family's transformers
// class and writes its config.json. Tensors whose source parameters sel
// does not select are left out.
func mapFamily(r *atomic.Reader, c *family.Config, plain []*Tensor, sel *regexp.Regexp, dt dtype.DType) ([]*Tensor, []byte, error) {
	var ps []family.Param
	byName := map[string]*Tensor{}
	for _, t := range plain {
		ps = append(ps, family.Param{Name: t.Name, Shape: t.Shape})
		byName[t.Name] = t
	}
	src, err := family.Resolve(c, ps, r.Manifest.Source.Format)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: --arch %s: %w", r.Dir, c.Family, err)
	}
	ts, err := src.Unfused(family.HF)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", r.Dir, err)
	}
	var out []*Tensor
	for _, ft := range ts {
		from := byName[ft.Pieces[0].Param]
		if sel != nil && !sel.MatchString(from.Name) {
			continue
		}
		t := &Tensor{Name: ft.Name, DType: from.DType, Shape: ft.Shape, AddOne: ft.AddOne}
		for _, p := range ft.Pieces {
			t.Pieces = append(t.Pieces, Piece{Param: p.Param, Start: p.Start, Len: p.Len})
		}
		out = append(out, t)
	}
	config, err := configJSON(r, c, dt)
	if err != nil {
		return nil, nil, err
	}
	return out, config, nil
}

// configJSON is config.json as transformers' to_json_file writes it
// (sorted keys, indent 2): the source's own config.json when the atomic
// checkpoint keeps one of the same family (torch_dtype set to the
// export's), else the family's fields of the config.
func configJSON(r *atomic.Reader, c *family.Config, dt dtype.DType) ([]byte, error) {
	var m map[string]any
	if r.HasFile(ConfigCopy) {
		b, err := fsutil.ReadFile(r.Dir + "/" + ConfigCopy)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", r.Dir, ConfigCopy, err)
		}
		if orig, err := family.FromHF(m); err != nil || orig.Family != c.Family {
			m = nil // --arch chose another family: write its fields
		} else if m, err = literalJSON(b); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", r.Dir, ConfigCopy, err)
		}
	}
	if m == nil {
		var err error
		if m, err = c.ToHF(); err != nil {
			return nil, err
		}
		pyFloats(m)
	}
	// transformers 4.56+ writes "dtype", earlier releases "torch_dtype".
	set := false
	for _, k := range []string{"dtype", "torch_dtype"} {
		if _, ok := m[k]; ok {
			m[k], set = dt.String(), true
		}
	}
	if !set {
		m["torch_dtype"] = dt.String()
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
