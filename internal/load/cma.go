package load

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"time"
	"unsafe"
)

// Ranks on the same host skip the socket for the bulk of a ring step:
// the sender announces where its slices are in its memory and the
// receiver copies them straight into its destinations with
// process_vm_readv, one copy by the kernel instead of TCP's two (into the
// socket buffer and out of it) plus the stack. The link's TCP connection
// still carries the headers, the announcements and the receiver's
// progress, so a dead or silent peer fails the step as before.
//
// A link uses it only when the receiver proves it can read the sender's
// memory: when the ring forms, every rank offers its pid and the address
// of 16 random bytes to the next rank, which reads them back with
// process_vm_readv and answers whether they matched. Another host,
// another pid namespace, a kernel or policy that refuses it (Yama
// ptrace_scope 1 between sibling processes, a seccomp filter, no
// CAP_SYS_PTRACE in some containers) or RingOptions.TCPOnly keep the
// link on plain TCP.

// RingOptions tune NewTCPCommOptions.
type RingOptions struct {
	// TCPOnly moves every byte through the TCP connections, even between
	// processes of one host.
	TCPOnly bool
}

// cmaChunk is what a receiver copies between two progress bytes to the
// sender (each renews the sender's deadline).
const cmaChunk = 16 << 20

// Progress bytes a receiver sends back on a same-host link.
const (
	cmaMore = 0 // a chunk was copied
	cmaDone = 1 // every slice of the step was copied
)

// negotiateCMA runs the offer on both of this rank's links; the peers run
// it at the same time. Waits are bounded by ctx.
func (c *TCPComm) negotiateCMA(ctx context.Context, opt RingOptions) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultTimeout)
	}
	for _, conn := range []net.Conn{c.next, c.prev} {
		if err := conn.SetDeadline(deadline); err != nil {
			return err
		}
		defer conn.SetDeadline(time.Time{})
	}
	var cookie [16]byte
	if _, err := rand.Read(cookie[:]); err != nil {
		return err
	}
	var offer [32]byte
	if pid := selfPID(); pid != 0 && !opt.TCPOnly {
		binary.LittleEndian.PutUint64(offer[:8], pid)
		binary.LittleEndian.PutUint64(offer[8:16], uint64(uintptr(unsafe.Pointer(&cookie[0]))))
		copy(offer[16:], cookie[:])
	}
	if _, err := c.next.Write(offer[:]); err != nil {
		return fmt.Errorf("offering a same-host link to rank %d: %w", (c.rank+1)%c.size, err)
	}
	var theirs [32]byte
	if _, err := io.ReadFull(c.prev, theirs[:]); err != nil {
		return fmt.Errorf("reading rank %d's offer: %w", (c.rank+c.size-1)%c.size, err)
	}
	if pid := binary.LittleEndian.Uint64(theirs[:8]); pid != 0 && !opt.TCPOnly {
		var got [16]byte
		if peerRead(pid, binary.LittleEndian.Uint64(theirs[8:16]), got[:]) == nil && got == [16]byte(theirs[16:]) {
			c.prevPID = pid
		}
	}
	answer := []byte{0}
	if c.prevPID != 0 {
		answer[0] = 1
	}
	if _, err := c.prev.Write(answer); err != nil {
		return fmt.Errorf("answering rank %d's offer: %w", (c.rank+c.size-1)%c.size, err)
	}
	if _, err := io.ReadFull(c.next, answer); err != nil {
		return fmt.Errorf("reading rank %d's answer: %w", (c.rank+1)%c.size, err)
	}
	c.nextCMA = answer[0] == 1
	runtime.KeepAlive(&cookie) // read by the next rank until it answered
	return nil
}

// SameHost reports whether this rank receives from the previous rank and
// sends to the next one by copying between the processes' memory.
func (c *TCPComm) SameHost() (fromPrev, toNext bool) { return c.prevPID != 0, c.nextCMA }

// sendCMA announces the slices of a step to the next rank (their address
// and length, after the step's header) and waits until it copied them.
func (c *TCPComm) sendCMA(slices [][]byte, timeout time.Duration) error {
	desc := make([]byte, 16*len(slices))
	for i, b := range slices {
		var a uint64
		if len(b) > 0 {
			a = uint64(uintptr(unsafe.Pointer(&b[0])))
		}
		binary.LittleEndian.PutUint64(desc[16*i:], a)
		binary.LittleEndian.PutUint64(desc[16*i+8:], uint64(len(b)))
	}
	if err := writeAll(c.next, desc, timeout); err != nil {
		return err
	}
	var p [1]byte
	for {
		if err := readAll(c.next, p[:], timeout); err != nil {
			return err
		}
		if p[0] == cmaDone {
			break
		}
		if p[0] != cmaMore {
			return fmt.Errorf("rank %d sent progress byte %d", (c.rank+1)%c.size, p[0])
		}
	}
	runtime.KeepAlive(slices) // read by the next rank until it is done
	return nil
}

// recvCMA copies the slices the previous rank announced into dst, which
// must match them one for one in length, telling it after every chunk.
func (c *TCPComm) recvCMA(ctx context.Context, dst [][]byte, timeout time.Duration) error {
	desc := make([]byte, 16*len(dst))
	if err := readAll(c.prev, desc, timeout); err != nil {
		return err
	}
	prev := (c.rank + c.size - 1) % c.size
	since := 0 // bytes copied since the last progress byte
	for i, b := range dst {
		addr, n := binary.LittleEndian.Uint64(desc[16*i:]), binary.LittleEndian.Uint64(desc[16*i+8:])
		if n != uint64(len(b)) {
			return fmt.Errorf("rank %d announced %d bytes for a destination of %d (the ranks' plans differ)", prev, n, len(b))
		}
		for off := 0; off < len(b); off += cmaChunk {
			if err := context.Cause(ctx); err != nil {
				return err
			}
			end := min(len(b), off+cmaChunk)
			if err := peerRead(c.prevPID, addr+uint64(off), b[off:end]); err != nil {
				return fmt.Errorf("copying from rank %d's memory: %w", prev, err)
			}
			if since += end - off; since >= cmaChunk {
				if err := writeAll(c.prev, []byte{cmaMore}, timeout); err != nil {
					return err
				}
				since = 0
			}
		}
	}
	return writeAll(c.prev, []byte{cmaDone}, timeout)
}
