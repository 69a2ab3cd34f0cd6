package mq_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// holdsOf returns what m's status says node id holds, and whether it
// lists id.
func holdsOf(m *mq.MQ, id string) ([]string, bool) {
	for _, nd := range m.ClusterStatus().Nodes {
		if nd.ID == id {
			return nd.Holds, true
		}
	}
	return nil, false
}

// TestCluster_DrainAndRemoveNode: a node holding a Raft3 replica and
// DoubleWrite replicas is drained while senders through another node send
// to both topics: its Raft3 replica moves to the fourth node, caught up
// before it votes, its pairs go to other nodes, and nothing acked is
// lost. Drained, shut down and removed, it is gone from the cluster's
// nodes and from the metadata group's voters; the rest keep taking sends.
func TestCluster_DrainAndRemoveNode(t *testing.T) {
	c := newCluster(t, 4, withSession(3*time.Second), withRaft3(2), withDoubleWrite(2, mq.Options{}))
	for p := range 2 {
		c.waitInSync(p, 30*time.Second)
	}
	var victim, via string
	for _, id := range othersThan(c) {
		h, _ := holdsOf(c.nodes["n1"], id)
		if slices.Contains(h, r3+"/0") && victim == "" {
			victim = id
		} else if via == "" {
			via = id
		}
	}
	before, _ := holdsOf(c.nodes[via], victim)
	t.Logf("draining %s, which holds %v; sending through %s", victim, before, via)
	viaNode := c.nodes[via] // never killed; c.nodes changes under the senders
	r := startSender(t, func() *mq.MQ { return viaNode }, r3, 2, "r")
	d := startSender(t, func() *mq.MQ { return viaNode }, "d", 2, "d")
	time.Sleep(500 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.nodes[via].DrainNode(ctx, "nobody"); !errors.Is(err, mq.ErrNoNode) {
		t.Fatalf("drain an unknown node: %v", err)
	}
	if err := c.nodes[via].DrainNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, victim+" drained", func() bool {
		h, _ := holdsOf(c.nodes[via], victim)
		return len(h) == 0
	})
	waitFor(t, time.Minute, "r3's replicas voters, the moved one gone", func() bool {
		for _, id := range othersThan(c, victim) {
			lost, voters := mq.Raft3Membership(c.nodes[id], r3, 0)
			if len(lost) > 0 || voters != nil && (len(voters) != 3 || slices.Contains(voters, victim)) {
				return false
			}
		}
		return true
	})
	for p := range 2 {
		c.waitInSync(p, time.Minute)
	}
	time.Sleep(500 * time.Millisecond)
	rAcked, dAcked := r.end(), d.end()
	t.Logf("%d and %d acked while draining", len(rAcked), len(dAcked))
	if err := c.nodes[via].RemoveNode(ctx, victim); !errors.Is(err, mq.ErrNodeInUse) {
		t.Fatalf("remove a node that is up: %v", err)
	}
	checkStoredOnce(t, c, r3, 2, rAcked)
	checkStoredOnce(t, c, "d", 2, dAcked)

	c.kill(victim)
	waitFor(t, time.Minute, victim+" removed", func() bool {
		err := c.nodes[via].RemoveNode(ctx, victim)
		if err != nil && !errors.Is(err, mq.ErrNodeInUse) {
			t.Fatalf("remove %s: %v", victim, err)
		}
		return err == nil
	})
	for id, m := range c.nodes {
		waitFor(t, 30*time.Second, victim+" gone from the nodes and voters seen by "+id, func() bool {
			_, listed := holdsOf(m, victim)
			return !listed && !slices.Contains(mq.MetaVoters(m), victim)
		})
	}
	acked := sendAll(ctx, t, c.nodes[via], r3, 2, 20, "after")
	checkStoredOnce(t, c, r3, 2, append(rAcked, acked...))
}

// checkStoredOnce checks that each of acked is stored once in topic's
// parts partitions, read through every open node.
func checkStoredOnce(t *testing.T, c *testCluster, topic string, parts int, acked []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range othersThan(c) {
		seen := readAll(ctx, t, c.nodes[id], topic, parts)
		missing := 0
		for _, a := range acked {
			if seen[a] != 1 {
				if missing++; missing <= 3 {
					t.Errorf("read through %s: acked %s stored %d times", id, a, seen[a])
				}
			}
		}
		if missing > 0 {
			t.Errorf("read through %s: %d of %d acked messages of %s not stored once", id, missing, len(acked), topic)
		}
	}
}

// TestCluster_MoveReplicaByHand: an operator moves a Raft3 replica to the
// fourth node and a DoubleWrite follower to the node placement chooses
// while senders send, and the
// move completes even when the node moved to, or the one moved from, is
// killed (closed without a hand-off) in the middle and restarted: every
// acked message is stored once, and the group's voters and the pair's
// replicas are the new placement. A move the placement refuses changes
// nothing.
func TestCluster_MoveReplicaByHand(t *testing.T) {
	for _, crash := range []string{"none", "to", "from"} {
		t.Run("crash-"+crash, func(t *testing.T) {
			c := newCluster(t, 4, withSession(3*time.Second), withRaft3(1), withDoubleWrite(1, mq.Options{}))
			c.waitInSync(0, 30*time.Second)
			var from, to string
			for _, id := range othersThan(c) {
				if h, _ := holdsOf(c.nodes["n1"], id); slices.Contains(h, r3+"/0") {
					if from == "" && slices.Contains(h, "d/0") && !leadsPair(c, id) {
						from = id
					}
				} else {
					to = id
				}
			}
			if from == "" || to == "" {
				t.Skipf("placement gave no node both a Raft3 replica and a DoubleWrite follower (%v)", c.nodes["n1"].ClusterStatus().Nodes)
			}
			via := othersThan(c, from, to)[0]
			t.Logf("moving r3/0 from %s to %s and d/0's follower away from it, sending through %s", from, to, via)
			viaNode := c.nodes[via] // never killed; c.nodes changes under the senders
			r := startSender(t, func() *mq.MQ { return viaNode }, r3, 1, "r")
			d := startSender(t, func() *mq.MQ { return viaNode }, "d", 1, "d")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := c.nodes[via].MoveReplica(ctx, r3, 0, to, from); !errors.Is(err, mq.ErrInvalidOption) {
				t.Fatalf("a move from a node holding no replica: %v", err)
			}
			if err := c.nodes[via].MoveReplica(ctx, r3, 0, from, to); err != nil {
				t.Fatal(err)
			}
			if err := c.nodes[via].MoveReplica(ctx, "d", 0, from, ""); err != nil { // to the node placement chooses
				t.Fatal(err)
			}
			if crash != "none" {
				victim := map[string]string{"to": to, "from": from}[crash]
				time.Sleep(200 * time.Millisecond)
				c.stopCutOff(victim)
				time.Sleep(time.Second)
				c.start(victim)
			}
			waitFor(t, 2*time.Minute, "r3/0 voters the new placement", func() bool {
				for _, id := range othersThan(c) {
					lost, voters := mq.Raft3Membership(c.nodes[id], r3, 0)
					if len(lost) > 0 || voters != nil && !slices.Contains(voters, to) || slices.Contains(voters, from) {
						return false
					}
				}
				return true
			})
			c.waitInSync(0, time.Minute)
			// A node killed in the middle may make the pair replace its
			// new follower by load, even with the one moved from.
			if _, replicas, _ := c.record("d", 0); crash == "none" && slices.Contains(replicas, from) {
				t.Fatalf("d/0's replicas %v after the move from %s", replicas, from)
			}
			time.Sleep(300 * time.Millisecond)
			rAcked, dAcked := r.end(), d.end()
			t.Logf("%d and %d acked during the move", len(rAcked), len(dAcked))
			checkStoredOnce(t, c, r3, 1, rAcked)
			checkStoredOnce(t, c, "d", 1, dAcked)
		})
	}
}

// leadsPair reports whether node id leads d/0.
func leadsPair(c *testCluster, id string) bool {
	leader, _, _ := c.record("d", 0)
	return leader == id
}
