package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
)

// reportAgents opens n agents like newAgents, with a session timeout
// of sessionTimeout instead of 1 s: long enough that a report's probe
// (about 2.2 s) ends well before a silent node's session expires.
func reportAgents(t *testing.T, n int, sessionTimeout time.Duration) map[string]*Agent {
	t.Helper()
	all := map[string]*Agent{}
	seed := ""
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		var seeds []string
		if seed != "" {
			seeds = []string{seed}
		}
		ag, err := OpenAgent(AgentConfig{ID: id, Dir: filepath.Join(t.TempDir(), id), Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0,
			Secret: testSecret, InsecurePlaintext: true, SessionTimeout: sessionTimeout, HeartbeatTimeout: 200 * time.Millisecond,
			ElectionTimeout: agentElection, LeaderLeaseTimeout: 100 * time.Millisecond, Partitions: noPartitions,
			CheckTx: noTx, Logger: discardLogger()})
		if err != nil {
			t.Fatalf("open agent %s: %v", id, err)
		}
		t.Cleanup(func() { ag.Close() })
		all[id] = ag
		if seed == "" {
			seed = ag.Addr()
		}
	}
	eventually(t, "every node up everywhere", func() bool {
		for _, ag := range all {
			up := 0
			for _, nd := range ag.Meta().State().Nodes() {
				if nd.Up {
					up++
				}
			}
			if up != n {
				return false
			}
		}
		return true
	})
	return all
}

// TestReport_KeepsConsumerLease: a node cut off from the
// others (a partition of the network, a long pause) still believes its
// session valid, and so keeps delivering to its consumers, until
// SessionDeadline: a heartbeat acknowledged less than the session timeout
// (less a margin) ago. The metadata leader may give its group members'
// partitions to others only once that has passed, which the session check
// guarantees by waiting out the timeout. A report (any node may send one)
// whose probe fails marks the node down at once: its members are removed
// and their partitions given to another member while the cut node still
// delivers them.
func TestReport_KeepsConsumerLease(t *testing.T) {
	all := reportAgents(t, 3, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var leader *Agent
	eventually(t, "a metadata leader", func() bool {
		for _, ag := range all {
			if ag.Meta().IsLeader() {
				leader = ag
				return true
			}
		}
		return false
	})
	var others []*Agent
	for _, ag := range all {
		if ag != leader {
			others = append(others, ag)
		}
	}
	reporter, cut := others[0], others[1]
	if _, err := leader.Propose(ctx, metastate.CreateTopic{Name: "t", Partitions: 2, Type: metastate.TypeSingle, Now: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	cutMember, otherMember := MemberName(cut.ID(), 1), MemberName(reporter.ID(), 1)
	if _, err := cut.Propose(ctx, metastate.JoinGroup{Topic: "t", Group: "g", Member: cutMember, Node: cut.ID()}); err != nil {
		t.Fatal(err)
	}
	if _, err := reporter.Propose(ctx, metastate.JoinGroup{Topic: "t", Group: "g", Member: otherMember, Node: reporter.ID()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cut node's member owning a partition, its session valid", func() bool {
		_, parts := cut.Meta().State().Assignment("t", "g", cutMember)
		return len(parts) > 0 && cut.SessionValid()
	})
	_, owned := cut.Meta().State().Assignment("t", "g", cutMember)

	// Isolate the node: both ends of each of its links.
	for _, ag := range all {
		if ag != cut {
			ag.Transport().SetLinkDown(cut.ID(), true)
			cut.Transport().SetLinkDown(ag.ID(), true)
		}
	}
	defer func() {
		for _, ag := range all {
			if ag != cut {
				ag.Transport().SetLinkDown(cut.ID(), false)
				cut.Transport().SetLinkDown(ag.ID(), false)
			}
		}
	}()
	if err := reporter.Report(ctx, cut.ID()); err != nil {
		t.Fatalf("report: %v", err)
	}
	// The cut node cannot hear anything: it goes by its own session.
	_, stillOwned := cut.Meta().State().Assignment("t", "g", cutMember)
	if len(stillOwned) == 0 || !cut.SessionValid() {
		t.Skipf("the cut node already stopped (owns %v, session valid %t): nothing to check", stillOwned, cut.SessionValid())
	}
	_, given := leader.Meta().State().Assignment("t", "g", otherMember)
	for _, p := range owned {
		for _, q := range given {
			if p == q {
				nd, _ := leader.Meta().State().Node(cut.ID())
				t.Fatalf("partition %d of the cut node's member %s given to %s (node up %t) while the cut node's session is valid until %v (%v from now): two consumers at once",
					p, cutMember, otherMember, nd.Up, cut.SessionDeadline().Format(time.StampMilli), time.Until(cut.SessionDeadline()).Round(time.Millisecond))
			}
		}
	}
}
