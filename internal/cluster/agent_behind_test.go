package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
)

// TestAgent_BehindUntilItHasTheLeadersState: a node's state is behind
// until it has applied what the leader's last answer to its heartbeat
// held, and while its session may have lapsed. A node cut off from the
// others is behind once its session lapses, and current again once back
// and caught up; a node told of a later index than its state's is behind
// until it applies that far.
func TestAgent_BehindUntilItHasTheLeadersState(t *testing.T) {
	a := newAgents(t, 3)
	eventually(t, "no node behind", func() bool {
		for _, ag := range a.all {
			if ag.Behind() {
				return false
			}
		}
		return true
	})
	ld := a.leader()
	if ld == nil {
		t.Fatal("no leader")
	}
	var f *Agent
	for _, ag := range a.all {
		if ag != ld {
			f = ag
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Told of an index its state has not reached.
	f.leaderIndex.Store(ld.Meta().State().Index() + 1)
	if !f.Behind() {
		t.Fatal("a node whose state is short of the leader's index is not behind")
	}
	if _, err := ld.Propose(ctx, metastate.CreateTopic{Name: "one", Partitions: 1, Type: metastate.TypeSingle, Now: 1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the follower current once it applied the leader's index", func() bool { return !f.Behind() })

	// Cut off: behind once its session lapses, while the others go on.
	for _, ag := range a.all {
		if ag != f {
			ag.Transport().SetLinkDown(f.ID(), true)
			f.Transport().SetLinkDown(ag.ID(), true)
		}
	}
	eventually(t, "the cut node behind", f.Behind)
	if _, err := a.leader().Propose(ctx, metastate.CreateTopic{Name: "two", Partitions: 1, Type: metastate.TypeSingle, Now: 1}); err != nil {
		t.Fatal(err)
	}
	for _, ag := range a.all {
		ag.Transport().SetLinkDown(f.ID(), false)
		f.Transport().SetLinkDown(ag.ID(), false)
	}
	eventually(t, "the node current again, with the topic made while it was cut", func() bool {
		_, ok := f.Meta().State().Topic("two")
		return !f.Behind() && ok
	})
}
