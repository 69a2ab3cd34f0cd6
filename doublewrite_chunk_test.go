package mq_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// DoubleWrite chunks (Options.PartitionsPerPair > 1): several partitions
// share one pair (one log, one record, one failover). The helpers are in
// doublewrite_helpers_test.go.

// TestDoubleWriteChunk_KillChunkLeadersAlter: four nodes, five partitions in
// chunks of two ({0,1} {2,3} {4}), producers through every node sending
// batches that span the partitions of a chunk; the node leading chunk
// {0,1} is killed, and while the failover runs AlterMQ grows the topic to
// 8 partitions (new chunks {5,6} {7}); then the leader of the new chunk
// {5,6} is killed too. Every chunk must be led by a live node afterwards,
// every partition of a chunk by the same node; every acked message is
// stored once, in its partition, at the offset its ack gave, with its own
// body, in each producer's order.
func TestDoubleWriteChunk_KillChunkLeadersAlter(t *testing.T) {
	parallelByDefault(t)
	var logs nodeLogs
	const parts, grown = 5, 8
	c := newCluster(t, 4, withNodeOptions(logs.opts), withDoubleWrite(parts, mq.Options{PartitionsPerPair: 2}))
	l := newLoad(c, parts)
	defer l.finish()
	for _, id := range othersThan(c) {
		l.runBatches(id, id+"a", grown, []int{0, 1})
		l.runBatches(id, id+"b", grown, []int{2, 3, 4})
	}
	waitFor(t, 20*time.Second, "first acks", func() bool { return l.count() > 40 })
	victim := c.leaderOf("d", 0)
	if v1 := c.leaderOf("d", 1); v1 != victim {
		t.Fatalf("d/0 led by %s, d/1 (same chunk) by %s", victim, v1)
	}
	admin := othersThan(c, victim)[0]
	t.Logf("kill %s, the leader of chunk {0,1}; AlterMQ through %s", victim, admin)
	l.set(victim, nil)
	c.kill(victim)
	actx, acancel := context.WithTimeout(context.Background(), 20*time.Second)
	err := c.nodes[admin].AlterMQ(actx, "d", grown)
	acancel()
	if err != nil {
		t.Fatalf("AlterMQ during the failover: %v", err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the new partitions on "+id, func() bool { return m.Topics()["d"] == grown })
	}
	for _, id := range othersThan(c) {
		l.runBatches(id, id+"c", grown, []int{5, 6, 7})
	}
	waitFor(t, 30*time.Second, "d/0 led by a live node", func() bool {
		for id := range c.nodes {
			if slices.Contains(c.nodes[id].ClusterStatus().Leading, "d/0") {
				return true
			}
		}
		return false
	})
	before := l.count()
	waitFor(t, 30*time.Second, "acks after the first failover", func() bool { return l.count() > before+60 })
	// The new chunks take sends once their followers are in sync (a
	// follower placed on the closed node was replaced by the failover).
	waitFor(t, 30*time.Second, "acks to the new partitions", func() bool { return l.countIn(5) > 0 && l.countIn(7) > 0 })
	victim2 := c.leaderOf("d", 5)
	t.Logf("kill %s, the leader of chunk {5,6}", victim2)
	l.set(victim2, nil)
	c.kill(victim2)
	time.Sleep(3 * time.Second)
	l.set(victim, c.start(victim))
	l.set(victim2, c.start(victim2))
	c.waitUp(4)
	before, before5 := l.count(), l.countIn(5)
	waitFor(t, 30*time.Second, "acks after the restarts", func() bool { return l.count() > before+60 && l.countIn(5) > before5 })
	acked := l.ended(t)
	leaders := dwLeaders(c, grown)
	for _, ch := range [][]int{{0, 1}, {2, 3}, {5, 6}} {
		if leaders[ch[0]] != leaders[ch[1]] {
			t.Errorf("chunk %v led by %s and %s", ch, leaders[ch[0]], leaders[ch[1]])
		}
	}
	per := make([]int, grown)
	for _, a := range acked {
		per[a.part]++
	}
	for i, n := range per {
		if n == 0 {
			t.Errorf("no send acked to d/%d", i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dwCheckAcks(t, dwReadMessages(ctx, t, c.nodes[admin], grown), acked, grown)
	t.Logf("%d acked, per partition %v; leaders %v", len(acked), per, leaders)
}

// TestDoubleWriteChunk_CloseUnderSends: three nodes, one chunk of four
// partitions, producers on every node sending batches over all four (the
// partitions of the chunk applied at once); the leader's node closed with
// them in flight, then, once its follower leads, the new leader's follower
// closed too and both reopened. Each Close returns in bounded time, every
// send returns, sends are acked again, and every acked message is stored
// once where its ack said.
func TestDoubleWriteChunk_CloseUnderSends(t *testing.T) {
	parallelByDefault(t)
	var logs nodeLogs
	const parts = 4
	c := newCluster(t, 3, withNodeOptions(logs.opts), withDoubleWrite(parts, mq.Options{PartitionsPerPair: parts}))
	l := newLoad(c, parts)
	defer l.finish()
	for _, id := range othersThan(c) {
		l.runBatches(id, id+"a", parts, []int{0, 1, 2, 3})
		l.runBatches(id, id+"b", parts, []int{3, 1})
	}
	waitFor(t, 20*time.Second, "first acks", func() bool { return l.count() > 60 })
	closeTimed := func(id string) {
		t.Helper()
		m := c.nodes[id]
		l.set(id, nil)
		done := make(chan error, 1)
		go func() { done <- m.Close() }()
		select {
		case err := <-done:
			t.Logf("close %s: %v", id, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("closing %s with sends in flight on every partition of its chunk takes more than 30s", id)
		}
		delete(c.nodes, id)
	}
	leader := c.leaderOf("d", 0)
	closeTimed(leader)
	var next string
	waitFor(t, 30*time.Second, "a new leader of the chunk", func() bool {
		for id, m := range c.nodes {
			if slices.Contains(m.ClusterStatus().Leading, "d/0") {
				next = id
				return true
			}
		}
		return false
	})
	before := l.count()
	waitFor(t, 30*time.Second, "acks after the promotion", func() bool { return l.count() > before+40 })
	l.set(leader, c.start(leader))
	c.waitUp(3)
	time.Sleep(2 * time.Second)
	f := dwFollower(c, next, 0)
	if f != "" {
		closeTimed(f)
		time.Sleep(2 * time.Second)
		l.set(f, c.start(f))
		c.waitUp(3)
	}
	before = l.count()
	waitFor(t, 30*time.Second, "acks after the follower came back", func() bool { return l.count() > before+40 })
	acked := l.ended(t)
	leaders := dwLeaders(c, parts)
	for i := 1; i < parts; i++ {
		if leaders[i] != leaders[0] {
			t.Errorf("one chunk, leaders %v", leaders)
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, id := range othersThan(c) {
		dwCheckAcks(t, dwReadMessages(ctx, t, c.nodes[id], parts), acked, parts)
	}
	t.Logf("%d acked; closed %s then %s", len(acked), leader, f)
}

// TestDoubleWriteChunk_ClusterRestart: three nodes, seven partitions in
// chunks of three ({0,1,2} {3,4,5} {6}) under load; the whole cluster
// closed mid-load (one node after the other) and reopened from disk (twice
// with ZEZE_FULL=1):
// every acked message is there once, at the offset its ack gave, and each
// chunk takes sends again, led as one.
func TestDoubleWriteChunk_ClusterRestart(t *testing.T) {
	parallelByDefault(t)
	var logs nodeLogs
	const parts = 7
	c := newCluster(t, 3, withNodeOptions(logs.opts), withDoubleWrite(parts, mq.Options{PartitionsPerPair: 3}))
	l := newLoad(c, parts)
	defer l.finish()
	for _, id := range othersThan(c) {
		l.runBatches(id, id+"a", parts, []int{0, 1, 2, 6})
		l.runBatches(id, id+"b", parts, []int{3, 4, 5})
	}
	for round := range sized(1, 2) { // twice with ZEZE_FULL=1
		before := l.count()
		waitFor(t, 30*time.Second, "acks", func() bool { return l.count() > before+40 })
		for _, id := range []string{"n2", "n1", "n3"} {
			l.set(id, nil)
			c.kill(id)
		}
		for _, id := range []string{"n3", "n2", "n1"} {
			l.set(id, c.start(id))
		}
		c.waitUp(3)
		t.Logf("round %d: restarted", round)
	}
	before := l.count()
	waitFor(t, 30*time.Second, "acks after the restarts", func() bool { return l.count() > before+60 })
	acked := l.ended(t)
	leaders := dwLeaders(c, parts)
	if leaders[0] != leaders[1] || leaders[0] != leaders[2] || leaders[3] != leaders[4] || leaders[3] != leaders[5] {
		t.Errorf("chunks not led as one: %v", leaders)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dwCheckAcks(t, dwReadMessages(ctx, t, c.nodes["n2"], parts), acked, parts)
	t.Logf("%d acked; leaders %v", len(acked), leaders)
}

// TestDoubleWriteChunk_IsolateNode: four nodes, six partitions in chunks of
// two; the node leading chunk {0,1} is cut from every other node (not
// killed: it goes on believing it leads until it learns otherwise) while
// producers on every node, its own included, send batches over all
// partitions. Its chunks fail over; nothing it acks may be lost; the links
// back, every chunk takes sends again and every acked message is stored
// once, where its ack said.
func TestDoubleWriteChunk_IsolateNode(t *testing.T) {
	fullOnly(t) // the default run isolates a pair's leader in TestDoubleWrite_ReportIsolatedLeaderAlive
	var logs nodeLogs
	const parts = 6
	c := newCluster(t, 4, withNodeOptions(logs.opts), withDoubleWrite(parts, mq.Options{PartitionsPerPair: 2}))
	l := newLoad(c, parts)
	defer l.finish()
	for _, id := range othersThan(c) {
		l.runBatches(id, id+"a", parts, []int{0, 1, 2})
		l.runBatches(id, id+"b", parts, []int{3, 4, 5})
	}
	waitFor(t, 20*time.Second, "first acks", func() bool { return l.count() > 60 })
	victim := c.leaderOf("d", 0)
	c.isolate(victim, true)
	waitFor(t, 30*time.Second, "chunk {0,1} led by another node", func() bool {
		for _, id := range othersThan(c, victim) {
			if slices.Contains(c.nodes[id].ClusterStatus().Leading, "d/0") {
				return true
			}
		}
		return false
	})
	before := l.count()
	waitFor(t, 30*time.Second, "acks with "+victim+" cut off", func() bool { return l.count() > before+60 })
	time.Sleep(2 * time.Second)
	c.isolate(victim, false)
	c.waitUp(4)
	before = l.count()
	waitFor(t, 30*time.Second, "acks after the links came back", func() bool { return l.count() > before+100 })
	acked := l.ended(t)
	per := make([]int, parts)
	for _, a := range acked {
		per[a.part]++
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dwCheckAcks(t, dwReadMessages(ctx, t, c.nodes[othersThan(c, victim)[0]], parts), acked, parts)
	t.Logf("%d acked, per partition %v; leaders %v", len(acked), per, dwLeaders(c, parts))
}

// TestDoubleWriteChunk_AckAloneLinkCutThenPromote: AckAlone, four nodes, two
// chunks of two; the link between the leader and the follower of the chunk
// off the metadata leader cut while producers send batches over both of
// its partitions: once the follower timeout passed the leader acks alone
// (recorded alone in sync, for the whole chunk). The link back, the
// follower catches up and is recorded in sync again; then the leader is
// killed: the follower is promoted and holds every acked message of both
// partitions, once, where its ack said.
func TestDoubleWriteChunk_AckAloneLinkCutThenPromote(t *testing.T) {
	var logs nodeLogs
	const parts = 4
	c := newCluster(t, 4, withNodeOptions(logs.opts), withDoubleWrite(parts, mq.Options{PartitionsPerPair: 2, AckAlone: true}))
	first, leader, follower, meta := dwChunkOff(t, c, []int{0, 2})
	l := newLoad(c, parts)
	defer l.finish()
	for _, id := range othersThan(c) {
		l.runBatches(id, id+"a", parts, []int{first, first + 1})
	}
	waitFor(t, 20*time.Second, "first acks", func() bool { return l.count() > 40 })
	c.cut(leader, follower, true)
	time.Sleep(3 * time.Second) // past the follower timeout (2s)
	before := l.count()
	waitFor(t, 12*time.Second, "acks with the link "+leader+"-"+follower+" cut (AckAlone)", func() bool { return l.count() > before+40 })
	c.cut(leader, follower, false)
	waitFor(t, 30*time.Second, follower+" in sync again", func() bool {
		_, _, in, _ := mq.PairRecord(c.nodes[meta], "d", first+1)
		return slices.Contains(in, follower)
	})
	before = l.count()
	waitFor(t, 20*time.Second, "acks with the follower in sync", func() bool { return l.count() > before+20 })
	l.set(leader, nil)
	c.kill(leader)
	waitFor(t, 30*time.Second, follower+" promoted", func() bool {
		return slices.Contains(c.nodes[follower].ClusterStatus().Leading, fmt.Sprintf("d/%d", first+1))
	})
	before = l.count()
	waitFor(t, 20*time.Second, "acks after the promotion", func() bool { return l.count() > before+20 })
	acked := l.endedChecked(t, c.nodes[follower], parts)
	t.Logf("%d acked on chunk {%d,%d}; %s then %s led it", len(acked), first, first+1, leader, follower)
}

// TestDoubleWriteChunk_LeaderCutFromMetadata: four nodes, two chunks of two;
// the leader of the chunk off the metadata leader cut from it (it still
// reaches its follower and believes it leads) while producers on every
// node send batches over both partitions of every chunk: its session
// expires and its follower is promoted. Nothing the old leader acks may be
// lost (it must not ack after the promotion); the link back, every acked
// message is stored once, where its ack said, and sends are acked again.
func TestDoubleWriteChunk_LeaderCutFromMetadata(t *testing.T) {
	fullOnly(t) // the default run has TestDoubleWrite_LeaderCutFromMetadata
	var logs nodeLogs
	const parts = 4
	c := newCluster(t, 4, withNodeOptions(logs.opts), withDoubleWrite(parts, mq.Options{PartitionsPerPair: 2}))
	first, leader, follower, meta := dwChunkOff(t, c, []int{0, 2})
	l := newLoad(c, parts)
	defer l.finish()
	for _, id := range othersThan(c) {
		l.runBatches(id, id+"a", parts, []int{first, first + 1})
		l.runBatches(id, id+"b", parts, []int{0, 1, 2, 3})
	}
	waitFor(t, 20*time.Second, "first acks", func() bool { return l.count() > 40 })
	c.cut(leader, meta, true)
	time.Sleep(5 * time.Second)
	t.Logf("cut %s (leader of chunk {%d,%d}) from %s: %s leads %v; %s leads %v", leader, first, first+1, meta,
		leader, c.nodes[leader].ClusterStatus().Leading, follower, c.nodes[follower].ClusterStatus().Leading)
	c.cut(leader, meta, false)
	c.waitUp(4)
	before := l.count()
	waitFor(t, 30*time.Second, "acks after the link came back", func() bool { return l.count() > before+60 })
	acked := l.endedChecked(t, c.nodes[meta], parts)
	t.Logf("%d acked", len(acked))
}
