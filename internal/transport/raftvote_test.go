package transport

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// startGated starts n's raft of group g bootstrapped with ids, over
// NewRaftTransport on a layer whose Vote and Campaign both follow may.
func startGated(t *testing.T, n *node, g string, ids []string, may *atomic.Bool) *member {
	t.Helper()
	l, err := n.m.Layer(g, LayerConfig{Member: anyone,
		Vote: func(string) bool { return may.Load() }, Campaign: may.Load})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return runMember(t, n, NewRaftTransport(l), newStores(), ids)
}

// TestRaftLayer_ReplicaThatMayNotVoteNeitherVotesNorLeads: a replica whose
// layer says it may not vote (LayerConfig.Vote, Campaign: its log lacks
// what it acknowledged) grants no vote or pre-vote and asks for none. The
// group elects one of the other two; told to hand its leadership to the
// replica, the leader's transfer fails and it stays leader; with the leader cut off, the one
// left cannot win without the replica's vote. Once the replica may vote
// again, a leader is elected among the two.
func TestRaftLayer_ReplicaThatMayNotVoteNeitherVotesNorLeads(t *testing.T) {
	verifyNone(t)
	nodes := threeNodes(t, newBook())
	ids := []string{"n1", "n2", "n3"}
	var yes, gated atomic.Bool
	yes.Store(true)
	ms := []*member{startGated(t, nodes[0], "g", ids, &gated), startGated(t, nodes[1], "g", ids, &yes), startGated(t, nodes[2], "g", ids, &yes)}
	apply(t, ms, "a", 20)
	lead := waitLeader(t, ms)
	if lead.id == "n1" {
		t.Fatal("n1, which may not campaign, leads")
	}
	if err := lead.r.LeadershipTransferToServer("n1", "n1").Error(); err == nil {
		t.Fatal("a transfer to n1, which may not campaign, succeeded")
	}
	if l := waitLeader(t, ms); l != lead {
		t.Fatalf("%s leads after a failed transfer, not %s", l.id, lead.id)
	}

	lead = waitLeader(t, ms)
	isolate(nodes, nodeByID(nodes, lead.id), true)
	rest := without(ms, lead)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, m := range rest {
			if m.r.State() == raft.Leader {
				t.Fatalf("%s leads without a vote from another replica", m.id)
			}
		}
	}
	gated.Store(true)
	if l := waitLeader(t, rest); l.id == lead.id {
		t.Fatal("the cut off leader leads")
	}
	apply(t, rest, "b", 10)
}
