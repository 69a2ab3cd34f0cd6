package mq_test

import (
	"context"
	"testing"
	"time"
)

// dwLeaderIsolated runs the load of every node on a pair of two partitions
// (sessions of 30 s: only a report moves the pair in time), isolates the
// pair's leader, alive and still taking its own producer's sends, for
// isolated, heals it, and checks every acked message once, in place and in
// order. It returns the cluster, the pair's first leader and its follower.
func dwLeaderIsolated(t *testing.T, isolated time.Duration) (c *testCluster, leader, follower string) {
	t.Helper()
	c = newCluster(t, 3, withSession(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	const parts = 2
	leader, follower, _ = c.createPair(ctx, parts)
	waitFor(t, 10*time.Second, follower+" in sync", func() bool { return c.inSync("d", 0, follower) })
	l := newLoad(c, parts)
	for id := range c.nodes {
		l.run(id)
	}
	defer func() {
		select {
		case <-l.stop:
		default:
			l.finish()
		}
	}()
	time.Sleep(500 * time.Millisecond)
	c.isolate(leader, true)
	time.Sleep(isolated)
	c.isolate(leader, false)
	c.waitUp(3)
	before := l.count()
	waitFor(t, 20*time.Second, "sends acked after the links are back", func() bool {
		return l.count() > before+30
	})
	acked, _ := l.finish()
	dwCheck(t, dwReadOrder(ctx, t, c.nodes[follower], parts), acked, parts)
	return c, leader, follower
}

// TestDoubleWrite_ReportIsolatedLeaderAlive: the pair's leader isolated but
// alive (its own producer keeps sending to its replica) for 4 s, far less
// than a session: the others report it, the metadata leader's probe fails,
// and the pair moves to the follower while the old leader still believes it
// leads. Epoch fencing must keep it from acking anything: every ack of the
// load once, in order, across the move and after the links are back; and
// the pair did move (not waiting out the 30 s session).
func TestDoubleWrite_ReportIsolatedLeaderAlive(t *testing.T) {
	parallelByDefault(t)
	c, leader, follower := dwLeaderIsolated(t, 4*time.Second)
	if now := c.leaderOf("d", 0); now == leader {
		t.Errorf("%s isolated 4 s with reports, still leads d/0 (follower %s): the reports did nothing", leader, follower)
	}
}
