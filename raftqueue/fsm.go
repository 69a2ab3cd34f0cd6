package raftqueue

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/store"
)

// fsm is a replica's state machine: the group's partitions, each a
// store.Partition opened Replicated. Raft's log is the durable record of the
// commands, so a partition applies them without a sync of its own: its
// materializer writes them into its file in deep batches, with bbolt's
// fsync, and every bbolt transaction records how far into the raft log the
// file holds. That store.Position is the entry's index and the command's
// number in the whole entry, whichever partitions its commands are for.
// After a restart each file stands where its last transaction left it,
// since Open sets Config.NoSnapshotRestoreOnStart, and raft replays the log
// above its last snapshot: the fsm skips, per partition, what the file
// already holds. A snapshot waits until the files hold everything applied
// (Partition.Sync) before raft may compact the log behind it.
type fsm struct {
	paths []string // the partition files, by partition

	mu    sync.RWMutex // guards parts, which Restore swaps, and failed
	parts []*store.Partition
	// failed is sticky: a partition failed on a disk error, or a Restore
	// could not reopen one. Every entry then answers it, and no file holds
	// a command after the failure: the next Open replays them from the
	// raft log, which no snapshot compacts meanwhile, Persist failing too.
	failed error

	restores atomic.Int64 // Restores that replaced a file, for tests

	// Owned by raft's FSM goroutine, and by Open before raft starts.
	applied []store.Position // per partition: the last command applied, or its file's position at open
	cmds    []*store.Command // one batch's decoded commands, and their partitions
	cmdPart []int
	byPart  []partBatch
}

// partBatch is one partition's share of a batch: its commands, their
// positions, and where their results go in the batch's.
type partBatch struct {
	cmds []*store.Command
	at   []store.Position
	to   []int
}

// entryResult is the FSM's response to one entry: per command, its result
// and error, in the entry's order; err when the entry could not be applied
// at all.
type entryResult struct {
	res  []store.Result
	errs []error
	err  error
}

// errApplied answers the commands a restarted replica skips: they were
// applied before the restart, and no caller waits for them here.
var errApplied = errors.New("raftqueue: applied before the restart")

func openFSM(paths []string) (*fsm, error) {
	f := &fsm{paths: paths, byPart: make([]partBatch, len(paths))}
	for _, path := range paths {
		p, err := openPartition(path)
		if err != nil {
			f.close()
			return nil, err
		}
		f.parts = append(f.parts, p)
		f.applied = append(f.applied, p.Position())
	}
	return f, nil
}

// openPartition opens a partition file of the group.
func openPartition(path string) (*store.Partition, error) {
	return store.Open(path, store.Options{Replicated: true, MaterializeAfter: time.Second})
}

// partition returns partition i, or the failure.
func (f *fsm) partition(i int) (*store.Partition, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.failed != nil {
		return nil, f.failed
	}
	return f.parts[i], nil
}

func (f *fsm) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed == nil {
		f.failed = err
	}
}

// Apply applies one entry.
func (f *fsm) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies the commands of every command entry of logs, in one
// call, and so one writer batch, of each partition they are for, skipping
// what its file already holds.
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	type span struct {
		i, first, n int // logs[i]'s n commands are at cmds[first:]
	}
	var spans []span
	cmds, cmdPart := f.cmds[:0], f.cmdPart[:0]
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		first := len(cmds)
		var err error
		if cmds, cmdPart, err = decodeEntry(l.Data, len(f.paths), cmds, cmdPart); err != nil {
			clear(cmds[first:])
			cmds, cmdPart = cmds[:first], cmdPart[:first]
			if errors.Is(err, errPartitions) {
				f.fail(err) // this replica's configuration is not the group's
			}
			out[i] = &entryResult{err: err}
			continue
		}
		for k := first; k < len(cmds); k++ {
			at := store.Position{Index: l.Index, Cmds: uint64(k - first + 1)}
			part := cmdPart[k]
			if cmds[k] == nil || !f.applied[part].Less(at) {
				continue // undecodable, answered below, or the file holds it
			}
			b := &f.byPart[part]
			b.cmds, b.at, b.to = append(b.cmds, cmds[k]), append(b.at, at), append(b.to, k)
		}
		spans = append(spans, span{i: i, first: first, n: len(cmds) - first})
	}
	res := make([]store.Result, len(cmds))
	errs := make([]error, len(cmds))
	for k := range errs {
		errs[k] = errApplied // unless applied below
		if cmds[k] == nil {
			errs[k] = errUndecodable
		}
	}
	var failed error
	for part := range f.byPart {
		b := &f.byPart[part]
		if len(b.cmds) > 0 && failed == nil {
			failed = f.applyPart(part, b, res, errs)
		}
		clear(b.cmds)
		b.cmds, b.at, b.to = b.cmds[:0], b.at[:0], b.to[:0]
	}
	for _, s := range spans {
		r := &entryResult{res: res[s.first : s.first+s.n : s.first+s.n], errs: errs[s.first : s.first+s.n : s.first+s.n]}
		if failed != nil {
			r.err = failed
		} else {
			// A command's own errors answer it alone; a failure of a
			// partition, ErrFailed or ErrCorrupt, fails the replica.
			for _, e := range r.errs {
				if errors.Is(e, store.ErrFailed) || errors.Is(e, store.ErrCorrupt) {
					f.fail(e)
					r.err = e
					break
				}
			}
		}
		out[s.i] = r
	}
	clear(cmds)
	f.cmds, f.cmdPart = cmds[:0], cmdPart[:0]
	return out
}

// applyPart applies b, partition part's share of a batch, putting each
// command's result and error at its place in res and errs. A failure of the
// partition fails the fsm and is returned.
func (f *fsm) applyPart(part int, b *partBatch, res []store.Result, errs []error) error {
	p, err := f.partition(part)
	if err != nil {
		return err
	}
	pres, perrs, err := p.ApplyLogged(context.Background(), b.cmds, b.at)
	if err != nil {
		f.fail(err)
		return err
	}
	f.applied[part] = b.at[len(b.at)-1]
	for j, k := range b.to {
		res[k], errs[k] = pres[j], perrs[j]
	}
	return nil
}

// Snapshot format: snapGroupMagic, the number of partitions as a uvarint,
// then each partition's store snapshot. store.WriteSnapshot writes the
// live keys, so a trimmed head costs nothing, with the partition's
// position and a checksum.
const snapGroupMagic = "ZQG\x01"

// Snapshot returns a snapshot whose Persist writes the partitions' states
// once their files hold everything applied by now and are synced: raft
// compacts its log only after Persist returns. Persist runs concurrently
// with Apply, so a state may hold commands after the snapshot's index: it
// records its own position, and the replica that restores it skips what it
// holds.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return &snapshot{f: f}, nil
}

type snapshot struct{ f *fsm }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	err := func() error {
		s.f.mu.RLock()
		defer s.f.mu.RUnlock()
		if s.f.failed != nil {
			return s.f.failed
		}
		head := binary.AppendUvarint([]byte(snapGroupMagic), uint64(len(s.f.parts)))
		if _, err := sink.Write(head); err != nil {
			return err
		}
		for _, p := range s.f.parts {
			if _, err := p.WriteSnapshot(sink); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftqueue: snapshot: %w", err)
	}
	return sink.Close()
}

func (s *snapshot) Release() {}

// Restore makes the partitions the snapshot's states: on a follower too
// far behind the leader's log, which was sent the leader's snapshot, or at
// Open on a replica whose files stand before its newest snapshot. A
// partition whose file holds the state's position already is kept: the
// log's commands between the two had no effect on it. Raft calls it on its
// FSM goroutine, never beside ApplyBatch.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	return f.restore(rc, nil)
}

// restore reads the snapshot in r, restoring beside their files the
// partitions it is ahead on, then runs before unless it is nil, and only
// then puts them in place: a damaged snapshot, or before failing, leaves
// the files as they were.
func (f *fsm) restore(r io.Reader, before func() error) error {
	tmps, err := f.readSnapshot(bufio.NewReaderSize(r, 1<<16))
	if err == nil && before != nil {
		err = before()
	}
	if err != nil {
		for _, tmp := range tmps {
			_ = os.Remove(tmp)
		}
		return fmt.Errorf("raftqueue: restore: %w", err)
	}
	if len(tmps) == 0 {
		return nil
	}
	return f.replace(tmps)
}

// readSnapshot restores, beside their files at path.restore, the partitions
// of the snapshot whose files do not hold its state yet, and returns them.
func (f *fsm) readSnapshot(r *bufio.Reader) (map[int]string, error) {
	var magic [len(snapGroupMagic)]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, err
	}
	if string(magic[:]) != snapGroupMagic {
		return nil, fmt.Errorf("%w: snapshot magic %q", store.ErrCorrupt, magic[:])
	}
	n, err := binary.ReadUvarint(r)
	if err != nil || n != uint64(len(f.paths)) {
		return nil, fmt.Errorf("%w: a snapshot of %d partitions (%v) for a group of %d", store.ErrCorrupt, n, err, len(f.paths))
	}
	f.mu.RLock()
	failed := f.failed != nil
	f.mu.RUnlock()
	tmps := map[int]string{}
	for i, path := range f.paths {
		s, err := store.NewSnapshotReader(r)
		if err != nil {
			return tmps, err
		}
		if !failed && !f.applied[i].Less(s.Position()) {
			if err := s.Skip(); err != nil {
				return tmps, err
			}
			continue
		}
		tmp := path + ".restore"
		if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return tmps, err
		}
		tmps[i] = tmp
		if err := s.RestoreTo(tmp); err != nil {
			return tmps, err
		}
	}
	if _, err := r.Peek(1); err != io.EOF {
		return tmps, fmt.Errorf("%w: bytes after the snapshot's last partition (%v)", store.ErrCorrupt, err)
	}
	return tmps, nil
}

// replace closes the partitions of tmps, moves each file at tmps[i] into
// its place and opens them. A failure leaves the fsm failed.
func (f *fsm) replace(tmps map[int]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := func() error {
		for i, tmp := range tmps {
			if f.parts[i] != nil {
				_ = f.parts[i].Close() // its content is replaced: a failure of the old one does not matter
				f.parts[i] = nil
			}
			if err := os.Rename(tmp, f.paths[i]); err != nil {
				return err
			}
		}
		if err := boltsafe.SyncDir(filepath.Dir(f.paths[0])); err != nil {
			return err
		}
		for i := range f.parts {
			if f.parts[i] != nil {
				continue
			}
			p, err := openPartition(f.paths[i])
			if err != nil {
				return err
			}
			f.parts[i], f.applied[i] = p, p.Position()
		}
		f.failed = nil
		f.restores.Add(1)
		return nil
	}()
	if err != nil {
		err = fmt.Errorf("raftqueue: restore: %w", err)
		f.failed = err
	}
	return err
}

// close closes the partitions.
func (f *fsm) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	for i, p := range f.parts {
		if p == nil {
			continue
		}
		if cerr := p.Close(); err == nil {
			err = cerr
		}
		f.parts[i] = nil
	}
	if f.failed == nil {
		f.failed = store.ErrClosed
	}
	return err
}
