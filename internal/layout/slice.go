// Package layout computes target layouts from an atomic checkpoint: for
// one target rank, which elements of each atomic tensor it holds
// (tensor-parallel slices as DeepSpeed's universal loader and Megatron cut
// them, ZeRO-1/2 and ZeRO-3 flat partitions, FSDP dim-0 chunks), and reads
// exactly those. The resume-time loader (capi, internal/load) and the
// reshard writers (formats/deepspeed, formats/megatron) share it; the
// writers stream their tensors through StateFill and WriteFile.
//
// The geometry is the one the converter uses, run backwards: a
// fragment.Shard's box maps say where each local element lives in the
// full tensor.
package layout

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Meta is what DeepSpeed's universal loader reads from a state file
// besides 'param' (atomic/FORMAT.md).
type Meta struct {
	CatDim     int     // -1 when the file has no cat_dim
	NSubParams int     // param_n_sub_params (2 for SwiGLU)
	SubSizes   []int64 // sub-parameter sizes at PartDim, from sub_param_shape
	PartDim    int
	Vocab      bool // vocab_tensor
}

// ReadMeta decodes the dict keys of an atomic state file (pickle only).
func ReadMeta(path string) (Meta, error) {
	m := Meta{CatDim: -1}
	f, err := torchfile.Decode(path)
	if err != nil {
		return m, err
	}
	switch f.Root.(type) {
	case *pyobj.Dict:
	default:
		return m, nil // a bare tensor (DeepSpeed ZeRO-3 style): no keys
	}
	d := pyobj.NewDec(path, f.Root)
	m.CatDim = int(d.OptInt("cat_dim", -1))
	m.NSubParams = int(d.OptInt("param_n_sub_params", 0))
	m.Vocab = d.OptBool("vocab_tensor", false)
	if err := d.Err(); err != nil {
		return m, err
	}
	if v, ok := d.Opt("sub_param_shape"); ok {
		v = v.Object("")
		pd := v.Attr("partition_dim").AsInt()
		spec := v.Attr("shape").AsList()
		if err := d.Err(); err != nil {
			return m, err
		}
		if int(pd) >= len(spec) || pd < 0 {
			return m, fmt.Errorf("%s: malformed sub_param_shape: partition_dim %d of %d dims", path, pd, len(spec))
		}
		// Sizes at partition_dim, or a single width, as the generic loader reads an int.
		sizes, isList := pyobj.Ints(spec[pd].Value())
		if !isList {
			sizes = []int64{spec[pd].AsInt()}
			if err := d.Err(); err != nil {
				return m, err
			}
		}
		m.PartDim, m.SubSizes, m.CatDim = int(pd), sizes, int(pd)
	}
	return m, nil
}

// TPShard returns the shard that tensor-parallel rank t of T holds of a
// parameter whose atomic tensor has shape full, cut as DeepSpeed's
// universal loader cuts it (its load_hp_checkpoint_state): whole when it has no
// cat_dim or when T is 1; a vocabulary zero-padded to localRows*T rows
// (localRows from the target model, or ceil(rows/T) when 0) and split
// evenly; sub-parameters each cut with torch.chunk semantics; anything
// else torch.chunk along cat_dim. Elements of the shard outside every map
// are zeros (vocabulary padding).
func TPShard(m Meta, full []int64, T, t int, localRows int64) (fragment.Shard, error) {
	repad := m.Vocab && len(full) == 2 && localRows > full[0] // a target padding even at T = 1
	if (T <= 1 && !repad) || (m.CatDim < 0 && m.SubSizes == nil) {
		return fragment.Shard{Shape: append([]int64(nil), full...)}, nil
	}
	if t < 0 || t >= T {
		return fragment.Shard{}, fmt.Errorf("tensor-parallel rank %d of %d", t, T)
	}
	switch {
	case m.Vocab:
		if len(full) != 2 {
			return fragment.Shard{}, fmt.Errorf("vocabulary tensor of shape %v", full)
		}
		if localRows <= 0 {
			localRows = (full[0] + int64(T) - 1) / int64(T)
		}
		padded := []int64{localRows * int64(T), full[1]}
		if padded[0] < full[0] {
			return fragment.Shard{}, fmt.Errorf("target vocabulary of %d rows is smaller than the checkpoint's %d", padded[0], full[0])
		}
		s, err := fragment.Split{Dim: 0}.Shard(padded, t, T)
		if err != nil {
			return fragment.Shard{}, err
		}
		return fragment.StripPad(s, padded, 0, full[0]), nil
	case m.SubSizes != nil:
		widths := make([][]int64, len(m.SubSizes))
		for k, s := range m.SubSizes {
			widths[k] = fragment.ChunkSizes(s, T)
		}
		return fragment.SubParams{Dim: m.PartDim, Widths: widths}.Shard(full, t, T)
	case m.NSubParams > 1:
		d := m.CatDim
		if d >= len(full) {
			return fragment.Shard{}, fmt.Errorf("cat_dim %d of shape %v", d, full)
		}
		halves := fragment.ChunkSizes(full[d], m.NSubParams)
		widths := make([][]int64, len(halves))
		for k, h := range halves {
			widths[k] = fragment.ChunkSizes(h, T)
		}
		return fragment.SubParams{Dim: d, Widths: widths}.Shard(full, t, T)
	}
	if m.CatDim >= len(full) {
		return fragment.Shard{}, fmt.Errorf("cat_dim %d of shape %v", m.CatDim, full)
	}
	return fragment.Split{Dim: m.CatDim, Sizes: fragment.ChunkSizes(full[m.CatDim], T)}.Shard(full, t, T)
}

// DimChunk returns the shard that rank r of W holds when a tensor is split
// on dim 0 with torch.chunk semantics (FSDP2 / DTensor Shard(0)).
func DimChunk(full []int64, r, W int) (fragment.Shard, error) {
	if len(full) == 0 {
		return fragment.Shard{Shape: nil}, nil
	}
	return fragment.Split{Dim: 0, Sizes: fragment.ChunkSizes(full[0], W)}.Shard(full, r, W)
}

// ReadLocal reads elements [start, start+n) of a shard of the atomic state
// st into dst, as float32; elements no map places (padding) are zero.
func ReadLocal(st *atomic.State, sh fragment.Shard, start, n int64, dst []float32) error {
	if int64(len(dst)) < n {
		return fmt.Errorf("buffer of %d for %d elements", len(dst), n)
	}
	clear(dst[:n])
	var err error
	sh.Runs(st.Shape, start, n, func(r fragment.Run) {
		if err != nil {
			return
		}
		var v []float32
		if v, err = st.ReadFloat32(r.Full, r.N); err == nil {
			copy(dst[r.Local-start:], v)
		}
	})
	return err
}

// ReadLocalAs is ReadLocal into little-endian elements of type dt in dst,
// which must hold n elements: the state's own dtype (copied as stored: a
// frozen parameter's or buffer's dtype, float32 otherwise), or float32,
// bfloat16 or float16, converted as torch does (through float32: an
// integer buffer gives its values as floats). It returns the bytes read
// from storage (padding is not read).
func ReadLocalAs(st *atomic.State, sh fragment.Shard, start, n int64, dt dtype.DType, dst []byte) (int64, error) {
	es, ss := int64(dt.Size()), int64(st.DType.Size())
	if dt != st.DType && dt != dtype.Float32 && dt != dtype.BFloat16 && dt != dtype.Float16 {
		return 0, fmt.Errorf("%s: cannot load %v as %v (float32, bfloat16, float16 or %v)", st.Path, st.DType, dt, st.DType)
	}
	if int64(len(dst)) < n*es {
		return 0, fmt.Errorf("buffer of %d bytes for %d %v elements", len(dst), n, dt)
	}
	// Elements no run covers are padding and must read as zeros; clearing
	// the whole buffer first would write every byte twice, so only a shard
	// with padding in the range is cleared.
	var covered int64
	sh.Runs(st.Shape, start, n, func(r fragment.Run) { covered += r.N })
	if covered != n {
		clear(dst[:n*es])
	}
	var read int64
	var err error
	sh.Runs(st.Shape, start, n, func(r fragment.Run) {
		if err != nil {
			return
		}
		out := dst[(r.Local-start)*es : (r.Local-start+r.N)*es]
		read += ss * r.N
		if dt == st.DType {
			err = st.ReadRange(r.Full, r.N, out)
			return
		}
		raw := make([]byte, ss*r.N)
		if err = st.ReadRange(r.Full, r.N, raw); err != nil {
			return
		}
		f32 := raw
		if st.DType != dtype.Float32 {
			f32 = make([]byte, 4*r.N)
			if err = dtype.ToFloat32(f32, raw, st.DType); err != nil {
				return
			}
		}
		err = dtype.FromFloat32(out, f32, dt)
	})
	return read, err
}
