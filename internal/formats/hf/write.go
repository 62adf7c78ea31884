package hf

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	ucpatomic "github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
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
// index; it returns the names written. Each file's tensors are written by
// layout.WriteFills: ranges copied in the kernel or cast by workers
// sharing them, as the resharding writers do.
func writeShards(ctx context.Context, r *ucpatomic.Reader, dir string, shards [][]*Tensor, opt Options) ([]string, error) {
	var names []string
	weightMap := map[string]string{}
	var total int64
	// Memory bounds the workers' buffers together.
	workers := int(max(1, min(int64(opt.Workers), opt.Memory/layout.MoverBytes)))
	var progress func(read, written int64)
	if opt.Progress != nil {
		progress = func(read, written int64) { opt.Progress(0, read, written) }
	}
	for i, shard := range shards {
		name := shardName(opt.Torch, i, len(shards))
		names = append(names, name)
		w, index, err := createSink(filepath.Join(dir, name), shard, opt)
		if err != nil {
			return nil, err
		}
		fills := make([]layout.TensorFill, len(shard))
		for j, t := range shard {
			weightMap[t.Name] = name
			total += t.NBytes()
			if fills[j], err = tensorFill(t, index[j]); err != nil {
				w.Abort()
				return nil, err
			}
		}
		if err := layout.WriteFillsProgress(ctx, r, w, fills, workers, 0, progress); err != nil {
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

// tensorFill is t as tensor i of its file: its pieces of fp32 states one
// after another.
func tensorFill(t *Tensor, i int) (layout.TensorFill, error) {
	f := layout.TensorFill{I: i, DType: t.DType, N: numel(t.Shape), Pieces: make([]layout.StatePiece, len(t.Pieces))}
	var at int64
	for k, p := range t.Pieces {
		f.Pieces[k] = layout.StatePiece{Param: p.Param, State: fragment.FP32, Local: p.Start, N: p.Len, At: at, AddOne: t.AddOne}
		at += p.Len
	}
	if at != f.N {
		return f, fmt.Errorf("%s: pieces give %d elements for shape %v", t.Name, at, t.Shape)
	}
	return f, nil
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
