package mapreduce

import (
	"fmt"
	"sync"
	"time"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
)

// Source reads full-tensor float32 element ranges of a table's states with
// the reducers' machinery (ranged preads, format conversion, Partial
// replicas averaged) but writes nothing: ucp diff compares two tables
// through it. Its source files are shared by its workers.
type Source struct {
	r   *runner
	mu  sync.Mutex
	wss []*WorkerStats // of its gatherers
}

// NewSource opens nothing yet; files are opened on first use.
func NewSource(t *fragment.Table) *Source {
	return &Source{r: &runner{t: t, src: newSources(), start: time.Now()}}
}

// Close closes the source files.
func (s *Source) Close() { s.r.src.close() }

// BytesRead returns the source bytes read by all workers; call it when
// they are done.
func (s *Source) BytesRead() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, ws := range s.wss {
		n += ws.BytesRead
	}
	return n
}

// Gatherer is one worker's reader of a Source; it is not safe for
// concurrent use (each worker takes its own).
type Gatherer struct {
	red *reducer
}

// Gatherer returns a new worker reader.
func (s *Source) Gatherer() *Gatherer {
	ws := &WorkerStats{}
	s.mu.Lock()
	s.wss = append(s.wss, ws)
	s.mu.Unlock()
	return &Gatherer{red: &reducer{r: s.r, ws: ws}}
}

// Read fills out with elements [start, end) of state si of parameter pi in
// float32 bytes, as convert would write them. The table must have passed
// Validate (every element covered), or elements may be left as they were.
func (g *Gatherer) Read(pi, si int, start, end int64, out []byte) error {
	p := g.red.r.t.Params[pi]
	st := p.States[si]
	out = out[:4*(end-start)]
	var err error
	if p.Average {
		g.red.out = out
		err = g.red.average(p, st, start, end)
	} else {
		err = g.red.gather(p, st, 0, start, end, out, dtype.Float32)
	}
	if err != nil {
		return fmt.Errorf("parameter %s, state %s: %w", p.Name, st.Name, err)
	}
	return nil
}
