package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestDoubleWrite_AcceptDataLossAfterTheOnlyCopyIsLost: a pair acks alone
// (AckAlone, its follower cut off), then its leader loses its disk. No
// copy is known to hold what it acked: sends fail at once with
// ErrNoQuorum and ClusterStatus's Failed says why, and the pair stays so.
// An operator's AcceptDataLoss, naming the follower, makes it lead with
// what it holds: every message acked while both were in sync is there,
// new sends are acked and stored once, and the wiped node catches up as
// its follower. With a replica in sync, or a leader that is no replica,
// AcceptDataLoss is refused.
func TestDoubleWrite_AcceptDataLossAfterTheOnlyCopyIsLost(t *testing.T) {
	parallelByDefault(t)
	const parts = 3
	c := newCluster(t, 3, withSession(8*time.Second), withDoubleWrite(parts, mq.Options{AckAlone: true, PartitionsPerPair: 1}))
	part, leader, follower, third, before := noIntactCopy(t, c, parts, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p, err := c.nodes[third].NewProducer("d")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	start := time.Now()
	_, err = p.SendMessage(sctx, (&mq.Message{ID: "refused", Body: []byte("x")}).ToPartition(part))
	scancel()
	if !errors.Is(err, mq.ErrNoQuorum) || time.Since(start) > 5*time.Second {
		t.Fatalf("a send with no intact copy: %v after %v", err, time.Since(start))
	}

	for _, bad := range []string{third, leader} {
		// A node that is no replica; the leader, whose copy was lost:
		// its empty log would contradict what the follower committed.
		if err := c.nodes[third].AcceptDataLoss(ctx, "d", part, bad); !errors.Is(err, mq.ErrInvalidOption) {
			t.Fatalf("AcceptDataLoss naming %s: %v", bad, err)
		}
	}
	if err := c.nodes[third].AcceptDataLoss(ctx, "d", part, follower); err != nil {
		t.Fatalf("AcceptDataLoss: %v", err)
	}
	// AcceptDataLoss returns once the caller's state shows the decision.
	if ld, _, inSync, _ := mq.PairRecord(c.nodes[third], "d", part); ld != follower || !slices.Equal(inSync, []string{follower}) {
		t.Fatalf("after AcceptDataLoss: leader %s, in sync %q", ld, inSync)
	}
	after, err := dwSend(c.nodes[third], parts, part, 50, "after", 60*time.Second)
	if err != nil {
		t.Fatalf("sends after AcceptDataLoss: %v", err)
	}
	c.waitInSync(part, 60*time.Second)
	for _, id := range othersThan(c) {
		seen := dwCheckStored(ctx, t, c.nodes[id], parts, append(slices.Clone(before), after...))
		if seen["refused"] != 0 {
			t.Errorf("a send refused with ErrNoQuorum is stored, read through %s", id)
		}
	}
}

// noIntactCopy brings a pair of d to the state AcceptDataLoss is for,
// which refuses it before: 50 "before" messages acked while both were in sync, 20
// "alone" ones acked by the leader alone, then the leader's directory
// replaced. The record has no replica in sync. alone, if not nil, runs
// once the "alone" messages are acked, before the leader is killed.
func noIntactCopy(t *testing.T, c *testCluster, parts int, alone func(part int, third string, acked []string)) (part int, leader, follower, third string, before []string) {
	t.Helper()
	part, leader, follower = dwPairOff(t, c, parts)
	c.waitInSync(part, 10*time.Second)
	third = othersThan(c, leader, follower)[0]
	before, err := dwSend(c.nodes[third], parts, part, 50, "before", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.waitInSync(part, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.nodes[third].AcceptDataLoss(ctx, "d", part, follower); !errors.Is(err, mq.ErrInvalidOption) {
		t.Fatalf("AcceptDataLoss with the follower in sync: %v", err)
	}
	c.cut(leader, follower, true)
	waitFor(t, time.Minute, "the leader alone in sync", func() bool {
		_, _, inSync := c.record("d", part)
		return slices.Equal(inSync, []string{leader})
	})
	acked, err := dwSend(c.nodes[third], parts, part, 20, "alone", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if alone != nil {
		alone(part, third, append(slices.Clone(before), acked...))
	}
	c.isolate(leader, true)
	c.kill(leader)
	c.isolate(leader, false)
	if err := os.RemoveAll(filepath.Join(c.root, leader)); err != nil {
		t.Fatal(err)
	}
	c.start(leader)
	c.cut(leader, follower, false)
	waitFor(t, 30*time.Second, "no replica in sync", func() bool {
		ld, _, inSync := c.record("d", part)
		return ld == leader && len(inSync) == 0
	})
	waitFor(t, 30*time.Second, "the pair failed on "+leader, func() bool {
		return strings.Contains(c.nodes[leader].ClusterStatus().Failed[fmt.Sprintf("d/%d", part)], "no intact copy")
	})
	return part, leader, follower, third, before
}

// TestDoubleWrite_NoIntactCopyOutlastsItsFollowersAbsence: a pair with no
// intact copy waits for an operator's AcceptDataLoss, also while its
// follower, which holds every message acked while both were in sync, is
// down (its node closed, its data kept): the metadata leader's failover
// does not replace it, so the wiped leader is never recorded in sync.
// (Before, ReplaceFollower recorded it so: it led its empty log, and the
// 50 messages acked while both held them were gone.)
func TestDoubleWrite_NoIntactCopyOutlastsItsFollowersAbsence(t *testing.T) {
	const parts = 3
	c := newCluster(t, 3, withSession(4*time.Second), withDoubleWrite(parts, mq.Options{AckAlone: true, PartitionsPerPair: 1}))
	part, leader, follower, third, before := noIntactCopy(t, c, parts, nil)
	c.kill(follower)                             // its data stays: the only copy of the "before" messages
	deadline := time.Now().Add(10 * time.Second) // past two sessions
	for time.Now().Before(deadline) {
		ld, reps, inSync := c.record("d", part)
		if len(inSync) > 0 {
			t.Logf("without AcceptDataLoss the record became leader %s, replicas %q, in sync %q", ld, reps, inSync)
			after, err := dwSend(c.nodes[third], parts, part, 5, "after", 20*time.Second)
			t.Logf("sends after: %d acked, %v", len(after), err)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			seen := readAll(ctx, t, c.nodes[third], "d", parts)
			lost := 0
			for _, id := range before {
				if seen[id] == 0 {
					lost++
				}
			}
			t.Fatalf("the wiped leader %s was recorded in sync with no AcceptDataLoss (its follower %s down): %d of %d messages acked while both were in sync are not read; %d sends acked after",
				leader, follower, lost, len(before), len(after))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDoubleWrite_AcceptDataLossKeepsConsumersFromSkippingNewSends: a
// consumer has taken the whole tail the lost copy alone held (its handler
// holds the last message of it), and its partition's new leader, after
// AcceptDataLoss, gives the offsets of that tail to new sends. The
// consumer still gets every new message, in the order sent: its position
// past the new leader's end is fenced (the leader's first entry), and it
// goes on from the offset the new leader holds for its group.
func TestDoubleWrite_AcceptDataLossKeepsConsumersFromSkippingNewSends(t *testing.T) {
	parallelByDefault(t)
	const parts = 3
	c := newCluster(t, 3, withSession(8*time.Second), withDoubleWrite(parts, mq.Options{AckAlone: true, PartitionsPerPair: 1}))
	col := &collector{}
	held, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the consumer's Close, which waits for the handler
	var last string
	hold := mq.ListenerFunc(func(ctx context.Context, topic string, m *mq.Message) error {
		if m.ID == last {
			select {
			case held <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return col.OnMessage(ctx, topic, m)
	})
	part, _, follower, third, _ := noIntactCopy(t, c, parts, func(part int, third string, acked []string) {
		last = acked[len(acked)-1]
		consume(t, c.nodes[third], "d", "g", hold)
		waitSeen(t, col, acked[:len(acked)-1]...)
		select { // its position: past what the follower holds
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatalf("the handler never held %s", last)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := c.nodes[third].AcceptDataLoss(ctx, "d", part, follower); err != nil {
		t.Fatalf("AcceptDataLoss: %v", err)
	}
	after, err := dwSend(c.nodes[third], parts, part, 50, "after", 60*time.Second)
	free()
	if err != nil {
		t.Fatalf("sends after AcceptDataLoss: %v", err)
	}
	waitFor(t, 60*time.Second, "every new message delivered", func() bool {
		ids := col.ids()
		for _, id := range after {
			if ids[id] == 0 {
				return false
			}
		}
		return true
	})
	var order []string // first deliveries of the new messages
	got := map[string]bool{}
	col.mu.Lock()
	delivered := slices.Clone(col.msgs)
	col.mu.Unlock()
	for _, m := range delivered {
		if strings.HasPrefix(m.ID, "after-") && !got[m.ID] {
			got[m.ID] = true
			order = append(order, m.ID)
		}
	}
	if !slices.Equal(order, after) {
		t.Fatalf("new messages first delivered in the order %q, sent %q", order, after)
	}
}
