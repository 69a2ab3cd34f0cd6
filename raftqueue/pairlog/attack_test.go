package pairlog

// Attack tests: each tries to break one of the package's promises. The
// tests named TestAttack_Break* failed with the first version of Log and
// Leader (an attack review); each comment tells what that version did (its
// line numbers are of that version) and the fix it asked for, which was
// made: a leader run's first Append resets the follower's tail (Append.
// Reset), the leader trusts only the end of the batch it sent, a follower
// behind the leader's compacted log fails the leader (ErrCompacted), Close
// starts no new write, index 0 and a wrapping index are refused. The other
// tests are attacks that held, kept because they are cheap.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// waitFor polls cond for up to 5 s, failing the test if it never holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// closeWithin closes l, failing the test if Close takes longer than d.
func closeWithin(t *testing.T, l *Leader, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("Close did not return in %v", d)
	}
}

// openAt opens a Log over s (committed as given) serving epoch.
func openAt(t *testing.T, s *gatedStore, epoch, committed uint64) *Log {
	t.Helper()
	l, err := OpenLog(s, s, committed)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch(epoch); err != nil {
		t.Fatal(err)
	}
	return l
}

// entryAt returns "index@epoch:data" of s's entry at i ("" if none).
func entryAt(s raft.LogStore, i uint64) string {
	var e raft.Log
	if err := s.GetLog(i, &e); err != nil {
		return ""
	}
	return fmt.Sprintf("%d@%d:%s", e.Index, e.Term, e.Data)
}

// inChild runs the test named name in a child process (for a scenario that
// may panic in a leader goroutine, which would kill the whole test binary)
// and fails if the child fails or panics. It returns true in the child,
// which then runs the scenario itself.
func inChild(t *testing.T, name string) bool {
	t.Helper()
	if os.Getenv("DWQUEUE_ATTACK_CHILD") == name {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "DWQUEUE_ATTACK_CHILD="+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if i := bytes.Index(out, []byte("panic:")); i >= 0 {
			out = out[i:min(len(out), i+1500)]
		}
		t.Fatalf("the scenario failed in a child process (%v):\n%s", err, out)
	}
	return false
}

// TestAttack_BreakSameEpochRestartDiverges (promises 1 and 3). The leader
// sends an entry to the follower before its own write is durable (the two
// writes run at the same time, by design). If its own write then fails (or
// the node crashes), the follower holds 1@1:x and the leader's log does not.
// A new Leader of the SAME epoch over the same log (as
// TestLeader_CatchesUpFollower does after a Close, and as a node restarting
// with an unchanged pair record would) proposes y at index 1, epoch 1. The
// follower's Log.Append compares only (index, epoch), finds 1@1 "already
// held" and skips it (log.go:176-195), returns end 1, and the leader answers
// y nil although the follower holds x there: an acked entry that is not on
// the follower, and two logs that never converge (every later check
// compares epochs only).
//
// Root cause: Log Matching by (index, epoch) assumes one entry per (index,
// epoch), but a Leader run reuses its Log's epoch (leader.go NewLeader takes
// cfg.Log.Epoch() and starts at its own log's last+1) while a previous run
// of that epoch may have left the follower entries past that point.
// Fix: a leader run must cut the follower's tail past the leader's log at
// start, e.g. an Append flag (Reset/LeaderLast) on the first Append of a run
// telling the follower to delete everything after PrevIndex once PrevIndex
// matches (never at or below its commit); or give every leader run a fresh
// epoch (SetEpoch on both before NewLeader).
func TestAttack_BreakSameEpochRestartDiverges(t *testing.T) {
	ls, fs := newGatedStore(), newGatedStore()
	p := newPair(t, 1, ls, fs, LeaderConfig{})
	release := ls.hold(t)
	fx := p.leader.Propose([]byte("x"))
	waitFor(t, "the follower to hold x", func() bool { return fs.writes.Load() == 1 })
	ls.fail.Store(true) // the leader's own write fails (or the node crashes)
	release()
	if err := answer(t, fx); err == nil {
		t.Fatal("x answered nil with the leader's write failing")
	}
	closeWithin(t, p.leader, 5*time.Second)
	ls.fail.Store(false)

	// The node leads again, the pair record (epoch 1) unchanged.
	p2 := newPair(t, 1, ls, fs, LeaderConfig{})
	fy := p2.leader.Propose([]byte("y"))
	err := answer(t, fy)
	lg, fg := dump(t, ls), dump(t, fs)
	if err == nil && entryAt(fs, fy.Index()) != entryAt(ls, fy.Index()) {
		t.Errorf("entry %d (y) answered nil, but the follower holds %q there (the leader %q); leader log %v, follower log %v",
			fy.Index(), entryAt(fs, fy.Index()), entryAt(ls, fy.Index()), lg, fg)
	}
}

// TestAttack_BreakStaleTailSurvivesCatchUp (promise 3: "after a full
// catch-up the follower's log equals the leader's"). A leader of epoch 2
// whose log is 1-3@1 and a follower (the old leader) holding 1-5@1, 4-5
// never acked. The leader's first Append (a heartbeat at PrevIndex 3)
// matches, matched = written = 3, the old entries are applied and the
// leader goes idle: it believes the follower caught up, but the follower
// still holds 4@1 and 5@1 and its Last() is 5@1 while the leader's is 3@1.
// Should the follower then be promoted (it looks in sync, even ahead), it
// applies 4 and 5 (leader.go apply: entries after Applied of earlier
// epochs), which this leader never had.
//
// Root cause: Log.Append (log.go:196-206) leaves the tail after a batch's
// end in place ("left for the next batch to check"), and the leader
// (leader.go send, idle condition) never sends a next batch while it has
// nothing new. Fix: let the Append carry the leader's last index (or a
// Reset flag on the run's first Append) and have the follower cut a tail
// after it, never at or below its commit.
func TestAttack_BreakStaleTailSurvivesCatchUp(t *testing.T) {
	ls, fs := newGatedStore(), newGatedStore()
	if err := ls.StoreLogs(ents(1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := fs.StoreLogs(ents(1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	p := newPair(t, 2, ls, fs, LeaderConfig{RetryAfter: time.Millisecond})
	waitFor(t, "the old entries to be applied", func() bool { return len(p.sm.list()) == 3 })
	waitFor(t, "the follower to learn the commit", func() bool { return p.flog.Commit() == 3 })
	time.Sleep(50 * time.Millisecond) // the leader is idle: nothing more is sent
	if lg, fg := dump(t, ls), dump(t, fs); !slices.Equal(lg, fg) {
		fi, fe, _ := p.flog.Last()
		t.Errorf("caught up (applied 1-3, follower commit 3) but the logs differ: leader %v, follower %v (follower's last %d@%d)", lg, fg, fi, fe)
	}
}

// lastPeer is a peer answering with the follower's last index rather than
// the batch's end (as raft's AppendEntries replies carry a last-log hint):
// a reply end past what was sent.
type lastPeer struct{ f *Log }

func (p *lastPeer) Append(ctx context.Context, a Append) (uint64, error) {
	if _, err := p.f.Append(a); err != nil {
		return 0, err
	}
	last, _, err := p.f.Last()
	return last, err
}

// TestAttack_BreakPeerEndPastBatch (promises 1 and 4). A peer whose reply
// claims an end past the batch it was sent (here the follower's last index,
// 5, for a heartbeat at 3: the follower holds an old tail 4-5@1). The
// leader takes the end as is (leader.go send, case err == nil: matched,
// sendAfter = max(.., end)), so matched (5) passes what the follower holds
// of this leader's log (3): the next entry the leader writes (4@2) commits
// on the leader's write alone; and sendAfter (5) passes next-1 (3), so the
// next send calls l.at(5) with an empty or short queue: an index out of
// range PANIC in the send goroutine, which kills the process (run in a
// child process here; it panics).
//
// Fix: the leader knows the end of the batch it sent (to, or prev for a
// heartbeat): use it, and treat a reply end other than that as a failed
// Append (or a protocol error failing the leader), never raise matched or
// sendAfter past what was sent.
func TestAttack_BreakPeerEndPastBatch(t *testing.T) {
	const name = "TestAttack_BreakPeerEndPastBatch"
	if !inChild(t, name) {
		return
	}
	ls, fs := newGatedStore(), newGatedStore()
	if err := ls.StoreLogs(ents(1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := fs.StoreLogs(ents(1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	flog := openAt(t, fs, 2, 0)
	p := newPair(t, 2, ls, newGatedStore(), LeaderConfig{Peer: &lastPeer{f: flog}, RetryAfter: time.Millisecond})
	time.Sleep(100 * time.Millisecond) // the heartbeat's reply arrives (and, today, the send goroutine panics)
	f := p.leader.Propose([]byte("a"))
	if err := answer(t, f); err == nil && entryAt(fs, f.Index()) != entryAt(ls, f.Index()) {
		t.Fatalf("entry %d answered nil; the follower holds %q there", f.Index(), entryAt(fs, f.Index()))
	}
}

// TestAttack_BreakLeaderLogCompacted (promise 4: every future eventually
// answered, no hang). The leader applied and compacted its log through 3
// (entries 4-6 remain); a new, empty follower joins (ReplaceFollower). The
// follower needs entry 1 on; the leader's send reads it from its own log
// (leader.go send, cfg.Log.Entries), fails, and retries after RetryAfter
// forever (the `return l.retry()` after Entries fails): proposals are never
// answered and Err() stays nil, so nothing above the leader learns that
// this pair needs a snapshot or a failover.
//
// Fix: an Entries failure for an index below the log's first is not
// transient: fail the leader (a distinct ErrNeedSnapshot) or install a
// snapshot; at least report it through Err().
func TestAttack_BreakLeaderLogCompacted(t *testing.T) {
	ls := newGatedStore()
	if err := ls.StoreLogs(ents(1, 1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := ls.DeleteRange(1, 3); err != nil { // compacted: applied through 6
		t.Fatal(err)
	}
	p := newPair(t, 2, ls, newGatedStore(), LeaderConfig{Applied: 6, RetryAfter: time.Millisecond})
	f := p.leader.Propose([]byte("x"))
	deadline := time.Now().Add(2 * time.Second)
	for !isDone(f) && p.leader.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !isDone(f) && p.leader.Err() == nil {
		t.Errorf("2 s on: entry %d unanswered, the leader's Err() nil, the follower holding %d entries: the leader retries a read of its compacted log forever",
			f.Index(), len(dump(t, p.fstore)))
	}
	closeWithin(t, p.leader, 5*time.Second)
	if err := answer(t, f); !errors.Is(err, ErrClosed) && err == nil {
		t.Fatalf("answered nil: %v", err)
	}
}

// TestAttack_BreakCloseStartsNewWrites (promise 4: "Close returns promptly:
// it may wait for one in-flight disk write"). With a write of entry 1 in
// flight and entries 2-3 proposed behind it, Close cancels and waits for the
// write goroutine; that goroutine, once the in-flight write returns, does
// not look at the cancelled context (leader.go write: it checks only
// l.failed, which Close sets only after wg.Wait) and starts a NEW disk
// write of 2-3 that Close then also waits for. With proposers still calling
// Propose during Close (its select between room and ctx.Done is random when
// both are ready) this can repeat up to MaxPending entries.
//
// Fix: in write (and apply), return false once l.ctx.Err() != nil before
// starting a new write (or set l.failed = ErrClosed under mu before
// waiting in Close, then answer in failLocked after wg.Wait); in Propose
// check ctx.Err() before taking room.
func TestAttack_BreakCloseStartsNewWrites(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{})
	p.peer.down.Store(true)
	release := p.lstore.hold(t)
	fs := []raft.ApplyFuture{p.leader.Propose([]byte("1"))}
	time.Sleep(100 * time.Millisecond) // the write goroutine takes entry 1 and waits on the disk
	fs = append(fs, p.leader.Propose([]byte("2")), p.leader.Propose([]byte("3")))
	closed := make(chan struct{})
	go func() { p.leader.Close(); close(closed) }()
	time.Sleep(50 * time.Millisecond) // Close has cancelled and waits
	release()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	for _, f := range fs {
		if err := answer(t, f); !errors.Is(err, ErrClosed) {
			t.Fatalf("entry %d: %v", f.Index(), err)
		}
	}
	if n := p.lstore.writes.Load(); n != 1 {
		t.Errorf("Close waited for %d disk writes (log %v): one was in flight, the others started after Close cancelled", n, dump(t, p.lstore))
	}
}

// TestAttack_BreakMaxUint64Wraps (promise 5: bad input is an error, never a
// changed log). On a log ending at math.MaxUint64, PrevIndex+1 wraps to 0:
// checkAppend (log.go:269) accepts an entry of index 0 after PrevIndex
// MaxUint64, Append then takes it for "compacted" (0 < first, log.go:177)
// and answers success (end 0); Log.Write (log.go:220, last+1+i) accepts
// and STORES an entry of index 0. Index 0 is never a valid entry.
//
// Fix: reject e.Index == 0 (and a PrevIndex+len(Entries) that overflows)
// in checkAppend and Write.
func TestAttack_BreakMaxUint64Wraps(t *testing.T) {
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

// --- Attacks that held. ---

// TestAttack_MalformedNeverChanges: malformed or out-of-range Appends
// (index 0, huge and wrapping indexes, nil entries, epoch 0) give an error
// and leave the log as it was, on a log with a compacted prefix too.
func TestAttack_MalformedNeverChanges(t *testing.T) {
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

// TestAttack_ConcurrentProposeClose: proposers racing Close over a lossy,
// flapping link: every future is answered, Close returns promptly, and
// every entry answered nil is on both logs, the same.
func TestAttack_ConcurrentProposeClose(t *testing.T) {
	for round := range 6 {
		p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{MaxBatch: 4, MaxPending: 16, RetryAfter: time.Millisecond})
		p.peer.lose(rand.New(rand.NewPCG(uint64(round), 3)), 200)
		var mu sync.Mutex
		var futures []raft.ApplyFuture
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					f := p.leader.Propose(fmt.Appendf(nil, "w%d-%d", w, i))
					mu.Lock()
					futures = append(futures, f)
					mu.Unlock()
					if i%3 == 0 {
						f.Error()
					}
				}
			}()
		}
		time.Sleep(time.Duration(5+round*7) * time.Millisecond)
		closeWithin(t, p.leader, 5*time.Second)
		close(stop)
		wg.Wait()
		acked := 0
		for _, f := range futures {
			err := answer(t, f)
			if err == nil {
				acked++
				if lg, fg := entryAt(p.lstore, f.Index()), entryAt(p.fstore, f.Index()); lg == "" || lg != fg {
					t.Fatalf("round %d: entry %d answered nil, leader %q follower %q", round, f.Index(), lg, fg)
				}
			} else if !errors.Is(err, ErrClosed) {
				t.Fatalf("round %d: entry %d: %v", round, f.Index(), err)
			}
		}
		if got := p.sm.list(); len(got) < acked {
			t.Fatalf("round %d: %d acked, %d applied", round, acked, len(got))
		}
	}
}

// TestAttack_LostReplyThenNewEpoch: Appends delivered with their replies
// lost, then the follower serves epoch 2: nothing more is answered nil,
// the leader is deposed, every future answered.
func TestAttack_LostReplyThenNewEpoch(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{RetryAfter: time.Millisecond})
	if err := answer(t, p.leader.Propose([]byte("ok"))); err != nil {
		t.Fatal(err)
	}
	p.peer.lose(rand.New(rand.NewPCG(1, 1)), 1000) // delivered, reply lost
	var fs []raft.ApplyFuture
	for i := range 5 {
		fs = append(fs, p.leader.Propose(fmt.Appendf(nil, "%d", i)))
	}
	waitFor(t, "the follower to hold them", func() bool { return len(dump(t, p.fstore)) == 6 })
	if err := p.flog.SetEpoch(2); err != nil {
		t.Fatal(err)
	}
	p.peer.loseRate.Store(0)
	for _, f := range fs {
		if err := answer(t, f); !errors.Is(err, ErrDeposed) {
			t.Fatalf("entry %d: %v, want ErrDeposed", f.Index(), err)
		}
	}
	if err := answer(t, p.leader.Propose([]byte("late"))); !errors.Is(err, ErrDeposed) {
		t.Fatalf("late: %v", err)
	}
}

// TestAttack_FullPendingFollowerDownClose: MaxPending reached with the
// follower down, more proposers blocked on room; Close answers all with
// ErrClosed promptly.
func TestAttack_FullPendingFollowerDownClose(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{MaxPending: 4, RetryAfter: time.Millisecond})
	p.peer.down.Store(true)
	out := make(chan raft.ApplyFuture, 10)
	for i := range 10 {
		go func() { out <- p.leader.Propose(fmt.Appendf(nil, "%d", i)) }()
	}
	time.Sleep(50 * time.Millisecond)
	closeWithin(t, p.leader, 2*time.Second)
	for range 10 {
		select {
		case f := <-out:
			if err := answer(t, f); !errors.Is(err, ErrClosed) {
				t.Fatalf("entry %d: %v", f.Index(), err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a blocked Propose did not return after Close")
		}
	}
	if len(p.sm.list()) != 0 {
		t.Fatalf("applied %v with the follower down", p.sm.list())
	}
}

// TestAttack_WalkBackOverCompactedFollower: the follower compacted its
// committed prefix (1-3) and holds an old tail 4-6@1; the leader of epoch 3
// (4-6@2) walks back to it, the tail is replaced, the prefix untouched,
// and the new entry is answered only when both hold it.
func TestAttack_WalkBackOverCompactedFollower(t *testing.T) {
	ls, fs := newGatedStore(), newGatedStore()
	if err := ls.StoreLogs(append(ents(1, 1, 1, 1), ents(4, 2, 2, 2)...)); err != nil {
		t.Fatal(err)
	}
	if err := fs.StoreLogs(ents(1, 1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	fs.DeleteRange(1, 3)
	p := newPair(t, 3, ls, fs, LeaderConfig{Applied: 3, MaxBatch: 2, RetryAfter: time.Millisecond})
	f := p.leader.Propose([]byte("x"))
	if err := answer(t, f); err != nil || f.Index() != 7 {
		t.Fatalf("x: %v at %d", err, f.Index())
	}
	want := []string{"4@2:4@2", "5@2:5@2", "6@2:6@2", "7@3:x"}
	if got := dump(t, fs); !slices.Equal(got, want) {
		t.Fatalf("follower %v, want %v", got, want)
	}
	if got := p.sm.list(); !slices.Equal(got, want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
}

// skipPeer delivers its first batch with entries only once gate is closed,
// then answers it one past the batch's end (a reply meant for another
// request, or a follower's last index); later Appends are delivered as is.
type skipPeer struct {
	f     *Log
	gate  chan struct{}
	after func() // called once the first batch is delivered
	calls atomic.Int64
}

func (p *skipPeer) Append(ctx context.Context, a Append) (uint64, error) {
	if len(a.Entries) == 0 || p.calls.Add(1) > 1 {
		return p.f.Append(a)
	}
	select {
	case <-p.gate:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	end, err := p.f.Append(a)
	p.after()
	return end + 1, err
}

// TestAttack_BreakPeerEndPastBatchAcks (promise 1), the same root cause as
// TestAttack_BreakPeerEndPastBatch without the panic: the first batch
// carries entry 1 only, its reply claims 2 while entry 2 is proposed: the
// leader raises matched and sendAfter to 2, never sends entry 2, and
// answers it nil once its own write is done, the follower not holding it
// (its disk stalls after the first batch: the later resend of entry 2,
// after a mismatch, cannot land before the answer).
// (Run in a child process in case the send goroutine panics.)
func TestAttack_BreakPeerEndPastBatchAcks(t *testing.T) {
	const name = "TestAttack_BreakPeerEndPastBatchAcks"
	if !inChild(t, name) {
		return
	}
	fs := newGatedStore()
	// Once the first batch is delivered the follower's disk stalls, so
	// that whatever the follower holds when entry 2 is answered is final.
	peer := &skipPeer{f: openAt(t, fs, 1, 0), gate: make(chan struct{}), after: func() { fs.hold(t) }}
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{Peer: peer, MaxBatch: 1, RetryAfter: time.Millisecond})
	f1 := p.leader.Propose([]byte("a"))
	f2 := p.leader.Propose([]byte("b"))
	close(peer.gate)
	answer(t, f1)
	if err2 := answer(t, f2); err2 == nil && entryAt(fs, 2) != entryAt(p.lstore, 2) {
		t.Fatalf("entry 2 answered nil, the follower holding %q there (its log %v)", entryAt(fs, 2), dump(t, fs))
	}
}
