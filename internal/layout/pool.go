package layout

import (
	"context"
	"runtime"

	"golang.org/x/sync/errgroup"
)

// Pooled runs fn on every item, at most workers at once (GOMAXPROCS when
// workers < 1), each call lent one of workers reusable states made by
// newState (a worker's buffers: allocated once, not per item). It stops at
// the first error or when ctx ends; release, when not nil, gets every
// state back at the end.
func Pooled[T, S any](ctx context.Context, workers int, items []T, newState func() S, release func(S), fn func(S, T) error) error {
	if workers < 1 {
		workers = runtime.GOMAXPROCS(0)
	}
	states := make(chan S, workers)
	for range workers {
		states <- newState()
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for _, it := range items {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			s := <-states
			defer func() { states <- s }()
			return fn(s, it)
		})
	}
	err := g.Wait()
	if release != nil {
		for range workers {
			release(<-states)
		}
	}
	return err
}
