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
	c, leader, follower, via, p := dwThirdNodeProducer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.cut(leader, follower, true)
	msg := (&mq.Message{ID: "m", Body: []byte("m")}).ToPartition(0)
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := p.SendMessage(sctx, msg)
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

// TestDoubleWrite_ForwardedSendCtxEndedBeforeSend: a send through a node
// that forwards it to the pair's leader, made with a ctx that ended
// before the call, is never sent: it returns the ctx's error, not
// ErrUnknownOutcome, and the message is not stored.
func TestDoubleWrite_ForwardedSendCtxEndedBeforeSend(t *testing.T) {
	parallelByDefault(t)
	c, _, _, via, p := dwThirdNodeProducer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, deadCancel := context.WithCancel(ctx)
	deadCancel()
	_, err := p.SendMessage(dead, (&mq.Message{ID: "never", Body: []byte("n")}).ToPartition(0))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a send whose ctx ended before it: %v, want the ctx's error", err)
	}
	if errors.Is(err, mq.ErrUnknownOutcome) {
		t.Fatalf("a send never made is reported ErrUnknownOutcome: %v", err)
	}
	expired, expCancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer expCancel()
	_, err = p.SendMessage(expired, (&mq.Message{ID: "never2", Body: []byte("n")}).ToPartition(0))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a send whose deadline passed before it: %v, want the ctx's error", err)
	}
	if errors.Is(err, mq.ErrUnknownOutcome) {
		t.Fatalf("a send never made is reported ErrUnknownOutcome: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	seen := readAll(ctx, t, c.nodes[via], "d", 1)
	if seen["never"] != 0 || seen["never2"] != 0 || seen["warm"] != 1 {
		t.Fatalf("stored %v", seen)
	}
}

// dwThirdNodeProducer starts three nodes with "d" of one pair in sync and
// returns them, the pair's leader and follower, the third node and a
// producer of "d" on it, which sent "warm" to d/0.
func dwThirdNodeProducer(t *testing.T) (c *testCluster, leader, follower, via string, p *mq.Producer) {
	t.Helper()
	c = newCluster(t, 3, withDoubleWrite(1, mq.Options{}))
	leader = c.leaderOf("d", 0)
	follower = dwFollower(c, leader, 0)
	c.waitInSync(0, 10*time.Second)
	via = othersThan(c, leader, follower)[0]
	p, err := c.nodes[via].NewProducer("d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.SendMessage(ctx, (&mq.Message{ID: "warm", Body: []byte("w")}).ToPartition(0)); err != nil {
		t.Fatal(err)
	}
	return c, leader, follower, via, p
}
