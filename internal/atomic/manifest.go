package atomic

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash"
	"hash/crc32"
	"path/filepath"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fsutil"
)

// Manifest is ucp.json, the last file written into an atomic checkpoint.
type Manifest struct {
	Format  string       `json:"format"`  // always "ucp-atomic"
	Version int          `json:"version"` // ManifestVersion
	Tool    string       `json:"tool,omitempty"`
	Source  SourceInfo   `json:"source"`
	Params  []ParamEntry `json:"params"`
	Files   []FileEntry  `json:"files"` // global files: optimizer_state.pt, model-state copies, extra_state.pt
	Notes   []string     `json:"notes,omitempty"`
}

// SourceInfo describes the checkpoint that was converted.
type SourceInfo struct {
	Format  string         `json:"format"`
	Path    string         `json:"path"`
	Tag     string         `json:"tag,omitempty"`
	Degrees Degrees        `json:"degrees"`
	DType   string         `json:"dtype,omitempty"` // training dtype, when the source tells it
	Args    map[string]any `json:"args,omitempty"`  // saved training arguments (scalars)
	// Model is the model family and its configuration (internal/family),
	// when the source records them (Megatron or Megatron-DeepSpeed args,
	// a Hugging Face config.json) or --arch named the family.
	Model *family.Config `json:"model,omitempty"`
}

// Degrees are the parallel degrees of the source checkpoint.
type Degrees struct {
	TP   int `json:"tp"`
	PP   int `json:"pp"`
	DP   int `json:"dp"`
	EP   int `json:"ep"`
	VPP  int `json:"vpp"`
	ZeRO int `json:"zero"` // ZeRO stage, 0 for none
}

// ParamEntry describes one parameter and its files.
type ParamEntry struct {
	Name        string   `json:"name"`
	Shape       []int64  `json:"shape"`
	DType       string   `json:"dtype"`
	Pattern     string   `json:"pattern"`
	SplitDims   []int    `json:"split_dims,omitempty"` // -1: a flattened tensor split in ranges
	Frozen      bool     `json:"frozen,omitempty"`
	SourceDType string   `json:"source_dtype,omitempty"` // frozen parameters and buffers: the stored dtype
	VocabSize   int64    `json:"vocab_size,omitempty"`
	PaddedVocab int64    `json:"padded_vocab_size,omitempty"`
	Aliases     []string `json:"aliases,omitempty"`
	// TPLayout says where the tensor-parallel cut of the state files'
	// keys (cat_dim, sub-parameters, vocabulary) comes from: TPFromSource,
	// TPFromFamily, or "" when nothing records it (a source saved without
	// tensor parallelism and no model-family rule): such a parameter is
	// never cut for a tensor-parallel target (layout.Model.Slice refuses).
	TPLayout string       `json:"tp_layout,omitempty"`
	Files    []StateEntry `json:"files"`
}

// ParamEntry.TPLayout values.
const (
	TPFromSource = "source" // the source checkpoint's own TP layout
	TPFromFamily = "family" // the model family's rules (internal/family)
)

// StateDType is the dtype of the parameter's state tensors: DType, which
// is float32 for trained parameters and the stored dtype for frozen
// parameters and buffers (manifests that leave it empty mean float32).
func (p *ParamEntry) StateDType() (dtype.DType, error) {
	if p.DType == "" {
		return dtype.Float32, nil
	}
	dt, err := dtype.Parse(p.DType)
	if err != nil {
		return dtype.Invalid, fmt.Errorf("parameter %s: dtype: %w", p.Name, err)
	}
	if dt.Size() == 0 {
		return dtype.Invalid, fmt.Errorf("parameter %s: dtype %s has no element size", p.Name, p.DType)
	}
	return dt, nil
}

// StateEntry is one state file of a parameter.
type StateEntry struct {
	State string `json:"state"`
	FileEntry
}

// FileEntry is a file with its size and the CRC-32 (IEEE) of all its bytes.
type FileEntry struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
	CRC32 string `json:"crc32"`
	// Blocks are the CRC-32s of each BlockSize block of the file's one
	// tensor record's data (a state file's storage data/0), from its
	// first byte, as base64 of little-endian uint32s; empty when not
	// recorded (checkpoints written before them, or data holding a
	// source record copied across a block end with its stated CRC).
	Blocks string `json:"block_crc32,omitempty"`
}

// BlockSize is the block of FileEntry.Blocks: small enough that the
// partial blocks a copied range begins and ends in, which are read back
// to hash, cost little; large enough that an 8 TB checkpoint's manifest
// grows by about 40 MB.
const BlockSize = 1 << 20

// encodeBlocks is FileEntry.Blocks for crcs.
func encodeBlocks(crcs []uint32) string {
	if len(crcs) == 0 {
		return ""
	}
	b := make([]byte, 0, 4*len(crcs))
	for _, c := range crcs {
		b = binary.LittleEndian.AppendUint32(b, c)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// decodeBlocks decodes FileEntry.Blocks.
func decodeBlocks(s string) ([]uint32, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b)%4 != 0 {
		return nil, fmt.Errorf("block_crc32 is not base64 of 4-byte CRCs")
	}
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out, nil
}

// AllFiles lists every file the manifest covers: the state files of each
// parameter in order, then the global files.
func (m *Manifest) AllFiles() []FileEntry {
	var out []FileEntry
	for _, p := range m.Params {
		for _, f := range p.Files {
			out = append(out, f.FileEntry)
		}
	}
	return append(out, m.Files...)
}

func newCRC() hash.Hash32 { return crc32.NewIEEE() }

// ReadManifest reads DIR/ucp.json.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestName)
	b, err := fsutil.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseManifest(path, b)
}

// maxManifestNumel bounds a parameter's elements (2^60: far beyond any
// model, and numel times any element size stays within int64).
const maxManifestNumel = 1 << 60

// ParseManifest decodes ucp.json (read from path) and checks what its
// readers rely on: the format and version, parameter names, shapes of
// non-negative dims whose product cannot overflow, state dtypes, and file
// sizes that are not negative.
func ParseManifest(path string, b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if m.Format != ManifestFormat {
		return nil, fmt.Errorf("%s: format %q, want %q", path, m.Format, ManifestFormat)
	}
	if m.Version != ManifestVersion {
		return nil, fmt.Errorf("%s: manifest version %d is not supported (want %d)", path, m.Version, ManifestVersion)
	}
	for i := range m.Params {
		p := &m.Params[i]
		if err := CheckName(p.Name); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		n := int64(1)
		for _, d := range p.Shape {
			if d < 0 || d > 0 && n > maxManifestNumel/d {
				return nil, fmt.Errorf("%s: parameter %s: shape %v is negative or holds more than 2^60 elements", path, p.Name, p.Shape)
			}
			n *= d
		}
		if _, err := p.StateDType(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, f := range p.Files {
			if f.Bytes < 0 {
				return nil, fmt.Errorf("%s: parameter %s: file %s of %d bytes", path, p.Name, f.Path, f.Bytes)
			}
		}
	}
	for _, f := range m.Files {
		if f.Bytes < 0 {
			return nil, fmt.Errorf("%s: file %s of %d bytes", path, f.Path, f.Bytes)
		}
	}
	return &m, nil
}
