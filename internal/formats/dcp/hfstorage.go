package dcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/safetensors"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// HFIndexFile is the weight map HuggingFaceStorageWriter (unsharded) and
// consolidate_safetensors_files write beside the safetensors files.
const HFIndexFile = "model.safetensors.index.json"

var (
	hfShardRE = regexp.MustCompile(`^shard-(\d+)-model-(\d+)-of-(\d+)\.safetensors$`)
	hfModelRE = regexp.MustCompile(`^model(-\d+-of-\d+)?\.safetensors$`)
	hfBinRE   = regexp.MustCompile(`^pytorch_model(-\d+-of-\d+)?\.bin$`)
)

// HFBinIndexFile is the weight map of transformers' sharded torch.save
// weights (save_pretrained with safe_serialization=False).
const HFBinIndexFile = "pytorch_model.bin.index.json"

// DetectHF reports whether path is a folder of safetensors files in the
// layouts of DCP's HuggingFaceStorageWriter: per-rank
// shard-R-model-K-of-N.safetensors (save_sharded), or model-K-of-N.safetensors
// with model.safetensors.index.json (unsharded or consolidated). A folder
// with a DCP .metadata is a plain DCP checkpoint instead.
func DetectHF(path string) bool {
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() || Detect(path) {
		return false
	}
	if exists(filepath.Join(path, HFIndexFile)) || exists(filepath.Join(path, HFBinIndexFile)) {
		return true
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if hfShardRE.MatchString(e.Name()) || hfModelRE.MatchString(e.Name()) || hfBinRE.MatchString(e.Name()) {
			return true
		}
	}
	return false
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// listHF returns the regular files of ents with extension ext (and
// matching re, when set) in shard order.
func listHF(ents []os.DirEntry, re *regexp.Regexp, ext string) []string {
	var files []string
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ext && e.Type().IsRegular() && (re == nil || re.MatchString(e.Name())) {
			files = append(files, e.Name())
		}
	}
	sort.Slice(files, func(i, j int) bool { return hfLess(files[i], files[j]) })
	return files
}

// hfEntry is one tensor of one weights file.
type hfEntry struct {
	name string
	off  []int64 // the chunk's offsets in the full tensor (DCP_SHARDING_INFO; zeros otherwise)
	ref  fragment.TensorRef
	item string
}

// safetensorsEntries lists the tensors of a safetensors file from its
// header, at the DCP_SHARDING_INFO saved_offsets when it has them.
func safetensorsEntries(path, name string) ([]hfEntry, error) {
	sf, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	sf.Close() // the header is all Open needs; data is read by path later
	var sharding map[string]struct {
		SavedOffsets []int64 `json:"saved_offsets"`
	}
	if info, ok := sf.Metadata["DCP_SHARDING_INFO"]; ok {
		if err := json.Unmarshal([]byte(info), &sharding); err != nil {
			return nil, fmt.Errorf("%s: DCP_SHARDING_INFO: %w", path, err)
		}
	}
	var out []hfEntry
	for i := range sf.Tensors {
		st := &sf.Tensors[i]
		off := make([]int64, len(st.Shape))
		if sharding != nil {
			sh, ok := sharding[st.Name]
			if !ok {
				return nil, fmt.Errorf("%s: DCP_SHARDING_INFO has no saved_offsets for %q", path, st.Name)
			}
			if len(sh.SavedOffsets) != len(st.Shape) {
				return nil, fmt.Errorf("%s: %q: saved_offsets %v do not have the %d dims of its shape %v", path, st.Name, sh.SavedOffsets, len(st.Shape), st.Shape)
			}
			for d, o := range sh.SavedOffsets {
				if o < 0 {
					return nil, fmt.Errorf("%s: %q: negative saved_offsets %v", path, st.Name, sh.SavedOffsets)
				}
				off[d] = o
			}
		}
		ref := fragment.TensorRef{Path: path, T: &torchfile.Tensor{
			Storage: &torchfile.Storage{Key: "safetensors:" + st.Name, DType: st.DType, Location: "cpu",
				Numel: st.Numel(), Offset: st.Offset},
			DType: st.DType, Shape: clone(st.Shape), Stride: torchfile.ContiguousStrides(st.Shape)}}
		out = append(out, hfEntry{name: st.Name, off: off, ref: ref, item: fmt.Sprintf("%s@%d+%d", name, st.Offset, st.NBytes)})
	}
	return out, nil
}

// binEntries lists the tensors of a torch.save file of a state dict
// (pytorch_model.bin or one of its shards) by parsing its pickle only:
// the data stays in the file and is read by range later. A tensor that
// is the very view of an earlier one in the same file (tied weights:
// transformers saves lm_head.weight sharing the embedding's storage) is
// the same parameter, kept once under the first name as the safetensors
// layout keeps it; a note says so.
func binEntries(path, name string) ([]hfEntry, map[string]string, error) {
	tf, err := torchfile.Open(path)
	if err != nil {
		return nil, nil, err
	}
	tf.Close() // the pickle is all we need; data is read by path later
	root := pyobj.NewDec(path, tf.Root)
	items := root.Items()
	if err := root.Err(); err != nil {
		return nil, nil, fmt.Errorf("%s: not a state dict: %w", path, err)
	}
	var out []hfEntry
	views := map[string]string{} // storage and view -> first name
	aliases := map[string]string{}
	for _, it := range items {
		t := pyobj.As[*torchfile.Tensor](it.Dec, "a tensor")
		if err := root.Err(); err != nil {
			return nil, nil, fmt.Errorf("%w: not a transformers weights file", err)
		}
		view := fmt.Sprint(t.Storage.Key, t.StorageOffset, t.Shape, t.Stride, t.DType)
		if first, dup := views[view]; dup {
			aliases[it.Key] = first
			continue
		}
		views[view] = it.Key
		out = append(out, hfEntry{name: it.Key, off: make([]int64, len(t.Shape)), ref: fragment.Ref(path, t, 0),
			item: fmt.Sprintf("%s:%s", name, t.Storage.Key)})
	}
	return out, aliases, nil
}

// IndexHF builds the fragment table of a HuggingFaceStorageWriter folder
// or of a transformers model folder (save_pretrained). A config.json
// beside the weights is copied into the atomic checkpoint (HFConfigCopy)
// and, for a known model_type, gives the model family (internal/family).
func IndexHF(ctx context.Context, path string, opt Options) (*fragment.Table, error) {
	c, err := OpenHF(ctx, path, opt)
	if err != nil {
		return nil, err
	}
	t, err := c.Table()
	if err != nil {
		return nil, err
	}
	if err := hfConfig(t, path); err != nil {
		return nil, err
	}
	return t, nil
}

// HFConfigCopy is where the atomic checkpoint keeps the source's
// config.json (hf.ConfigCopy).
const HFConfigCopy = "hf_config.json"

// hfConfig records the config.json beside the weights, when there is one.
func hfConfig(t *fragment.Table, dir string) error {
	p := filepath.Join(dir, "config.json")
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return applyHFConfig(t, p, false)
}

// ApplyModelConfig records a transformers config.json the user names for
// a checkpoint that records no model (a torchtitan DCP checkpoint:
// 'ucp convert --model-config'): its model_type must be a known family
// whose parameters the table's are, in any of the family's namings.
func ApplyModelConfig(t *fragment.Table, path string) error {
	return applyHFConfig(t, path, true)
}

// applyHFConfig records the config.json at p: copied as it is, and its
// family and config when its model_type is a known family whose
// parameters these are (else an error when must, a note otherwise).
func applyHFConfig(t *fragment.Table, p string, must bool) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	cf := t.CopyFiles[:0]
	for _, f := range t.CopyFiles {
		if f.Name != HFConfigCopy {
			cf = append(cf, f)
		}
	}
	t.CopyFiles = append(cf, fragment.CopyFile{Name: HFConfigCopy, Src: p, Size: st.Size()})
	var dt, tdt, mt string
	for _, f := range []struct {
		key string
		dst *string
	}{{"dtype", &dt}, {"torch_dtype", &tdt}, {"model_type", &mt}} {
		switch x := m[f.key].(type) {
		case nil:
		case string:
			*f.dst = x
		default:
			return fmt.Errorf("%s: %s is %v, not a string", p, f.key, x)
		}
	}
	if t.DType = dt; dt == "" {
		t.DType = tdt
	}
	if _, err := family.ByHFModelType(mt); err != nil {
		if must {
			return fmt.Errorf("%s: model_type %q is no known model family (%s)", p, mt, strings.Join(family.Names(), ", "))
		}
		t.Notes = append(t.Notes, fmt.Sprintf("%s: model_type %q is no known model family: exports keep the names (--arch none) or name one with --arch", p, mt))
		return nil
	}
	c, err := family.FromHF(m)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	var ps []family.Param
	for _, x := range t.Params {
		ps = append(ps, family.Param{Name: x.Name, Shape: x.Shape})
	}
	if _, err := family.Resolve(c, ps, t.Format); err != nil {
		return fmt.Errorf("%s says %s, but the weights are not that model's: %w", p, c.Family, err)
	}
	t.Model = c
	return nil
}

// hfIndex is model.safetensors.index.json.
type hfIndex struct {
	WeightMap map[string]string `json:"weight_map"`
	order     []string          // weight_map keys in file order
}

func readHFIndex(path string) (*hfIndex, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var idx hfIndex
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if idx.WeightMap == nil {
		return nil, fmt.Errorf("%s: no weight_map", path)
	}
	// The keys' order in the file is the model's (json maps lose it).
	var raw struct {
		WeightMap json.RawMessage `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw.WeightMap))
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%s: weight_map: %w", path, err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%s: weight_map: %w", path, err)
		}
		k, err := jsonKey(tok)
		if err != nil {
			return nil, fmt.Errorf("%s: weight_map %w", path, err)
		}
		var v string
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s: weight_map[%q]: %w", path, k, err)
		}
		idx.order = append(idx.order, k)
	}
	return &idx, nil
}

// OpenHF reads the safetensors headers of a HuggingFaceStorageWriter folder
// and builds the checkpoint HuggingFaceStorageReader.read_metadata would:
// one chunk per (file, tensor) at the DCP_SHARDING_INFO saved_offsets
// (zeros without it), each tensor's size the largest offset + shape per
// dim. The chunks are then checked as a DCP checkpoint's: in bounds, no
// overlap, no hole (a missing shard file leaves one).
func OpenHF(ctx context.Context, dir string, opt Options) (*Checkpoint, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files, idx, idxName, bin, err := hfFiles(dir, ents)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Dir: dir, Format: "hf", Meta: &Metadata{PlannerData: map[string][]pyobj.Value{},
		byKey: map[string]*Entry{}, storage: map[string]int{}}}
	tensors := map[string]*Tensor{}
	ranks := map[string]bool{}
	aliased := map[string]bool{} // names of a .bin's tied copies, not read
	for _, name := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		path := filepath.Join(dir, name)
		var ents []hfEntry
		if bin {
			var al map[string]string
			ents, al, err = binEntries(path, name)
			for _, k := range slices.Sorted(maps.Keys(al)) {
				aliased[k] = true
				c.Notes = append(c.Notes, fmt.Sprintf("%s: %s is %s (the same storage and view: tied weights), kept once as %s", path, k, al[k], al[k]))
			}
		} else {
			ents, err = safetensorsEntries(path, name)
		}
		if errors.Is(err, fs.ErrNotExist) && idx != nil {
			return nil, fmt.Errorf("%s: weights file is missing (%s names it)", path, idxName)
		}
		if err != nil {
			return nil, err
		}
		if m := hfShardRE.FindStringSubmatch(name); m != nil {
			ranks[m[1]] = true
		}
		if err := c.addHFEntries(tensors, idx, idxName, name, ents); err != nil {
			return nil, err
		}
	}
	if idx != nil {
		for _, k := range idx.order {
			if tensors[k] == nil && !aliased[k] {
				return nil, fmt.Errorf("%s: %s maps %q to %s, which has no such tensor", dir, idxName, k, idx.WeightMap[k])
			}
		}
	}
	if err := c.hfEntries(files); err != nil {
		return nil, err
	}
	c.World = max(len(ranks), 1)
	if n := len(ranks); n > 0 {
		for r := 1; r <= maxRank(ranks); r++ {
			if !ranks[fmt.Sprintf("%05d", r)] {
				c.Notes = append(c.Notes, fmt.Sprintf("no shard-%05d-model-*.safetensors file: if that rank saved tensors, the checkpoint is incomplete", r))
			}
		}
	}
	c.MetaFiles = files
	return c, nil
}

// hfFiles lists the weights files of an HF folder, in the index's order
// when it has one. The safetensors layouts come first, as transformers'
// from_pretrained prefers them; the torch.save ones (save_pretrained with
// safe_serialization=False) only in a folder without safetensors.
func hfFiles(dir string, ents []os.DirEntry) (files []string, idx *hfIndex, idxName string, bin bool, err error) {
	idxName = HFIndexFile
	files = listHF(ents, hfModelRE, ".safetensors")
	if !exists(filepath.Join(dir, HFIndexFile)) && len(files) == 0 {
		if bf := listHF(ents, hfBinRE, ".bin"); len(bf) > 0 || exists(filepath.Join(dir, HFBinIndexFile)) {
			idxName, bin, files = HFBinIndexFile, true, bf
		}
	}
	if len(files) == 0 && !bin {
		files = listHF(ents, nil, ".safetensors")
	}
	ip := filepath.Join(dir, idxName)
	if exists(ip) {
		if idx, err = readHFIndex(ip); err != nil {
			return nil, nil, "", false, err
		}
		files = nil
		seen := map[string]bool{}
		for _, k := range idx.order {
			f := idx.WeightMap[k]
			if err := checkRelative(f); err != nil {
				return nil, nil, "", false, fmt.Errorf("%s: weight_map[%q]: %w", ip, k, err)
			}
			if !seen[f] {
				seen[f] = true
				files = append(files, f)
			}
		}
	}
	if len(files) == 0 {
		return nil, nil, "", false, fmt.Errorf("%s: no .safetensors files and no pytorch_model*.bin", dir)
	}
	return files, idx, idxName, bin, nil
}

// addHFEntries adds the tensors of one weights file as chunks.
func (c *Checkpoint) addHFEntries(tensors map[string]*Tensor, idx *hfIndex, idxName, name string, ents []hfEntry) error {
	path := filepath.Join(c.Dir, name)
	for _, e := range ents {
		if idx != nil {
			if f, ok := idx.WeightMap[e.name]; !ok || f != name {
				return fmt.Errorf("%s: tensor %q is not mapped to this file by %s", path, e.name, idxName)
			}
		}
		t := tensors[e.name]
		if t == nil {
			t = &Tensor{Key: e.name, Path: []pyobj.Value{e.name}, DType: e.ref.T.DType}
			tensors[e.name] = t
			c.Tensors = append(c.Tensors, t)
			c.Meta.PlannerData[e.name] = t.Path
			c.Meta.PlannerOrder = append(c.Meta.PlannerOrder, e.name)
		} else if t.DType != e.ref.T.DType {
			return fmt.Errorf("%s: %q is %v here but %v in another file", path, e.name, e.ref.T.DType, t.DType)
		} else if len(t.Chunks[0].Sizes) != len(e.ref.T.Shape) {
			return fmt.Errorf("%s: %q has %d dims here but %d in another file", path, e.name, len(e.ref.T.Shape), len(t.Chunks[0].Sizes))
		}
		t.Chunks = append(t.Chunks, ChunkRef{Chunk: Chunk{Offsets: e.off, Sizes: clone(e.ref.T.Shape)}, Ref: e.ref,
			Item: e.item, Meta: name})
	}
	return nil
}

// hfEntries sizes every tensor from its chunks and records it as a
// metadata entry, as a DCP .metadata would list it.
func (c *Checkpoint) hfEntries(files []string) error {
	for _, t := range c.Tensors {
		t.Size = make([]int64, len(t.Chunks[0].Sizes))
		for _, ch := range t.Chunks {
			for d := range t.Size {
				t.Size[d] = max(t.Size[d], ch.Offsets[d]+ch.Sizes[d])
			}
		}
		e := &Entry{Key: t.Key, DType: t.DType, Size: t.Size}
		for _, ch := range t.Chunks {
			e.Chunks = append(e.Chunks, ch.Chunk)
		}
		c.Meta.Entries = append(c.Meta.Entries, e)
		c.Meta.byKey[t.Key] = e
		if err := markCopies(t); err != nil {
			return fmt.Errorf("%s: %q: %w (a shard file may be missing; files read: %v)", c.Dir, t.Key, err, files)
		}
		c.PlannerOrder = append(c.PlannerOrder, t.Key)
	}
	return nil
}

func maxRank(ranks map[string]bool) int {
	m := 0
	for r := range ranks {
		if n, err := strconv.Atoi(r); err == nil && n > m {
			m = n
		}
	}
	return m
}

// hfLess orders shard files by rank then file index, others by name.
func hfLess(a, b string) bool {
	ma, mb := hfShardRE.FindStringSubmatch(a), hfShardRE.FindStringSubmatch(b)
	if ma != nil && mb != nil {
		ra, _ := strconv.Atoi(ma[1])
		rb, _ := strconv.Atoi(mb[1])
		if ra != rb {
			return ra < rb
		}
		ka, _ := strconv.Atoi(ma[2])
		kb, _ := strconv.Atoi(mb[2])
		return ka < kb
	}
	return a < b
}

// jsonKey is a JSON object's key token (json.Decoder.Token returns keys as
// strings; anything else is a malformed object).
func jsonKey(tok json.Token) (string, error) {
	switch k := tok.(type) {
	case string:
		return k, nil
	}
	return "", fmt.Errorf("has a non-string key")
}
