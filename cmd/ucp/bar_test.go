package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestBarUnits: the progress bar counts in the binary units of every other
// number ucp prints (MiB, not MB).
func TestBarUnits(t *testing.T) {
	var b bytes.Buffer
	bar := newBar(&b, "converting", 3<<30)
	bar.Add64(1536 << 20)
	out := b.String()
	if !strings.Contains(out, "1.5 GiB / 3.0 GiB") || strings.Contains(out, "GB") ||
		!strings.Contains(out, "converting") {
		t.Errorf("bar: %q", out)
	}
}

// TestBarRate (issue 22, friction 3): no rate until the bar has run a
// second (a burst counted at the start showed "1.6 TiB/s"), then the
// average since the start; 100% only when everything is done; Finish
// clears the line.
func TestBarRate(t *testing.T) {
	var b bytes.Buffer
	now := time.Unix(1000, 0)
	bar := newBar(&b, "converting", 4<<30)
	bar.now = func() time.Time { return now }
	bar.start = now
	steps := []struct {
		after time.Duration
		add   int64
		want  string
	}{
		{10 * time.Millisecond, 1 << 30, "converting  25% [=======                       ] 1.0 GiB / 4.0 GiB"},
		{2 * time.Second, 1 << 30, "converting  50% [===============               ] 2.0 GiB / 4.0 GiB, 1.0 GiB/s, 2s left"},
		{4 * time.Second, 2<<30 - 64<<20, "converting  98% [=============================Й] 3.9 GiB / 4.0 GiB, 1008.0 MiB/s"},
		{4*time.Second + barEvery, 64 << 20, "converting 100% [==============================] 4.0 GiB / 4.0 GiB, 975.2 MiB/s"},
	}
	for _, s := range steps {
		now = time.Unix(1000, 0).Add(s.after)
		b.Reset()
		bar.Add64(s.add)
		got := strings.TrimRight(strings.TrimPrefix(b.String(), "\r"), " ")
		want := strings.ReplaceAll(s.want, "Й", " ")
		if got != want {
			t.Errorf("after %s: got %q, want %q", s.after, got, want)
		}
	}
	b.Reset()
	bar.Finish()
	if got := b.String(); strings.Trim(got, "\r ") != "" {
		t.Errorf("Finish wrote %q", got)
	}
}

// TestTransferLine: one summary form for every run; no "0.00s" or "0.00
// GiB/s" on small runs, milliseconds below a second, a rate only from
// 100ms.
func TestTransferLine(t *testing.T) {
	for _, c := range []struct {
		read, written int64
		total, index  time.Duration
		want          string
	}{
		{28 << 10, 27 << 10, 3 * time.Millisecond, 0, "28.0 KiB read, 27.0 KiB written in 3ms"},
		{28 << 10, 27 << 10, 400 * time.Microsecond, 200 * time.Microsecond, "28.0 KiB read, 27.0 KiB written in <1ms"},
		{3 << 30, 5 << 30, 4 * time.Second, 250 * time.Millisecond,
			"3.0 GiB read, 5.0 GiB written in 4.00s (indexing 250ms): 768.0 MiB/s read, 1.2 GiB/s written"},
		{1 << 20, 1 << 20, 99 * time.Millisecond, 2 * time.Millisecond, "1.0 MiB read, 1.0 MiB written in 99ms (indexing 2ms)"},
	} {
		if got := transferLine(c.read, c.written, c.total, c.index); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}
