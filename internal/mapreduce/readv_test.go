package mapreduce

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestPreadRuns: more buffers than one preadv takes (IOV_MAX), of uneven
// sizes, are filled in order from the offset; a file too short is
// io.ErrUnexpectedEOF, not a silent short read.
func TestPreadRuns(t *testing.T) {
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>8)
	}
	path := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const off = 1000
	var bufs [][]byte
	var want []byte
	at := off
	for i := 0; i < 2500; i++ {
		b := make([]byte, 1+(i*37)%300)
		bufs = append(bufs, b)
		want = append(want, data[at:at+len(b)]...)
		at += len(b)
	}
	keep := append([][]byte(nil), bufs...)
	if err := preadRuns(f, off, bufs); err != nil {
		t.Fatal(err)
	}
	if got := bytes.Join(keep, nil); !bytes.Equal(got, want) {
		t.Fatal("buffers do not hold the file's bytes in order")
	}
	err = preadRuns(f, int64(len(data))-10, [][]byte{make([]byte, 8), make([]byte, 8)})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read past the end: %v, want io.ErrUnexpectedEOF", err)
	}
}
