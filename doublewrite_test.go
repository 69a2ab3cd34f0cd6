package mq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestDoubleWrite_Refusals: a DoubleWrite topic needs two nodes up
// (ErrNoQuorum at once on one) and a cluster (ErrUnsupportedType
// standalone); AckAlone is for DoubleWrite only.
func TestDoubleWrite_Refusals(t *testing.T) {
	c := newCluster(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.nodes["n1"].CreateMQ(ctx, "d", 1, mq.Options{Type: mq.DoubleWrite}); !errors.Is(err, mq.ErrNoQuorum) {
		t.Fatalf("DoubleWrite on one node: %v, want ErrNoQuorum", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("refused after %v: not at once", took)
	}
	if err := c.nodes["n1"].CreateMQ(ctx, "s", 1, mq.Options{AckAlone: true}); !errors.Is(err, mq.ErrInvalidOption) {
		t.Fatalf("AckAlone on a Single topic: %v, want ErrInvalidOption", err)
	}
	m := openNode(t, t.TempDir())
	if err := m.CreateMQ(ctx, "d", 1, mq.Options{Type: mq.DoubleWrite}); !errors.Is(err, mq.ErrUnsupportedType) {
		t.Fatalf("DoubleWrite standalone: %v, want ErrUnsupportedType", err)
	}
}

// TestDoubleWrite_SendConsumeFailover: a DoubleWrite topic on three nodes
// takes sends from every node and a consumer group receives them; the
// leader's node killed, its follower is promoted, a new follower caught up,
// and sends go on (refused with ErrNoQuorum or outcome-unknown meanwhile,
// never lost): every acked message is stored once, in its partition.
func TestDoubleWrite_SendConsumeFailover(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const parts = 2
	if err := c.nodes["n2"].CreateMQ(ctx, "d", parts, mq.Options{Type: mq.DoubleWrite}); err != nil {
		t.Fatalf("CreateMQ DoubleWrite: %v", err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()["d"] == parts })
	}
	var mu sync.Mutex
	var acked []string
	sendFrom := func(ids []string, tag string) {
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Go(func() {
				sent := sendAll(ctx, t, c.nodes[id], "d", parts, 30, tag+"-"+id)
				mu.Lock()
				acked = append(acked, sent...)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	sendFrom([]string{"n1", "n2", "n3"}, "a")
	leader := c.leaderOf("d", 0)
	var others []string
	for id := range c.nodes {
		if id != leader {
			others = append(others, id)
		}
	}
	col := collect(t, c.nodes[others[0]], "d", "g")
	waitSeen(t, col, acked...)

	c.kill(leader)
	sendFrom(others, "b")
	waitSeen(t, col, acked...)
	if now := c.leaderOf("d", 0); now == leader {
		t.Fatalf("%s still leads", leader)
	}
	seen := readAll(ctx, t, c.nodes[others[1]], "d", parts)
	for _, id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
	if len(seen) != len(acked) {
		t.Errorf("%d messages stored, %d acked", len(seen), len(acked))
	}
}

// TestDoubleWrite_ClusterRestart: the whole cluster closed and reopened
// from its directories keeps every acked message, once; the leaders, which
// led their epochs before, take new ones (RenewEpoch) and take sends again.
func TestDoubleWrite_ClusterRestart(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const parts = 2
	if err := c.nodes["n1"].CreateMQ(ctx, "d", parts, mq.Options{Type: mq.DoubleWrite}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the topic on n2", func() bool { return c.nodes["n2"].Topics()["d"] == parts })
	acked := sendAll(ctx, t, c.nodes["n2"], "d", parts, 40, "a")
	c.kill("n2")
	c.kill("n1")
	c.start("n1")
	c.start("n2")
	c.waitUp(2)
	acked = append(acked, sendAll(ctx, t, c.nodes["n1"], "d", parts, 40, "b")...)
	seen := readAll(ctx, t, c.nodes["n2"], "d", parts)
	for _, id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
	if len(seen) != len(acked) {
		t.Errorf("%d messages stored, %d acked", len(seen), len(acked))
	}
}

// TestDoubleWrite_FollowerLost: without the risk stage, a pair whose
// follower's node is gone (and no node free to replace it) refuses sends
// with ErrNoQuorum, at once, not a hang; the follower back, it catches up
// and sends are acked again, nothing lost.
func TestDoubleWrite_FollowerLost(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "d", 1, mq.Options{Type: mq.DoubleWrite}); err != nil {
		t.Fatal(err)
	}
	acked := sendAll(ctx, t, c.nodes["n1"], "d", 1, 20, "a")
	leader := c.leaderOf("d", 0)
	follower := "n1"
	if leader == "n1" {
		follower = "n2"
	}
	c.kill(follower)
	p, err := c.nodes[leader].NewProducer("d")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitFor(t, 20*time.Second, "ErrNoQuorum once the follower's node is down", func() bool {
		sctx, scancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer scancel()
		start := time.Now()
		_, err := p.SendMessage(sctx, &mq.Message{ID: "refused", Body: []byte("x")})
		t.Logf("send with the follower down: %v after %v", err, time.Since(start))
		return errors.Is(err, mq.ErrNoQuorum) && !errors.Is(err, context.DeadlineExceeded) && time.Since(start) < 400*time.Millisecond
	})
	c.start(follower)
	c.waitUp(2)
	acked = append(acked, sendAll(ctx, t, c.nodes[leader], "d", 1, 20, "b")...)
	seen := readAll(ctx, t, c.nodes[follower], "d", 1)
	for _, id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
}

// TestDoubleWrite_AckAlone: with the risk stage, a pair whose follower's
// node is gone goes on acking on its leader's copy while a new follower
// catches up (no ErrNoQuorum); the old follower back, the leader is
// killed, the new follower, once in sync, is promoted, and every acked
// message is there, once. The
// loss the option documents (the lone copy's disk) is not caused here: the
// killed nodes keep their disks.
func TestDoubleWrite_AckAlone(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "d", 1, mq.Options{Type: mq.DoubleWrite, AckAlone: true}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()["d"] == 1 })
	}
	leader := c.leaderOf("d", 0)
	var follower, other string
	for id := range c.nodes {
		if id == leader {
			continue
		}
		// The follower is the node holding a replica besides the leader.
		if c.holdsReplica(id, "d", 0) {
			follower = id
		} else {
			other = id
		}
	}
	if follower == "" || other == "" {
		t.Fatalf("leader %s, follower %q, other %q", leader, follower, other)
	}
	acked := sendAll(ctx, t, c.nodes[leader], "d", 1, 30, "a")
	c.kill(follower)
	// Sends go on: no ErrNoQuorum (sendAll would wait it out; count them).
	p, err := c.nodes[leader].NewProducer("d")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	refused := 0
	for i := range 60 {
		msg := &mq.Message{ID: fmt.Sprintf("b-%d", i), Body: []byte("b")}
		for {
			_, err := p.SendMessage(ctx, msg)
			if err == nil {
				break
			}
			if errors.Is(err, mq.ErrNoQuorum) {
				refused++
			} else if !errors.Is(err, mq.ErrUnknownOutcome) {
				t.Fatalf("send %s with the follower gone: %v", msg.ID, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		acked = append(acked, msg.ID)
	}
	if refused > 0 {
		t.Errorf("the risk stage refused %d sends with ErrNoQuorum", refused)
	}
	// The new follower (the third node) catches up and is recorded in sync;
	// then the leader is killed and it is promoted.
	waitFor(t, 30*time.Second, other+" in sync", func() bool { return c.holdsReplica(other, "d", 0) && c.inSync("d", 0, other) })
	c.start(follower) // back, holding no replica now: the metadata group keeps its quorum when the leader goes
	c.waitUp(3)
	c.kill(leader)
	acked = append(acked, sendAll(ctx, t, c.nodes[other], "d", 1, 20, "c")...)
	if now := c.leaderOf("d", 0); now != other {
		t.Fatalf("%s leads, not the in-sync %s", now, other)
	}
	c.start(leader)
	seen := readAll(ctx, t, c.nodes[other], "d", 1)
	for _, id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
}

// TestDoubleWrite_CompactedNewFollower: the replicas compact their logs as
// they go (every 8 entries here); a new follower, chosen when the
// follower's node is lost, finds the leader's log compacted and catches up
// from a snapshot of the leader's sent over the node's port in pieces;
// once in sync it is promoted when the leader is killed (the old follower's
// node back, for the metadata's quorum), and holds every acked message of
// both partitions of the pair, once.
func TestDoubleWrite_CompactedNewFollower(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withNodeOptions(func(string) []mq.Option { return []mq.Option{mq.WithPairCompaction(8, 2)} }))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const parts = 2
	leader, follower, other := c.createPair(ctx, parts)
	acked := sendAll(ctx, t, c.nodes[leader], "d", parts, 100, "a")
	if n, _ := mq.PairReplica(c.nodes[leader], "d", 0); n < 1 {
		t.Fatalf("the leader compacted its log %d times in 100 entries", n)
	}
	c.kill(follower)
	waitFor(t, 30*time.Second, other+" recorded in sync", func() bool { return c.inSync("d", 0, other) })
	if _, in := mq.PairReplica(c.nodes[other], "d", 1); in < 1 {
		t.Fatalf("the new follower caught up with %d snapshots installed", in)
	}
	acked = append(acked, sendAll(ctx, t, c.nodes[leader], "d", parts, 20, "b")...)
	c.start(follower) // back as a node (the metadata's quorum), no longer in the pair
	c.waitUp(3)
	c.kill(leader)
	waitFor(t, 30*time.Second, other+" leads", func() bool { return c.leaderOf("d", 0) == other })
	acked = append(acked, sendAll(ctx, t, c.nodes[other], "d", parts, 10, "c")...)
	seen := readAll(ctx, t, c.nodes[other], "d", parts)
	for _, id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
	if len(seen) != len(acked) {
		t.Errorf("%d messages stored, %d acked", len(seen), len(acked))
	}
}

// TestDoubleWrite_CloseHandsOff: a node that closes cleanly hands the pair
// it leads to its follower in sync at once: the follower leads long
// before the old leader's session would expire (30 s here), the sends go
// on there, and every acked message is stored once.
func TestDoubleWrite_CloseHandsOff(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withSession(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const parts = 2
	leader, follower, other := c.createPair(ctx, parts)
	waitFor(t, 10*time.Second, follower+" in sync", func() bool { return c.inSync("d", 0, follower) })
	acked := sendAll(ctx, t, c.nodes[other], "d", parts, 20, "a")
	start := time.Now()
	c.kill(leader)
	waitFor(t, 10*time.Second, follower+" leads", func() bool { return c.leaderOf("d", 0) == follower })
	t.Logf("%s leads %v after %s began to close", follower, time.Since(start), leader)
	acked = append(acked, sendAll(ctx, t, c.nodes[other], "d", parts, 20, "b")...)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("the sends went on %v after the leader's node closed: not before its session expired", took)
	}
	seen := readAll(ctx, t, c.nodes[follower], "d", parts)
	for _, id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
}
