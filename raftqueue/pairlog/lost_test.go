package pairlog

import (
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
