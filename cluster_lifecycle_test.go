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

// TestCluster_DrainAndRemoveNode: a node holding a Raft3 replica,
// DoubleWrite replicas and a Single partition is drained while senders
// through another node send to the three topics: its Raft3 replica moves
// to the fourth node, caught up before it votes, its pairs go to other
// nodes, its Single partition moves with its data, and nothing acked is
// lost. Drained, shut down and removed, it is gone from the cluster's
// nodes and from the metadata group's voters; the rest keep taking sends.
// With "meta-crash", the metadata leader, neither the drained node nor
// the one sent through, crashes (cut off, closed, back) once the drain
// started: the next leader carries it on.
func TestCluster_DrainAndRemoveNode(t *testing.T) {
	for _, crash := range []string{"none", "meta-crash"} {
		t.Run(crash, func(t *testing.T) { drainAndRemove(t, crash == "meta-crash") })
	}
}

func drainAndRemove(t *testing.T, crashMeta bool) {
	c := newCluster(t, 4, withSession(3*time.Second), withRaft3(2), withDoubleWrite(2, mq.Options{}), withTopic("s", 2, mq.Options{}))
	for p := range 2 {
		c.waitInSync(p, 30*time.Second)
	}
	var meta string
	if crashMeta {
		waitFor(t, 10*time.Second, "a metadata leader", func() bool {
			meta = c.nodes["n1"].ClusterStatus().Leader
			return meta != ""
		})
	}
	var victim, via string
	for _, id := range othersThan(c, meta) {
		h, _ := holdsOf(c.nodes[id], id)
		if slices.Contains(h, r3+"/0") && victim == "" {
			victim = id
		} else if via == "" {
			via = id
		}
	}
	if victim == "" || via == "" {
		t.Fatalf("no node off the metadata leader %q holding r3/0 (victim %q, via %q)", meta, victim, via)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if owner, _ := singleOwner(c.nodes[via], "s", 0); owner != victim {
		if err := c.nodes[via].MoveReplica(ctx, "s", 0, owner, victim); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "s/0 moved to "+victim, func() bool {
			owner, moving := singleOwner(c.nodes[via], "s", 0)
			return owner == victim && moving == ""
		})
	}
	before, _ := holdsOf(c.nodes[via], victim)
	t.Logf("draining %s, which holds %v; sending through %s", victim, before, via)
	viaNode := c.nodes[via] // never killed; c.nodes changes under the senders
	r := startSender(t, func() *mq.MQ { return viaNode }, r3, 2, "r")
	d := startSender(t, func() *mq.MQ { return viaNode }, "d", 2, "d")
	sg := startSender(t, func() *mq.MQ { return viaNode }, "s", 2, "s")
	time.Sleep(500 * time.Millisecond)

	if err := c.nodes[via].DrainNode(ctx, "nobody"); !errors.Is(err, mq.ErrNoNode) {
		t.Fatalf("drain an unknown node: %v", err)
	}
	if err := c.nodes[via].DrainNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	if crashMeta {
		waitFor(t, time.Minute, "the drain under way", func() bool {
			h, _ := holdsOf(c.nodes[via], victim)
			return len(h) < len(before)
		})
		c.stopCutOff(meta)
		c.start(meta)
		t.Logf("metadata leader %s crashed and restarted during the drain", meta)
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
	rAcked, dAcked, sAcked := r.end(), d.end(), sg.end()
	t.Logf("%d, %d and %d acked while draining", len(rAcked), len(dAcked), len(sAcked))
	if err := c.nodes[via].RemoveNode(ctx, victim); !errors.Is(err, mq.ErrNodeInUse) {
		t.Fatalf("remove a node that is up: %v", err)
	}
	checkStoredOnce(t, c, r3, 2, rAcked)
	checkStoredOnce(t, c, "d", 2, dAcked)
	checkStoredOnce(t, c, "s", 2, sAcked)

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

// TestCluster_MoveSinglePartition: an operator moves a Single partition
// to another node while senders through the third send to it: the
// partition's node freezes it, the node moved to copies it and takes it
// over, and every message acked before, during and after the move is
// stored once, in the order sent, with a consumer group's committed
// offset carried along; the moved-away copy's file is deleted. The move
// is held once the copy is made, and there the node moved to, or the one
// moved from, is killed (closed without a hand-off) and restarted, the
// one moved from before the move ends or after ("from-down"); and a move
// cancelled there by its target's MoveReplica back to the partition's
// node thaws it where it was.
func TestCluster_MoveSinglePartition(t *testing.T) {
	for _, crash := range []string{"none", "to", "from", "from-down", "cancel"} {
		t.Run("crash-"+crash, func(t *testing.T) {
			sm := newSingleMove(t, 2)
			c, from, to, ctx := sm.c, sm.from, sm.to, sm.ctx
			viaNode := c.nodes[sm.via] // never killed; c.nodes changes under the senders
			before := sendAll(ctx, t, viaNode, "s", 1, 50, "before")
			g, err := viaNode.NewConsumer("s", "g", mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "g consumed what was sent before", func() bool {
				lag, err := viaNode.Lag(context.Background(), "s", "g")
				return err == nil && lag[0].Known && lag[0].Lag == 0
			})
			g.Close()

			h := holdMoves(t)
			s := startSender(t, func() *mq.MQ { return viaNode }, "s", 1, "during")
			time.Sleep(300 * time.Millisecond)
			if err := viaNode.MoveReplica(ctx, "s", 0, to, from); !errors.Is(err, mq.ErrInvalidOption) {
				t.Fatalf("a move from a node not holding the partition: %v", err)
			}
			if err := viaNode.MoveReplica(ctx, "s", 0, from, to); err != nil {
				t.Fatal(err)
			}
			h.wait(t, ctx)
			time.Sleep(200 * time.Millisecond) // sends wait meanwhile
			want := to
			switch crash {
			case "to", "from":
				victim := map[string]string{"to": to, "from": from}[crash]
				c.stopCutOff(victim)
				time.Sleep(500 * time.Millisecond)
				c.start(victim)
			case "from-down":
				c.stopCutOff(from)
				h.free()
				waitFor(t, time.Minute, "s/0 on "+to+" with "+from+" down", func() bool {
					owner, moving := singleOwner(viaNode, "s", 0)
					return owner == to && moving == ""
				})
				c.start(from)
			case "cancel":
				if err := viaNode.MoveReplica(ctx, "s", 0, to, from); err != nil {
					t.Fatal(err)
				}
				want = from
			}
			h.free()
			sm.waitOn(t, want, 2*time.Minute)
			time.Sleep(500 * time.Millisecond)
			during := s.end()
			after := sendAll(ctx, t, viaNode, "s", 1, 20, "after")
			t.Logf("%d acked during the move", len(during))
			all := slices.Concat(before, during, after)
			checkStoredOnce(t, c, "s", 1, all)
			checkOrder(ctx, t, c.nodes[want], "s", 0, all)
			if lag, err := c.nodes[want].Lag(context.Background(), "s", "g"); err != nil || lag[0].Committed != uint64(len(before)) {
				t.Fatalf("g's offset after the move: %+v, %v; want %d", lag, err, len(before))
			}
			if owner, _ := singleOwner(viaNode, "s", 1); owner == "" {
				t.Fatal("s/1 has no node")
			}
			if crash != "cancel" {
				waitFor(t, 10*time.Second, "the moved-away file deleted", func() bool { return sm.fileGone(from) })
			}
		})
	}
}

// checkOrder checks that partition i of topic, read through m, holds the
// messages of want in want's order.
func checkOrder(ctx context.Context, t *testing.T, m *mq.MQ, topic string, i int, want []string) {
	t.Helper()
	var got []string
	for off := int64(0); ; off++ {
		msg, err := m.ReadMessage(ctx, topic, i, off)
		if errors.Is(err, mq.ErrNoMessage) {
			break
		}
		if err != nil {
			t.Fatalf("read %s/%d at %d: %v", topic, i, off, err)
		}
		got = append(got, msg.ID)
	}
	at := map[string]int{}
	for k, id := range got {
		if _, dup := at[id]; !dup {
			at[id] = k
		}
	}
	for k := 1; k < len(want); k++ {
		if at[want[k-1]] > at[want[k]] {
			t.Fatalf("%s stored after %s, sent before it", want[k-1], want[k])
		}
	}
}

// TestCluster_MovedRaft3ReplicaRunsUpkeepWhenItLeads: a Raft3 replica
// moved to a node that held none of the group, once it leads, runs the
// partition's upkeep there: a delayed message sent after is released.
func TestCluster_MovedRaft3ReplicaRunsUpkeepWhenItLeads(t *testing.T) {
	c := newCluster(t, 4, withSession(3*time.Second), withRaft3(1))
	var from, to string
	for _, id := range othersThan(c) {
		if h, _ := holdsOf(c.nodes["n1"], id); slices.Contains(h, r3+"/0") {
			from = id
		} else {
			to = id
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.nodes[to].MoveReplica(ctx, r3, 0, from, to); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "r3/0 voters the new placement", func() bool {
		lost, voters := mq.Raft3Membership(c.nodes[to], r3, 0)
		return len(lost) == 0 && slices.Contains(voters, to) && !slices.Contains(voters, from)
	})
	waitFor(t, time.Minute, to+" leads r3/0", func() bool {
		leader, _ := mq.Raft3Leader(c.nodes[to], r3, 0)
		if leader == to {
			return true
		}
		if m := c.nodes[leader]; m != nil {
			_ = mq.Raft3TransferTo(m, r3, 0, to)
		}
		time.Sleep(200 * time.Millisecond)
		return false
	})
	col := collect(t, c.nodes[to], r3, "g")
	p, err := c.nodes[to].NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.SendMessage(ctx, (&mq.Message{ID: "later", Body: []byte("x")}).DeliverAfter(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	waitSeen(t, col, "later")
}
