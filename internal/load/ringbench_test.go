package load

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The CPU ring between two processes (issue 27 asks for at least 1 GB/s on
// one machine): BenchmarkRingTwoProcesses starts this test binary again as
// rank 1 (TestRingPeer) and forwards layers of ringBlock bytes each way per
// iteration with ringStep, the exchange LoadGroup runs; the bytes counted
// are those this rank receives. Run it with `make bench` or
//
//	go test -run '^$' -bench RingTwoProcesses ./internal/load
const ringBlock = 256 << 20

func ringRun(rank int, ln net.Listener, addrs []string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c, err := NewTCPComm(ctx, rank, ln, addrs)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	mine := make([]byte, ringBlock)
	theirs := make([]byte, ringBlock)
	blocks := make([][][]byte, 2)
	blocks[rank], blocks[1-rank] = [][]byte{mine}, [][]byte{theirs}
	for i := 0; i < n; i++ {
		if _, _, err := c.ringStep(context.Background(), i, blocks, 30*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// TestRingPeer is rank 1 of BenchmarkRingTwoProcesses; it does nothing
// unless that benchmark started it.
func TestRingPeer(t *testing.T) {
	spec := os.Getenv("UCP_RING_PEER") // "rank0addr iterations"
	if spec == "" {
		t.Skip("rank 1 of BenchmarkRingTwoProcesses only")
	}
	f := strings.Fields(spec)
	n, _ := strconv.Atoi(f[1])
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("PEER %s\n", ln.Addr())
	os.Stdout.Sync()
	if err := ringRun(1, ln, []string{f[0], ln.Addr().String()}, n); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkRingTwoProcesses(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestRingPeer$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("UCP_RING_PEER=%s %d", ln.Addr(), b.N))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	sc := bufio.NewScanner(stdout)
	var peer string
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "PEER ") {
			peer = strings.TrimPrefix(l, "PEER ")
			break
		}
	}
	if peer == "" {
		b.Fatal("the peer process gave no address")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	b.SetBytes(ringBlock)
	b.ResetTimer()
	if err := ringRun(0, ln, []string{ln.Addr().String(), peer}, b.N); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLoopbackFloor is the floor the ring is judged against in the
// same run: one plain TCP stream over loopback in one process, 4 MiB
// writes read into 4 MiB buffers, nothing else.
func BenchmarkLoopbackFloor(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		buf := make([]byte, 4<<20)
		for i := 0; i < b.N; i++ {
			for s := 0; s < ringBlock; s += len(buf) {
				if _, err := c.Write(buf); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	c, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.SetBytes(ringBlock)
	b.ResetTimer()
	buf := make([]byte, 4<<20)
	for i := 0; i < b.N; i++ {
		for s := 0; s < ringBlock; s += len(buf) {
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

func BenchmarkRingInProcess(b *testing.B) {
	lns := make([]net.Listener, 2)
	addrs := make([]string, 2)
	for i := range lns {
		lns[i], _ = net.Listen("tcp", "127.0.0.1:0")
		addrs[i] = lns[i].Addr().String()
	}
	b.SetBytes(ringBlock)
	errc := make(chan error, 2)
	for r := 0; r < 2; r++ {
		go func() { errc <- ringRun(r, lns[r], addrs, b.N) }()
	}
	for r := 0; r < 2; r++ {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
}
