package fsutil

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCopyRange copies ranges of a file into the middle of another with
// the kernel, with a kernel that refuses (the fallback), with one that
// fails half-way through, each through CopyRangeCRC (hashing) and CopyRange
// (not); the destination must hold exactly the source bytes at the offset
// and nothing else.
func TestCopyRange(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3<<20+17)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	srcPath := filepath.Join(dir, "src")
	if err := os.WriteFile(srcPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(srcPath)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	refuse := func(*os.File, int64, *os.File, int64, int) (int, error) { return 0, errKernelUnsupported }
	calls := 0
	refuseLater := func(d *os.File, do int64, s *os.File, so int64, n int) (int, error) {
		if calls++; calls > 1 {
			return 0, errKernelUnsupported
		}
		return kernelCopy(d, do, s, so, min(n, 1000))
	}
	for _, c := range []struct {
		name    string
		copier  Copier
		kernel  bool // the kernel must still be asked afterwards
		srcOff  int64
		n       int64
		dstOff  int64
		bufSize int
	}{
		{name: "kernel", kernel: true, srcOff: 5, n: 2<<20 + 3, dstOff: 100},
		{name: "fallback", copier: Copier{kernel: refuse}, srcOff: 5, n: 2<<20 + 3, dstOff: 100, bufSize: 4096},
		{name: "fallback after a partial kernel copy", copier: Copier{kernel: refuseLater}, srcOff: 0, n: int64(len(data)), dstOff: 7, bufSize: 1000},
		{name: "crc", kernel: true, srcOff: 1, n: 3 << 20, dstOff: 0, bufSize: 65536},
		{name: "crc fallback after a partial kernel copy", copier: Copier{kernel: refuseLater}, srcOff: 3, n: 3 << 20, dstOff: 11, bufSize: 4096},
		{name: "crc fallback", copier: Copier{kernel: refuse}, srcOff: 3, n: 1<<20 + 1, dstOff: 11},
		{name: "empty", kernel: true, srcOff: 10, n: 0, dstOff: 10},
	} {
		for _, hashed := range []bool{true, false} {
			name := c.name
			if !hashed {
				name += " unhashed"
			}
			t.Run(name, func(t *testing.T) {
				calls = 0
				copyCase(t, dir, src, data, c.copier, c.kernel, c.srcOff, c.n, c.dstOff, c.bufSize, hashed, name)
			})
		}
	}
	// A range past the end of the source is an error naming the file, on both paths.
	for _, cp := range []*Copier{{}, {kernel: refuse}} {
		dst, err := os.Create(filepath.Join(dir, "short"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = cp.CopyRangeCRC(dst, 0, src, int64(len(data))-10, 20)
		err2 := (&Copier{kernel: cp.kernel}).CopyRange(dst, 0, src, int64(len(data))-10, 20)
		dst.Close()
		for _, err := range []error{err, err2} {
			if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), srcPath) {
				t.Errorf("short source: %v", err)
			}
		}
	}
}

// copyCase is one case of TestCopyRange: hashed through CopyRangeCRC,
// else through CopyRange.
func copyCase(t *testing.T, dir string, src *os.File, data []byte, cp Copier, kernel bool, srcOff, n, dstOff int64, bufSize int, hashed bool, name string) {
	dstPath := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
	dst, err := os.Create(dstPath)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	size := dstOff + n + 9
	if err := dst.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if bufSize > 0 {
		cp.Buf = make([]byte, bufSize)
	}
	want := data[srcOff : srcOff+n]
	if hashed {
		crc, err := cp.CopyRangeCRC(dst, dstOff, src, srcOff, n)
		if err != nil {
			t.Fatal(err)
		}
		if crc != crc32.ChecksumIEEE(want) {
			t.Errorf("crc %08x, want %08x", crc, crc32.ChecksumIEEE(want))
		}
	} else if err := cp.CopyRange(dst, dstOff, src, srcOff, n); err != nil {
		t.Fatal(err)
	}
	if cp.noKernel == kernel {
		t.Errorf("noKernel = %v after the copy", cp.noKernel)
	}
	got, err := os.ReadFile(dstPath)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != size {
		t.Fatalf("destination has %d bytes, want %d", len(got), size)
	}
	if !bytes.Equal(got[dstOff:dstOff+n], want) {
		t.Error("copied bytes differ from the source")
	}
	if !bytes.Equal(got[:dstOff], make([]byte, dstOff)) || !bytes.Equal(got[dstOff+n:], make([]byte, 9)) {
		t.Error("bytes outside the range were written")
	}
}

// TestPresize sizes a new file and one that already holds data: the size
// is exact and existing bytes are kept (nodes of a conversion presize the
// shared file each).
func TestPresize(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Presize(f, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("kept"), 1000); err != nil {
		t.Fatal(err)
	}
	if err := Presize(f, 1<<20); err != nil {
		t.Fatal(err)
	}
	StartWriteback(f, 0, 1<<20)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 1<<20 || string(b[1000:1004]) != "kept" || b[0] != 0 || b[1<<20-1] != 0 {
		t.Fatalf("size %d, bytes at 1000 %q", len(b), b[1000:1004])
	}
}

// TestWriteAt writes through the pipe (unaligned buffers and offsets,
// several pipe-fulls), below the splice threshold, with splice turned off
// (pwrite in chunks) and from many goroutines at once into disjoint ranges
// of one file, reusing the buffer right after each write returns: every
// byte lands where it belongs.
func TestWriteAt(t *testing.T) {
	for _, c := range []struct {
		name        string
		n, off      int
		noSplice    bool
		concurrency int
	}{
		{name: "splice", n: 3*pipeSize + 5, off: 3},
		{name: "splice unaligned", n: spliceMin + 1, off: 4095},
		{name: "small", n: spliceMin - 1, off: 1},
		{name: "pwrite", n: 2*WriteChunk + 5, off: 3, noSplice: true},
		{name: "concurrent", n: 8*pipeSize + 13, off: 0, concurrency: 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.noSplice {
				was := spliceOff.Swap(true)
				defer spliceOff.Store(was)
			}
			p := filepath.Join(t.TempDir(), "f")
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			data := make([]byte, c.n+1)[1:] // an address not page-aligned
			for i := range data {
				data[i] = byte(i*7 + 1)
			}
			parts := max(c.concurrency, 1)
			step := (c.n + parts - 1) / parts
			errs := make(chan error, parts)
			for k := 0; k < parts; k++ {
				go func() {
					a, b := min(k*step, c.n), min((k+1)*step, c.n)
					buf := append([]byte(nil), data[a:b]...)
					err := WriteAt(f, buf, int64(c.off+a))
					clear(buf) // the pipe must hold no reference to buf once WriteAt returned
					errs <- err
				}()
			}
			for k := 0; k < parts; k++ {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(data)+c.off || !bytes.Equal(got[c.off:], data) || !bytes.Equal(got[:c.off], make([]byte, c.off)) {
				t.Fatal("written bytes differ")
			}
		})
	}
}
