package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	part, leader, follower := dwPairOff(t, c, parts)
	c.waitInSync(part, 10*time.Second)
	third := othersThan(c, leader, follower)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	before, err := dwSend(c.nodes[third], parts, part, 50, "before", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.waitInSync(part, 10*time.Second)
	if err := c.nodes[third].AcceptDataLoss(ctx, "d", part, follower); !errors.Is(err, mq.ErrInvalidOption) {
		t.Fatalf("AcceptDataLoss with the follower in sync: %v", err)
	}

	c.cut(leader, follower, true)
	waitFor(t, 20*time.Second, "the leader alone in sync", func() bool {
		_, _, inSync := c.record("d", part)
		return slices.Equal(inSync, []string{leader})
	})
	if _, err := dwSend(c.nodes[third], parts, part, 20, "alone", 30*time.Second); err != nil {
		t.Fatal(err)
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

	if err := c.nodes[third].AcceptDataLoss(ctx, "d", part, third); !errors.Is(err, mq.ErrInvalidOption) {
		t.Fatalf("AcceptDataLoss naming a node that is no replica: %v", err)
	}
	if err := c.nodes[third].AcceptDataLoss(ctx, "d", part, follower); err != nil {
		t.Fatalf("AcceptDataLoss: %v", err)
	}
	if ld, _, inSync := c.record("d", part); ld != follower || !slices.Equal(inSync, []string{follower}) {
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
