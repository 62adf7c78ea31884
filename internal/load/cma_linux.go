package load

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

func selfPID() uint64 { return uint64(os.Getpid()) }

// peerRead copies len(dst) bytes at addr in process pid into dst with one
// process_vm_readv (a single copy by the kernel, no socket buffers).
func peerRead(pid, addr uint64, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	local := []unix.Iovec{{Base: &dst[0]}}
	local[0].SetLen(len(dst))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}
	n, err := unix.ProcessVMReadv(int(pid), local, remote, 0)
	if err != nil {
		return err
	}
	if n != len(dst) {
		return errors.New("short read of the peer's memory")
	}
	return nil
}
