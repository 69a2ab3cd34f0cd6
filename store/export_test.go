package store

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
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
	fd, saved := breakPath(p.path)
	return func() {
		syscall.Dup2(saved, fd)
		syscall.Close(saved)
	}
}

// breakPath points the descriptor open on path at /dev/full, and returns
// it and a duplicate of what it was.
func breakPath(path string) (fd, saved int) {
	fd = -1
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == path {
			fd, _ = strconv.Atoi(e.Name())
		}
	}
	if fd < 0 {
		panic("no descriptor of " + path)
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
	return fd, saved
}

// FillDiskDuringRestore makes the writes of a restore fail with ENOSPC
// from its k-th transaction on (k from 1): the file's descriptor then
// refers to /dev/full, until the restore closes it. It returns the
// function that stops doing so.
func FillDiskDuringRestore(k int) (stop func()) {
	var saved []int
	n := 0
	snapTxCommitted = func(path string) {
		if n++; n == k {
			_, s := breakPath(path)
			saved = append(saved, s)
		}
	}
	return func() {
		snapTxCommitted = nil
		for _, s := range saved {
			syscall.Close(s) // the restore closed the descriptor it replaced
		}
	}
}

// AckBeforeSync makes w acknowledge each write before syncing it: a broken
// build, the negative control of the crash tests. Call it before the first
// Append.
func AckBeforeSync(w *WAL) { w.ackEarly = true }

// Dump waits until every gen of p is in its file and returns the file's
// whole state as text: every pair of every bucket in key order, and the
// state without Applied (which counts batches, not commands) and without
// the file's id; group records decoded (with their length: the layout).
// Two partitions given the same commands dump the same text however the
// commands were batched.
func Dump(p *Partition) (string, error) {
	if err := p.drain(); err != nil {
		return "", err
	}
	var b strings.Builder
	err := p.view(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			fmt.Fprintf(&b, "[%s]\n", name)
			err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				switch {
				case bytes.Equal(name, bucketMeta) && bytes.Equal(k, metaID):
					return nil
				case bytes.Equal(name, bucketMeta) && bytes.Equal(k, metaState):
					var st state
					if err := decodeState(v, &st); err != nil {
						return err
					}
					st.Applied = 0
					fmt.Fprintf(&b, "state %+v\n", st)
					return nil
				case bytes.Equal(name, bucketGroups):
					if g, _, err := decodeGroup(string(k), v); err == nil {
						fmt.Fprintf(&b, "%q %+v (%d bytes)\n", k, g, len(v))
						return nil
					}
				}
				fmt.Fprintf(&b, "%q %q\n", k, v)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return b.String(), err
}

// SnapshotFile writes to path the partition file as of its last bbolt
// commit (the one in flight included once its meta page is written), which
// is what a power loss at this instant leaves of a file bbolt syncs on each
// commit.
func SnapshotFile(p *Partition, path string) error {
	return boltsafe.View(p.db, func(tx *bolt.Tx) error {
		return tx.CopyFile(path, 0o600)
	})
}

// StateWithGroupGen returns the partition state value v with the group
// generation counter set to gen.
func StateWithGroupGen(v []byte, gen uint64) ([]byte, error) {
	var st state
	if err := decodeState(v, &st); err != nil {
		return nil, err
	}
	st.GroupGen = gen
	return appendState(nil, &st), nil
}

// WALChunk is how far the WAL zero-fills a segment at a time.
const WALChunk = walChunk

// SetSnapTxBytes sets how many bytes a snapshot's restore writes per bbolt
// transaction, and returns the function that puts it back.
func SetSnapTxBytes(n int) (restore func()) {
	old := snapTxBytes
	snapTxBytes = n
	return func() { snapTxBytes = old }
}
