package store

import (
	"os"
	"strconv"
	"syscall"
)

// Commits returns how many bbolt transactions p committed and how many gens
// (batches with effects) it built.
func Commits(p *Partition) (commits, gens uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.commits, p.batches
}

// HalfRecords calls fn with each record of the half transaction value v.
func HalfRecords(v []byte, fn func(rec []byte)) {
	h, err := decodeHalf(v)
	if err != nil {
		panic(err)
	}
	for _, r := range h.Records {
		fn(r)
	}
}

// BreakFile makes every write to p's bbolt file fail with ENOSPC (its fd
// now refers to /dev/full; reads go through the memory map and still work)
// and returns the function that puts the file back.
func BreakFile(p *Partition) (restore func()) {
	fd := -1
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == p.path {
			fd, _ = strconv.Atoi(e.Name())
		}
	}
	if fd < 0 {
		panic("no descriptor of " + p.path)
	}
	saved, err := syscall.Dup(fd)
	if err != nil {
		panic(err)
	}
	full, err := syscall.Open("/dev/full", syscall.O_WRONLY, 0)
	if err != nil {
		panic(err)
	}
	if err := syscall.Dup2(full, fd); err != nil {
		panic(err)
	}
	syscall.Close(full)
	return func() {
		syscall.Dup2(saved, fd)
		syscall.Close(saved)
	}
}
