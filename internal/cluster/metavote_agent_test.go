package cluster

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
)

// rvNet is a metadata group of Metas on raft's in-memory transports whose
// links the test sets one by one, and whose nodes each get their own raft
// timing.
// rvAgent opens agent id on dir with incarnation inc, joining through
// seeds (none: it may start the cluster).
func rvAgent(t *testing.T, id, dir, inc string, seeds ...string) *Agent {
	t.Helper()
	ag, err := OpenAgent(AgentConfig{ID: id, Dir: dir, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: testSecret, InsecurePlaintext: true,
		Incarnation: inc, SessionTimeout: time.Second, HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: agentElection,
		LeaderLeaseTimeout: 100 * time.Millisecond, Partitions: noPartitions, CheckTx: noTx, Logger: discardLogger()})
	if err != nil {
		t.Fatalf("open agent %s: %v", id, err)
	}
	return ag
}

// TestAgent_NewClusterRestartedWhileJoiningElects: a new cluster whose two
// joiners are restarted at once after they open, and then the whole
// cluster restarted, comes back: every replica votes, a topic is created,
// and without n1 the other two elect a leader. (Before a replica without
// state asked its seeds whether they had it registered, about one run of
// twenty deadlocked: n1's latest configuration named them voters before
// they stored an entry, they withheld their votes having applied no
// registration, and n1 stayed a candidate.)
func TestAgent_NewClusterRestartedWhileJoiningElects(t *testing.T) {
	root := t.TempDir()
	dir := func(id string) string { return filepath.Join(root, id) }
	all := map[string]*Agent{}
	t.Cleanup(func() {
		for _, ag := range all {
			ag.Close()
		}
	})
	all["n1"] = rvAgent(t, "n1", dir("n1"), "i-n1")
	seed := all["n1"].Addr()
	for _, delay := range []time.Duration{0, 50 * time.Millisecond, 300 * time.Millisecond} {
		for _, id := range []string{"n2", "n3"} {
			if all[id] != nil {
				all[id].Close()
			}
			all[id] = rvAgent(t, id, dir(id), "i-"+id, seed)
		}
		time.Sleep(delay)
	}
	eventually(t, "n2 and n3 registered", func() bool {
		st := all["n1"].Meta().State()
		a, _ := st.Node("n2")
		b, _ := st.Node("n3")
		return a.Up && b.Up
	})
	for id, ag := range all { // the whole cluster stops at once
		ag.Close()
		delete(all, id)
	}
	all["n1"] = rvAgent(t, "n1", dir("n1"), "i-n1")
	seed = all["n1"].Addr()
	for _, id := range []string{"n2", "n3"} {
		all[id] = rvAgent(t, id, dir(id), "i-"+id, seed)
	}
	votes := func() bool {
		for _, ag := range all {
			if !ag.Meta().MayVote() {
				return false
			}
		}
		return true
	}
	for end := time.Now().Add(20 * time.Second); !votes(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			for id, ag := range all {
				m := ag.Meta()
				l, _ := m.Leader()
				st := m.Raft().Stats()
				nd, ok := m.State().Node(id)
				_, err := os.Stat(voteFilePath(m.dir))
				t.Logf("%s: may vote %v (vote file: %v), raft %s, leader %q, last %s commit %s applied %s, config %s, self in state %v %+v",
					id, m.MayVote(), err == nil, m.Raft().State(), l, st["last_log_index"], st["commit_index"], st["applied_index"], st["latest_configuration"], ok, nd)
			}
			t.Fatal("after a full restart, a replica never votes")
		}
	}
	eventually(t, "every node up at its address everywhere", func() bool {
		for _, ag := range all {
			for _, o := range all {
				nd, ok := ag.Meta().State().Node(o.ID())
				if !ok || !nd.Up || nd.Addr != o.Addr() {
					return false
				}
			}
		}
		return true
	})
	eventually(t, "three voters", func() bool {
		voters := 0
		for _, s := range all["n2"].Meta().Raft().GetConfiguration().Configuration().Servers {
			if s.Suffrage == raft.Voter {
				voters++
			}
		}
		return voters == 3
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := all["n2"].Propose(ctx, metastate.CreateTopic{Name: "t", Partitions: 1, Type: metastate.TypeSingle, Now: 1}); err != nil {
		t.Fatal(err)
	}
	all["n1"].Close()
	delete(all, "n1")
	if _, err := all["n3"].Propose(ctx, metastate.CreateTopic{Name: "u", Partitions: 1, Type: metastate.TypeSingle, Now: 1}); err != nil {
		t.Fatalf("n2 and n3 without n1: %v", err)
	}
}

// TestAgent_JoinerCutBeforeItsFirstEntryElects: n1 starts a cluster and
// n2 joins. The leader records n2 and makes it a voter: its latest
// configuration is {n1, n2}. n2's link is cut before it stored an entry,
// so n1 steps down and needs n2's vote, which n2, having applied nothing,
// withholds (a replica without state may be a voter back with its disk
// replaced). It asks n1 whether n1's state has it registered with its
// incarnation (Agent.checkVote): n1's does, since committed, so n2 votes
// once the link is back, and n1 leads again. (Before the question, the
// cluster never had a leader again.)
func TestAgent_JoinerCutBeforeItsFirstEntryElects(t *testing.T) {
	var n1, n2 *Agent
	voter := func() bool {
		for _, s := range n1.Meta().Raft().GetConfiguration().Configuration().Servers {
			if s.ID == "n2" && s.Suffrage == raft.Voter {
				return true
			}
		}
		return false
	}
	for attempt := 1; ; attempt++ {
		if attempt > 30 {
			t.Fatal("the cut never landed before n2's first entry in 30 attempts")
		}
		root := t.TempDir()
		n1 = rvAgent(t, "n1", filepath.Join(root, "n1"), "i-n1")
		eventually(t, "n1 leads, registered", func() bool {
			nd, ok := n1.Meta().State().Node("n1")
			return n1.Meta().IsLeader() && ok && nd.Up
		})
		st := n1.Meta().State()
		n2 = rvAgent(t, "n2", filepath.Join(root, "n2"), "i-n2", n1.Addr())
		for {
			if _, ok := st.Node("n2"); ok {
				break
			}
			<-st.Changed()
			st = n1.Meta().State()
		}
		n1.Transport().SetLinkDown("n2", true)
		n2.Transport().SetLinkDown("n1", true)
		for end := time.Now().Add(2 * time.Second); !voter() && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
		if n2.Meta().Raft().LastIndex() == 0 && voter() {
			t.Logf("attempt %d: n2 registered and a voter in n1's latest configuration, cut before it stored an entry", attempt)
			break
		}
		n2.Close() // the join's RPC ended before AddVoter, or n2 got an entry: again
		n1.Close()
	}
	t.Cleanup(func() { n2.Close(); n1.Close() })
	time.Sleep(500 * time.Millisecond) // n1's lease (100 ms) runs out
	n1.Transport().SetLinkDown("n2", false)
	n2.Transport().SetLinkDown("n1", false)
	eventually(t, "a metadata leader", func() bool { return n1.Meta().IsLeader() || n2.Meta().IsLeader() })
	eventually(t, "n2 votes", n2.Meta().MayVote)
}

// TestAgent_ReplicaWithoutDataFollowsOnlyItsRegistrar: a metadata replica
// opened without state takes entries only from the leader that registered
// its node (registeredBy), not from any node claiming to lead: one back
// with its disk replaced has forgotten its term, and a deposed leader
// whose configuration still counts its old self as a voter would count
// its acknowledgements. Once it votes, it follows any leader.
func TestAgent_ReplicaWithoutDataFollowsOnlyItsRegistrar(t *testing.T) {
	root := t.TempDir()
	n1 := rvAgent(t, "n1", filepath.Join(root, "n1"), "i-n1")
	t.Cleanup(func() { n1.Close() })
	eventually(t, "n1 leads", n1.Meta().IsLeader)
	n1.Transport().SetLinkDown("n2", true) // n2 cannot register yet
	n2 := rvAgent(t, "n2", filepath.Join(root, "n2"), "i-n2", n1.Addr())
	t.Cleanup(func() { n2.Close() })
	if n2.metaMayFollow("n1") || n2.metaMayFollow("n3") {
		t.Fatal("a replica without state, not registered, follows a leader")
	}
	n1.Transport().SetLinkDown("n2", false)
	eventually(t, "n2 votes", n2.Meta().MayVote)
	if !n2.metaMayFollow("n1") || !n2.metaMayFollow("n3") {
		t.Fatal("a replica that votes does not follow every leader")
	}
}
