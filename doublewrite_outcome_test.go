package mq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestDoubleWrite_ForwardedSendUnknownOutcome: a send forwarded to the
// leader's node, which takes it but cannot commit it (its follower cut
// off), and whose ctx ends meanwhile, returns ErrUnknownOutcome, still
// wrapping the ctx's error, never a plain ErrNoQuorum or ctx error: the
// leader may have written it. Resent with the same ID once the link is
// back, it is stored once.
func TestDoubleWrite_ForwardedSendUnknownOutcome(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withDoubleWrite(1, mq.Options{}))
	leader := c.leaderOf("d", 0)
	follower := dwFollower(c, leader, 0)
	c.waitInSync(0, 10*time.Second)
	via := othersThan(c, leader, follower)[0]
	p, err := c.nodes[via].NewProducer("d")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.SendMessage(ctx, (&mq.Message{ID: "warm", Body: []byte("w")}).ToPartition(0)); err != nil {
		t.Fatal(err)
	}
	c.cut(leader, follower, true)
	msg := (&mq.Message{ID: "m", Body: []byte("m")}).ToPartition(0)
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = p.SendMessage(sctx, msg)
	scancel()
	if !errors.Is(err, mq.ErrUnknownOutcome) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, mq.ErrNoQuorum) {
		t.Fatalf("a forwarded send the leader took and could not commit: %v, want ErrUnknownOutcome wrapping the deadline", err)
	}
	c.cut(leader, follower, false)
	if _, err := p.SendMessage(ctx, msg); err != nil {
		t.Fatalf("the resend: %v", err)
	}
	dwCheckStored(ctx, t, c.nodes[via], 1, []string{"warm", "m"})
}
