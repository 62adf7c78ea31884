package hf

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
)

// Options configure Export.
type Options struct {
	// Torch writes torch.save files (pytorch_model.bin) instead of
	// safetensors.
	Torch bool
	// DType is the dtype of the trained weights: float32, bfloat16 or
	// float16; Invalid means the source's training dtype when the
	// manifest records it, else float32. Frozen parameters and buffers
	// keep the dtype they were stored in.
	DType dtype.DType
	// MaxShard is the largest file in tensor bytes (0: DefaultMaxShard).
	MaxShard int64
	// Arch maps names to a transformers model class with config.json:
	// "auto" the manifest's family, or a family name (internal/family);
	// "" or "none" keeps the atomic names.
	Arch string
	// Params, when set, selects the parameters (atomic names) to export.
	Params *regexp.Regexp
	Force  bool // replace DST when it exists
	// Workers write ranges of the tensors at once (0: all cores); Memory
	// bounds the bytes they buffer together (0: 256 MiB): at most
	// Memory/layout.MoverBytes workers run, at least one.
	Workers int
	Memory  int64
	NoSync  bool
	// Progress, when set, is called once with the bytes the export will
	// read and write (total), then with every piece read and written
	// (from several goroutines).
	Progress func(total, read, written int64)
}

// Stats describe an export.
type Stats struct {
	Files       int   // tensor files
	Tensors     int   // tensors written
	TensorBytes int64 // their bytes (the index's total_size)
	Bytes       int64 // bytes of every file written
	DType       dtype.DType
	Notes       []string
}

// Piece is a run of elements of one atomic fp32 state.
type Piece struct {
	Param      string
	Start, Len int64
}

// Tensor is one output tensor: the concatenation of its pieces, cast to
// DType, in Shape.
type Tensor struct {
	Name   string
	DType  dtype.DType
	Shape  []int64
	Pieces []Piece
	// AddOne adds 1 to every element in float32 before the cast (norm
	// weights of Megatron's apply_layernorm_1p).
	AddOne bool
}

// NBytes is the tensor's size in the output.
func (t *Tensor) NBytes() int64 { return numel(t.Shape) * int64(t.DType.Size()) }

func numel(s []int64) int64 {
	n := int64(1)
	for _, d := range s {
		n *= d
	}
	return n
}

// Export writes the atomic checkpoint of r to dst as opt says.
func Export(ctx context.Context, r *atomic.Reader, dst string, opt Options) (*Stats, error) {
	if opt.MaxShard == 0 {
		opt.MaxShard = DefaultMaxShard
	}
	if opt.MaxShard < 0 {
		return nil, fmt.Errorf("max shard size %d is negative", opt.MaxShard)
	}
	if opt.Workers <= 0 {
		opt.Workers = runtime.NumCPU()
	}
	if opt.Memory <= 0 {
		opt.Memory = 256 << 20
	}
	st := &Stats{DType: opt.DType}
	if st.DType == dtype.Invalid {
		st.DType = dtype.Float32
		if d, err := dtype.Parse(r.Manifest.Source.DType); err == nil && r.Manifest.Source.DType != "" {
			st.DType = d
		}
	}
	if st.DType != dtype.Float32 && st.DType != dtype.BFloat16 && st.DType != dtype.Float16 {
		return nil, fmt.Errorf("cannot export %v weights: use float32, bfloat16 or float16", st.DType)
	}
	var model *family.Config
	if opt.Arch != "" && opt.Arch != ArchNone {
		var err error
		if model, err = ModelConfig(r, opt.Arch); err != nil {
			return nil, err
		}
	}
	dst = filepath.Clean(dst)
	if _, err := os.Stat(dst); err == nil && !opt.Force {
		return nil, fmt.Errorf("%s already exists (use --force to replace it)", dst)
	}
	var tensors []*Tensor
	var config []byte
	var err error
	if model != nil {
		// The family resolves every parameter; --params then filters.
		if tensors, err = plainTensors(r, nil, st.DType); err == nil {
			tensors, config, err = mapFamily(r, model, tensors, opt.Params, st.DType)
		}
	} else {
		tensors, err = plainTensors(r, opt.Params, st.DType)
	}
	if err != nil {
		return nil, err
	}
	if len(tensors) == 0 {
		return nil, fmt.Errorf("%s: no parameter to export (--params matches none?)", r.Dir)
	}
	shards, err := packShards(tensors, opt.MaxShard)
	if err != nil {
		return nil, err
	}
	if opt.Progress != nil {
		var total int64
		for _, t := range tensors {
			total += t.NBytes()
			for _, p := range t.Pieces {
				size := 4
				if e, ok := r.Param(p.Param); ok {
					if dt, err := e.StateDType(); err == nil {
						size = dt.Size()
					}
				}
				total += int64(size) * p.Len
			}
		}
		opt.Progress(total, 0, 0)
	}
	var files []string
	if err := fsutil.WriteDir(dst+atomic.PartialSuffix, dst, opt.Force, opt.NoSync, func(tmp string) error {
		if err := r.VerifyingReads(func() error {
			var err error
			files, err = writeShards(ctx, r, tmp, shards, opt)
			return err
		}); err != nil {
			return err
		}
		if config != nil {
			return fsutil.WriteFileAtomic(filepath.Join(tmp, ConfigName), config, opt.NoSync)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	st.Files = len(shards)
	for _, t := range tensors {
		st.Tensors++
		st.TensorBytes += t.NBytes()
	}
	for _, name := range append(files, ConfigName) {
		if fi, err := os.Stat(filepath.Join(dst, name)); err == nil {
			st.Bytes += fi.Size()
		}
	}
	return st, nil
}

// plainTensors lists the weights under their atomic names, in manifest
// order: trained parameters in dt, frozen parameters and buffers in the
// dtype they were stored in (when the manifest records it).
func plainTensors(r *atomic.Reader, sel *regexp.Regexp, dt dtype.DType) ([]*Tensor, error) {
	var out []*Tensor
	for _, p := range r.Params() {
		if sel != nil && !sel.MatchString(p.Name) {
			continue
		}
		has := false
		for _, f := range p.Files {
			has = has || f.State == fragment.FP32
		}
		if !has {
			continue
		}
		t := &Tensor{Name: p.Name, DType: dt, Shape: append([]int64{}, p.Shape...),
			Pieces: []Piece{{Param: p.Name, Len: numel(p.Shape)}}}
		if p.Frozen && p.SourceDType != "" {
			sd, err := dtype.Parse(p.SourceDType)
			if err != nil {
				return nil, fmt.Errorf("%s: parameter %s: source_dtype: %w", r.Dir, p.Name, err)
			}
			t.DType = sd
		}
		out = append(out, t)
	}
	return out, nil
}

// packShards groups tensors into files as huggingface_hub's
// split_state_dict_into_shards_factory does: in order, a new shard when the
// next tensor would overflow the current one, and a tensor larger than
// the limit alone in a shard of its own.
func packShards(tensors []*Tensor, max int64) ([][]*Tensor, error) {
	smallest := tensors[0]
	for _, t := range tensors {
		if t.NBytes() < smallest.NBytes() {
			smallest = t
		}
	}
	if len(tensors) > 1 && smallest.NBytes() > max {
		return nil, fmt.Errorf("max shard size %d bytes is below every tensor (the smallest, %s, has %d bytes): every tensor would be a shard of its own",
			max, smallest.Name, smallest.NBytes())
	}
	var shards [][]*Tensor
	var cur []*Tensor
	var size int64
	for _, t := range tensors {
		n := t.NBytes()
		if n > max {
			shards = append(shards, []*Tensor{t})
			continue
		}
		if len(cur) > 0 && size+n > max {
			shards = append(shards, cur)
			cur, size = nil, 0
		}
		cur = append(cur, t)
		size += n
	}
	if len(cur) > 0 {
		shards = append(shards, cur)
	}
	if len(shards) > 99999 {
		return nil, fmt.Errorf("%d shards: more than the 99999 that the file names allow; raise --max-shard-size", len(shards))
	}
	return shards, nil
}
