package pairlog

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"
)

// TestLeader_FollowerLostItsLog: a follower whose log is replaced by an
// empty one (a new disk) while the pair is idle is found by the leader's
// check within CheckEvery, with no send: Lost, no longer InSync, and
// nothing more is acked until the follower holds the whole log again;
// then it is InSync and no longer Lost, and both logs are equal.
func TestLeader_FollowerLostItsLog(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{CheckEvery: 20 * time.Millisecond})
	for i := range 10 {
		if err := answer(t, p.leader.Propose([]byte{'a' + byte(i)})); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the follower in sync", p.leader.InSync)
	if p.leader.Lost() {
		t.Fatal("Lost with an intact follower")
	}

	// The follower's disk is replaced: an empty log, serving the epoch.
	empty := newGatedStore()
	hold := empty.hold(t) // its writes wait: it cannot catch up yet
	flog := openAt(t, empty, 1, 0)
	p.peer.mu.Lock()
	p.peer.f = flog
	p.peer.mu.Unlock()
	waitFor(t, "the idle leader to find the follower lost", p.leader.Lost)
	if p.leader.InSync() {
		t.Fatal("InSync with a follower that lost its log")
	}
	if got := p.leader.Matched(); got != 0 {
		t.Fatalf("Matched %d with a follower that lost its log", got)
	}
	f := p.leader.Propose([]byte("k"))
	time.Sleep(50 * time.Millisecond)
	if isDone(f) {
		t.Fatal("an entry acked while the follower, which lost its log, holds none of it")
	}
	hold()
	if err := answer(t, f); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the follower caught up", func() bool { return p.leader.InSync() && !p.leader.Lost() })
	want, got := dump(t, p.lstore), dump(t, empty)
	if len(got) != 11 || len(want) != 11 {
		t.Fatalf("after the catch-up: the leader's log %v, the follower's %v", want, got)
	}
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("entry %d: the leader's %s, the follower's %s", i+1, want[i], got[i])
		}
	}
}

// installPeer is a testPeer whose follower restores snapshots as
// raftqueue's does: it assembles the pieces, empties its log
// (Truncate), then records the snapshot's index (Restored).
type installPeer struct {
	*testPeer
	mu    sync.Mutex
	buf   bytes.Buffer
	index uint64 // the last snapshot restored
}

func (p *installPeer) Install(ctx context.Context, in Install) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.testPeer.mu.Lock()
	f := p.testPeer.f
	p.testPeer.mu.Unlock()
	if err := f.CheckEpoch(in.Epoch); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if in.Offset == 0 {
		p.buf.Reset()
	}
	p.buf.Write(in.Data)
	if !in.Done {
		return nil
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if err := f.Restored(in.Index); err != nil {
		return err
	}
	p.index = in.Index
	return nil
}

// TestLeader_FollowerRestoredSnapshotNotLost: a new follower that gets a
// snapshot (the leader's log compacted), then entries after it, then
// compacts its whole log and restarts, holds every entry it matched: the
// leader's idle checks never find it lost, it stays in sync, and an entry
// proposed afterwards commits.
func TestLeader_FollowerRestoredSnapshotNotLost(t *testing.T) {
	ls, fs := newGatedStore(), newGatedStore()
	if err := ls.StoreLogs(ents(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := ls.DeleteRange(1, 8); err != nil { // compacted: applied through 8
		t.Fatal(err)
	}
	snap := func() (uint64, io.ReadCloser, error) {
		return 8, io.NopCloser(bytes.NewReader([]byte("state at 8"))), nil
	}
	p := &pair{lstore: ls, fstore: fs, sm: &applied{}}
	llog, err := OpenLog(ls, ls, 8)
	if err != nil {
		t.Fatal(err)
	}
	flog, err := OpenLog(fs, fs, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Log{llog, flog} {
		if err := l.SetEpoch(2); err != nil {
			t.Fatal(err)
		}
	}
	p.flog = flog
	p.peer = &testPeer{f: flog}
	peer := &installPeer{testPeer: p.peer}
	p.leader, err = NewLeader(LeaderConfig{Log: llog, Apply: p.sm.apply, Applied: 8, Peer: peer, Snapshot: snap,
		CheckEvery: 5 * time.Millisecond, RetryAfter: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(t, p.leader, 5*time.Second)

	if err := answer(t, p.leader.Propose([]byte("x"))); err != nil {
		t.Fatal(err)
	}
	peer.mu.Lock()
	restored := peer.index
	peer.mu.Unlock()
	if restored != 8 {
		t.Fatalf("the follower restored a snapshot at %d, want 8", restored)
	}
	waitFor(t, "the follower in sync", p.leader.InSync)
	checkNotLost := func(what string) {
		t.Helper()
		for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if p.leader.Lost() {
				t.Fatalf("%s: the leader finds its follower lost (matched %d)", what, p.leader.Matched())
			}
		}
	}
	checkNotLost("after the install")

	// The follower compacts its whole log, then restarts.
	_, last, err := flog.Bounds()
	if err != nil {
		t.Fatal(err)
	}
	if err := flog.Compact(last); err != nil {
		t.Fatal(err)
	}
	checkNotLost("after the follower compacted its log")
	reopened, err := OpenLog(fs, fs, last)
	if err != nil {
		t.Fatal(err)
	}
	p.peer.mu.Lock()
	p.peer.f = reopened
	p.peer.mu.Unlock()
	checkNotLost("after the follower restarted")
	if !p.leader.InSync() {
		t.Fatal("the follower, intact, is no longer in sync")
	}
	if err := answer(t, p.leader.Propose([]byte("y"))); err != nil {
		t.Fatal(err)
	}
	checkNotLost("after y")
}

// TestLeader_CloseDuringIdleChecks: a leader whose idle checks run every
// millisecond closes promptly at any point of its check cycle, its
// follower reachable or not, and leaves no goroutine behind (goleak in
// TestMain).
func TestLeader_CloseDuringIdleChecks(t *testing.T) {
	for i := range 40 {
		p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{CheckEvery: time.Millisecond, RetryAfter: time.Millisecond})
		if err := answer(t, p.leader.Propose([]byte("a"))); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			p.peer.down.Store(true)
		}
		time.Sleep(time.Duration(i%7) * time.Millisecond)
		closeWithin(t, p.leader, 2*time.Second)
	}
}

// TestLeader_ConfirmFollower: Confirm returns nil once an intact follower
// answers a round begun after it, even with nothing to send; for a
// follower whose log was replaced by an empty one it fails, and for one
// that does not answer it waits until ctx ends.
func TestLeader_ConfirmFollower(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{CheckEvery: time.Hour})
	for i := range 5 {
		if err := answer(t, p.leader.Propose([]byte{'a' + byte(i)})); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the follower in sync", p.leader.InSync)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.leader.Confirm(ctx); err != nil {
		t.Fatalf("Confirm with an intact follower: %v", err)
	}
	p.peer.down.Store(true)
	short, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer scancel()
	if err := p.leader.Confirm(short); err == nil {
		t.Fatal("Confirm with a follower that does not answer: nil")
	}
	empty := newGatedStore()
	flog := openAt(t, empty, 1, 0)
	p.peer.mu.Lock()
	p.peer.f = flog
	p.peer.mu.Unlock()
	hold := empty.hold(t) // it cannot catch up while Confirm looks
	defer hold()
	p.peer.down.Store(false)
	if err := p.leader.Confirm(ctx); err == nil {
		t.Fatal("Confirm with a follower back with an empty log: nil")
	}
}
