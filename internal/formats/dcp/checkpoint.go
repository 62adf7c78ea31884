package dcp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Options configure Open and Index.
type Options struct {
	Workers int // items decoded at once (0: all cores)
	// PadSizes reads a chunk whose sizes have fewer dims than its offsets
	// as if the missing leading sizes were 1: Megatron's prepended axes
	// (layer, expert) seen recorded in the offsets only. Plain DCP refuses it.
	PadSizes bool
	// Attrs names Metadata attributes beyond DCP's that the caller reads
	// (Megatron's mcore_data): not listed in the "not used" note.
	Attrs []string
}

// Checkpoint is a DCP folder with its metadata checked and every item
// located and decoded (pickles only; tensor bytes stay in the files).
type Checkpoint struct {
	Dir string
	// Format is "dcp" (a .metadata folder) or "hf" (the safetensors
	// layouts of HuggingFaceStorageWriter, OpenHF); "" means "dcp".
	Format    string
	MetaFiles []string  // .metadata, or the __<rank>.metadata files merged
	Meta      *Metadata // the first metadata file (the only one normally)
	// World is the number of ranks that wrote data files (__<rank>_<n>.distcp).
	World   int
	Tensors []*Tensor // tensor keys in state_dict_metadata order
	Values  []*Value  // non-tensor keys in state_dict_metadata order
	// PlannerOrder is every key in planner_data order (the state dict's
	// own order), then keys without planner data (tensors, then values).
	PlannerOrder []string
	Notes        []string
	// Scratch is the temporary folder of items decoded from stream
	// transforms (zstd), "" when there are none; the table's refs point
	// into it, so it lives until Table.Close (or Checkpoint.Close).
	Scratch string
}

// Close removes the decoded items of the scratch folder.
func (c *Checkpoint) Close() error {
	err := removeScratch(c.Scratch)
	c.Scratch = ""
	return err
}

// Tensor is one tensor key with its chunks.
type Tensor struct {
	Key    string
	Path   []pyobj.Value
	DType  dtype.DType
	Size   []int64
	Chunks []ChunkRef
}

// ChunkRef is a chunk with its decoded item.
type ChunkRef struct {
	Chunk
	Item string // "__0_0.distcp@811+747"
	Ref  fragment.TensorRef
	// Copy is 0 for the first chunk with this box and k for its k-th
	// repetition (a replica saved by another rank).
	Copy int
	Meta string // the metadata file that listed it
}

// Value is one non-tensor key: the decoded torch.save stream of a Python
// value (TensorRefs for tensors inside), or raw bytes.
type Value struct {
	Key  string
	Path []pyobj.Value
	V    pyobj.Value
	Item string
}

// Numel returns the number of elements of the full tensor.
func (t *Tensor) Numel() int64 { return torchfile.Numel(t.Size) }

// Whole reports whether the tensor is stored as one chunk covering all of
// it (possibly repeated by several ranks).
func (t *Tensor) Whole() bool {
	n := 0
	for _, c := range t.Chunks {
		if c.Copy == 0 {
			n++
			if !torchfile.SameShape(c.Sizes, t.Size) {
				return false
			}
		}
	}
	return n == 1
}

var (
	dataFileRE = regexp.MustCompile(`^(?:.*)__(\d+)_(\d+)\.distcp$`)
	rankMetaRE = regexp.MustCompile(`^__(\d+)\.metadata$`)
)

// metadataFiles returns the metadata files of a folder: .metadata, or
// (saves without collectives) every __<rank>.metadata in rank order.
func metadataFiles(dir string) ([]string, error) {
	if st, err := os.Stat(filepath.Join(dir, MetadataFile)); err == nil && st.Mode().IsRegular() {
		return []string{MetadataFile}, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type rf struct {
		rank int
		name string
	}
	var found []rf
	for _, e := range ents {
		if m := rankMetaRE.FindStringSubmatch(e.Name()); m != nil {
			r, err := strconv.Atoi(m[1])
			if err == nil {
				found = append(found, rf{r, e.Name()})
			}
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].rank < found[j].rank })
	var out []string
	for _, f := range found {
		out = append(out, f.name)
	}
	return out, nil
}

// Detect reports whether path is a DCP folder: it holds .metadata (or the
// per-rank __<rank>.metadata files of a save without collectives) and no
// Megatron metadata.json.
func Detect(path string) bool {
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() || isMegatron(path) {
		return false
	}
	names, err := metadataFiles(path)
	return err == nil && len(names) > 0
}

// Open reads the metadata of the DCP folder dir, checks every chunk and
// item against it, and decodes the items' pickles.
func Open(ctx context.Context, dir string, opt Options) (*Checkpoint, error) {
	names, err := metadataFiles(dir)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		if _, err := os.Stat(filepath.Join(dir, MetadataFile+".tmp")); err == nil {
			return nil, fmt.Errorf("%s: no %s, only %s.tmp: the save did not finish", dir, MetadataFile, MetadataFile)
		}
		return nil, fmt.Errorf("%s: no %s file (not a DCP checkpoint folder)", dir, MetadataFile)
	}
	c := &Checkpoint{Dir: dir, MetaFiles: names}
	if c.World, err = worldSize(dir); err != nil {
		return nil, err
	}
	fs := newFiles(dir)
	defer fs.close()
	o := &opener{c: c, fs: fs, opt: opt, tensors: map[string]*Tensor{}, values: map[string]bool{}, planned: map[string]bool{}}
	for _, name := range names {
		if err := o.addMetadata(name); err != nil {
			return nil, err
		}
	}
	o.orderUnplanned()
	for _, t := range c.Tensors {
		if err := markCopies(t); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", dir, t.Key, err)
		}
	}
	if err := runJobs(ctx, o.jobs, opt.Workers); err != nil {
		removeScratch(fs.scratch)
		return nil, err
	}
	c.Scratch = fs.scratch
	sort.Strings(c.Notes)
	if len(names) > 1 {
		c.Notes = append(c.Notes, fmt.Sprintf("saved without collectives: %d per-rank metadata files merged", len(names)))
	}
	var unused []string
	for _, a := range c.Meta.Unknown {
		if !slices.Contains(opt.Attrs, a) {
			unused = append(unused, a)
		}
	}
	if len(unused) > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("Metadata attributes not used: %v", unused))
	}
	return c, nil
}

// opener merges the metadata files of a folder into a Checkpoint, queueing
// the reads of values and chunk headers as jobs.
type opener struct {
	c       *Checkpoint
	fs      *files
	opt     Options
	jobs    []func() error
	notesMu sync.Mutex
	tensors map[string]*Tensor
	values  map[string]bool
	planned map[string]bool
}

// addMetadata merges one metadata file: its planner order, values and
// tensor chunks.
func (o *opener) addMetadata(name string) error {
	path := filepath.Join(o.c.Dir, name)
	md, err := ReadMetadata(path)
	if err != nil {
		return err
	}
	if o.c.Meta == nil {
		o.c.Meta = md
	}
	for _, k := range md.PlannerOrder {
		if !o.planned[k] {
			o.planned[k] = true
			o.c.PlannerOrder = append(o.c.PlannerOrder, k)
		}
	}
	for _, e := range md.Entries {
		if e.Bytes {
			err = o.addValue(path, md, e)
		} else {
			err = o.addTensor(path, name, md, e)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// addValue adds a non-tensor key (the first rank's value wins).
func (o *opener) addValue(path string, md *Metadata, e *Entry) error {
	if o.values[e.Key] {
		return nil // the first rank's value
	}
	if o.tensors[e.Key] != nil {
		return fmt.Errorf("%s: %q is a tensor in another rank's metadata but bytes here", path, e.Key)
	}
	o.values[e.Key] = true
	si, ok := md.Lookup(e.Key, nil, false)
	if !ok {
		return fmt.Errorf("%s: storage_data has no MetadataIndex(%q) for the non-tensor key %q", path, e.Key, e.Key)
	}
	it, err := o.fs.resolve(si)
	if err != nil {
		return fmt.Errorf("%s: %q: %w", path, e.Key, err)
	}
	v := &Value{Key: e.Key, Path: md.Path(e.Key), Item: it.String()}
	o.c.Values = append(o.c.Values, v)
	o.jobs = append(o.jobs, func() error {
		val, note, err := o.fs.bytesValue(e.Key, it)
		if err != nil {
			return err
		}
		v.V = val
		if note != "" {
			o.notesMu.Lock()
			o.c.Notes = append(o.c.Notes, note)
			o.notesMu.Unlock()
		}
		return nil
	})
	return nil
}

// addTensor adds the chunks one metadata file lists for a tensor key.
func (o *opener) addTensor(path, name string, md *Metadata, e *Entry) error {
	if o.values[e.Key] {
		return fmt.Errorf("%s: %q is bytes in another rank's metadata but a tensor here", path, e.Key)
	}
	t := o.tensors[e.Key]
	if t == nil {
		t = &Tensor{Key: e.Key, Path: md.Path(e.Key), DType: e.DType, Size: e.Size}
		o.tensors[e.Key] = t
		o.c.Tensors = append(o.c.Tensors, t)
	} else if t.DType != e.DType || !torchfile.SameShape(t.Size, e.Size) {
		return fmt.Errorf("%s: %q is %v%v here but %v%v in %s", path, e.Key, e.DType, e.Size, t.DType, t.Size, o.c.MetaFiles[0])
	}
	for ci, ch := range e.Chunks {
		if o.opt.PadSizes && len(ch.Offsets) == len(t.Size) && len(ch.Sizes) < len(ch.Offsets) {
			ch.Sizes = append(slices.Repeat([]int64{1}, len(ch.Offsets)-len(ch.Sizes)), ch.Sizes...)
		}
		if err := checkChunk(t.Size, ch); err != nil {
			return fmt.Errorf("%s: %q chunk %d: %w", path, e.Key, ci, err)
		}
		si, ok := md.Lookup(e.Key, ch.Offsets, true)
		if !ok {
			return fmt.Errorf("%s: storage_data has no MetadataIndex(%q, %v) for chunk %d of %q", path, e.Key, ch.Offsets, ci, e.Key)
		}
		it, err := o.fs.resolve(si)
		if err != nil {
			return fmt.Errorf("%s: %q chunk %d: %w", path, e.Key, ci, err)
		}
		t.Chunks = append(t.Chunks, ChunkRef{Chunk: ch, Item: it.String(), Meta: name})
		idx := len(t.Chunks) - 1
		dt := t.DType
		o.jobs = append(o.jobs, func() error {
			ref, err := o.fs.tensor(e.Key, it, dt, ch.Offsets, ch.Sizes)
			if err != nil {
				return err
			}
			t.Chunks[idx].Ref = ref
			return nil
		})
	}
	return nil
}

// orderUnplanned appends the keys without planner data: tensors, then
// values, each in metadata order.
func (o *opener) orderUnplanned() {
	var keys []string
	for _, t := range o.c.Tensors {
		keys = append(keys, t.Key)
	}
	for _, v := range o.c.Values {
		keys = append(keys, v.Key)
	}
	for _, k := range keys {
		if !o.planned[k] {
			o.c.PlannerOrder = append(o.c.PlannerOrder, k)
			o.planned[k] = true
		}
	}
}

// runJobs runs every job (at most workers at once) and returns the error
// of the first failing job in order, so that messages do not depend on
// scheduling.
func runJobs(ctx context.Context, jobs []func() error, workers int) error {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	errs := make([]error, len(jobs))
	var g errgroup.Group
	g.SetLimit(workers)
	for i, j := range jobs {
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				errs[i] = err
				return nil
			}
			errs[i] = j()
			return nil
		})
	}
	g.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// worldSize counts the ranks that wrote data files: every rank writes at
// least one file, empty when deduplication left it nothing.
func worldSize(dir string) (int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	world := 0
	for _, e := range ents {
		if m := dataFileRE.FindStringSubmatch(e.Name()); m != nil {
			if r, err := strconv.Atoi(m[1]); err == nil && r+1 > world {
				world = r + 1
			}
		}
	}
	return max(world, 1), nil
}

// checkChunk checks that a chunk has the tensor's rank and lies inside it.
func checkChunk(size []int64, ch Chunk) error {
	if len(ch.Offsets) != len(size) || len(ch.Sizes) != len(size) {
		return fmt.Errorf("offsets %v and sizes %v do not have the %d dims of the tensor %v", ch.Offsets, ch.Sizes, len(size), size)
	}
	for d := range size {
		if ch.Offsets[d] > size[d] || ch.Sizes[d] > size[d]-ch.Offsets[d] {
			return fmt.Errorf("box at %v of sizes %v lies outside the tensor %v", ch.Offsets, ch.Sizes, size)
		}
	}
	return nil
}

// markCopies numbers repeated boxes and checks that the distinct boxes
// tile the tensor: no partial overlap, volumes adding up to the tensor's.
func markCopies(t *Tensor) error {
	first := map[string]int{} // box -> copies seen
	var distinct []int
	for i := range t.Chunks {
		ch := &t.Chunks[i]
		k := fmt.Sprint(ch.Offsets, ch.Sizes)
		n := first[k]
		first[k] = n + 1
		ch.Copy = n
		if n == 0 {
			distinct = append(distinct, i)
		}
	}
	var vol int64
	for _, i := range distinct {
		vol += torchfile.Numel(t.Chunks[i].Sizes)
	}
	if len(t.Size) > 0 {
		// Sweep along dim 0: only boxes whose dim-0 ranges meet can overlap.
		order := append([]int(nil), distinct...)
		sort.Slice(order, func(a, b int) bool { return t.Chunks[order[a]].Offsets[0] < t.Chunks[order[b]].Offsets[0] })
		var active []int
		for _, i := range order {
			a := t.Chunks[i].Chunk
			if torchfile.Numel(a.Sizes) == 0 {
				continue
			}
			keep := active[:0]
			for _, j := range active {
				b := t.Chunks[j].Chunk
				if b.Offsets[0]+b.Sizes[0] > a.Offsets[0] {
					keep = append(keep, j)
				}
			}
			active = keep
			for _, j := range active {
				if overlaps(a, t.Chunks[j].Chunk) {
					return fmt.Errorf("chunks at %v (sizes %v) and %v (sizes %v) overlap",
						t.Chunks[j].Offsets, t.Chunks[j].Sizes, a.Offsets, a.Sizes)
				}
			}
			active = append(active, i)
		}
	} else if len(distinct) > 1 {
		return fmt.Errorf("a 0-dim tensor has %d different chunks", len(distinct))
	}
	if n := t.Numel(); vol != n {
		return fmt.Errorf("chunks cover %d of the %d elements of the %v tensor", vol, n, t.Size)
	}
	return nil
}

func overlaps(a, b Chunk) bool {
	for d := range a.Offsets {
		if a.Sizes[d] == 0 || b.Sizes[d] == 0 {
			return false
		}
		if a.Offsets[d]+a.Sizes[d] <= b.Offsets[d] || b.Offsets[d]+b.Sizes[d] <= a.Offsets[d] {
			return false
		}
	}
	return true
}
