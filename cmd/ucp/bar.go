package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// bar is the progress bar on a terminal: percent, bytes done of the total
// in the binary units of every other figure ucp prints, and the average
// rate since the bar started, shown only after barWarmup so the first
// samples (a burst from the page cache, a lump counted at once) cannot
// show an inflated rate. It redraws at most every barEvery.
type bar struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	total int64
	done  int64
	start time.Time
	drawn time.Time
	width int // of the last line drawn, to clear it
	now   func() time.Time
}

const (
	barEvery  = 200 * time.Millisecond
	barWarmup = time.Second
	barCells  = 30
)

func newBar(w io.Writer, label string, total int64) *bar {
	b := &bar{w: w, label: label, total: total, now: time.Now}
	b.start = b.now()
	return b
}

// Add64 counts n more bytes done.
func (b *bar) Add64(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done += n
	if t := b.now(); t.Sub(b.drawn) >= barEvery {
		b.drawn = t
		b.draw(b.line(t))
	}
	return nil
}

// line is the bar's text at time t.
func (b *bar) line(t time.Time) string {
	done := min(b.done, b.total)
	pct := 100
	if b.total > 0 {
		pct = int(done * 100 / b.total) // 100 only when everything is done
	}
	cells := barCells * pct / 100
	s := fmt.Sprintf("%s %3d%% [%s%s] %s / %s", b.label, pct, strings.Repeat("=", cells), strings.Repeat(" ", barCells-cells),
		humanBytes(done), humanBytes(b.total))
	if el := t.Sub(b.start); el >= barWarmup && done > 0 {
		rate := float64(done) / el.Seconds()
		s += fmt.Sprintf(", %s/s", humanBytes(int64(rate)))
		if left := time.Duration(float64(b.total-done) / rate * float64(time.Second)).Round(time.Second); left > 0 {
			s += ", " + left.String() + " left"
		}
	}
	return s
}

func (b *bar) draw(s string) {
	pad := max(b.width-len(s), 0)
	fmt.Fprintf(b.w, "\r%s%s", s, strings.Repeat(" ", pad))
	b.width = len(s)
}

// Finish clears the bar's line for the summary that follows.
func (b *bar) Finish() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.width > 0 {
		fmt.Fprintf(b.w, "\r%s\r", strings.Repeat(" ", b.width))
		b.width = 0
	}
	return nil
}
