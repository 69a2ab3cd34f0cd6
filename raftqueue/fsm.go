package raftqueue

import (
	"context"
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

// fsm is a replica's state machine: a store.Partition opened Replicated.
// Raft's log is the durable record of the commands, so the partition applies
// them without a sync of its own: its materializer writes them into the file
// in deep batches (bbolt's fsync), and every bbolt transaction records how
// far into the raft log the file holds (store.Position). After a restart the
// file stands where its last transaction left it (Config.NoSnapshotRestoreOnStart),
// and raft replays the log above its last snapshot: the fsm skips what the
// file already holds. A snapshot waits until the file holds everything
// applied (Partition.Sync) before raft may compact the log behind it.
type fsm struct {
	path string // the partition file

	mu   sync.RWMutex // guards part (Restore swaps it) and failed
	part *store.Partition
	// failed is sticky: the partition failed (a disk error), or a Restore
	// could not reopen it. Every entry then answers it, and the file holds
	// no command after the failure: the next Open replays them from the
	// raft log, which no snapshot compacts meanwhile (Sync fails too).
	failed error

	restores atomic.Int64 // Restores that replaced the file (tests)

	// Owned by raft's FSM goroutine.
	applied store.Position // the last command applied, or the file's position at open
	cmds    []*store.Command
	at      []store.Position
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

func openFSM(path string) (*fsm, error) {
	p, err := store.Open(path, store.Options{Replicated: true, MaterializeAfter: time.Second})
	if err != nil {
		return nil, err
	}
	return &fsm{path: path, part: p, applied: p.Position()}, nil
}

// partition returns the current partition, or the failure.
func (f *fsm) partition() (*store.Partition, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.failed != nil {
		return nil, f.failed
	}
	return f.part, nil
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
// call of the partition (one batch of its writer), skipping what the file
// already holds.
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	type span struct {
		i, first, skip, n int // logs[i]'s commands: n in all, the first skip skipped, the rest at cmds[first:]
	}
	var spans []span
	cmds, at := f.cmds[:0], f.at[:0]
	for i, l := range logs {
		if l.Type != raft.LogCommand || l.Index < f.applied.Index {
			continue // configuration entries; entries the file holds
		}
		first := len(cmds)
		decoded, err := decodeEntry(l.Data, cmds)
		if err != nil {
			clear(decoded[first:])
			cmds = decoded[:first]
			out[i] = &entryResult{err: err}
			continue
		}
		n := len(decoded) - first
		skip := 0
		if l.Index == f.applied.Index {
			skip = int(min(f.applied.Cmds, uint64(n)))
		}
		cmds = append(decoded[:first], decoded[first+skip:]...)
		for k := skip; k < n; k++ {
			at = append(at, store.Position{Index: l.Index, Cmds: uint64(k + 1)})
		}
		spans = append(spans, span{i: i, first: first, skip: skip, n: n})
	}
	var res []store.Result
	var errs []error
	var err error
	if len(cmds) > 0 {
		var p *store.Partition
		if p, err = f.partition(); err == nil {
			res, errs, err = p.ApplyLogged(context.Background(), cmds, at)
			if err != nil {
				f.fail(err)
			} else {
				f.applied = at[len(at)-1]
			}
		}
	}
	for _, s := range spans {
		r := &entryResult{res: make([]store.Result, s.n), errs: make([]error, s.n)}
		for k := range s.skip {
			r.errs[k] = errApplied
		}
		if err != nil {
			r.err = err
		} else {
			copy(r.res[s.skip:], res[s.first:])
			copy(r.errs[s.skip:], errs[s.first:])
			// A command's own errors answer it alone; a failure of the
			// partition (ErrFailed, ErrCorrupt) fails the replica.
			for _, e := range r.errs[s.skip:] {
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
	f.cmds, f.at = cmds[:0], at[:0]
	return out
}

// Snapshot returns a snapshot whose Persist writes the partition's state
// (store.WriteSnapshot: its live keys, so a trimmed head costs nothing) once
// the file holds everything applied by now and is synced: raft compacts its
// log only after Persist returns. Persist runs concurrently with Apply, so
// the state may hold commands after the snapshot's index: it records its own
// position, and the replica that restores it skips what it holds.
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
		_, err := s.f.part.WriteSnapshot(sink)
		return err
	}()
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftqueue: snapshot: %w", err)
	}
	return sink.Close()
}

func (s *snapshot) Release() {}

// Restore replaces the partition by the snapshot's state (a follower too far
// behind the leader's log, sent the leader's snapshot).
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	tmp := f.path + ".restore"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("raftqueue: restore: %w", err)
	}
	if err := store.RestoreSnapshot(tmp, rc); err != nil {
		return fmt.Errorf("raftqueue: restore: %w", err)
	}
	return f.replace(tmp)
}

// replace closes the partition, moves the file at tmp into its place and
// opens it. A failure leaves the fsm failed.
func (f *fsm) replace(tmp string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := func() error {
		if f.part != nil {
			_ = f.part.Close() // its content is replaced: a failure of the old one does not matter
			f.part = nil
		}
		if err := os.Rename(tmp, f.path); err != nil {
			return err
		}
		if err := boltsafe.SyncDir(filepath.Dir(f.path)); err != nil {
			return err
		}
		p, err := store.Open(f.path, store.Options{Replicated: true})
		if err != nil {
			return err
		}
		f.part, f.applied = p, p.Position()
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

// close closes the partition.
func (f *fsm) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.part == nil {
		return nil
	}
	err := f.part.Close()
	f.part = nil
	if f.failed == nil {
		f.failed = store.ErrClosed
	}
	return err
}
