package pairlog

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// memLog returns a Log over a new in-memory store serving epoch, holding
// entries of the epochs given from index 1 on (written directly, as an
// earlier leader's appends left them).
func memLog(t *testing.T, epoch uint64, epochs ...uint64) (*Log, *raft.InmemStore) {
	t.Helper()
	s := raft.NewInmemStore()
	if len(epochs) > 0 {
		if err := s.StoreLogs(ents(1, epochs...)); err != nil {
			t.Fatal(err)
		}
	}
	l, err := OpenLog(s, s, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch(epoch); err != nil {
		t.Fatal(err)
	}
	return l, s
}

// held returns "index@epoch" of every entry in s, checking each entry's
// data names its own index and epoch.
func held(t *testing.T, s raft.LogStore) []string {
	t.Helper()
	var out []string
	for _, e := range entriesOf(t, s) {
		if want := fmt.Sprintf("%d@%d", e.Index, e.Term); string(e.Data) != want {
			t.Fatalf("entry %d holds %q, want %q", e.Index, e.Data, want)
		}
		out = append(out, string(e.Data))
	}
	return out
}

func names(es []*raft.Log) []string {
	var out []string
	for _, e := range es {
		out = append(out, string(e.Data))
	}
	return out
}

// TestLog_EpochFencing: a replica accepts appends of the epoch it serves
// only, that epoch persisted (kept across a reopen) and never lowered; one
// that never set an epoch accepts nothing.
func TestLog_EpochFencing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stable.db")
	open := func() (*Log, *raftboltdb.BoltStore) {
		b, err := raftboltdb.New(raftboltdb.Options{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		l, err := OpenLog(b, b, 0)
		if err != nil {
			t.Fatal(err)
		}
		return l, b
	}
	l, b := open()
	var ee *EpochError
	if _, err := l.Append(Append{Epoch: 0, Entries: ents(1, 0)}); !errors.As(err, &ee) || ee.Epoch != 0 {
		t.Fatalf("append before any epoch: %v", err)
	}
	if err := l.SetEpoch(1); err != nil {
		t.Fatal(err)
	}
	if end, err := l.Append(Append{Epoch: 1, Entries: ents(1, 1, 1)}); err != nil || end != 2 {
		t.Fatalf("append of epoch 1: %d, %v", end, err)
	}
	// The follower is promoted: epoch 2 persisted before it serves.
	if err := l.SetEpoch(2); err != nil {
		t.Fatal(err)
	}
	// The old leader's next batch is refused, naming the epoch.
	if _, err := l.Append(Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 1)}); !errors.As(err, &ee) || ee.Epoch != 2 {
		t.Fatalf("append of the old epoch: %v", err)
	}
	if _, err := l.Append(Append{Epoch: 3, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 3)}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("append of an epoch not yet served: %v", err)
	}
	if err := l.SetEpoch(1); !errors.Is(err, ErrStaleEpoch) || l.Epoch() != 2 {
		t.Fatalf("SetEpoch lower: %v, epoch %d", err, l.Epoch())
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	l, b = open()
	defer b.Close()
	if l.Epoch() != 2 {
		t.Fatalf("reopened at epoch %d, want 2", l.Epoch())
	}
	if _, err := l.Append(Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 1)}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("reopened, append of the old epoch: %v", err)
	}
	if got := held(t, b); !slices.Equal(got, []string{"1@1", "2@1"}) {
		t.Fatalf("log %v", got)
	}
}

// TestLog_GapAndResend: a batch past the log's end is refused with where
// to resume; a batch resent (a lost reply) changes nothing; an overlapping
// one adds only what is new.
func TestLog_GapAndResend(t *testing.T) {
	l, s := memLog(t, 1, 1, 1, 1)
	var me *MismatchError
	if _, err := l.Append(Append{Epoch: 1, PrevIndex: 5, PrevEpoch: 1, Entries: ents(6, 1)}); !errors.As(err, &me) || me.Last != 3 {
		t.Fatalf("gap: %v", err)
	}
	if end, err := l.Append(Append{Epoch: 1, PrevIndex: 1, PrevEpoch: 1, Entries: ents(2, 1, 1), Commit: 3}); err != nil || end != 3 {
		t.Fatalf("resend: %d, %v", end, err)
	}
	if end, err := l.Append(Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 1, 1, 1), Commit: 4}); err != nil || end != 5 {
		t.Fatalf("overlap: %d, %v", end, err)
	}
	if got := held(t, s); !slices.Equal(got, []string{"1@1", "2@1", "3@1", "4@1", "5@1"}) {
		t.Fatalf("log %v", got)
	}
	if l.Commit() != 4 {
		t.Fatalf("commit %d, want 4", l.Commit())
	}
	// A heartbeat (no entries) moves the commit up to its previous entry
	// only, and never back.
	if _, err := l.Append(Append{Epoch: 1, PrevIndex: 5, PrevEpoch: 1, Commit: 9}); err != nil || l.Commit() != 5 {
		t.Fatalf("heartbeat: %v, commit %d", err, l.Commit())
	}
	if _, err := l.Append(Append{Epoch: 1, PrevIndex: 5, PrevEpoch: 1, Commit: 2}); err != nil || l.Commit() != 5 {
		t.Fatalf("older commit: %v, commit %d", err, l.Commit())
	}
}

// TestLog_RejoiningLeaderCutsItsTail: an old leader holding a tail of
// epoch 1 that its follower never got (so never acked) follows the new
// leader of epoch 2: the leader walks back to where the logs match and the
// old tail is replaced by the new leader's entries.
func TestLog_RejoiningLeaderCutsItsTail(t *testing.T) {
	l, s := memLog(t, 2, 1, 1, 1, 1, 1) // 1-5 of epoch 1; 4 and 5 never acked
	leader := append(ents(1, 1, 1, 1), ents(4, 2)...)
	var me *MismatchError
	next := uint64(5)
	for range 10 {
		prev := next - 1
		_, err := l.Append(Append{Epoch: 2, PrevIndex: prev, PrevEpoch: leader[prev-1].Term, Entries: leader[prev:], Commit: 3})
		if err == nil {
			break
		}
		if !errors.As(err, &me) {
			t.Fatal(err)
		}
		next = me.Last + 1
	}
	if got := held(t, s); !slices.Equal(got, names(leader)) {
		t.Fatalf("log %v, want the leader's %v", got, names(leader))
	}
}

// TestLog_NeverCutsCommitted: a batch that would replace an entry known
// to be committed (opened as committed, or told by a commit index) is
// refused and the log is unchanged.
func TestLog_NeverCutsCommitted(t *testing.T) {
	s := raft.NewInmemStore()
	if err := s.StoreLogs(ents(1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	l, err := OpenLog(s, s, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch(2); err != nil {
		t.Fatal(err)
	}
	for _, a := range []Append{
		{Epoch: 2, PrevIndex: 1, PrevEpoch: 1, Entries: ents(2, 2, 2)},
		{Epoch: 2, PrevIndex: 2, PrevEpoch: 2, Entries: ents(3, 2)},
	} {
		if _, err := l.Append(a); !errors.Is(err, ErrCommitted) {
			t.Fatalf("append %+v: %v, want ErrCommitted", a, err)
		}
	}
	// A commit index told by the leader protects as much.
	if _, err := l.Append(Append{Epoch: 2, PrevIndex: 4, PrevEpoch: 1, Commit: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(Append{Epoch: 2, PrevIndex: 3, PrevEpoch: 1, Entries: ents(4, 2)}); !errors.Is(err, ErrCommitted) {
		t.Fatalf("cut below the told commit: %v", err)
	}
	if got := held(t, s); !slices.Equal(got, []string{"1@1", "2@1", "3@1", "4@1"}) {
		t.Fatalf("log %v", got)
	}
	if _, err := OpenLog(raft.NewInmemStore(), s, 9); err != nil {
		t.Fatalf("an empty log (compacted away) with entries committed: %v", err)
	}
	if _, err := OpenLog(s, s, 9); err == nil {
		t.Fatal("opened a log ending at 4 with 9 entries committed")
	}
}

// TestLog_Malformed: batches whose fields do not hold together are
// refused, the log unchanged.
func TestLog_Malformed(t *testing.T) {
	l, s := memLog(t, 2, 1, 1)
	for name, a := range map[string]Append{
		"NotConsecutive": {Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Entries: append(ents(3, 2), ents(5, 2)...)},
		"NotAfterPrev":   {Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Entries: ents(4, 2)},
		"EpochBack":      {Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 2, 1)},
		"EpochAhead":     {Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 3)},
		"BeforePrev":     {Epoch: 2, PrevIndex: 2, PrevEpoch: 2, Entries: ents(3, 1)},
		"PrevAhead":      {Epoch: 2, PrevIndex: 2, PrevEpoch: 3},
		"NoPrevEpoch":    {Epoch: 2, PrevIndex: 0, PrevEpoch: 1, Entries: ents(1, 1)},
		"Nil":            {Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Entries: []*raft.Log{nil}},
	} {
		if _, err := l.Append(a); !errors.Is(err, ErrBadAppend) {
			t.Errorf("%s: %v, want ErrBadAppend", name, err)
		}
	}
	if got := held(t, s); !slices.Equal(got, []string{"1@1", "2@1"}) {
		t.Fatalf("log %v", got)
	}
}

// TestLog_Compacted: entries before the log's first (compacted, so
// committed) are taken as matching.
func TestLog_Compacted(t *testing.T) {
	l, s := memLog(t, 1, 1, 1, 1, 1, 1)
	if err := s.DeleteRange(1, 3); err != nil {
		t.Fatal(err)
	}
	if end, err := l.Append(Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 1, 1, 1, 1)}); err != nil || end != 6 {
		t.Fatalf("append over the compacted prefix: %d, %v", end, err)
	}
	if got := held(t, s); !slices.Equal(got, []string{"4@1", "5@1", "6@1"}) {
		t.Fatalf("log %v", got)
	}
}

// TestLog_RandomLeaders: leaders of rising epochs each write a log that
// keeps the previous one's committed prefix and replaces some of its
// uncommitted tail; the follower gets random batches of it (resends,
// gaps, stale leaders, walking back on a mismatch), and after a full
// catch-up holds exactly the current leader's log, and never lost a
// committed entry on the way.
func TestLog_RandomLeaders(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 7))
		l, s := memLog(t, 1)
		var leader []*raft.Log
		commit := uint64(0)
		for epoch := uint64(1); epoch <= 8; epoch++ {
			if epoch > 1 {
				if err := l.SetEpoch(epoch); err != nil {
					t.Fatal(err)
				}
				// The new leader holds the committed prefix and some of
				// the rest; it writes new entries of its own epoch.
				keep := commit + uint64(rng.IntN(len(leader)-int(commit)+1))
				leader = leader[:keep]
			}
			leader = append(leader, ents(uint64(len(leader))+1, slices.Repeat([]uint64{epoch}, 1+rng.IntN(6))...)...)
			for range 20 {
				prev := uint64(rng.IntN(len(leader) + 1))
				prevEpoch := uint64(0)
				if prev > 0 {
					prevEpoch = leader[prev-1].Term
				}
				a := Append{Epoch: epoch, PrevIndex: prev, PrevEpoch: prevEpoch, Entries: leader[prev:min(len(leader), int(prev)+1+rng.IntN(4))]}
				if rng.IntN(5) == 0 {
					a.Epoch = epoch - 1 // a stale leader's batch
				}
				end, err := l.Append(a)
				switch {
				case err == nil:
					if a.Epoch != epoch {
						t.Fatalf("seed %d: a batch of epoch %d accepted at %d", seed, a.Epoch, epoch)
					}
					commit = max(commit, min(end, uint64(rng.IntN(len(leader)+1)))) // what the leader learns both hold
				case errors.Is(err, ErrMismatch), errors.Is(err, ErrStaleEpoch):
				default:
					t.Fatalf("seed %d: %v", seed, err)
				}
			}
		}
		// Catch up: walk back from the end until the batch fits.
		next := uint64(len(leader)) + 1
		for {
			prev := next - 1
			prevEpoch := uint64(0)
			if prev > 0 {
				prevEpoch = leader[prev-1].Term
			}
			_, err := l.Append(Append{Epoch: 8, PrevIndex: prev, PrevEpoch: prevEpoch, Entries: leader[prev:]})
			var me *MismatchError
			if err == nil {
				break
			}
			if !errors.As(err, &me) || me.Last+1 >= next {
				t.Fatalf("seed %d: catch-up from %d: %v", seed, next, err)
			}
			next = me.Last + 1
		}
		if got := held(t, s); !slices.Equal(got, names(leader)) {
			t.Fatalf("seed %d: log %v, want the leader's %v", seed, got, names(leader))
		}
	}
}

// TestLog_CompactAndRestore: a compacted log records what its state
// machine holds (Synced, kept across a reopen) and still takes appends
// that follow its compacted entries (committed: any epoch matches them);
// Entries below its start is ErrCompacted; a compaction past its end is
// refused. Truncate empties it for a snapshot, after which it follows the
// replica's applied index, and Restored the snapshot's: appends go on
// from there, and a reopen of the emptied log follows Synced.
func TestLog_CompactAndRestore(t *testing.T) {
	l, s := memLog(t, 2, 1, 1, 2, 2, 2)
	if err := l.Compact(9); !errors.Is(err, ErrBadAppend) {
		t.Fatalf("compact past the end: %v, want ErrBadAppend", err)
	}
	if err := l.Compact(3); err != nil {
		t.Fatal(err)
	}
	if first, last, _ := l.Bounds(); first != 4 || last != 5 || l.Synced() != 3 {
		t.Fatalf("after Compact(3): %d-%d, synced %d", first, last, l.Synced())
	}
	if _, err := l.Entries(2, 4); !errors.Is(err, ErrCompacted) {
		t.Fatalf("Entries below the start: %v, want ErrCompacted", err)
	}
	// A resend from the compacted entry 2, of whatever epoch, matches.
	if end, err := l.Append(Append{Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 2, 2, 2, 2), Commit: 6}); err != nil || end != 6 {
		t.Fatalf("append after the compacted entries: %d, %v", end, err)
	}
	re, err := OpenLog(s, s, 0)
	if err != nil || re.Synced() != 3 || re.Commit() != 3 {
		t.Fatalf("reopened: synced %d, commit %d, %v", re.Synced(), re.Commit(), err)
	}

	if err := l.Truncate(4); err != nil {
		t.Fatal(err)
	}
	if first, last, _ := l.Bounds(); first != 5 || last != 4 || len(entriesOf(t, s)) != 0 {
		t.Fatalf("after Truncate(4): %d-%d, %d entries", first, last, len(entriesOf(t, s)))
	}
	if err := l.Restored(10); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(Append{Epoch: 2, PrevIndex: 12, PrevEpoch: 2, Entries: ents(13, 2)}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("an append past the restored index: %v, want ErrMismatch", err)
	}
	if end, err := l.Append(Append{Epoch: 2, PrevIndex: 10, PrevEpoch: 1, Entries: ents(11, 2, 2), Commit: 12}); err != nil || end != 12 {
		t.Fatalf("append after the restored index: %d, %v", end, err)
	}
	if idx, e, err := l.Last(); idx != 12 || e != 2 || err != nil {
		t.Fatalf("Last: %d@%d, %v", idx, e, err)
	}
	if err := l.Truncate(12); err != nil {
		t.Fatal(err)
	}
	if err := l.Write(ents(13, 2)); err != nil {
		t.Fatalf("the leader's write after an emptied log: %v", err)
	}
	// A crash after Truncate, before the restore: the reopened log is empty
	// and follows what the state machine holds.
	s2 := raft.NewInmemStore()
	l2, _ := OpenLog(s2, s2, 0)
	_ = l2.SetEpoch(1)
	if err := l2.Write(ents(1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := l2.Truncate(2); err != nil {
		t.Fatal(err)
	}
	re2, err := OpenLog(s2, s2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if first, last, _ := re2.Bounds(); first != 3 || last != 2 {
		t.Fatalf("reopened after Truncate: %d-%d, want to follow 2", first, last)
	}
	if err := re2.Restored(7); err != nil {
		t.Fatal(err)
	}
	re3, err := OpenLog(s2, s2, 0)
	if err != nil || re3.Synced() != 7 || re3.Commit() != 7 {
		t.Fatalf("reopened after Restored(7): synced %d, commit %d, %v", re3.Synced(), re3.Commit(), err)
	}
	if first, last, _ := re3.Bounds(); first != 8 || last != 7 {
		t.Fatalf("reopened after Restored(7): %d-%d", first, last)
	}
}

// TestLog_MaxIndexDoesNotWrap: bad input is an error, never a changed log.
// On a log ending at math.MaxUint64, PrevIndex+1 wraps to 0, and index 0
// is never a valid entry: Append and Write refuse it. This broke when
// Append took the wrapped entry for compacted and answered success, and
// Write stored an entry of index 0.
func TestLog_MaxIndexDoesNotWrap(t *testing.T) {
	s := newGatedStore()
	if err := s.StoreLogs([]*raft.Log{{Index: math.MaxUint64 - 1, Term: 1}, {Index: math.MaxUint64, Term: 1}}); err != nil {
		t.Fatal(err)
	}
	l := openAt(t, s, 1, 0)
	zero := func() []*raft.Log { return []*raft.Log{{Index: 0, Term: 1, Data: []byte("wrapped")}} }
	if end, err := l.Append(Append{Epoch: 1, PrevIndex: math.MaxUint64, PrevEpoch: 1, Entries: zero()}); err == nil {
		t.Errorf("Append of an entry of index 0 after MaxUint64: accepted, end %d", end)
	}
	if err := l.Write(zero()); err == nil {
		t.Errorf("Write of an entry of index 0 after MaxUint64: accepted, the log now holds %q at index 0", entryAt(s, 0))
	}
}

// TestLog_MalformedLeavesLogUnchanged: malformed or out-of-range Appends
// (index 0, huge and wrapping indexes, nil entries, epoch 0) give an error
// and leave the log as it was, on a log with a compacted prefix too.
func TestLog_MalformedLeavesLogUnchanged(t *testing.T) {
	for _, compacted := range []bool{false, true} {
		s := newGatedStore()
		if err := s.StoreLogs(ents(1, 1, 1, 1, 2, 2)); err != nil {
			t.Fatal(err)
		}
		if compacted {
			s.DeleteRange(1, 2)
		}
		l := openAt(t, s, 2, 3)
		before := dump(t, s)
		huge := func(idx ...uint64) []*raft.Log {
			var out []*raft.Log
			for _, i := range idx {
				out = append(out, &raft.Log{Index: i, Term: 2})
			}
			return out
		}
		for name, a := range map[string]Append{
			"Index0":           {Epoch: 2, PrevIndex: 5, PrevEpoch: 2, Entries: huge(0)},
			"Index0First":      {Epoch: 2, Entries: huge(0)},
			"PrevMax":          {Epoch: 2, PrevIndex: math.MaxUint64, PrevEpoch: 2, Entries: huge(0, 1)},
			"PrevMaxHeartbeat": {Epoch: 2, PrevIndex: math.MaxUint64, PrevEpoch: 2, Commit: math.MaxUint64},
			"EntryMax":         {Epoch: 2, PrevIndex: math.MaxUint64 - 1, PrevEpoch: 2, Entries: huge(math.MaxUint64)},
			"Gap":              {Epoch: 2, PrevIndex: 5, PrevEpoch: 2, Entries: huge(7)},
			"Nil":              {Epoch: 2, PrevIndex: 5, PrevEpoch: 2, Entries: []*raft.Log{nil, nil}},
			"NilAfter":         {Epoch: 2, PrevIndex: 5, PrevEpoch: 2, Entries: append(huge(6), nil)},
			"Epoch0":           {Epoch: 0, Entries: ents(1, 0)},
			"PrevEpochAhead":   {Epoch: 2, PrevIndex: 5, PrevEpoch: 3},
			"CutCommitted":     {Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 2)},
			"PrevMismatchComm": {Epoch: 2, PrevIndex: 3, PrevEpoch: 2, Entries: ents(4, 2)},
		} {
			if end, err := l.Append(a); err == nil {
				t.Errorf("compacted %v, %s: accepted, end %d", compacted, name, end)
			}
			if got := dump(t, s); !slices.Equal(got, before) {
				t.Fatalf("compacted %v, %s: log %v, was %v", compacted, name, got, before)
			}
		}
		if l.Commit() != 3 {
			t.Errorf("compacted %v: commit %d, want 3", compacted, l.Commit())
		}
		if err := l.Write([]*raft.Log{{Index: 0, Term: 2}}); err == nil {
			t.Errorf("Write of index 0 accepted")
		}
		if _, err := l.Entries(math.MaxUint64-1, math.MaxUint64); err == nil {
			t.Errorf("Entries past the log: no error")
		}
	}
}
