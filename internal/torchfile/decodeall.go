package torchfile

import (
	"context"
	"runtime"

	"golang.org/x/sync/errgroup"
)

// Decode opens path, decodes its pickle and closes it again. The File
// describes every tensor with absolute storage offsets, which is all an
// index needs; its data must then be read through another handle.
func Decode(path string) (*File, error) { return Options{}.Decode(path) }

// Decode is Decode with these options.
func (o Options) Decode(path string) (*File, error) {
	f, err := o.Open(path)
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
	return Options{}.DecodeAll(ctx, paths, workers)
}

// DecodeAll is DecodeAll with these options.
func (o Options) DecodeAll(ctx context.Context, paths []string, workers int) ([]*File, error) {
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
			f, err := o.Decode(p)
			out[i] = f
			return err
		})
	}
	return out, g.Wait()
}
