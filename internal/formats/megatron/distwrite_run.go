package megatron

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Rank files are planned before a byte is written: every bytes item and
// chunk gets its offset (a chunk's torch.save stream has a size known from
// its dtype and shape), so all files are written at once by a bounded pool
// of workers, each task a range of one chunk's elements streamed in
// pieces. A chunk's stream ends with CRCs of its data: each task records
// the CRC of its range, and the tails are written once every range is.
// (mapreduce.Run plans atomic state files from a fragment table; this is
// the same plan-then-run shape for DCP rank files.)
const (
	pieceBytes = 4 << 20  // bytes of one read-convert-write step (one per worker)
	taskBytes  = 64 << 20 // bytes of one task: a giant chunk spreads over workers
)

// dwStream is one chunk's planned torch.save stream.
type dwStream struct {
	k    *dwKey
	ch   *dwChunk
	file *os.File
	lay  *torchfile.Layout
	base int64
	crcs []torchfile.Piece // per task, offsets relative to the blob
}

// dwTask writes elements [from, to) of a stream's tensor.
type dwTask struct {
	s        *dwStream
	from, to int64
	piece    int
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
	var tasks []dwTask
	for _, k := range w.tensor {
		es := int64(k.dt.Size())
		tb := w.o.taskBytes
		if tb <= 0 {
			tb = taskBytes
		}
		step := max(tb/es, 1)
		for _, ch := range k.chunks {
			lay, err := torchfile.NewLayout("archive", &torchfile.Blob{DType: k.dt, Shape: ch.size})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k.key, err)
			}
			ch.info = dcp.StorageInfo{RelativePath: name(ch.rank), Offset: at[ch.rank], Length: lay.Size()}
			s := &dwStream{k: k, ch: ch, lay: lay, base: at[ch.rank]}
			at[ch.rank] += lay.Size()
			streams = append(streams, s)
			n := torchfile.Numel(ch.size)
			for from := int64(0); from < n || (n == 0 && from == 0); from += step {
				tasks = append(tasks, dwTask{s: s, from: from, to: min(from+step, n), piece: len(s.crcs)})
				s.crcs = append(s.crcs, torchfile.Piece{})
				if n == 0 {
					break
				}
			}
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
	err := w.runRanks(ctx, files[0], streams, tasks)
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

// runRanks writes the bytes items, the streams' heads and every task's
// range with o.Workers workers, then the tails.
func (w *distWriter) runRanks(ctx context.Context, rank0 *os.File, streams []*dwStream, tasks []dwTask) error {
	for _, k := range w.items {
		if err := fsutil.WriteAt(rank0, k.data, k.info.Offset); err != nil {
			return fmt.Errorf("%s: %s: %w", rank0.Name(), k.key, err)
		}
	}
	for _, s := range streams {
		for _, seg := range s.lay.Head() {
			if err := fsutil.WriteAt(s.file, seg.Data, s.base+seg.Off); err != nil {
				return fmt.Errorf("%s: %s: %w", s.file.Name(), s.k.key, err)
			}
		}
	}
	bufs := sync.Pool{New: func() any { b := make([]byte, pieceBytes); return &b }}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.o.Workers)
	for _, t := range tasks {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			buf := bufs.Get().(*[]byte)
			defer bufs.Put(buf)
			if err := w.runTask(t, *buf); err != nil {
				return fmt.Errorf("%s: %s: %w", t.s.file.Name(), t.s.k.key, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, s := range streams {
		es := int64(s.k.dt.Size())
		crc, err := torchfile.CombinePieces(s.crcs, torchfile.Numel(s.ch.size)*es)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", s.file.Name(), s.k.key, err)
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

// runTask streams elements [from, to) of one chunk from its pieces of the
// atomic states (zeros between and around them) to its place in the rank
// file, pieceBytes at a time, and records their CRC.
func (w *distWriter) runTask(t dwTask, buf []byte) error {
	s, ch := t.s, t.s.ch
	dt := s.k.dt
	open := map[string]*atomic.State{} // the task's states, by parameter
	defer func() {
		for _, st := range open {
			st.Close()
		}
	}()
	es := int64(dt.Size())
	step := max(int64(len(buf))/es, 1)
	var crc uint32
	for done := t.from; done < t.to; {
		m := min(t.to-done, step)
		b := buf[:m*es]
		if err := w.readPieces(ch, dt, done, m, b, open); err != nil {
			return err
		}
		if err := fsutil.WriteAt(s.file, b, s.base+s.lay.BlobOffset(0)+done*es); err != nil {
			return err
		}
		crc = crc32.Update(crc, crc32.IEEETable, b)
		done += m
	}
	s.crcs[t.piece] = torchfile.Piece{Off: t.from * es, Len: (t.to - t.from) * es, CRC: crc}
	return nil
}

// readPieces reads elements [at, at+n) of a chunk into b (its dtype): the
// pieces' elements, zeros elsewhere; open caches the states opened.
func (w *distWriter) readPieces(ch *dwChunk, dt dtype.DType, at, n int64, b []byte, open map[string]*atomic.State) error {
	es := int64(dt.Size())
	covered := int64(0)
	for _, pc := range ch.pieces {
		if lo, hi := max(at, pc.At), min(at+n, pc.At+pc.N); lo < hi {
			covered += hi - lo
		}
	}
	if covered < n {
		clear(b)
	}
	for _, pc := range ch.pieces {
		lo, hi := max(at, pc.At), min(at+n, pc.At+pc.N)
		if lo >= hi {
			continue
		}
		st, ok := open[pc.Param]
		if !ok {
			var err error
			if st, err = w.p.r.OpenState(pc.Param, ch.state); err != nil {
				return err
			}
			open[pc.Param] = st
		}
		if _, err := layout.ReadLocalAs(st, pc.Shard, pc.Local+lo-pc.At, hi-lo, dt, b[(lo-at)*es:(hi-at)*es]); err != nil {
			return err
		}
	}
	return nil
}
