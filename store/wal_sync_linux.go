//go:build linux

package store

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data, and the size, which an append changes,
// without its other metadata.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
