package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// Comm exchanges blocks of bytes among the ranks of a group.
type Comm interface {
	Rank() int
	Size() int
	// AllGather contributes this rank's block and returns every rank's
	// block, indexed by rank. Blocks may differ in size.
	AllGather(ctx context.Context, block []byte) ([][]byte, error)
	Close() error
}

// maxBlock bounds a block announced by a peer, so a corrupt frame cannot
// make a rank allocate without limit.
const maxBlock = 1 << 40

// TCPComm is a ring over TCP: each rank sends to the next and receives from
// the previous; an all-gather takes Size-1 steps, each forwarding the block
// received in the step before.
type TCPComm struct {
	rank, size int
	next, prev net.Conn
	ln         net.Listener
	prevPID    uint64 // != 0: copy from the previous rank's memory (cma.go)
	nextCMA    bool   // the next rank copies from this rank's memory
}

// NewTCPComm joins the ring of len(addrs) ranks as rank, accepting on ln
// (the caller listens on addrs[rank]; port 0 in tests) and connecting to
// the next rank's address, retrying until ctx is done (the peers start in
// any order). Ranks on one host then move bulk data by copying between
// their memories (cma.go).
func NewTCPComm(ctx context.Context, rank int, ln net.Listener, addrs []string) (*TCPComm, error) {
	return NewTCPCommOptions(ctx, rank, ln, addrs, RingOptions{})
}

// NewTCPCommOptions is NewTCPComm with options.
func NewTCPCommOptions(ctx context.Context, rank int, ln net.Listener, addrs []string, opt RingOptions) (*TCPComm, error) {
	c := &TCPComm{rank: rank, size: len(addrs), ln: ln}
	if c.size == 1 {
		return c, nil
	}
	type accepted struct {
		conn net.Conn
		err  error
	}
	acc := make(chan accepted, 1)
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			err = expectRank(conn, (rank+c.size-1)%c.size)
		}
		acc <- accepted{conn, err}
	}()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", addrs[(rank+1)%c.size])
		if err == nil {
			c.next = conn
			break
		}
		select {
		case <-ctx.Done():
			ln.Close()
			return nil, fmt.Errorf("rank %d: connecting to rank %d at %s: %w", rank, (rank+1)%c.size, addrs[(rank+1)%c.size], ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	var hello [4]byte
	binary.LittleEndian.PutUint32(hello[:], uint32(rank))
	if _, err := c.next.Write(hello[:]); err != nil {
		c.Close()
		return nil, err
	}
	select {
	case a := <-acc:
		if a.err != nil {
			c.Close()
			return nil, fmt.Errorf("rank %d: accepting the previous rank: %w", rank, a.err)
		}
		c.prev = a.conn
	case <-ctx.Done():
		c.Close()
		return nil, fmt.Errorf("rank %d: waiting for rank %d: %w", rank, (rank+c.size-1)%c.size, ctx.Err())
	}
	if err := c.negotiateCMA(ctx, opt); err != nil {
		c.Close()
		return nil, fmt.Errorf("rank %d: %w", rank, err)
	}
	return c, nil
}

func expectRank(conn net.Conn, want int) error {
	var hello [4]byte
	if _, err := io.ReadFull(conn, hello[:]); err != nil {
		return err
	}
	if got := int(binary.LittleEndian.Uint32(hello[:])); got != want {
		return fmt.Errorf("rank %d connected, expected rank %d", got, want)
	}
	return nil
}

func (c *TCPComm) Rank() int { return c.rank }
func (c *TCPComm) Size() int { return c.size }

// AllGather runs the ring: in step s a rank sends the block of rank
// (rank-s) mod N and receives that of rank (rank-s-1) mod N.
func (c *TCPComm) AllGather(ctx context.Context, block []byte) ([][]byte, error) {
	out := make([][]byte, c.size)
	out[c.rank] = block
	if c.size == 1 {
		return out, nil
	}
	stop := context.AfterFunc(ctx, func() {
		c.next.SetDeadline(time.Now())
		c.prev.SetDeadline(time.Now())
	})
	defer stop()
	for s := 0; s < c.size-1; s++ {
		send := (c.rank - s + c.size) % c.size
		recv := (c.rank - s - 1 + 2*c.size) % c.size
		errc := make(chan error, 1)
		go func() { errc <- writeFrame(c.next, send, out[send]) }()
		from, b, err := readFrame(c.prev)
		if serr := <-errc; err == nil {
			err = serr
		}
		if err == nil && from != recv {
			err = fmt.Errorf("received the block of rank %d, expected rank %d", from, recv)
		}
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("rank %d: all-gather step %d: %w", c.rank, s, err)
		}
		out[recv] = b
	}
	return out, nil
}

func writeFrame(w io.Writer, from int, b []byte) error {
	var h [12]byte
	binary.LittleEndian.PutUint32(h[:4], uint32(from))
	binary.LittleEndian.PutUint64(h[4:], uint64(len(b)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

func readFrame(r io.Reader) (int, []byte, error) {
	var h [12]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint64(h[4:])
	if n > maxBlock {
		return 0, nil, errors.New("peer announced an impossible block size")
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, err
	}
	return int(binary.LittleEndian.Uint32(h[:4])), b, nil
}

// Close closes the ring's connections and the listener.
func (c *TCPComm) Close() error {
	var errs []error
	for _, cl := range []io.Closer{c.next, c.prev, c.ln} {
		if cl != nil {
			errs = append(errs, cl.Close())
		}
	}
	return errors.Join(errs...)
}

// ioChunk is how much one write or read may take before its deadline is
// renewed: a peer that makes no progress for the timeout fails the step.
const ioChunk = 4 << 20

// closeConns breaks the ring (a failed or cancelled step): the peers'
// reads and writes end at once, and so does any of ours.
func (c *TCPComm) closeConns() {
	for _, cl := range []net.Conn{c.next, c.prev} {
		if cl != nil {
			cl.Close()
		}
	}
}

func writeAll(conn net.Conn, b []byte, timeout time.Duration) error {
	for len(b) > 0 {
		n := min(len(b), ioChunk)
		if err := conn.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		if _, err := conn.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func readAll(conn net.Conn, b []byte, timeout time.Duration) error {
	for len(b) > 0 {
		n := min(len(b), ioChunk)
		if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		if _, err := io.ReadFull(conn, b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// stepErr names a ring failure the way a user can act on it.
func (c *TCPComm) stepErr(ctx context.Context, what string, err error, timeout time.Duration) error {
	if cause := context.Cause(ctx); cause != nil {
		return fmt.Errorf("rank %d: %s: %w", c.rank, what, cause)
	}
	var ne net.Error
	prev, next := (c.rank+c.size-1)%c.size, (c.rank+1)%c.size
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("rank %d: %s: no progress from rank %d or rank %d for %v (a rank died, hangs or made a different call): %w", c.rank, what, prev, next, timeout, err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		return fmt.Errorf("rank %d: %s: the link to rank %d or rank %d dropped (a rank died or failed): %w", c.rank, what, prev, next, err)
	}
	return fmt.Errorf("rank %d: %s: %w", c.rank, what, err)
}

// ring runs the size-1 steps of a ring exchange: in step s this rank
// sends, in a goroutine, rank (rank-s)'s data to the next rank and
// receives rank (rank-s-1)'s from the previous one; done follows each
// step that both ends finished. A failure of either end closes the ring
// (which unblocks the other); what names the failed step in the error.
func (c *TCPComm) ring(ctx context.Context, timeout time.Duration, what func(s int) string,
	send, recv func(rank int) error, done func(send, recv int)) error {
	stop := context.AfterFunc(ctx, c.closeConns)
	defer stop()
	for s := 0; s < c.size-1; s++ {
		to := (c.rank - s + c.size) % c.size
		from := (c.rank - s - 1 + 2*c.size) % c.size
		errc := make(chan error, 1)
		go func() { errc <- send(to) }()
		err := recv(from)
		if err != nil {
			c.closeConns() // unblocks our own send too
		}
		if serr := <-errc; err == nil {
			err = serr
		}
		if err != nil {
			c.closeConns()
			return c.stepErr(ctx, what(s), err, timeout)
		}
		done(to, from)
	}
	return nil
}

// allGather is AllGather for small control blocks: each frame is bounded
// by limit and every wait by timeout.
func (c *TCPComm) allGather(ctx context.Context, block []byte, limit int, timeout time.Duration) ([][]byte, error) {
	out := make([][]byte, c.size)
	out[c.rank] = block
	if c.size == 1 {
		return out, nil
	}
	var b []byte // the block received in this step
	err := c.ring(ctx, timeout, func(s int) string { return fmt.Sprintf("exchanging requests (step %d)", s) },
		func(send int) error {
			var h [12]byte
			binary.LittleEndian.PutUint32(h[:4], uint32(send))
			binary.LittleEndian.PutUint64(h[4:], uint64(len(out[send])))
			err := writeAll(c.next, h[:], timeout)
			if err == nil {
				err = writeAll(c.next, out[send], timeout)
			}
			return err
		},
		func(recv int) error {
			b = nil
			var h [12]byte
			if err := readAll(c.prev, h[:], timeout); err != nil {
				return err
			}
			from, n := int(binary.LittleEndian.Uint32(h[:4])), binary.LittleEndian.Uint64(h[4:])
			switch {
			case from != recv:
				return fmt.Errorf("received the block of rank %d, expected rank %d", from, recv)
			case n > uint64(limit):
				return fmt.Errorf("rank %d announced a block of %d bytes (at most %d)", from, n, limit)
			}
			b = make([]byte, n)
			return readAll(c.prev, b, timeout)
		},
		func(_, recv int) { out[recv] = b })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ringStep forwards one layer around the ring: blocks[k] are the
// destination slices of rank k's items, in the same order on every rank.
// In step s a rank sends rank (rank-s)'s slices, which it holds, to the
// next rank, and receives rank (rank-s-1)'s straight into its slices;
// blocks every rank knows to be empty are skipped on both ends. Any
// failure closes the ring.
func (c *TCPComm) ringStep(ctx context.Context, layer int, blocks [][][]byte, timeout time.Duration) (sent, recvd int64, err error) {
	if c.size == 1 {
		return 0, 0, nil
	}
	size := func(k int) (n int64) {
		for _, b := range blocks[k] {
			n += int64(len(b))
		}
		return n
	}
	err = c.ring(ctx, timeout, func(s int) string { return fmt.Sprintf("exchanging layer %d (step %d)", layer, s) },
		func(send int) error {
			ns := size(send)
			if ns == 0 {
				return nil
			}
			var h [16]byte
			binary.LittleEndian.PutUint32(h[:4], uint32(layer))
			binary.LittleEndian.PutUint32(h[4:8], uint32(send))
			binary.LittleEndian.PutUint64(h[8:], uint64(ns))
			err := writeAll(c.next, h[:], timeout)
			if err == nil && c.nextCMA {
				err = c.sendCMA(blocks[send], timeout)
			}
			for _, b := range blocks[send] {
				if err != nil || c.nextCMA {
					break
				}
				err = writeAll(c.next, b, timeout)
			}
			return err
		},
		func(recv int) error {
			nr := size(recv)
			if nr == 0 {
				return nil
			}
			var h [16]byte
			err := readAll(c.prev, h[:], timeout)
			if err == nil {
				l, from, n := int(binary.LittleEndian.Uint32(h[:4])), int(binary.LittleEndian.Uint32(h[4:8])), int64(binary.LittleEndian.Uint64(h[8:]))
				if l != layer || from != recv || n != nr {
					err = fmt.Errorf("received %d bytes of layer %d from rank %d, expected %d bytes of layer %d from rank %d (the ranks' plans differ)", n, l, from, nr, layer, recv)
				}
			}
			if err == nil && c.prevPID != 0 {
				err = c.recvCMA(ctx, blocks[recv], timeout)
			}
			for _, b := range blocks[recv] {
				if err != nil || c.prevPID != 0 {
					break
				}
				err = readAll(c.prev, b, timeout)
			}
			return err
		},
		func(send, recv int) {
			sent += size(send)
			recvd += size(recv)
		})
	return sent, recvd, err
}
