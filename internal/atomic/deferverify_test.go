package atomic_test

import (
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/testkit"
)

// VerifyingReads checks each state file opened from the bytes read of it
// (ReadRange, Record) plus the bytes nobody read: a flipped bit anywhere in
// the file is found whether or not the reads covered it, read twice or in
// overlapping ranges, and an intact file passes.
func TestVerifyingReads(t *testing.T) {
	// reads of "w"'s fp32 state (12 elements): [start, n) ranges read with
	// ReadRange, and whether the last one is recorded as a copy instead.
	type read struct{ start, n int64 }
	cases := []struct {
		name    string
		reads   []read
		record  bool  // the first range is a kernel copy (Record), not a ReadRange
		flip    int64 // byte to flip: -1 none, else an offset from the tensor's first byte (negative: header)
		flipHdr bool  // flip a byte of the zip header instead
		wantErr string
	}{
		{name: "all read, intact", reads: []read{{0, 12}}, flip: -1},
		{name: "pieces, intact", reads: []read{{0, 5}, {5, 7}}, flip: -1},
		{name: "overlapping and repeated, intact", reads: []read{{0, 6}, {3, 6}, {0, 6}, {9, 3}}, flip: -1},
		{name: "part read, intact", reads: []read{{4, 2}}, flip: -1},
		{name: "nothing read, intact", flip: -1},
		{name: "copied, intact", reads: []read{{0, 12}}, record: true, flip: -1},
		{name: "flip in a byte read", reads: []read{{0, 12}}, flip: 8, wantErr: "CRC-32"},
		{name: "flip in a byte not read", reads: []read{{0, 2}}, flip: 20, wantErr: "CRC-32"},
		{name: "flip in the header", reads: []read{{0, 12}}, flipHdr: true, wantErr: "CRC-32"},
		{name: "flip under overlapping reads", reads: []read{{0, 6}, {3, 6}}, flip: 16, wantErr: "CRC-32"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := sampleCheckpoint(t)
			path := filepath.Join(dir, atomic.StatePath("w", fragment.FP32))
			testkit.FlipState(t, path, func(b []byte, off int64) {
				switch {
				case c.flipHdr:
					b[5] ^= 1 // inside the first local header's fixed fields (version needed): still opens
				case c.flip >= 0:
					b[off+c.flip] ^= 1
				}
			})
			r, err := atomic.OpenReader(dir, atomic.ReaderOptions{Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			err = r.VerifyingReads(func() error {
				st, err := r.OpenState("w", fragment.FP32)
				if err != nil {
					return err
				}
				defer st.Close()
				for i, rd := range c.reads {
					buf := make([]byte, 4*rd.n)
					if err := st.ReadRange(rd.start, rd.n, buf); err != nil {
						return err
					}
					if i == 0 && c.record {
						// What a kernel copy of these bytes reports instead.
						st2, _ := r.OpenState("w", fragment.FP32)
						st2.Record(rd.start, rd.n, crc32.ChecksumIEEE(buf))
						st2.Close()
					}
				}
				return nil
			})
			if c.wantErr == "" && err != nil {
				t.Fatalf("intact file: %v", err)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), "fp32.pt")) {
				t.Fatalf("got %v, want an error with %q naming fp32.pt", err, c.wantErr)
			}
			// Checked once: a later open reports the same result at once.
			_, err2 := r.OpenState("w", fragment.FP32)
			if (err2 == nil) != (c.wantErr == "") {
				t.Errorf("after VerifyingReads, OpenState: %v", err2)
			}
		})
	}
}

// A file that changed size since the manifest fails.
func TestVerifyingReadsSize(t *testing.T) {
	dir := sampleCheckpoint(t)
	path := filepath.Join(dir, atomic.StatePath("w", fragment.ExpAvg))
	r, err := atomic.OpenReader(dir, atomic.ReaderOptions{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	err = r.VerifyingReads(func() error {
		st, err := r.OpenState("w", fragment.ExpAvg)
		if err != nil {
			return err
		}
		st.Close()
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		f.Write([]byte{0})
		return f.Close()
	})
	if err == nil || !strings.Contains(err.Error(), "bytes, but the manifest says") {
		t.Errorf("grown file: %v", err)
	}
}
