package torchfile

import (
	"context"
	"runtime"

	"golang.org/x/sync/errgroup"
)

// Decode opens path, decodes its pickle and closes it again. The File
// describes every tensor with absolute storage offsets, which is all an
// index needs; its data must then be read through another handle.
func Decode(path string) (*File, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	f.closer.Close()
	f.closer, f.r = nil, nil
	return f, nil
}

// DecodeAll decodes the files concurrently (the map step: pickles only),
// at most workers at a time, stopping at the first error.
func DecodeAll(ctx context.Context, paths []string, workers int) ([]*File, error) {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	out := make([]*File, len(paths))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i, p := range paths {
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			f, err := Decode(p)
			out[i] = f
			return err
		})
	}
	return out, g.Wait()
}
