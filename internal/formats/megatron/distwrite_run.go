package megatron

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Rank files are planned before a byte is written: every bytes item and
// chunk gets its offset (a chunk's torch.save stream has a size known from
// its dtype and shape), so all files are written at once: each chunk's
// payload is a region of its rank file (layout.Regions) that
// layout.WriteFills fills from the chunk's pieces with a bounded pool of
// workers sharing ranges of every chunk (elements stored in the output
// dtype copied in the kernel, the others converted through small
// buffers). A chunk's stream ends with the CRC of its data, written once
// every range is. (mapreduce.Run plans atomic state files from a fragment
// table; this is the same plan-then-run shape for DCP rank files.)

// dwStream is one chunk's planned torch.save stream.
type dwStream struct {
	k      *dwKey
	ch     *dwChunk
	file   *os.File
	lay    *torchfile.Layout
	base   int64
	region int // its payload in runRanks' Regions
}

// writeRanks writes __<rank>_0.distcp for every model-parallel rank into
// dir: rank 0's bytes items first, then each rank's chunks in key order,
// and returns the file sizes.
func (w *distWriter) writeRanks(ctx context.Context, dir string) ([]int64, error) {
	ranks := w.o.TP * w.o.PP
	at := make([]int64, ranks)
	name := func(r int) string { return fmt.Sprintf("__%d_0.distcp", r) }
	for _, k := range w.items {
		k.info = dcp.StorageInfo{RelativePath: name(0), Offset: at[0], Length: int64(len(k.data))}
		at[0] += int64(len(k.data))
	}
	var streams []*dwStream
	for _, k := range w.tensor {
		for _, ch := range k.chunks {
			lay, err := torchfile.NewLayout("archive", &torchfile.Blob{DType: k.dt, Shape: ch.size})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k.key, err)
			}
			ch.info = dcp.StorageInfo{RelativePath: name(ch.rank), Offset: at[ch.rank], Length: lay.Size()}
			streams = append(streams, &dwStream{k: k, ch: ch, lay: lay, base: at[ch.rank]})
			at[ch.rank] += lay.Size()
		}
	}
	files := make([]*os.File, ranks)
	closeAll := func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	for r := range files {
		f, err := os.Create(filepath.Join(dir, name(r)))
		if err != nil {
			closeAll()
			return nil, err
		}
		files[r] = f
	}
	for _, s := range streams {
		s.file = files[s.ch.rank]
	}
	err := w.runRanks(ctx, files[0], streams)
	for r, f := range files {
		if err == nil && !w.o.NoSync {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s: %w", filepath.Join(dir, name(r)), cerr)
		}
	}
	if err != nil {
		return nil, err
	}
	return at, nil
}

// runRanks writes the bytes items, the streams' heads and their payloads
// with o.Workers workers, then the tails.
func (w *distWriter) runRanks(ctx context.Context, rank0 *os.File, streams []*dwStream) error {
	for _, k := range w.items {
		if err := fsutil.WriteAt(rank0, k.data, k.info.Offset); err != nil {
			return fmt.Errorf("%s: %s: %w", rank0.Name(), k.key, err)
		}
	}
	var regions layout.Regions
	fills := make([]layout.TensorFill, 0, len(streams))
	for _, s := range streams {
		for _, seg := range s.lay.Head() {
			if err := fsutil.WriteAt(s.file, seg.Data, s.base+seg.Off); err != nil {
				return fmt.Errorf("%s: %s: %w", s.file.Name(), s.k.key, err)
			}
		}
		n := torchfile.Numel(s.ch.size)
		s.region = regions.Add(s.file, s.base+s.lay.BlobOffset(0), n*int64(s.k.dt.Size()))
		fills = append(fills, layout.TensorFill{I: s.region, DType: s.k.dt, N: n, Pieces: withState(s.ch.pieces, s.ch.state)})
	}
	if err := layout.WriteFills(ctx, w.p.r, &regions, fills, w.o.Workers, w.o.taskBytes); err != nil {
		return err
	}
	for _, s := range streams {
		crc, err := regions.CRC(s.region)
		if err != nil {
			return fmt.Errorf("%s: %w", s.k.key, err)
		}
		tail, err := s.lay.Tail([]uint32{crc})
		if err != nil {
			return err
		}
		for _, seg := range tail {
			if err := fsutil.WriteAt(s.file, seg.Data, s.base+seg.Off); err != nil {
				return fmt.Errorf("%s: %s: %w", s.file.Name(), s.k.key, err)
			}
		}
	}
	return nil
}
