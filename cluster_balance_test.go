package mq_test

import (
	"errors"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_BalanceLeadersUnderLoad: six Raft3 groups, all led by n1,
// while a sender on each node sends to every partition; BalanceLeaders
// moves four of them, each node then leads two, and every acked message
// is stored once at the offset of its ack, each key in send order. A
// second call finds nothing to move.
func TestCluster_BalanceLeadersUnderLoad(t *testing.T) {
	parallelByDefault(t)
	const parts = 6
	c := newCluster(t, 3)
	createR3With(t, c, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 1})
	for i := range parts {
		if lead := leaderOf(t, c, i); lead != "n1" {
			if err := mq.Raft3TransferTo(c.nodes[lead], r3, i, "n1"); err != nil {
				t.Fatalf("move r3/%d to n1: %v", i, err)
			}
		}
	}
	waitFor(t, 30*time.Second, "n1 leads every group", func() bool { return len(c.nodes["n1"].ClusterStatus().Leading) == parts })

	ctx := testCtx(t)
	l := newLedger()
	stop := l.sendFrom(ctx, t, c, parts, "n1", "n2", "n3")
	waitFor(t, 30*time.Second, "sends acked", l.atLeast(20, "n1", "n2", "n3"))
	moved, err := c.nodes["n2"].BalanceLeaders(ctx)
	if err != nil || moved != 4 {
		t.Fatalf("BalanceLeaders: %d moved, %v", moved, err)
	}
	waitFor(t, 30*time.Second, "two leaderships each", func() bool {
		for _, m := range c.nodes {
			if len(m.ClusterStatus().Leading) != 2 {
				return false
			}
		}
		return true
	})
	before := l.total()
	waitFor(t, 30*time.Second, "sends acked after the moves", func() bool { return l.total() >= before+60 })
	stop()
	if moved, err := c.nodes["n3"].BalanceLeaders(ctx); err != nil || moved != 0 {
		t.Errorf("a second BalanceLeaders: %d moved, %v", moved, err)
	}
	for _, id := range othersThan(c) {
		l.check(t, c.nodes[id], parts)
	}
	t.Logf("%d acked", l.total())
}

// TestCluster_BalanceLeadersNeedsAdmin: a node whose identity lacks the
// Admin right on "*" cannot balance, and a standalone MQ or a closed one
// says why at once.
func TestCluster_BalanceLeadersNeedsAdmin(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx := testCtx(t)
	admin := []mq.ACLRule{{Identity: "n1", Topic: "*", Rights: mq.Admin}, {Identity: "*", Topic: "*", Rights: mq.Produce | mq.Consume}}
	if err := c.nodes["n1"].SetACL(ctx, admin); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the ACL on n2", func() bool {
		_, err := c.nodes["n2"].BalanceLeaders(ctx)
		return errors.Is(err, mq.ErrDenied)
	})
	if _, err := c.nodes["n1"].BalanceLeaders(ctx); err != nil {
		t.Errorf("n1, an admin: %v", err)
	}
	standalone, err := mq.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := standalone.BalanceLeaders(ctx); !errors.Is(err, mq.ErrUnsupportedType) {
		t.Errorf("standalone: %v", err)
	}
	standalone.Close()
	if _, err := standalone.BalanceLeaders(ctx); !errors.Is(err, mq.ErrClosed) {
		t.Errorf("closed: %v", err)
	}
}
