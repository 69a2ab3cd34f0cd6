package mq_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// metaLeader waits until every open node of c names the same metadata
// leader, none of not, and returns it.
func metaLeader(t *testing.T, c *testCluster, d time.Duration, not ...string) string {
	t.Helper()
	var lead string
	waitFor(t, d, "one metadata leader seen by every node", func() bool {
		lead = ""
		for _, m := range c.nodes {
			l := m.ClusterStatus().Leader
			if l == "" || slices.Contains(not, l) || lead != "" && l != lead {
				return false
			}
			lead = l
		}
		return true
	})
	return lead
}

// TestCluster_MetadataVoterBackEmpty: a voter of the metadata group whose
// disk is replaced comes back under its node id with an empty directory.
// The leader L commits topics with A while B, cut off from L, lags; then L
// and A stop and A comes back empty. raft's safety needs each voter that
// held a committed entry to remember it: A, its log empty, must grant B no
// vote, and B must never lead without what L and A committed. Once L is
// back, A leaves the voters and joins again as a new server, votes again,
// and every topic is in every node's state; with L gone after that, A and
// B elect a leader, which needs A's vote or its campaign.
func TestCluster_MetadataVoterBackEmpty(t *testing.T) {
	c := newCluster(t, 3, withSession(3*time.Second))
	lead := metaLeader(t, c, 20*time.Second)
	others := othersThan(c, lead)
	a, b := others[0], others[1]
	t.Logf("metadata leader %s, A %s (to be wiped), B %s (lagging)", lead, a, b)
	waitFor(t, 20*time.Second, "every node votes", func() bool {
		for _, m := range c.nodes {
			if !mq.MetaMayVote(m) {
				return false
			}
		}
		return true
	})

	c.cut(lead, b, true)
	time.Sleep(300 * time.Millisecond)
	var topics []string
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 5 {
		name := fmt.Sprintf("committed-%d", i)
		if err := c.nodes[lead].CreateMQ(ctx, name, 1, mq.Options{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		topics = append(topics, name)
	}
	_, committed := mq.MetaIndexes(c.nodes[lead])
	bLast, _ := mq.MetaIndexes(c.nodes[b])
	t.Logf("L committed %d, B's log ends at %d", committed, bLast)
	if bLast >= committed {
		t.Fatalf("B, cut off from the leader, caught up (%d >= %d)", bLast, committed)
	}

	// L and A stop, cut off so that neither hands its leadership to B;
	// A comes back with an empty directory.
	c.stopCutOff(lead, a)
	c.wipe(a)

	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if last, _ := mq.MetaIndexes(c.nodes[b]); c.nodes[b].ClusterStatus().Leader == b && last < committed {
			t.Fatalf("%s leads the metadata group with its log ending at %d, before the %d committed by %s and %s", b, last, committed, lead, a)
		}
	}
	if mq.MetaMayVote(c.nodes[a]) {
		t.Fatalf("%s, back with an empty directory, votes before the group registered it again", a)
	}

	c.start(lead)
	waitFor(t, 60*time.Second, "A a voter again, voting", func() bool {
		voters := mq.MetaVoters(c.nodes[lead])
		return slices.Contains(voters, a) && len(voters) == 3 && mq.MetaMayVote(c.nodes[a])
	})
	for id, m := range c.nodes {
		waitFor(t, 30*time.Second, "every committed topic on "+id, func() bool {
			for _, tp := range topics {
				if !mq.MetaHasTopic(m, tp) {
					return false
				}
			}
			return true
		})
	}

	// Without L, A and B elect a leader: one of them votes for the other.
	c.kill(lead)
	nl := metaLeader(t, c, 60*time.Second, lead)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	if err := c.nodes[nl].CreateMQ(ctx2, "after", 1, mq.Options{}); err != nil {
		t.Fatalf("create a topic with %s and %s: %v", a, b, err)
	}
}
