package fsutil

import "testing"

func TestWritebackRange(t *testing.T) {
	const w = writebackWindow
	cases := []struct {
		name          string
		off, n        int64
		lo, hi        int64 // hi <= lo: nothing started
		startsNothing bool
	}{
		{"empty write", 5, 0, 0, 0, true},
		{"small write inside the first window", 0, 128 << 10, 0, 0, true},
		{"small write inside a later window", 3*w + 10, 100, 0, 0, true},
		{"small write ending on a multiple", w - 128<<10, 128 << 10, 0, w, false},
		{"small write crossing a multiple", 2*w - 10, 20, 0, 2 * w, false},
		{"small write ending on the third multiple", 3*w - 4096, 4096, w, 3 * w, false},
		{"a window's worth, unaligned", 10, w, 0, w + 10, false},
		{"a large copy, to its end", 5*w + 7, 3*w + 1, 4 * w, 8*w + 8, false},
		{"negative offset", -1, w, 0, 0, true},
	}
	for _, c := range cases {
		lo, hi := writebackRange(c.off, c.n)
		if c.startsNothing {
			if hi > lo {
				t.Errorf("%s: started [%d, %d), want nothing", c.name, lo, hi)
			}
			continue
		}
		if lo != c.lo || hi != c.hi {
			t.Errorf("%s: [%d, %d), want [%d, %d)", c.name, lo, hi, c.lo, c.hi)
		}
	}
}

// TestWritebackCoversSequentialWrites: a file written front to back in
// small pieces has every byte before its last multiple of the window
// started, and nothing past the end of what was written.
func TestWritebackCoversSequentialWrites(t *testing.T) {
	const w = writebackWindow
	for _, piece := range []int64{4096, 100 << 10, 128 << 10, 3 * w / 2} {
		size := int64(5*w + 12345)
		var covered int64
		for off := int64(0); off < size; off += piece {
			n := min(piece, size-off)
			lo, hi := writebackRange(off, n)
			if hi <= lo {
				continue
			}
			if lo > covered {
				t.Fatalf("piece %d: started [%d, %d), leaving [%d, %d) never started", piece, lo, hi, covered, lo)
			}
			covered = max(covered, hi)
			if hi > off+n {
				t.Fatalf("piece %d: started up to %d, past the write's end %d", piece, hi, off+n)
			}
		}
		if want := size &^ (w - 1); covered < want {
			t.Errorf("piece %d: started up to %d, want at least %d", piece, covered, want)
		}
	}
}
