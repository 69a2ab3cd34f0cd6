package cluster

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestMeta_DoubleWriteFailover: the metadata leader promotes the in-sync
// follower of a pair whose leader's session expired (epoch+1, a new
// follower on a live node), gives a pair whose follower's session expired
// a new follower, and leaves a pair whose follower is out of sync led by
// its lost leader.
func TestMeta_DoubleWriteFailover(t *testing.T) {
	c := newTestCluster(t, time.Second)
	c.start("n1", true)
	c.leader()
	for _, id := range []string{"n2", "n3", "n4", "n5"} {
		c.addNode(id)
	}
	silent := c.heartbeat("n1", "n2", "n3", "n4", "n5")
	// n1 leads the metadata and holds one replica (of "s"), so that the
	// pairs go to n2-n5: d/0 on n2 and n3, d/1 on n4 and n5.
	c.mustPropose(CreateTopic{Name: "s", Partitions: 1, Type: TypeSingle})
	c.mustPropose(CreateTopic{Name: "d", Partitions: 2, Type: TypeDoubleWrite})
	part := func(i int) Partition {
		p, _ := c.leader().State().Partition("d", i)
		return p
	}
	if p0, p1 := part(0), part(1); !slices.Equal(p0.Replicas, []string{"n2", "n3"}) || !slices.Equal(p1.Replicas, []string{"n4", "n5"}) {
		t.Fatalf("placed %q and %q; the test expects n2,n3 and n4,n5", p0.Replicas, p1.Replicas)
	}
	// d/1's leader found its follower lagging: n4 alone in sync.
	c.mustPropose(SetInSync{Topic: "d", Partition: 1, Version: 1, InSync: []string{"n4"}})

	// n2, d/0's leader, goes silent: n3 is promoted, n1 (the least loaded
	// live node but n2 and n3) follows.
	silent.Store("n2", true)
	eventually(t, "d/0 promoted", func() bool { return part(0).Leader == "n3" })
	if p := part(0); p.Epoch != 2 || !slices.Equal(p.InSync, []string{"n3"}) || !slices.Equal(p.Replicas, []string{"n3", "n1"}) {
		t.Fatalf("d/0 after its leader's loss: %+v", p)
	}
	// n4, d/1's leader, goes silent: n5 is not in sync and is not
	// promoted, whatever time passes.
	silent.Store("n4", true)
	eventually(t, "n4 marked down", func() bool { n, _ := c.leader().State().Node("n4"); return !n.Up })
	time.Sleep(time.Second)
	if p := part(1); p.Leader != "n4" || p.Epoch != 1 || p.Version != 2 {
		t.Fatalf("d/1, its follower out of sync, changed: %+v", p)
	}
	// d/1's follower goes silent too: with both down nothing is done.
	silent.Store("n5", true)
	eventually(t, "n5 marked down", func() bool { n, _ := c.leader().State().Node("n5"); return !n.Up })
	time.Sleep(time.Second)
	if p := part(1); p.Leader != "n4" || p.Version != 2 {
		t.Fatalf("d/1 with both replicas down changed: %+v", p)
	}
	// n4 comes back: its follower n5 is down, and a new one is chosen, the
	// least loaded live node but the pair (n3: d/0; n1 holds s and d/0).
	silent.Delete("n4")
	eventually(t, "n4 back", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.leader().AddNode(ctx, "n4", "n4") == nil
	})
	eventually(t, "d/1 gets a new follower", func() bool { return part(1).Follower() != "n5" })
	if p := part(1); p.Leader != "n4" || p.Epoch != 2 || !slices.Equal(p.InSync, []string{"n4"}) || p.Follower() != "n3" {
		t.Fatalf("d/1 after its follower's loss: %+v", p)
	}
}
