package pairlog

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/hashicorp/raft"
)

var (
	// ErrStaleEpoch is returned for an append of an epoch other than the
	// one the replica serves, and by SetEpoch for a lower epoch. The error
	// is an *EpochError naming the replica's epoch.
	ErrStaleEpoch = errors.New("pairlog: stale epoch")

	// ErrMismatch is returned by Append when the log does not hold the
	// entry the batch follows, leaving a gap, or holds another in its
	// place. The error is a *MismatchError telling where the leader
	// resumes.
	ErrMismatch = errors.New("pairlog: log mismatch")

	// ErrCommitted is returned by Append for a batch that would replace an
	// entry known to be committed: a leader whose log lacks what both
	// copies held, which fencing rules out. Nothing is changed.
	ErrCommitted = errors.New("pairlog: append would replace a committed entry")

	// ErrBadAppend is returned for an append whose fields do not hold
	// together: indexes not consecutive, epochs out of order.
	ErrBadAppend = errors.New("pairlog: malformed append")

	// ErrCompacted is returned by Entries for entries compacted away: a
	// follower that lacks them needs a snapshot.
	ErrCompacted = errors.New("pairlog: entries compacted away")

	// ErrEpochLed is returned by Lead for an epoch this replica has led
	// before: a leader's run needs an epoch of its own, as Lead explains;
	// ask the metadata for the next one.
	ErrEpochLed = errors.New("pairlog: epoch led before")
)

// EpochError is ErrStaleEpoch with the epoch the replica serves.
type EpochError struct{ Epoch uint64 }

func (e *EpochError) Error() string {
	return fmt.Sprintf("%v (the replica serves epoch %d)", ErrStaleEpoch, e.Epoch)
}

// Is makes errors.Is(err, ErrStaleEpoch) true.
func (e *EpochError) Is(target error) bool { return target == ErrStaleEpoch }

// MismatchError is ErrMismatch with the index of the last entry the
// replica holds that may match the leader's: the leader resends from the
// one after it.
type MismatchError struct{ Last uint64 }

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%v (resend from %d)", ErrMismatch, e.Last+1)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// Append is one batch of a pair's log, sent by the leader of Epoch: the
// entries following the one at PrevIndex, of epoch PrevEpoch, both 0
// before the first; and Commit, the leader's commit index, up to which
// both copies hold the log.
type Append struct {
	Epoch     uint64
	PrevIndex uint64
	PrevEpoch uint64
	Entries   []*raft.Log // Index consecutive from PrevIndex+1, Term the epoch each was written in
	Commit    uint64
	// Reset is set on a leader's batches until the first one is taken:
	// what the follower holds after PrevIndex, above its commit, is
	// replaced by Entries, whatever epochs it carries. A leader that
	// restarted in the same epoch may lack a tail its previous run sent
	// and never acked, at the same indexes and epoch; and a follower's
	// tail past the leader's log would otherwise stay until the leader
	// writes that far.
	Reset bool
}

// epochKey is the stable-store key of the epoch a replica serves, ledKey
// the one of the last epoch it led, syncedKey the one of the index up to
// which the state machine holds every entry's effects durably, as Compact
// and Restored record: a restart applies the log from after it.
var (
	epochKey  = []byte("DoubleWriteEpoch")
	ledKey    = []byte("DoubleWriteLed")
	syncedKey = []byte("DoubleWriteSynced")
)

// Log is one replica's copy of a pair's log and the epoch it serves. Safe
// for concurrent use.
type Log struct {
	mu     sync.Mutex
	log    raft.LogStore
	stable raft.StableStore
	epoch  uint64 // persisted in stable
	led    uint64 // persisted in stable: the last epoch this replica led
	synced uint64 // persisted in stable: the state machine holds the effects up to here
	commit uint64 // entries up to it are on both copies: never cut
	// base is, while the log holds no entry, the index it follows: what
	// was compacted or restored up to, committed and so matching any
	// leader.
	base uint64
}

// OpenLog opens a replica's log kept in log, its epoch in stable. Entries
// up to committed, the state machine's applied index, are known to be
// committed: Append never cuts them. So are those up to Synced, which the
// state machine holds as well, since it applies the log from after
// max(committed, Synced). A log that holds entries but ends before them
// lost some: an error.
func OpenLog(log raft.LogStore, stable raft.StableStore, committed uint64) (*Log, error) {
	var keys [3]uint64
	for i, k := range [][]byte{epochKey, ledKey, syncedKey} {
		v, err := stable.GetUint64(k)
		if err != nil && err.Error() != "not found" { // raft-boltdb's missing key, as raft itself tells it
			return nil, fmt.Errorf("pairlog: read %s: %w", k, err)
		}
		keys[i] = v
	}
	l := &Log{log: log, stable: stable, epoch: keys[0], led: keys[1], synced: keys[2]}
	committed = max(committed, l.synced)
	l.base = committed
	first, last, err := l.bounds()
	if err != nil {
		return nil, err
	}
	if committed > last && first <= last {
		// The state machine applied entries the log lost: a log is
		// emptied before a restore, by Truncate, and compacted only behind
		// Synced.
		return nil, fmt.Errorf("pairlog: %d entries committed, the log ends at %d", committed, last)
	}
	// What was compacted away was committed.
	l.commit = max(committed, first-1)
	return l, nil
}

// Synced returns the index up to which the state machine holds every
// entry's effects durably, as Compact or Restored last recorded.
func (l *Log) Synced() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.synced
}

// Bounds returns the index of the log's first and last entry: first is
// last+1 when it holds none.
func (l *Log) Bounds() (first, last uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bounds()
}

// Compact drops the entries up to upTo, which the state machine applied,
// so they are committed, and holds durably. That is recorded first as
// Synced, so that a restart applies from after upTo. A follower that needs
// them then needs a snapshot: Entries answers ErrCompacted.
func (l *Log) Compact(upTo uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	first, last, err := l.bounds()
	if err != nil || upTo < first {
		return err
	}
	if upTo > last {
		return fmt.Errorf("%w: compact to %d, the log ends at %d", ErrBadAppend, upTo, last)
	}
	l.commit = max(l.commit, upTo)
	if err := l.setSynced(upTo); err != nil {
		return err
	}
	if err := l.log.DeleteRange(first, min(upTo, last)); err != nil {
		return fmt.Errorf("pairlog: compact the log to %d: %w", upTo, err)
	}
	if upTo >= last {
		l.base = upTo
	}
	return nil
}

// Truncate drops every entry, before a snapshot replaces the state
// machine's and Restored is called: the log then follows applied, up to
// which the state machine holds the effects. Whatever a crash leaves
// between the two, the log never holds an entry the restored state
// contradicts.
func (l *Log) Truncate(applied uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	first, last, err := l.bounds()
	if err != nil {
		return err
	}
	if first <= last {
		if err := l.log.DeleteRange(first, last); err != nil {
			return fmt.Errorf("pairlog: empty the log: %w", err)
		}
	}
	l.base, l.commit = applied, applied
	return nil
}

// Restored records that the state machine holds, durably, every effect up
// to index, a snapshot having been restored after Truncate: the log
// follows index.
func (l *Log) Restored(index uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if first, last, err := l.bounds(); err != nil {
		return err
	} else if first <= last {
		return fmt.Errorf("%w: restored to %d with entries %d-%d in the log", ErrBadAppend, index, first, last)
	}
	if err := l.setSynced(index); err != nil {
		return err
	}
	l.base, l.commit = index, index
	return nil
}

func (l *Log) setSynced(index uint64) error {
	if index <= l.synced {
		return nil
	}
	if err := l.stable.SetUint64(syncedKey, index); err != nil {
		return fmt.Errorf("pairlog: persist the synced index %d: %w", index, err)
	}
	l.synced = index
	return nil
}

// Epoch returns the epoch the replica serves, 0 before its first.
func (l *Log) Epoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch
}

// Commit returns the index up to which the log is known committed.
func (l *Log) Commit() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.commit
}

// Lead makes the replica serve epoch e as its leader: persisted, as
// SetEpoch does, with the mark that it led e. Each leader's run needs an
// epoch no run wrote entries in before: a replica that led e, then
// restarted or stopped and started leading again, writes its new entries at
// indexes its earlier run may have sent the follower other entries at, with
// the same epoch, and log matching, which compares indexes and epochs,
// would take them for the same. So an epoch led before is refused with
// ErrEpochLed, and one below with ErrStaleEpoch.
func (l *Log) Lead(e uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkLead(e); err != nil {
		return err
	}
	if err := l.stable.SetUint64(ledKey, e); err != nil {
		return fmt.Errorf("pairlog: persist the epoch led %d: %w", e, err)
	}
	l.led = e
	return l.setEpoch(e)
}

// CheckLead returns what Lead would refuse e with, changing nothing.
func (l *Log) CheckLead(e uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkLead(e)
}

func (l *Log) checkLead(e uint64) error {
	if err := l.checkEpoch(e); err != nil {
		return err
	}
	if e <= l.led {
		return fmt.Errorf("%w: %d (the last led: %d)", ErrEpochLed, e, l.led)
	}
	return nil
}

// CheckEpoch returns what SetEpoch would refuse e with, changing nothing.
func (l *Log) CheckEpoch(e uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkEpoch(e)
}

func (l *Log) checkEpoch(e uint64) error {
	if e < l.epoch || e == 0 {
		return &EpochError{l.epoch}
	}
	return nil
}

// SetEpoch makes the replica serve epoch e from now on, persisted before it
// returns: appends of any other epoch are refused from then on. A lower
// epoch than the current one is ErrStaleEpoch; the same one is a no-op.
func (l *Log) SetEpoch(e uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.setEpoch(e)
}

func (l *Log) setEpoch(e uint64) error {
	switch {
	case e < l.epoch:
		return &EpochError{l.epoch}
	case e == l.epoch:
		return nil
	}
	if err := l.stable.SetUint64(epochKey, e); err != nil {
		return fmt.Errorf("pairlog: persist epoch %d: %w", e, err)
	}
	l.epoch = e
	return nil
}

// Append adds a's entries to the log, durably before it returns, and
// returns the index up to which the log now matches the leader's: the
// batch's last entry. A tail after it, of an older epoch, may not match and
// is left for the next batch to check. Entries it holds, as on a resend,
// are skipped; a tail that does not match a's entries, never acked since
// the leader acks only what both copies hold, is cut first. Changing
// nothing, it refuses an epoch other than the replica's with
// ErrStaleEpoch, a batch that does not follow what the log holds with
// ErrMismatch, and one that would cut a committed entry with ErrCommitted.
func (l *Log) Append(a Append) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a.Epoch != l.epoch || a.Epoch == 0 {
		return 0, &EpochError{l.epoch}
	}
	if err := checkAppend(a); err != nil {
		return 0, err
	}
	first, last, err := l.bounds()
	if err != nil {
		return 0, err
	}
	if a.PrevIndex > last {
		return 0, &MismatchError{last}
	}
	if a.PrevIndex >= first && a.PrevIndex <= last {
		// Below first the log was compacted, which it is only up to the
		// commit index: committed entries match.
		epoch, err := l.epochAt(a.PrevIndex)
		if err != nil {
			return 0, err
		}
		if epoch != a.PrevEpoch {
			if a.PrevIndex <= l.commit {
				return 0, fmt.Errorf("%w: entry %d of epoch %d, the leader's of %d", ErrCommitted, a.PrevIndex, epoch, a.PrevEpoch)
			}
			return 0, &MismatchError{a.PrevIndex - 1}
		}
	}
	if cut := max(a.PrevIndex, l.commit) + 1; a.Reset && cut <= last {
		if err := l.log.DeleteRange(max(cut, first), last); err != nil {
			return 0, fmt.Errorf("pairlog: cut the log from %d: %w", cut, err)
		}
		last = cut - 1
	}
	es := a.Entries
	for len(es) > 0 && es[0].Index <= last {
		if es[0].Index < first {
			es = es[1:] // compacted, so committed and the same
			continue
		}
		epoch, err := l.epochAt(es[0].Index)
		if err != nil {
			return 0, err
		}
		if epoch != es[0].Term {
			if es[0].Index <= l.commit {
				return 0, fmt.Errorf("%w: entry %d of epoch %d, the leader's of %d", ErrCommitted, es[0].Index, epoch, es[0].Term)
			}
			if err := l.log.DeleteRange(es[0].Index, last); err != nil {
				return 0, fmt.Errorf("pairlog: cut the log from %d: %w", es[0].Index, err)
			}
			break
		}
		es = es[1:]
	}
	if len(es) > 0 {
		if err := l.log.StoreLogs(es); err != nil {
			return 0, fmt.Errorf("pairlog: write the log: %w", err)
		}
	}
	end := a.PrevIndex
	if n := len(a.Entries); n > 0 {
		end = a.Entries[n-1].Index
	}
	l.commit = max(l.commit, min(a.Commit, end))
	return end, nil
}

// Write appends the leader's own entries, durably before it returns: they
// follow the log's last entry one by one, all of the epoch the replica
// serves. Otherwise nothing is written and it returns ErrBadAppend.
func (l *Log) Write(es []*raft.Log) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, last, err := l.bounds()
	if err != nil {
		return err
	}
	for i, e := range es {
		if e == nil || e.Index == 0 || e.Index != last+1+uint64(i) || e.Term != l.epoch || l.epoch == 0 {
			return fmt.Errorf("%w: the leader's entry %d of %d after %d, serving epoch %d", ErrBadAppend, i, len(es), last, l.epoch)
		}
	}
	if len(es) == 0 {
		return nil
	}
	if err := l.log.StoreLogs(es); err != nil {
		return fmt.Errorf("pairlog: write the log: %w", err)
	}
	return nil
}

// Last returns the index and epoch of the log's last entry, or 0, 0 when
// it is empty.
func (l *Log) Last() (index, epoch uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first, index, err := l.bounds()
	if err != nil || index == 0 {
		return index, 0, err
	}
	if first > index {
		return index, 0, nil // compacted or restored, so committed: its epoch no longer matters
	}
	epoch, err = l.epochAt(index)
	return index, epoch, err
}

// Entries returns the entries from index from through to: ErrCompacted
// when the log no longer holds from.
func (l *Log) Entries(from, to uint64) ([]*raft.Log, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if first, _, err := l.bounds(); err != nil {
		return nil, err
	} else if from < first && from <= to {
		return nil, fmt.Errorf("%w: entry %d, the log starts at %d", ErrCompacted, from, first)
	}
	var out []*raft.Log
	for i := from; i <= to; i++ {
		e := new(raft.Log)
		if err := l.log.GetLog(i, e); err != nil {
			return nil, fmt.Errorf("pairlog: read entry %d: %w", i, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// checkAppend checks that a's entries follow PrevIndex one by one, with
// epochs that never decrease from PrevEpoch and never pass a's.
func checkAppend(a Append) error {
	if a.PrevEpoch > a.Epoch || a.PrevIndex == 0 && a.PrevEpoch != 0 || a.PrevIndex == math.MaxUint64 {
		return fmt.Errorf("%w: previous entry %d of epoch %d in epoch %d", ErrBadAppend, a.PrevIndex, a.PrevEpoch, a.Epoch)
	}
	prev, epoch := a.PrevIndex, a.PrevEpoch
	for _, e := range a.Entries {
		if e == nil || e.Index == 0 || e.Index != prev+1 || e.Term < epoch || e.Term > a.Epoch {
			return fmt.Errorf("%w: entry after %d of epoch %d in epoch %d", ErrBadAppend, prev, epoch, a.Epoch)
		}
		prev, epoch = e.Index, e.Term
	}
	return nil
}

// bounds returns the log's first and last index; an empty log is
// (base+1, base): it follows what was compacted or restored.
func (l *Log) bounds() (first, last uint64, err error) {
	if first, err = l.log.FirstIndex(); err == nil {
		last, err = l.log.LastIndex()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("pairlog: read the log: %w", err)
	}
	if last == 0 {
		return l.base + 1, l.base, nil
	}
	return first, last, nil
}

// epochAt returns the epoch of the entry at index, which the log holds.
func (l *Log) epochAt(index uint64) (uint64, error) {
	var e raft.Log
	if err := l.log.GetLog(index, &e); err != nil {
		return 0, fmt.Errorf("pairlog: read entry %d: %w", index, err)
	}
	return e.Term, nil
}
