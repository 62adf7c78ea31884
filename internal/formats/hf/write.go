package hf

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"

	"golang.org/x/sync/errgroup"

	ucpatomic "github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/safetensors"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// File names, as transformers' save_pretrained writes them.
const (
	SafetensorsName  = "model.safetensors"
	SafetensorsIndex = "model.safetensors.index.json"
	TorchName        = "pytorch_model.bin"
	TorchIndex       = "pytorch_model.bin.index.json"
	ConfigName       = "config.json"
)

// shardName is the file of shard i of n: the single name, or
// <stem>-0000i-of-0000n<ext> (transformers' SAFE_WEIGHTS_NAME /
// WEIGHTS_NAME with the shard suffix before the extension).
func shardName(torch bool, i, n int) string {
	stem, ext := "model", ".safetensors"
	if torch {
		stem, ext = "pytorch_model", ".bin"
	}
	if n == 1 {
		return stem + ext
	}
	return fmt.Sprintf("%s-%05d-of-%05d%s", stem, i+1, n, ext)
}

// sink is one output file being written: safetensors.Writer or
// torchfile.Writer.
type sink interface {
	layout.Sink
	Commit() error
	Abort()
}

// writeShards writes every shard file and, when there are several, the
// index; it returns the names written.
func writeShards(ctx context.Context, r *ucpatomic.Reader, dir string, shards [][]*Tensor, opt Options) ([]string, error) {
	var names []string
	weightMap := map[string]string{}
	var total int64
	// One pair of buffers per worker, reused by every tensor: fresh
	// multi-megabyte buffers per tensor cost page faults and zeroing.
	bufs := make(chan *tensorBufs, opt.Workers)
	for range opt.Workers {
		bufs <- &tensorBufs{}
	}
	defer func() {
		for range opt.Workers {
			(<-bufs).mover.Close()
		}
	}()
	progress := func(read, written int64) {
		if opt.Progress != nil {
			opt.Progress(0, read, written)
		}
	}
	for i, shard := range shards {
		name := shardName(opt.Torch, i, len(shards))
		names = append(names, name)
		w, index, err := createSink(filepath.Join(dir, name), shard, opt)
		if err != nil {
			return nil, err
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(opt.Workers)
		for j, t := range shard {
			weightMap[t.Name] = name
			total += t.NBytes()
			if !t.AddOne {
				// Cut into ranges the workers share: one large tensor (the
				// embedding) would otherwise keep one worker busy alone.
				if err := rangeTasks(gctx, g, r, w, bufs, index[j], t, progress); err != nil {
					g.Wait()
					w.Abort()
					return nil, err
				}
				continue
			}
			g.Go(func() error {
				b := <-bufs
				defer func() { bufs <- b }()
				return writeTensor(gctx, r, w, b, index[j], t, chunkElems(opt, t.DType), progress)
			})
		}
		if err := g.Wait(); err != nil {
			w.Abort()
			return nil, err
		}
		if err := w.Commit(); err != nil {
			return nil, err
		}
	}
	if len(shards) > 1 {
		idx := SafetensorsIndex
		if opt.Torch {
			idx = TorchIndex
		}
		b, err := indexJSON(total, weightMap)
		if err != nil {
			return nil, err
		}
		if err := fsutil.WriteFileAtomic(filepath.Join(dir, idx), b, opt.NoSync); err != nil {
			return nil, err
		}
		names = append(names, idx)
	}
	return names, nil
}

// indexJSON is the shard index as transformers writes it:
// json.dumps(index, indent=2, sort_keys=True) + "\n".
func indexJSON(total int64, weightMap map[string]string) ([]byte, error) {
	index := map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(index); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// createSink starts one file of the shard's tensors; index[j] is the
// writer's number of shard[j].
func createSink(path string, shard []*Tensor, opt Options) (sink, []int, error) {
	index := make([]int, len(shard))
	if !opt.Torch {
		entries := make([]safetensors.Entry, len(shard))
		for j, t := range shard {
			entries[j] = safetensors.Entry{Name: t.Name, DType: t.DType, Shape: t.Shape}
			index[j] = j
		}
		w, err := safetensors.Create(path, entries, map[string]string{"format": "pt"})
		return w, index, err
	}
	// A state dict: an OrderedDict of name -> tensor, as torch.save(model.state_dict()).
	root := pyobj.NewDict(pyobj.OrderedDict)
	blobs := make([]*torchfile.Blob, len(shard))
	for j, t := range shard {
		blobs[j] = &torchfile.Blob{DType: t.DType, Shape: t.Shape}
		root.Set(t.Name, blobs[j])
	}
	w, err := torchfile.Create(path, root)
	if err != nil {
		return nil, nil, err
	}
	w.NoSync = opt.NoSync
	pos := map[*torchfile.Blob]int{}
	for i, b := range w.Layout.Blobs {
		pos[b] = i
	}
	for j, b := range blobs {
		i, ok := pos[b]
		if !ok {
			w.Abort()
			return nil, nil, fmt.Errorf("%s: tensor %s is not in the file layout", path, shard[j].Name)
		}
		index[j] = i
	}
	return w, index, nil
}

// chunkElems is how many elements one worker converts at once: its share
// of the memory budget over the float32 input and the output bytes.
func chunkElems(opt Options, dt dtype.DType) int64 {
	n := opt.Memory / int64(opt.Workers) / int64(4+dt.Size())
	return max(4096, min(n, layout.Chunk))
}

// tensorBufs are one worker's input (as stored), float32 and cast output
// buffers.
type tensorBufs struct {
	in, f32, out []byte
	mover        layout.Mover // copies and casts tensors without AddOne (rangeTasks)
}

func growBuf(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// writeTensor streams one tensor with AddOne (Megatron's
// apply_layernorm_1p norm weights: 1 added before the cast) through the
// worker's buffers: ranged reads of each piece, cast and written at their
// offsets.
func writeTensor(ctx context.Context, r *ucpatomic.Reader, w sink, b *tensorBufs, i int, t *Tensor, chunk int64, progress func(read, written int64)) error {
	es := int64(t.DType.Size())
	b.out = growBuf(b.out, es*min(chunk, numel(t.Shape)))
	var at int64 // output element
	for _, p := range t.Pieces {
		st, err := r.OpenState(p.Param, "fp32")
		if err != nil {
			return err
		}
		ss := int64(st.DType.Size())
		b.in = growBuf(b.in, ss*min(chunk, numel(t.Shape)))
		for done := int64(0); done < p.Len; {
			if err := ctx.Err(); err != nil {
				st.Close()
				return err
			}
			m := min(p.Len-done, chunk)
			out, err := b.cast(st, p.Start+done, m, t.DType, t.AddOne)
			if err != nil {
				st.Close()
				return fmt.Errorf("%s: %w", t.Name, err)
			}
			if err := w.WriteAt(i, out, at*es); err != nil {
				st.Close()
				return err
			}
			progress(ss*m, es*m)
			done += m
			at += m
		}
		st.Close()
	}
	if at != numel(t.Shape) {
		return fmt.Errorf("%s: pieces give %d elements for shape %v", t.Name, at, t.Shape)
	}
	return nil
}

// rangeJob bounds the elements of one task of rangeTasks.
const rangeJob = 1 << 20

// rangeTasks adds to g one task per range of at most rangeJob elements of
// tensor t (blob i of w): copied or cast from its atomic fp32 state by
// the workers' Movers.
func rangeTasks(ctx context.Context, g *errgroup.Group, r *ucpatomic.Reader, w sink, bufs chan *tensorBufs, i int, t *Tensor, progress func(read, written int64)) error {
	es := int64(t.DType.Size())
	var at int64
	for _, p := range t.Pieces {
		for done := int64(0); done < p.Len; done += rangeJob {
			n, start, pos, param := min(rangeJob, p.Len-done), p.Start+done, at+done, p.Param
			g.Go(func() error {
				if err := ctx.Err(); err != nil {
					return err
				}
				b := <-bufs
				defer func() { bufs <- b }()
				st, err := b.mover.Open(r, param, "fp32")
				if err != nil {
					return err
				}
				if err := b.mover.Range(w, i, pos*es, st, start, n, t.DType); err != nil {
					return fmt.Errorf("%s: %w", t.Name, err)
				}
				progress(int64(st.DType.Size())*n, es*n)
				return nil
			})
		}
		at += p.Len
	}
	if at != numel(t.Shape) {
		return fmt.Errorf("%s: pieces give %d elements for shape %v", t.Name, at, t.Shape)
	}
	return nil
}

// cast reads elements [start, start+m) of st and returns them as dt: the
// bytes read when st has that dtype, else converted through float32.
func (b *tensorBufs) cast(st *ucpatomic.State, start, m int64, dt dtype.DType, addOne bool) ([]byte, error) {
	raw := b.in[:int64(st.DType.Size())*m]
	if err := st.ReadRange(start, m, raw); err != nil {
		return nil, err
	}
	if st.DType == dt && !addOne {
		return raw, nil
	}
	f32 := raw
	if st.DType != dtype.Float32 || addOne {
		b.f32 = growBuf(b.f32, 4*m)
		f32 = b.f32[:4*m]
		if st.DType == dtype.Float32 {
			copy(f32, raw)
		} else if err := dtype.ToFloat32(f32, raw, st.DType); err != nil {
			return nil, err
		}
	}
	if addOne {
		for k := 0; k < len(f32); k += 4 {
			binary.LittleEndian.PutUint32(f32[k:], math.Float32bits(math.Float32frombits(binary.LittleEndian.Uint32(f32[k:]))+1))
		}
	}
	out := b.out[:int64(dt.Size())*m]
	return out, castFloat32(out, f32, dt)
}

// castFloat32 converts float32 elements to dt: the float types as torch's
// .to() rounds them, float64 exactly, integers and bool (frozen buffers,
// which atomic checkpoints written before ucp kept their dtype hold exactly
// as float32) by
// truncation toward zero, as torch's float-to-int cast does.
func castFloat32(dst, src []byte, dt dtype.DType) error {
	switch dt {
	case dtype.Float32, dtype.BFloat16, dtype.Float16:
		return dtype.FromFloat32(dst, src, dt)
	}
	le := binary.LittleEndian
	n := len(src) / 4
	for k := 0; k < n; k++ {
		f := math.Float32frombits(le.Uint32(src[4*k:]))
		switch dt {
		case dtype.Float64:
			le.PutUint64(dst[8*k:], math.Float64bits(float64(f)))
		case dtype.Int64:
			le.PutUint64(dst[8*k:], uint64(int64(f)))
		case dtype.Int32:
			le.PutUint32(dst[4*k:], uint32(int32(f)))
		case dtype.Int16:
			le.PutUint16(dst[2*k:], uint16(int16(f)))
		case dtype.Int8:
			dst[k] = byte(int8(f))
		case dtype.Uint8:
			dst[k] = byte(f)
		case dtype.Bool:
			dst[k] = 0
			if f != 0 {
				dst[k] = 1
			}
		default:
			return fmt.Errorf("cannot write %v tensors", dt)
		}
	}
	return nil
}
