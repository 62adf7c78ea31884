package dcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// ExportOptions configure Export.
type ExportOptions struct {
	// Shards is the number of chunks each tensor is split in along dim 0
	// (torch.chunk sizes, as FSDP2 shards), one rank file per chunk index.
	Shards int
	// DType is the element type of the written weights and optimizer
	// states: float32 (default), bfloat16 or float16.
	DType dtype.DType
	// ModelKey and OptimKey are the top-level state-dict keys of the model
	// and the optimizer state. ModelKey defaults to "model"; OptimKey to
	// the optimizer key of a DCP source (found in its extra state), else
	// "optim", as get_state_dict users save them.
	ModelKey, OptimKey string
	Force              bool   // replace DST when it exists
	Workers            int    // rank files written at once (0: all cores)
	SaveID             string // StorageMeta.save_id (default: a random UUID)
	NoSync             bool   // skip fsync (tests)
}

// ExportStats describe an export.
type ExportStats struct {
	Files   int   // .distcp files
	Bytes   int64 // bytes of all files, .metadata included
	Tensors int   // tensor keys
	Values  int   // non-tensor keys
	Notes   []string
}

// outKey is one key of the checkpoint being written.
type outKey struct {
	key  string
	path []pyobj.Value
	// A tensor: float32 elements of an atomic state (param, state), or the
	// bytes of a small tensor (blob); written as dt.
	tensor       bool
	dt           dtype.DType
	size         []int64
	param, state string
	stored       dtype.DType // the atomic state's dtype
	blob         *torchfile.Blob
	chunks       []outChunk
	// A non-tensor value: its torch.save stream.
	data []byte
	info StorageInfo // of the bytes item
}

type outChunk struct {
	rank          int
	offsets, size []int64
	info          StorageInfo
}

// Export writes the atomic checkpoint of r as a DCP folder dst that
// torch.distributed.checkpoint.load reads into a model (and optimizer) of
// the same shapes: <model>.<name> for every weight, <optim>.state.<name>.<state>
// for the optimizer states and steps, the extra state's values at their
// paths, and the param groups. Tensors are split in Shards chunks along
// dim 0, chunk r of every tensor in __r_0.distcp. Everything is written
// in DST.partial; .metadata is written last, then the folder is renamed.
func Export(ctx context.Context, r *atomic.Reader, dst string, opt ExportOptions) (*ExportStats, error) {
	if opt.Shards <= 0 {
		opt.Shards = 1
	}
	if opt.Shards > 1<<16 {
		return nil, fmt.Errorf("--shards %d is more than %d", opt.Shards, 1<<16)
	}
	if opt.DType == dtype.Invalid {
		opt.DType = dtype.Float32
	}
	if opt.DType != dtype.Float32 && opt.DType != dtype.BFloat16 && opt.DType != dtype.Float16 {
		return nil, fmt.Errorf("cannot export %v tensors: use float32, bfloat16 or float16", opt.DType)
	}
	if opt.ModelKey == "" {
		opt.ModelKey = "model"
	}
	if opt.OptimKey == "" {
		k, err := optimKeyOf(r)
		if err != nil {
			return nil, err
		}
		opt.OptimKey = k
	}
	if opt.Workers <= 0 {
		opt.Workers = runtime.NumCPU()
	}
	if opt.SaveID == "" {
		opt.SaveID = newUUID()
	}
	dst = filepath.Clean(dst)
	if _, err := os.Stat(dst); err == nil && !opt.Force {
		return nil, fmt.Errorf("%s already exists (use --force to replace it)", dst)
	}
	stats := &ExportStats{}
	keys, err := exportKeys(r, opt, stats)
	if err != nil {
		return nil, err
	}
	sizes := make([]int64, opt.Shards)
	var pkl []byte
	if err := fsutil.WriteDir(dst+atomic.PartialSuffix, dst, opt.Force, opt.NoSync, func(tmp string) error {
		if err := r.VerifyingReads(func() error {
			g, gctx := errgroup.WithContext(ctx)
			g.SetLimit(opt.Workers)
			for rank := 0; rank < opt.Shards; rank++ {
				g.Go(func() error {
					n, err := writeRank(gctx, r, tmp, rank, keys, opt)
					sizes[rank] = n
					return err
				})
			}
			return g.Wait()
		}); err != nil {
			return err
		}
		var err error
		if pkl, err = exportMetadata(keys, opt, dst).Marshal(); err != nil {
			return err
		}
		// .metadata marks a complete save: written last, through a temporary
		// name, after the data files are on disk.
		if err := fsutil.WriteFileAtomic(filepath.Join(tmp, MetadataFile), pkl, opt.NoSync); err != nil {
			return err
		}
		// Read back what was written before publishing it.
		if _, err := Open(ctx, tmp, Options{Workers: opt.Workers}); err != nil {
			return fmt.Errorf("the written checkpoint does not read back: %w", err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	stats.Files = opt.Shards
	stats.Bytes = int64(len(pkl))
	for _, n := range sizes {
		stats.Bytes += n
	}
	for _, k := range keys {
		if k.tensor {
			stats.Tensors++
		} else {
			stats.Values++
		}
	}
	return stats, nil
}

// optimKeyOf returns the optimizer's top-level key of a DCP source, found
// in the extra state (its param groups), or "optim".
func optimKeyOf(r *atomic.Reader) (string, error) {
	if !r.HasFile(atomic.ExtraState) {
		return "optim", nil
	}
	d, err := loadExtra(r)
	if err != nil {
		return "", err
	}
	var found []string
	for i := 0; i < d.Len(); i++ {
		k, sub := d.Item(i)
		ks, isStr := field(k)
		sd, isDict := sub.(*pyobj.Dict)
		if !isDict || !isStr || ks == "" {
			continue // not an optimizer's group: the extra state holds any values
		}
		for _, sk := range sd.Keys() {
			if s, ok := field(sk); ok && (s == "param_groups" || strings.HasPrefix(s, "param_groups.")) {
				found = append(found, ks)
				break
			}
		}
	}
	if len(found) == 0 {
		return "optim", nil
	}
	return preferred(found, optimGroups)[0], nil
}

// loadExtra loads the atomic checkpoint's extra state, a dict.
func loadExtra(r *atomic.Reader) (*pyobj.Dict, error) {
	v, err := r.Load(atomic.ExtraState)
	if err != nil {
		return nil, err
	}
	d := pyobj.NewDec(r.Dir+": "+atomic.ExtraState, v)
	x := d.AsDict()
	return x, d.Err()
}

// NewSaveID is a random UUID for StorageMeta.save_id, as torch makes one.
func NewSaveID() string { return newUUID() }

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// exportKeys lists the keys to write, in order: per parameter its weight
// (and aliases), then its optimizer states and step; then the extra
// state's values; then the param groups.
func exportKeys(r *atomic.Reader, opt ExportOptions, stats *ExportStats) ([]*outKey, error) {
	ks := &keySet{seen: map[string]bool{}}
	trained, err := ks.addParams(r, opt)
	if err != nil {
		return nil, err
	}
	// The extra state (a DCP source's non-tensor values, at their paths).
	if r.HasFile(atomic.ExtraState) {
		d, err := loadExtra(r)
		if err != nil {
			return nil, err
		}
		leaves, err := flatten(d)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", r.Dir, atomic.ExtraState, err)
		}
		for _, lf := range leaves {
			if ks.seen[joinPath(lf.path)] {
				stats.Notes = append(stats.Notes, fmt.Sprintf("extra state %s not written: the key holds a parameter's tensor", joinPath(lf.path)))
				continue
			}
			if err := ks.addLeaf(lf); err != nil {
				return nil, err
			}
		}
	}
	if err := ks.addGroups(r, opt, trained, stats); err != nil {
		return nil, err
	}
	for _, k := range ks.keys {
		if k.tensor {
			chunkKey(k, opt.Shards)
		}
	}
	return ks.keys, nil
}

// keySet collects the keys of an export, each once.
type keySet struct {
	keys []*outKey
	seen map[string]bool
}

func (ks *keySet) add(k *outKey) error {
	k.key = joinPath(k.path)
	if ks.seen[k.key] {
		return fmt.Errorf("key %q would be written twice", k.key)
	}
	ks.seen[k.key] = true
	ks.keys = append(ks.keys, k)
	return nil
}

// addParams adds every parameter's tensors (under opt.ModelKey) and
// optimizer states and step (under opt.OptimKey); it returns the trained
// parameters.
func (ks *keySet) addParams(r *atomic.Reader, opt ExportOptions) (map[string]bool, error) {
	modelPath := func(name string) []pyobj.Value {
		if opt.ModelKey == "" {
			return []pyobj.Value{name}
		}
		return []pyobj.Value{opt.ModelKey, name}
	}
	trained := map[string]bool{}
	for _, p := range r.Params() {
		states := map[string]bool{}
		for _, f := range p.Files {
			states[f.State] = true
		}
		stored, err := p.StateDType()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.Dir, err)
		}
		if states[fragment.FP32] {
			// float32 tensors are written as opt.DType; frozen parameters and
			// buffers the atomic checkpoint keeps in another dtype, as they are.
			dt := stored
			if dt == dtype.Float32 {
				dt = opt.DType
			}
			for _, name := range append([]string{p.Name}, p.Aliases...) {
				if err := ks.add(&outKey{path: modelPath(name), tensor: true, dt: dt, size: p.Shape,
					param: p.Name, state: fragment.FP32, stored: stored}); err != nil {
					return nil, err
				}
			}
		}
		if p.Frozen {
			continue
		}
		trained[p.Name] = true
		for _, f := range p.Files {
			if f.State == fragment.FP32 || f.State == fragment.StepState {
				continue
			}
			if err := ks.add(&outKey{path: []pyobj.Value{opt.OptimKey, "state", p.Name, f.State}, tensor: true, dt: opt.DType,
				size: p.Shape, param: p.Name, state: f.State, stored: stored}); err != nil {
				return nil, err
			}
		}
		step, ok, err := r.Step(p.Name)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		k := &outKey{path: []pyobj.Value{opt.OptimKey, "state", p.Name, fragment.StepState}}
		switch b := step.(type) {
		case *torchfile.Blob: // a tensor step; a Python number otherwise
			k.tensor, k.dt, k.size, k.blob = true, b.DType, b.Shape, b
		default:
			if k.data, err = saveBytes(step); err != nil {
				return nil, fmt.Errorf("step of %s: %w", p.Name, err)
			}
		}
		if err := ks.add(k); err != nil {
			return nil, err
		}
	}
	return trained, nil
}

// addGroups adds param groups naming the parameters, unless the extra
// state had them; groups that cannot be named are left out with a note.
func (ks *keySet) addGroups(r *atomic.Reader, opt ExportOptions, trained map[string]bool, stats *ExportStats) error {
	pgPrefix := opt.OptimKey + ".param_groups"
	for k := range ks.seen {
		if k == pgPrefix || strings.HasPrefix(k, pgPrefix+".") {
			return nil
		}
	}
	optFile := filepath.ToSlash(filepath.Join(atomic.ZeroDir, atomic.OptimizerState))
	if len(trained) == 0 || !r.HasFile(optFile) {
		return nil
	}
	v, err := r.Load(optFile)
	if err != nil {
		return err
	}
	pg, _ := pyobj.Path(v, "param_groups") // none: namedGroups says so in the note
	ok, why := namedGroups(pg, trained)
	if !ok {
		if named, err := groupsByOrder(r, pg, trained); err == nil {
			pg, ok = named, true
		} else {
			why += "; " + err.Error()
		}
	}
	if !ok {
		stats.Notes = append(stats.Notes, "param groups not written: "+why)
		return nil
	}
	leaves, err := flatten(pyobj.DictOf(opt.OptimKey, pyobj.DictOf("param_groups", pg)))
	if err != nil {
		return err
	}
	for _, lf := range leaves {
		if err := ks.addLeaf(lf); err != nil {
			return err
		}
	}
	return nil
}

// addLeaf adds a value: a tensor as it is, anything else as the bytes of
// its torch.save.
func (ks *keySet) addLeaf(lf leaf) error {
	k := &outKey{path: lf.path}
	switch b := lf.v.(type) {
	case *torchfile.Blob: // a tensor of the extra state
		k.tensor, k.dt, k.size, k.blob = true, b.DType, b.Shape, b
	default:
		data, err := saveBytes(lf.v)
		if err != nil {
			return fmt.Errorf("%s: %w", joinPath(lf.path), err)
		}
		k.data = data
	}
	return ks.add(k)
}

// namedGroups reports whether param groups list parameters by name, all of
// them trained parameters of the checkpoint (DCP sources); DeepSpeed's
// groups hold flat-group ids that mean nothing to a DCP loader.
func namedGroups(pg pyobj.Value, trained map[string]bool) (bool, string) {
	d := pyobj.NewDec("", pg)
	groups := d.AsList()
	if d.Err() != nil || len(groups) == 0 {
		return false, "the optimizer state has no param_groups list"
	}
	for i, g := range groups {
		if g.AsDict() == nil {
			return false, fmt.Sprintf("param_groups[%d] is %s", i, pyobj.TypeName(g.Value()))
		}
		names := g.Key("params").AsStrings()
		if d.Err() != nil {
			return false, fmt.Sprintf("param_groups[%d].params are not parameter names", i)
		}
		for _, n := range names {
			if !trained[n] {
				return false, fmt.Sprintf("param_groups[%d] names %q, which has no optimizer state", i, n)
			}
		}
	}
	return true, ""
}

// chunkKey splits a tensor along dim 0 in torch.chunk sizes; rank i gets
// chunk i. Empty chunks are left out; 0-dim, empty and in-memory tensors
// are one chunk of rank 0.
func chunkKey(k *outKey, shards int) {
	whole := outChunk{offsets: make([]int64, len(k.size)), size: clone(k.size)}
	if len(k.size) == 0 || k.blob != nil || torchfile.Numel(k.size) == 0 {
		k.chunks = []outChunk{whole}
		return
	}
	var at int64
	for i, n := range fragment.ChunkSizes(k.size[0], shards) {
		if n > 0 {
			off := make([]int64, len(k.size))
			off[0] = at
			sz := clone(k.size)
			sz[0] = n
			k.chunks = append(k.chunks, outChunk{rank: i, offsets: off, size: sz})
		}
		at += n
	}
}

// leaf is one value of a nested state dict and its path.
type leaf struct {
	path []pyobj.Value
	v    pyobj.Value
}

// flatten walks a nested dict as torch >= 2.4's traverse_state_dict does:
// every mapping is descended (str(key) path elements); a list is descended
// (int positions) only when an element is a tensor, a mapping or such a
// list; anything else (tuples included) is a leaf.
func flatten(d *pyobj.Dict) ([]leaf, error) {
	var out []leaf
	var terminal func(v pyobj.Value, depth int) bool
	terminal = func(v pyobj.Value, depth int) bool {
		switch x := v.(type) {
		case *pyobj.Dict:
			return false
		case *pyobj.List:
			if depth > pyobj.DefaultLimits().MaxDepth {
				return true
			}
			for _, e := range x.Items {
				switch e.(type) {
				case *torchfile.Blob, *pyobj.Dict:
					return false
				case *pyobj.List:
					if !terminal(e, depth+1) {
						return false
					}
				}
			}
		}
		return true
	}
	var walk func(path []pyobj.Value, v pyobj.Value, depth int) error
	walk = func(path []pyobj.Value, v pyobj.Value, depth int) error {
		if depth > pyobj.DefaultLimits().MaxDepth {
			return fmt.Errorf("values nest deeper than %d levels", pyobj.DefaultLimits().MaxDepth)
		}
		switch x := v.(type) {
		case *pyobj.Dict:
			for i := 0; i < x.Len(); i++ {
				k, e := x.Item(i)
				ks, err := keyString(k)
				if err != nil {
					return fmt.Errorf("%s: %w", joinPath(path), err)
				}
				if err := walk(append(path[:len(path):len(path)], ks), e, depth+1); err != nil {
					return err
				}
			}
			return nil
		case *pyobj.List:
			if !terminal(x, depth) {
				for i, e := range x.Items {
					if err := walk(append(path[:len(path):len(path)], int64(i)), e, depth+1); err != nil {
						return err
					}
				}
				return nil
			}
		}
		out = append(out, leaf{path: path, v: v})
		return nil
	}
	if err := walk(nil, d, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// keyString is Python's str() of a dict key.
func keyString(k pyobj.Value) (string, error) {
	switch x := k.(type) {
	case string:
		return x, nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case bool:
		if x {
			return "True", nil
		}
		return "False", nil
	case nil:
		return "None", nil
	}
	return "", fmt.Errorf("dict key of type %s", pyobj.TypeName(k))
}

// writeRank writes __<rank>_0.distcp: rank 0's bytes items first, then
// the rank's chunk of every tensor, each a complete torch.save stream. The
// streams' places are laid out first, then opt.Workers write them at once.
func writeRank(ctx context.Context, r *atomic.Reader, dir string, rank int, keys []*outKey, opt ExportOptions) (int64, error) {
	name := fmt.Sprintf("__%d_0.distcp", rank)
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	w := &rankWriter{r: r, f: f, name: name, path: path, noSync: opt.NoSync}
	err = w.write(ctx, rank, keys, max(opt.Workers, 1))
	if err == nil && !opt.NoSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return w.at, err
}

type rankWriter struct {
	r    *atomic.Reader
	f    *os.File
	name string
	path string
	at   int64
	// noSync: the file is not synced, so its writeback is not started early.
	noSync bool
}

// stream is one tensor chunk's torch.save stream at its place in the file.
type stream struct {
	k      *outKey
	ch     *outChunk
	l      *torchfile.Layout
	base   int64
	region int // its payload in write's Regions
}

func (w *rankWriter) write(ctx context.Context, rank int, keys []*outKey, workers int) error {
	if rank == 0 {
		for _, k := range keys {
			if k.tensor {
				continue
			}
			if _, err := w.f.WriteAt(k.data, w.at); err != nil {
				return fmt.Errorf("%s: %w", w.path, err)
			}
			k.info = StorageInfo{RelativePath: w.name, Offset: w.at, Length: int64(len(k.data))}
			w.at += int64(len(k.data))
		}
	}
	var streams []stream
	for _, k := range keys {
		for i := range k.chunks {
			if k.chunks[i].rank != rank {
				continue
			}
			l, err := torchfile.NewLayout("archive", &torchfile.Blob{DType: k.dt, Shape: k.chunks[i].size})
			if err != nil {
				return fmt.Errorf("%s: %s: %w", w.path, k.key, err)
			}
			streams = append(streams, stream{k: k, ch: &k.chunks[i], l: l, base: w.at})
			k.chunks[i].info = StorageInfo{RelativePath: w.name, Offset: w.at, Length: l.Size()}
			w.at += l.Size()
		}
	}
	if err := fsutil.Presize(w.f, w.at); err != nil {
		return err
	}
	// Every chunk's payload is a region of the file: the atomic states'
	// ranges are filled by layout.WriteFills (runs stored as written copied
	// in the kernel, the rest converted through small buffers, large
	// chunks cut into ranges the workers share), small tensors written as
	// they are; each stream's tail (its CRC) follows.
	regions := layout.Regions{Writeback: !w.noSync}
	var fills []layout.TensorFill
	for i := range streams {
		s := &streams[i]
		for _, seg := range s.l.Head() {
			if _, err := w.f.WriteAt(seg.Data, s.base+seg.Off); err != nil {
				return fmt.Errorf("%s: %w", w.path, err)
			}
		}
		k, ch := s.k, s.ch
		n := torchfile.Numel(ch.size)
		s.region = regions.Add(w.f, s.base+s.l.BlobOffset(0), n*int64(k.dt.Size()))
		if k.blob != nil {
			if int64(len(k.blob.Data)) != k.blob.NBytes() {
				return fmt.Errorf("%s: %s: %d bytes for %v%v", w.path, k.key, len(k.blob.Data), k.blob.DType, k.blob.Shape)
			}
			if err := regions.WriteAt(s.region, k.blob.Data, 0); err != nil {
				return fmt.Errorf("%s: %s: %w", w.path, k.key, err)
			}
			continue
		}
		row := int64(1)
		for _, d := range k.size[min(1, len(k.size)):] {
			row *= d
		}
		var start int64
		if len(ch.offsets) > 0 {
			start = ch.offsets[0] * row
		}
		fills = append(fills, layout.TensorFill{I: s.region, DType: k.dt, N: n,
			Pieces: []layout.StatePiece{{Param: k.param, State: k.state, Local: start, N: n}}})
	}
	if err := layout.WriteFills(ctx, w.r, &regions, fills, fillWorkers(streams, workers), 0); err != nil {
		return fmt.Errorf("%s: %w", w.path, err)
	}
	for _, s := range streams {
		crc, err := regions.CRC(s.region)
		if err != nil {
			return fmt.Errorf("%s: %w", s.k.key, err)
		}
		tail, err := s.l.Tail([]uint32{crc})
		if err != nil {
			return err
		}
		for _, seg := range tail {
			if _, err := w.f.WriteAt(seg.Data, s.base+seg.Off); err != nil {
				return fmt.Errorf("%s: %w", w.path, err)
			}
		}
	}
	return nil
}

// fillWorkers is how many workers fill one rank file: one where every
// tensor is copied in the kernel as stored, since copies into one file
// serialise on its inode lock (ext4 takes i_rwsem for every buffered write,
// which copy_file_range's splice writes are) and a second worker only
// spins on it; all where tensors are converted in user space first.
func fillWorkers(streams []stream, workers int) int {
	for _, s := range streams {
		if s.k.blob == nil && s.k.dt != s.k.stored {
			return workers
		}
	}
	return 1
}

// exportMetadata builds the .metadata of the written keys, as
// create_default_global_save_plan and FileSystemWriter.finish do: entries
// in key order with chunks in rank order (index hint = position), and
// storage_data ordered by rank, then by position in the rank's file.
func exportMetadata(keys []*outKey, opt ExportOptions, dst string) *Metadata {
	md := &Metadata{PlannerData: map[string][]pyobj.Value{}, Version: CurrentVersion,
		StorageMeta: &StorageMeta{CheckpointID: dst, SaveID: opt.SaveID}}
	type stored struct {
		rank int
		off  int64
		e    StorageEntry
	}
	var all []stored
	for _, k := range keys {
		md.PlannerOrder = append(md.PlannerOrder, k.key)
		md.PlannerData[k.key] = k.path
		if !k.tensor {
			md.Entries = append(md.Entries, &Entry{Key: k.key, Bytes: true})
			all = append(all, stored{0, k.info.Offset, StorageEntry{Index: MetadataIndex{FQN: k.key, Hint: -1}, Info: k.info}})
			continue
		}
		e := &Entry{Key: k.key, DType: k.dt, Size: clone(k.size)}
		for i, ch := range k.chunks {
			e.Chunks = append(e.Chunks, Chunk{Offsets: clone(ch.offsets), Sizes: clone(ch.size)})
			all = append(all, stored{ch.rank, ch.info.Offset, StorageEntry{
				Index: MetadataIndex{FQN: k.key, Offset: clone(ch.offsets), HasOffset: true, Hint: int64(i)}, Info: ch.info}})
		}
		md.Entries = append(md.Entries, e)
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].rank != all[j].rank {
			return all[i].rank < all[j].rank
		}
		return all[i].off < all[j].off
	})
	for _, s := range all {
		md.Storage = append(md.Storage, s.e)
	}
	return md
}

// groupsByOrder names the parameters of DeepSpeed's param groups, whose
// params are flat-group ids, by parameter order: group i holds the
// parameters of the model states' param_shapes[i], in order (the model
// states of every stage, copied into the atomic checkpoint).
func groupsByOrder(r *atomic.Reader, pg pyobj.Value, trained map[string]bool) (pyobj.Value, error) {
	gd := pyobj.NewDec("", pg)
	groups := gd.AsList()
	if gd.Err() != nil || len(groups) == 0 {
		return nil, fmt.Errorf("no param_groups list")
	}
	names := make([][]string, len(groups))
	seen := map[string]bool{}
	found := false
	for _, fe := range r.Manifest.Files {
		if !strings.HasSuffix(fe.Path, "model_states.pt") {
			continue
		}
		path := filepath.Join(r.Dir, filepath.FromSlash(fe.Path))
		f, err := torchfile.Open(path)
		if err != nil {
			return nil, err
		}
		root := pyobj.NewDec(path, f.Root)
		f.Close()
		ps, ok := root.Opt("param_shapes")
		if !ok {
			if root.AsDict() == nil {
				return nil, root.Err()
			}
			continue // model states without param_shapes
		}
		shapes := ps.AsList()
		if err := root.Err(); err != nil {
			return nil, err
		}
		if len(shapes) != len(groups) {
			return nil, fmt.Errorf("%s: %d param_shapes groups for %d param groups", path, len(shapes), len(groups))
		}
		found = true
		for i, s := range shapes {
			for _, it := range s.Items() {
				if !seen[it.Key] && trained[it.Key] {
					seen[it.Key] = true
					names[i] = append(names[i], it.Key)
				}
			}
		}
		if err := root.Err(); err != nil {
			return nil, err
		}
	}
	if !found {
		return nil, fmt.Errorf("no model states with param_shapes to name them by order")
	}
	out := &pyobj.List{}
	for i, g := range groups {
		d := g.AsDict()
		if d == nil {
			return nil, fmt.Errorf("param_groups[%d] is %s", i, pyobj.TypeName(g.Value()))
		}
		c := pyobj.NewDict(d.Kind)
		for j := 0; j < d.Len(); j++ {
			k, v := d.Item(j)
			if k == "params" {
				l := &pyobj.List{}
				for _, n := range names[i] {
					l.Items = append(l.Items, n)
				}
				v = l
			}
			c.Set(k, v)
		}
		out.Items = append(out.Items, c)
	}
	if ok, why := namedGroups(out, trained); !ok {
		return nil, fmt.Errorf("named by order: %s", why)
	}
	return out, nil
}
