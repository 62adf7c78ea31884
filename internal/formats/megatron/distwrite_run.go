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
	"golang.org/x/sync/errgroup"
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

func rankFileName(r int) string { return fmt.Sprintf("__%d_0.distcp", r) }

// planRanks places rank 0's bytes items first, then each rank's chunks in
// key order, in the rank files __<rank>_0.distcp, and returns the chunks'
// streams and the file sizes.
func (w *distWriter) planRanks() ([]*dwStream, []int64, error) {
	at := make([]int64, w.o.TP*w.o.PP)
	for _, k := range w.items {
		k.info = dcp.StorageInfo{RelativePath: rankFileName(0), Offset: at[0], Length: int64(len(k.data))}
		at[0] += int64(len(k.data))
	}
	var streams []*dwStream
	for _, k := range w.tensor {
		for _, ch := range k.chunks {
			lay, err := torchfile.NewLayout("archive", &torchfile.Blob{DType: k.dt, Shape: ch.size})
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", k.key, err)
			}
			ch.info = dcp.StorageInfo{RelativePath: rankFileName(ch.rank), Offset: at[ch.rank], Length: lay.Size()}
			streams = append(streams, &dwStream{k: k, ch: ch, lay: lay, base: at[ch.rank]})
			at[ch.rank] += lay.Size()
		}
	}
	return streams, at, nil
}

// writeRanks writes the rank files of the ranks given (nil: every
// model-parallel rank) into dir and returns the sizes of all.
func (w *distWriter) writeRanks(ctx context.Context, dir string, ranks []int) ([]int64, error) {
	all, at, err := w.planRanks()
	if err != nil {
		return nil, err
	}
	files := make([]*os.File, len(at))
	if ranks == nil {
		for r := range at {
			ranks = append(ranks, r)
		}
	}
	closeAll := func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	for _, r := range ranks {
		f, err := os.Create(filepath.Join(dir, rankFileName(r)))
		if err != nil {
			closeAll()
			return nil, err
		}
		files[r] = f
	}
	var streams []*dwStream
	for _, s := range all {
		if s.file = files[s.ch.rank]; s.file != nil {
			streams = append(streams, s)
		}
	}
	err = w.runRanks(ctx, files[0], streams)
	if err == nil && !w.o.NoSync {
		// At once: each fsync waits on its file's writeback and then on the
		// device's cache flush; one after the other, the files' waits add up.
		var g errgroup.Group
		for _, r := range ranks {
			f := files[r]
			g.Go(func() error {
				if err := f.Sync(); err != nil {
					return fmt.Errorf("%s: %w", f.Name(), err)
				}
				return nil
			})
		}
		err = g.Wait()
	}
	for _, r := range ranks {
		if cerr := files[r].Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s: %w", filepath.Join(dir, rankFileName(r)), cerr)
		}
	}
	if err != nil {
		return nil, err
	}
	return at, nil
}

// runRanks writes the bytes items (when rank0, rank 0's file, is
// written here), the streams' heads and their payloads with o.Workers
// workers, then the tails.
func (w *distWriter) runRanks(ctx context.Context, rank0 *os.File, streams []*dwStream) error {
	for _, k := range w.items {
		if rank0 == nil {
			break
		}
		if err := fsutil.WriteAt(rank0, k.data, k.info.Offset); err != nil {
			return fmt.Errorf("%s: %s: %w", rank0.Name(), k.key, err)
		}
	}
	// writeback as ranges are written, as every writer that syncs does
	regions := layout.Regions{Writeback: !w.o.NoSync}
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
