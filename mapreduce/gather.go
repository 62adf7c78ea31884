package mapreduce

import (
	"fmt"
	"time"

	"github.com/ucp-project/ucp/fragment"
)

// Source reads full-tensor float32 element ranges of a table's states with
// the reducers' machinery (ranged preads, format conversion, Partial
// replicas averaged) but writes nothing: ucp diff compares two tables
// through it. Its source files are shared by its workers.
type Source struct {
	r *runner
}

// NewSource opens nothing yet; files are opened on first use.
func NewSource(t *fragment.Table) *Source {
	return &Source{r: &runner{t: t, src: newSources(), start: time.Now()}}
}

// Close closes the source files.
func (s *Source) Close() { s.r.src.close() }

// BytesRead returns the source bytes read so far by all workers.
func (s *Source) BytesRead() int64 { return s.r.read.Load() }

// Gatherer is one worker's reader of a Source; it is not safe for
// concurrent use (each worker takes its own).
type Gatherer struct {
	red *reducer
}

// Gatherer returns a new worker reader.
func (s *Source) Gatherer() *Gatherer {
	return &Gatherer{red: &reducer{r: s.r, ws: &WorkerStats{}}}
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
		err = g.red.gather(p, st, 0, start, end, out)
	}
	if err != nil {
		return fmt.Errorf("parameter %s, state %s: %w", p.Name, st.Name, err)
	}
	return nil
}
