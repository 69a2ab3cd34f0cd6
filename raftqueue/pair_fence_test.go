package raftqueue

import (
	"context"
	"testing"

	"github.com/zeze-go/mq/store"
)

// TestPair_LeadAfterLossFencesFirst: a replica that leads the epoch at
// which a loss was accepted writes the fence before anything else, on
// both copies: the group's owner from before is refused, the fence's
// record holds the log's end, and a read at the leader waits for it. A
// later epoch's leader whose log holds the fence does not fence again.
func TestPair_LeadAfterLossFencesFirst(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("a"), msg("b")); err != nil {
		t.Fatal(err)
	}
	claim, err := ps.rep(0).Apply(ctx, &store.Command{Op: store.OpClaim, Now: t0, Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	// The follower leads epoch 2 after the loss, replicating to the old
	// leader.
	if err := ps.rep(0).Follow(2); err != nil {
		t.Fatal(err)
	}
	if err := ps.rep(1).LeadAfterLoss(2, pairLink{ps, 1}, false, 2); err != nil {
		t.Fatal(err)
	}
	ps.mu.Lock()
	ps.epoch, ps.leader, ps.ledBy[2] = 2, 1, 1
	ps.mu.Unlock()
	part, err := ps.rep(1).LeaderPartition(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	mark, ok, err := part.Group(store.FenceRecord)
	if err != nil || !ok || mark.Offset != 2 {
		t.Fatalf("the fence's record at the new leader: %+v %v %v, want offset 2", mark, ok, err)
	}
	if _, err := ps.rep(1).Apply(ctx, &store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g", Generation: claim.Generation, Offset: 2}); err == nil {
		t.Fatal("the owner from before the fence committed")
	}
	if _, err := ps.send(ctx, 1, msg("c")); err != nil {
		t.Fatal(err)
	}
	ps.settle()
	follower, err := ps.rep(0).Partition(0)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok, err := follower.Group(store.FenceRecord); err != nil || !ok || m != mark {
		t.Fatalf("the fence's record on the follower: %+v %v %v, want %+v", m, ok, err, mark)
	}
	// The next epoch, the loss still on record: the log holds the fence.
	ps.renewAfterLoss(2)
	part, err = ps.rep(1).LeaderPartition(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if again, _, _ := part.Group(store.FenceRecord); again != mark {
		t.Fatalf("fenced again at the next epoch: %+v, was %+v", again, mark)
	}
}

// renewAfterLoss is renew for a pair whose loss was accepted at accepted.
func (ps *pairs) renewAfterLoss(accepted uint64) {
	ps.t.Helper()
	ps.mu.Lock()
	ps.epoch++
	epoch, leader := ps.epoch, ps.leader
	ps.ledBy[epoch] = leader
	ps.mu.Unlock()
	if err := ps.rep(1 - leader).Follow(epoch); err != nil {
		ps.t.Fatal(err)
	}
	if err := ps.rep(leader).LeadAfterLoss(epoch, pairLink{ps, leader}, false, accepted); err != nil {
		ps.t.Fatal(err)
	}
}
