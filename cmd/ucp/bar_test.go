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
	if err := bar.RenderBlank(); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "(1.5/3.0 GiB") || strings.Contains(out, "GB") ||
		!strings.Contains(out, "converting") {
		t.Errorf("bar: %q", out)
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
