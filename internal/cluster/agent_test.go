package cluster

import (
	"github.com/hashicorp/raft"

	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

var testSecret = []byte("7b2e9f4c1a6d3e8b0f5a2c7d4e9b1f6a3c8e0d5b2a7f4c9e")

// agents is a cluster of agents on 127.0.0.1 in one process.
type agents struct {
	t    testing.TB
	dirs map[string]string
	all  map[string]*Agent
	seed string
}

func noPartitions(string, int) (partition.Partition, error)           { return nil, metastate.ErrNoTopic }
func noTx(context.Context, string, []PartRef) (store.Decision, error) { return store.Undecided, nil }

// agentElection is the agents' raft election timeout.
const agentElection = 200 * time.Millisecond

func (a *agents) start(id string, seeds ...string) *Agent {
	a.t.Helper()
	dir, ok := a.dirs[id]
	if !ok {
		dir = filepath.Join(a.t.TempDir(), id)
		a.dirs[id] = dir
	}
	ag, err := OpenAgent(AgentConfig{ID: id, Dir: dir, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: testSecret, InsecurePlaintext: true,
		SessionTimeout: time.Second, HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: agentElection,
		LeaderLeaseTimeout: 100 * time.Millisecond, Partitions: noPartitions, CheckTx: noTx, Logger: discardLogger()})
	if err != nil {
		a.t.Fatalf("open agent %s: %v", id, err)
	}
	a.all[id] = ag
	a.t.Cleanup(func() { ag.Close() })
	return ag
}

func newAgents(t testing.TB, n int) *agents {
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	first := a.start("n1")
	a.seed = first.Addr()
	for i := 2; i <= n; i++ {
		a.start(fmt.Sprintf("n%d", i), a.seed)
	}
	eventually(t, "every node up everywhere", func() bool { return a.allUp(n) })
	return a
}

// allUp reports whether every open agent's state has n nodes up, and its
// metadata configuration as many voters as it takes (a node joins as a
// nonvoter and becomes a voter once its replica votes).
func (a *agents) allUp(n int) bool {
	for _, ag := range a.all {
		up := 0
		for _, nd := range ag.Meta().State().Nodes() {
			if nd.Up {
				up++
			}
		}
		voters := 0
		for _, s := range ag.Meta().Raft().GetConfiguration().Configuration().Servers {
			if s.Suffrage == raft.Voter {
				voters++
			}
		}
		if up != n || voters != min(n, MaxVoters) {
			return false
		}
	}
	return true
}

func (a *agents) leader() *Agent {
	for _, ag := range a.all {
		if ag.Meta().IsLeader() {
			return ag
		}
	}
	return nil
}

// TestAgent_Cluster: three agents on loopback TCP form one metadata group
// through a seed; a proposal from any node reaches the leader; the leader
// killed, a new one takes proposals within a few election timeouts; a node
// restarting on its data (and a new port) rejoins, and a silent node is
// marked down.
func TestAgent_Cluster(t *testing.T) {
	a := newAgents(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for id, ag := range a.all {
		name := "t-" + id
		r, err := ag.Propose(ctx, metastate.CreateTopic{Name: name, Partitions: 3, Type: metastate.TypeSingle, Now: time.Now().UnixNano()})
		if err != nil {
			t.Fatalf("create from %s: %v", id, err)
		}
		if len(r.Topic.Parts) != 3 {
			t.Fatalf("create from %s placed %+v", id, r.Topic)
		}
	}
	for id, ag := range a.all {
		eventually(t, "topics on "+id, func() bool { return len(ag.Meta().State().Topics()) == 3 })
		eventually(t, "the session of "+id, ag.SessionValid)
	}
	_, err := a.all["n2"].Propose(ctx, metastate.CreateTopic{Name: "t-n1", Partitions: 1, Type: metastate.TypeSingle, Now: 1})
	if !errors.Is(err, metastate.ErrTopicExists) {
		t.Fatalf("create of an existing topic: %v, want ErrTopicExists", err)
	}

	// The leader killed: the others go on.
	old := a.leader()
	if old == nil {
		t.Fatal("no leader")
	}
	oldID := old.ID()
	old.Close()
	delete(a.all, oldID)
	var survivor *Agent
	for _, ag := range a.all {
		survivor = ag
	}
	start := time.Now()
	if _, err := survivor.Propose(ctx, metastate.CreateTopic{Name: "after", Partitions: 2, Type: metastate.TypeSingle, Now: time.Now().UnixNano()}); err != nil {
		t.Fatalf("create after the leader died: %v", err)
	}
	// A few election timeouts (raft waits one to two of them before it
	// campaigns); the bound leaves room for a loaded CI machine.
	took := time.Since(start)
	t.Logf("created %v after the leader's death", took)
	if limit := 15 * agentElection; took > limit {
		t.Fatalf("a topic created %v after the leader's death, limit %v", took, limit)
	}
	eventually(t, "the dead leader marked down", func() bool {
		nd, ok := survivor.Meta().State().Node(oldID)
		return ok && !nd.Up
	})

	// It restarts on its data, on a new port (the seed it names is another
	// node: its own old address is gone), and rejoins.
	back := a.start(oldID, a.all[firstKey(a.all)].Addr())
	eventually(t, "the restarted node up", func() bool { return a.allUp(3) })
	eventually(t, "the restarted node has the topics", func() bool { return len(back.Meta().State().Topics()) == 4 })
	eventually(t, "the restarted node's session", back.SessionValid)
}

func firstKey(m map[string]*Agent) string {
	for k := range m {
		return k
	}
	return ""
}

// TestAgent_Report: a report of a node that answers the metadata leader's
// probe leaves it up and the pairs it leads as they were (the fault was
// the reporter's); one of a node that is gone hands the pairs it leads to
// their in-sync followers as soon as the probe fails, while the node
// itself stays up until its session expires (its consumers' leases run
// until then); reports of the reporter itself, of the leader and of an
// unknown node change nothing.
func TestAgent_Report(t *testing.T) {
	a := newAgents(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leader := a.leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	var others []*Agent
	for _, ag := range a.all {
		if ag != leader {
			others = append(others, ag)
		}
	}
	reporter, reported := others[0], others[1]
	up := func(id string) bool { nd, ok := leader.Meta().State().Node(id); return ok && nd.Up }
	// Pairs of one partition each, spread by load: some led by reported.
	if _, err := reporter.Propose(ctx, metastate.CreateTopic{Name: "d", Partitions: 3, Type: metastate.TypeDoubleWrite, Now: 1}); err != nil {
		t.Fatal(err)
	}
	ledBy := func(id string) []int {
		tp, _ := leader.Meta().State().Topic("d")
		var out []int
		for i, p := range tp.Parts {
			if p.Leader == id {
				out = append(out, i)
			}
		}
		return out
	}
	led := ledBy(reported.ID())
	if len(led) == 0 {
		t.Fatalf("no pair led by %s", reported.ID())
	}
	for _, id := range []string{reported.ID(), reporter.ID(), leader.ID(), "nobody"} {
		if err := reporter.Report(ctx, id); err != nil {
			t.Fatalf("report of %s: %v", id, err)
		}
	}
	for _, id := range []string{reported.ID(), reporter.ID(), leader.ID()} {
		if !up(id) {
			t.Fatalf("%s, alive, marked down after a report", id)
		}
	}
	if got := ledBy(reported.ID()); !slices.Equal(got, led) {
		t.Fatalf("%s, alive, leads %v after a report, %v before", reported.ID(), got, led)
	}
	id := reported.ID()
	reported.Close()
	delete(a.all, id)
	if err := reporter.Report(ctx, id); err != nil {
		t.Fatalf("report of the closed %s: %v", id, err)
	}
	if got := ledBy(id); len(got) != 0 {
		t.Fatalf("%s, closed, still leads %v after the report", id, got)
	}
	// That it stays up until its session expires is
	// TestReport_KeepsConsumerLease's (sessions of 10 s).
}
