package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/raftqueue/pairlog"
)

// TestPair_Replicates: concurrent sends through the leader are acked with
// consecutive offsets, and the follower ends with the same messages.
func TestPair_Replicates(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	const n = 200
	var wg sync.WaitGroup
	offs := make([]uint64, n)
	for k := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := ps.send(ctx, 0, msg(fmt.Sprintf("m%d", k)))
			if err != nil || len(res.Acks) != 1 {
				t.Errorf("send %d: %v %v", k, res, err)
				return
			}
			offs[k] = res.Acks[0].Offset
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for _, o := range offs {
		if seen[o] || o >= n {
			t.Fatalf("offset %d acked twice or past %d", o, n)
		}
		seen[o] = true
	}
	if got := ps.settle(); len(got) != n {
		t.Fatalf("the replicas hold %d messages, %d acked", len(got), n)
	}
	// The follower refuses proposals: it does not lead.
	if _, err := ps.send(ctx, 1, msg("x")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("send through the follower: %v, want ErrNotLeader", err)
	}
}

// TestPair_AckNeedsFollower: with the link to the follower cut, nothing is
// acked (the caller's ctx ends with the outcome unknown); once it heals,
// the entry commits on both and a retry of the same ID is a duplicate.
func TestPair_AckNeedsFollower(t *testing.T) {
	ps := newPairs(t, nil)
	ps.cut[0].Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := ps.send(ctx, 0, msg("held"))
	cancel()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send with the follower cut off: %v, want ErrUnknownOutcome", err)
	}
	if got := ps.logOf(0); len(got) != 0 {
		t.Fatalf("the leader applied %v before the follower held it", got)
	}
	ps.cut[0].Store(false)
	ctx, cancel = context.WithTimeout(context.Background(), patience)
	defer cancel()
	res, err := ps.send(ctx, 0, msg("held"))
	if err != nil || len(res.Acks) != 1 || !res.Acks[0].Duplicate || res.Acks[0].Offset != 0 {
		t.Fatalf("retry: %+v %v, want a duplicate at 0", res, err)
	}
	if got := ps.settle(); len(got) != 1 {
		t.Fatalf("the replicas hold %v", got)
	}
}

// TestPair_PromotionFencesOldLeader: the follower, promoted while the old
// leader still runs, refuses the old leader's appends, so the old leader
// acks nothing after the promotion (its callers learn ErrNotLeader or an
// unknown outcome) and its reads are refused; rejoining as the follower it
// cuts the tail it never had acked and ends with the new leader's log.
func TestPair_PromotionFencesOldLeader(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 10 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	// The old leader writes a tail the follower never gets.
	ps.cut[0].Store(true)
	tail := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := ps.send(c, 0, msg("orphan"))
		tail <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if b := ps.promote(false); b != 1 {
		t.Fatalf("promoted %d", b)
	}
	ps.cut[0].Store(false)
	if err := <-tail; !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("the old leader's send in flight: %v, want ErrUnknownOutcome", err)
	}
	// Its appends now meet the new epoch: deposed.
	deadline := time.Now().Add(patience)
	for ps.rep(0).Leading() {
		if time.Now().After(deadline) {
			t.Fatal("the old leader still leads")
		}
		_ = ps.rep(0).Verify(ctx)
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := ps.send(ctx, 0, msg("late")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a send to the deposed leader: %v, want ErrNotLeader", err)
	}
	if _, err := ps.rep(0).LeaderPartition(ctx, 0); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a read at the deposed leader: %v, want ErrNotLeader", err)
	}
	ps.rejoin()
	res, err := ps.send(ctx, 1, msg("b0"))
	if err != nil || res.Acks[0].Offset != 10 {
		t.Fatalf("the new leader's first send: %+v %v, want offset 10", res, err)
	}
	got := ps.settle()
	if len(got) != 11 || got[10].ID != "b0" {
		t.Fatalf("after the rejoin the replicas hold %d messages, the last %q", len(got), got[len(got)-1].ID)
	}
	for _, m := range got {
		if m.ID == "orphan" || m.ID == "late" {
			t.Fatalf("%s, never acked, is in the log", m.ID)
		}
	}
	if e := ps.rep(0).Epoch(); e != 2 {
		t.Fatalf("the old leader serves epoch %d, want 2", e)
	}
}

// TestPair_KillLeaderNoRisk: the leader killed, its follower promoted
// without the risk stage acks nothing until the old leader is back as its
// follower; then everything acked before is there, once.
func TestPair_KillLeaderNoRisk(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 20 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	ps.stop(0)
	ps.promote(false)
	c, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := ps.send(c, 1, msg("b0"))
	cancelShort()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("a send with no follower: %v, want ErrUnknownOutcome (not acked)", err)
	}
	ps.rejoin()
	for k := range 20 {
		if _, err := ps.send(ctx, 1, msg(fmt.Sprintf("b%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	got := ps.settle()
	if len(got) != 40 {
		t.Fatalf("the replicas hold %d messages, want 40", len(got))
	}
	for k, m := range got[:20] {
		if m.ID != fmt.Sprintf("a%d", k) {
			t.Fatalf("offset %d holds %s", k, m.ID)
		}
	}
}

// TestPair_RiskStage: promoted alone (the risk stage), the new leader acks
// on its own copy; its old leader, back, catches up from it and the pair
// holds what was acked. What the option documents as lost (kill the lone
// leader's disk) is not tried here: the copy is one.
func TestPair_RiskStage(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("a0")); err != nil {
		t.Fatal(err)
	}
	ps.stop(0)
	ps.promote(true)
	for k := range 30 {
		if _, err := ps.send(ctx, 1, msg(fmt.Sprintf("b%d", k))); err != nil {
			t.Fatalf("alone: %v", err)
		}
	}
	ps.rejoin()
	if ps.isAlone(1) {
		t.Fatal("the leader still replicates to none")
	}
	if _, err := ps.send(ctx, 1, msg("c0")); err != nil {
		t.Fatal(err)
	}
	if got := ps.settle(); len(got) != 32 || got[31].ID != "c0" {
		t.Fatalf("the replicas hold %d messages", len(got))
	}
}

// TestPair_RestartBoth: both replicas closed and reopened keep every
// acked message; the leader, told to lead again, applies what it holds
// once its follower does.
func TestPair_RestartBoth(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 50 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	ps.close()
	ps.start(0)
	ps.start(1)
	// A restarted leader takes a new epoch from the metadata.
	ps.mu.Lock()
	ps.leader = 1
	ps.mu.Unlock()
	ps.promote(false) // replica 0 at epoch 2
	ps.rejoin()
	p, err := ps.rep(0).LeaderPartition(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if next := p.Stats().Next; next != 50 {
		t.Fatalf("the restarted leader reads up to %d, want 50", next)
	}
	if got := ps.settle(); len(got) != 50 {
		t.Fatalf("the replicas hold %d messages", len(got))
	}
}

// TestPair_LeadLowerEpoch: an epoch below the one served is refused.
func TestPair_LeadLowerEpoch(t *testing.T) {
	ps := newPairs(t, nil)
	ps.promote(false)
	ps.rejoin()
	if err := ps.rep(0).Follow(1); !errors.Is(err, pairlog.ErrStaleEpoch) {
		t.Fatalf("Follow(1) at epoch 2: %v, want ErrStaleEpoch", err)
	}
	if err := ps.rep(1).Lead(1, nil, false); !errors.Is(err, pairlog.ErrStaleEpoch) {
		t.Fatalf("Lead(1) at epoch 2: %v, want ErrStaleEpoch", err)
	}
}

// TestPair_CloseWhileSending: Close with sends waiting on a cut follower
// answers each (never a hang), and later calls get ErrClosed.
func TestPair_CloseWhileSending(t *testing.T) {
	ps := newPairs(t, nil)
	ps.cut[0].Store(true)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for k := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := ps.send(context.Background(), 0, msg(fmt.Sprintf("m%d", k)))
			errs <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	ps.stop(0)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil || !(errors.Is(err, ErrUnknownOutcome) || errors.Is(err, ErrClosed) || errors.Is(err, ErrNotLeader)) {
			t.Fatalf("a send cut by Close: %v", err)
		}
	}
}

// TestPair_RiskStageKillNewLeader: promoted alone (the risk stage), the new
// leader acks on its own copy; killed, it comes back on its disk with every
// ack (a crash loses nothing: the lone copy is durable). Killed again with
// its disk lost (what Options.AckAlone documents: an ack then means one
// copy), the old leader, made to lead, lacks exactly what was acked alone,
// and nothing acked before.
func TestPair_RiskStageKillNewLeader(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.sendN(ctx, 0, 10, "a")
	ps.stop(0)
	ps.promote(true)
	ps.sendN(ctx, 1, 20, "b")
	ps.stop(1)
	ps.start(1)
	ps.renew() // the restarted leader at an epoch of its own (its follower down)
	p, err := ps.rep(1).LeaderPartition(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if next := p.Stats().Next; next != 30 {
		t.Fatalf("the lone leader, restarted on its disk, holds %d messages, 30 acked", next)
	}
	ps.stop(1)
	if err := os.RemoveAll(ps.dirs[1]); err != nil {
		t.Fatal(err)
	}
	ps.start(0)
	ps.promote(true)
	got := ps.logOf(0)
	if len(got) != 10 {
		t.Fatalf("after the lone copy's loss the old leader holds %d messages, want the 10 acked on both copies", len(got))
	}
	for k, m := range got {
		if m.ID != fmt.Sprintf("a%d", k) {
			t.Fatalf("offset %d holds %s, want a%d", k, m.ID, k)
		}
	}
}
