package main

import (
	"fmt"
	"time"
)

// Every size ucp prints is binary (KiB, MiB, GiB: humanBytes), and every
// transfer counts the same two quantities: bytes read from the source and
// bytes written to the output.

// fmtDuration prints short runs in milliseconds, so that small runs do not
// show 0.00s.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return "<1ms"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// minRateTime is the shortest run whose throughput is worth printing: on
// shorter ones it is noise (and "0.00 GiB/s").
const minRateTime = 100 * time.Millisecond

// fmtRate prints bytes per second in binary units, or "" for runs too
// short to measure.
func fmtRate(bytes int64, d time.Duration) string {
	if d < minRateTime {
		return ""
	}
	return humanBytes(int64(float64(bytes)/d.Seconds())) + "/s"
}

// transferLine is the one summary of a run: what was read and written, in
// how long, and how fast when that means something.
func transferLine(read, written int64, total, index time.Duration) string {
	s := fmt.Sprintf("%s read, %s written in %s", humanBytes(read), humanBytes(written), fmtDuration(total))
	if index >= time.Millisecond {
		s += fmt.Sprintf(" (indexing %s)", fmtDuration(index))
	}
	if r, w := fmtRate(read, total), fmtRate(written, total); r != "" {
		s += fmt.Sprintf(": %s read, %s written", r, w)
	}
	return s
}
