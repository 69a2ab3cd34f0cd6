package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// TestPair_SameEpochRestartThenPromotionAgrees: a leader whose batch
// reached the follower but not its own disk (entry 5 = X on b only)
// restarts while the link is down; it may not lead its epoch again
// (ErrEpochLed), so its entry Y at index 5 is of a new epoch. The follower
// is then promoted, X's client retries through it, and X is at its acked
// offset on both replicas, which agree. This broke when the restarted
// leader wrote Y at index 5 of the same epoch: the promoted follower's
// Reset append found a's entry 5 "matching" (same index, same epoch), b
// applied X and a applied Y, and the retry of X was acked as a duplicate
// at the offset where a held Y.
func TestPair_SameEpochRestartThenPromotionAgrees(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 4 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	idx := writeOnlyToFollower(t, ps, &d, "X")

	// a restarts and leads epoch 1 again (the metadata did not change), cut
	// off from b: its send of Y is written at index 5 of epoch 1 on a only.
	ps.stop(0)
	ps.cut[0].Store(true)
	ps.start(0)
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := ps.send(c, 0, msg("Y"))
	cc()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send Y with the link cut: %v", err)
	}
	if got := ps.entryIDs(0, idx); !slices.Equal(got, []string{"Y"}) {
		t.Fatalf("setup: a's entry %d holds %v", idx, got)
	}

	// b is promoted; a rejoins as its follower.
	ps.promote(false)
	ps.cut[0].Store(false)
	ps.rejoin()
	if !waitFor(patience, func() bool {
		c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cc()
		_, err := ps.rep(1).LeaderPartition(c, 0)
		return err == nil
	}) {
		t.Fatal("the new leader never became ready")
	}
	// X's client retries at the new leader.
	res, err := ps.send(ctx, 1, msg("X"))
	if err != nil || len(res.Acks) != 1 {
		t.Fatalf("retry X at b: %+v %v", res, err)
	}
	ack := res.Acks[0]
	waitFor(3*time.Second, func() bool { return len(ps.logOf(0)) >= len(ps.logOf(1)) })
	a, b := ps.logOf(0), ps.logOf(1)
	if got := ps.atOffset(0, ack.Offset); got != "X" {
		t.Fatalf("X acked by b at offset %d (duplicate %v), but replica a holds %q there: "+
			"both logs hold entry %d of epoch 1, a's with %v, b's with %v (matched by index and epoch only); "+
			"the replicas diverged: a %v, b %v",
			ack.Offset, ack.Duplicate, got, idx, ps.entryIDs(0, idx), ps.entryIDs(1, idx), ids(a), ids(b))
	}
	if !slices.EqualFunc(a, b, sameMessage) {
		t.Fatalf("the replicas differ once healed: a %v, b %v", ids(a), ids(b))
	}
}

// TestPair_SameEpochDoubleRestartAgrees: the case of
// TestPair_SameEpochRestartThenPromotionAgrees with no promotion: the
// leader restarts twice (its second run writes Y at index 5 while cut off,
// its third run's Reset append meets b's X at index 5). A retry of Y is
// acked at an offset where b holds Y too. This broke when each run led the
// same epoch 1: the third run's Reset append found b's X "matching", and a
// acked Y as a duplicate at the offset where b held X.
func TestPair_SameEpochDoubleRestartAgrees(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 4 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	idx := writeOnlyToFollower(t, ps, &d, "X")
	// Run 2, cut off: Y at index 5 of epoch 1 on a only.
	ps.stop(0)
	ps.cut[0].Store(true)
	ps.start(0)
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := ps.send(c, 0, msg("Y"))
	cc()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send Y with the link cut: %v", err)
	}
	// Run 3, the link healed.
	ps.stop(0)
	ps.cut[0].Store(false)
	ps.start(0)
	if err := ps.rep(0).Lead(2, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(2) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	res, err := ps.send(ctx, 0, msg("Y"))
	if err != nil || len(res.Acks) != 1 {
		t.Fatalf("retry Y at a: %+v %v", res, err)
	}
	ack := res.Acks[0]
	waitFor(3*time.Second, func() bool { return len(ps.logOf(1)) >= len(ps.logOf(0)) })
	a, b := ps.logOf(0), ps.logOf(1)
	if got := ps.atOffset(1, ack.Offset); got != "Y" {
		t.Fatalf("Y acked by a at offset %d (duplicate %v), but follower b holds %q there "+
			"(entry %d of epoch 1: a's %v, b's %v): a: %v, b: %v",
			ack.Offset, ack.Duplicate, got, idx, ps.entryIDs(0, idx), ps.entryIDs(1, idx), ids(a), ids(b))
	}
	if !slices.EqualFunc(a, b, sameMessage) {
		t.Fatalf("the replicas differ once healed: a %v, b %v", ids(a), ids(b))
	}
}

// TestPair_RestartLeaderSameEpochFollowerTail: the leader restarted
// once in its epoch, its follower holding an entry it never wrote: the
// follower's tail is replaced, the replicas agree.
func TestPair_RestartLeaderSameEpochFollowerTail(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m0")); err != nil {
		t.Fatal(err)
	}
	writeOnlyToFollower(t, ps, &d, "X")
	ps.stop(0)
	ps.start(0)
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	res, err := ps.send(ctx, 0, msg("Y"))
	if err != nil || res.Acks[0].Offset != 1 {
		t.Fatalf("send Y: %+v %v", res, err)
	}
	got := ps.settle()
	if len(got) != 2 || got[1].ID != "Y" {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPair_StaleRoleCallKeepsLeader: a stale (lower-epoch) Follow or Lead,
// e.g. a delayed metadata message, is refused with ErrStaleEpoch and
// leaves the live leader of the current epoch leading and sending. This
// broke when serve stopped the leader before checking the epoch: its
// in-flight sends became unknown and the partition had no leader.
func TestPair_StaleRoleCallKeepsLeader(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.promote(false)
	ps.rejoin()
	if _, err := ps.send(ctx, 1, msg("b0")); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		name string
		f    func() error
	}{
		{"Follow(1)", func() error { return ps.rep(1).Follow(1) }},
		{"Lead(1, peer)", func() error { return ps.rep(1).Lead(1, pairLink{ps, 1}, false) }},
	} {
		if err := call.f(); !errors.Is(err, pairlog.ErrStaleEpoch) {
			t.Fatalf("%s at epoch 2: %v, want ErrStaleEpoch", call.name, err)
		}
		c, cc := context.WithTimeout(ctx, time.Second)
		_, err := ps.send(c, 1, msg("after-"+call.name))
		cc()
		if !ps.rep(1).Leading() || err != nil {
			t.Errorf("after a refused %s, the leader of epoch 2 leads: %v, and a send gives %v", call.name, ps.rep(1).Leading(), err)
		}
		if !ps.rep(1).Leading() {
			if err := ps.rep(1).Lead(2, pairLink{ps, 1}, false); err != nil { // restore it
				t.Fatal(err)
			}
		}
	}
}

// TestPair_IsolatedOldLeader: the old leader cut off both ways while
// its follower is promoted alone (the risk stage) acks nothing and serves
// no read, before and after the link heals; the pair then agrees.
func TestPair_IsolatedOldLeader(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m0")); err != nil {
		t.Fatal(err)
	}
	ps.cut[0].Store(true)
	ps.cut[1].Store(true)
	ps.promote(true)
	if _, err := ps.send(ctx, 1, msg("new")); err != nil {
		t.Fatal(err)
	}
	c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
	if err := ps.rep(0).Verify(c); err == nil {
		t.Fatal("the isolated old leader verified its leadership")
	}
	if res, err := ps.send(c, 0, msg("stale")); err == nil {
		t.Fatalf("the isolated old leader acked: %+v", res)
	}
	cc()
	ps.cut[0].Store(false)
	ps.cut[1].Store(false)
	if !waitFor(patience, func() bool {
		c, cc := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cc()
		err := ps.rep(0).Verify(c)
		_, rerr := ps.rep(0).LeaderPartition(c, 0)
		return errors.Is(err, ErrNotLeader) && errors.Is(rerr, ErrNotLeader) && !ps.rep(0).Leading()
	}) {
		t.Fatal("the old leader was not deposed")
	}
	if res, err := ps.send(ctx, 0, msg("late")); err == nil {
		t.Fatalf("the deposed leader acked: %+v", res)
	}
	ps.rejoin()
	got := ps.settle()
	if len(got) != 2 || got[1].ID != "new" {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPair_AsyncThenSync: a leader in the risk stage (async) acks
// with its follower cut off; switched back to sync it is not InSync until
// the follower holds every ack; then the follower, promoted, holds each
// acked message at its offset.
func TestPair_AsyncThenSync(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("s0")); err != nil {
		t.Fatal(err)
	}
	a := ps.rep(0)
	a.SetSync(false) // the risk stage
	ps.cut[0].Store(true)
	acked := map[string]uint64{"s0": 0}
	for k := range 20 {
		id := fmt.Sprintf("r%d", k)
		res, err := ps.send(ctx, 0, msg(id))
		if err != nil {
			t.Fatalf("async send with the follower cut off: %v", err)
		}
		acked[id] = res.Acks[0].Offset
	}
	if err := a.Verify(ctx); err != nil {
		t.Fatalf("Verify in the risk stage: %v", err)
	}
	a.SetSync(true)
	if a.InSync() {
		t.Fatal("InSync with the follower cut off and 20 acks it lacks")
	}
	c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := ps.send(c, 0, msg("sync0"))
	cc()
	if err == nil {
		t.Fatal("a sync send acked with the follower cut off")
	}
	ps.cut[0].Store(false)
	if !waitFor(patience, a.InSync) {
		t.Fatalf("never InSync (lag %d)", a.Lag())
	}
	if e := ps.entryEpochs(1); len(e) < len(acked) {
		t.Fatalf("InSync, but the follower's log holds %d of %d acked messages", len(e), len(acked))
	}
	ps.stop(0)
	ps.promote(true)
	b := ps.rep(1)
	if _, err := b.LeaderPartition(ctx, 0); err != nil {
		t.Fatal(err)
	}
	held := map[string]uint64{}
	for _, m := range ps.logOf(1) {
		held[m.ID] = m.Offset
	}
	for id, off := range acked {
		if o, ok := held[id]; !ok || o != off {
			t.Fatalf("%s acked at %d, the promoted follower holds it at %d (%v)", id, off, o, ok)
		}
	}
}

// TestPair_FollowerDiskFails: while the follower cannot write, nothing
// is acked and the leader keeps leading; healed, the entry commits on both.
func TestPair_FollowerDiskFails(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m0")); err != nil {
		t.Fatal(err)
	}
	d.set(1, func([]*raft.Log) error { return errTestDisk })
	c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := ps.send(c, 0, msg("m1"))
	cc()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send with the follower's disk failing: %v", err)
	}
	if got := ps.logOf(0); len(got) != 1 || !ps.rep(0).Leading() {
		t.Fatalf("the leader applied %v (leading %v) with its follower failing", ids(got), ps.rep(0).Leading())
	}
	d.set(1, nil)
	res, err := ps.send(ctx, 0, msg("m1"))
	if err != nil || res.Acks[0].Offset != 1 {
		t.Fatalf("retry: %+v %v", res, err)
	}
	if got := ps.settle(); len(got) != 2 {
		t.Fatalf("the replicas hold %v", ids(got))
	}
	if e := ps.entryEpochs(1); len(e["m1"]) == 0 {
		t.Fatal("the follower's log lacks m1")
	}
}

// TestPair_LeaderDiskFailsThenRelead: a leader whose disk fails stops
// leading (unknown outcome, then ErrNotLeader); led again in the same epoch
// it acks the retry once, at one offset, on both replicas.
func TestPair_LeaderDiskFailsThenRelead(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m0")); err != nil {
		t.Fatal(err)
	}
	d.set(0, func([]*raft.Log) error { return errTestDisk })
	if _, err := ps.send(ctx, 0, msg("m1")); !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send with the leader's disk failing: %v", err)
	}
	if _, err := ps.send(ctx, 0, msg("m2")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("send to the failed leader: %v", err)
	}
	d.set(0, nil)
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	for _, id := range []string{"m1", "m2", "m1"} {
		if _, err := ps.send(ctx, 0, msg(id)); err != nil {
			t.Fatalf("send %s after Lead again: %v", id, err)
		}
	}
	got := ps.settle()
	if len(got) != 3 || got[1].ID != "m1" || got[2].ID != "m2" {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPair_ConcurrentRoleChurn: sends, reads, Lead of the same epoch,
// Follow of the same epoch and direct empty appends race, then both
// replicas close mid-flight: no panic, no hang; reopened under a new
// epoch, every acked message is at its offset on both replicas.
func TestPair_ConcurrentRoleChurn(t *testing.T) {
	ps := newPairs(t, nil)
	a, b := ps.rep(0), ps.rep(1)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var mu sync.Mutex
	acked := map[string]uint64{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	run := func(f func(k int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				f(k)
			}
		}()
	}
	for w := range 4 {
		run(func(k int) {
			id := fmt.Sprintf("w%d-%d", w, k)
			for try := 0; try < 3; try++ {
				c, cc := context.WithTimeout(ctx, 500*time.Millisecond)
				res, err := a.Apply(c, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}})
				cc()
				if err == nil {
					mu.Lock()
					acked[id] = res.Acks[0].Offset
					mu.Unlock()
					return
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	for _, p := range []*Pair{a, b} {
		run(func(int) {
			c, cc := context.WithTimeout(ctx, 100*time.Millisecond)
			_, _ = p.LeaderPartition(c, 0)
			_ = p.Verify(c)
			_, _, _ = p.InSync(), p.Lag(), p.Leading()
			cc()
			time.Sleep(time.Millisecond)
		})
	}
	run(func(int) {
		_ = a.Lead(1, pairLink{ps, 0}, false)
		time.Sleep(15 * time.Millisecond)
	})
	run(func(int) {
		_ = b.Follow(1)
		_, _ = b.Append(ctx, pairlog.Append{Epoch: 1})
		time.Sleep(5 * time.Millisecond)
	})
	time.Sleep(700 * time.Millisecond)
	closed := make(chan struct{})
	go func() {
		ps.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung under concurrent calls")
	}
	close(stop)
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("nothing acked")
	}
	ps.start(0)
	ps.start(1)
	ps.mu.Lock()
	ps.leader = 1
	ps.mu.Unlock()
	ps.promote(false) // a leads epoch 2
	ps.rejoin()
	if _, err := ps.rep(0).LeaderPartition(ctx, 0); err != nil {
		t.Fatal(err)
	}
	got := ps.settle()
	at := map[string]uint64{}
	for k, m := range got {
		if m.Offset != uint64(k) {
			t.Fatalf("offset %d at position %d", m.Offset, k)
		}
		if _, dup := at[m.ID]; dup {
			t.Fatalf("%s stored twice", m.ID)
		}
		at[m.ID] = m.Offset
	}
	for id, off := range acked {
		if o, ok := at[id]; !ok || o != off {
			t.Fatalf("%s acked at %d, held at %d (%v)", id, off, o, ok)
		}
	}
	t.Logf("%d acked, %d held", len(acked), len(got))
}
