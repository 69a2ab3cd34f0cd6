package cluster

import (
	"bytes"
	"errors"

	"github.com/zeze-go/mq/internal/metastate"

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
	c.mustPropose(metastate.CreateTopic{Name: "s", Partitions: 1, Type: metastate.TypeSingle})
	c.mustPropose(metastate.CreateTopic{Name: "d", Partitions: 2, Type: metastate.TypeDoubleWrite})
	part := func(i int) metastate.Partition {
		p, _ := c.leader().State().Partition("d", i)
		return p
	}
	if p0, p1 := part(0), part(1); !slices.Equal(p0.Replicas, []string{"n2", "n3"}) || !slices.Equal(p1.Replicas, []string{"n4", "n5"}) {
		t.Fatalf("placed %q and %q; the test expects n2,n3 and n4,n5", p0.Replicas, p1.Replicas)
	}
	// d/1's leader found its follower lagging: n4 alone in sync.
	c.mustPropose(metastate.SetInSync{Topic: "d", Partition: 1, Version: 1, InSync: []string{"n4"}})

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
		return c.leader().AddNode(ctx, metastate.RegisterNode{ID: "n4", Addr: "n4"}) == nil
	})
	eventually(t, "d/1 gets a new follower", func() bool { return part(1).Follower() != "n5" })
	if p := part(1); p.Leader != "n4" || p.Epoch != 2 || !slices.Equal(p.InSync, []string{"n4"}) || p.Follower() != "n3" {
		t.Fatalf("d/1 after its follower's loss: %+v", p)
	}
}

// chunkSame fails the test unless the partitions first..first+n-1 of "d" in
// s have one record, with Chunk first.
func chunkSame(t *testing.T, s *metastate.State, first, n int) metastate.Partition {
	t.Helper()
	top, _ := s.Topic("d")
	a := top.Parts[first]
	for j := first; j < first+n; j++ {
		p := top.Parts[j]
		if p.Chunk != first || p.Leader != a.Leader || p.Epoch != a.Epoch || p.Version != a.Version ||
			!slices.Equal(p.Replicas, a.Replicas) || !slices.Equal(p.InSync, a.InSync) {
			t.Fatalf("d/%d %+v differs from d/%d %+v, its chunk's first", j, p, first, a)
		}
	}
	if f, m := top.Chunk(first + n - 1); f != first || m != n {
		t.Fatalf("Chunk(%d) = %d, %d; want %d, %d", first+n-1, f, m, first, n)
	}
	return a
}

// TestMeta_FailoverOncePerChunk: five nodes, the metadata leader n1
// holding a Single topic; "d" has five partitions in chunks of two ({0,1}
// on n2,n3; {2,3} on n4,n5; {4} on n1,n2). n2 goes silent: chunk {0,1} is
// promoted to n3 and chunk {4} gets a new follower, each by one change of
// its record (Version+1), every member alike; chunk {2,3} is untouched.
func TestMeta_FailoverOncePerChunk(t *testing.T) {
	c := newTestCluster(t, time.Second)
	c.start("n1", true)
	c.leader()
	for _, id := range []string{"n2", "n3", "n4", "n5"} {
		c.addNode(id)
	}
	silent := c.heartbeat("n1", "n2", "n3", "n4", "n5")
	c.mustPropose(metastate.CreateTopic{Name: "s", Partitions: 1, Type: metastate.TypeSingle})
	c.mustPropose(metastate.CreateTopic{Name: "d", Partitions: 5, Type: metastate.TypeDoubleWrite, GroupSize: 2})
	part := func(i int) metastate.Partition {
		p, _ := c.leader().State().Partition("d", i)
		return p
	}
	want := [][]string{{"n2", "n3"}, {"n2", "n3"}, {"n4", "n5"}, {"n4", "n5"}, {"n1", "n2"}}
	for i, w := range want {
		if p := part(i); !slices.Equal(p.Replicas, w) {
			t.Fatalf("d/%d placed on %q; the test expects %q", i, p.Replicas, w)
		}
	}
	silent.Store("n2", true)
	eventually(t, "d/0 promoted", func() bool { return part(0).Leader == "n3" })
	eventually(t, "d/4 gets a new follower", func() bool { return part(4).Follower() != "n2" })
	time.Sleep(time.Second) // more failover ticks: nothing more to do
	s := c.leader().State()
	a := chunkSame(t, s, 0, 2)
	if a.Epoch != 2 || a.Version != 2 || !slices.Equal(a.InSync, []string{"n3"}) || a.Follower() == "n2" {
		t.Fatalf("chunk {0,1} after n2's loss: %+v", a)
	}
	if b := chunkSame(t, s, 2, 2); b.Version != 1 || b.Epoch != 1 || !slices.Equal(b.Replicas, []string{"n4", "n5"}) {
		t.Fatalf("chunk {2,3} changed: %+v", b)
	}
	if e := chunkSame(t, s, 4, 1); e.Leader != "n1" || e.Version != 2 || e.Epoch != 2 {
		t.Fatalf("chunk {4} after its follower's loss: %+v", e)
	}
	b, err := metastate.EncodeSnapshot(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := metastate.DecodeSnapshot(b)
	if err != nil {
		t.Fatalf("snapshot round trip: %v", err)
	}
	if again, err := metastate.EncodeSnapshot(got); err != nil || !bytes.Equal(again, b) {
		t.Fatalf("snapshot round trip: the restored state differs (%v)", err)
	}
}

// TestPairLeader_OnlyTheLeaderProposes: RenewEpoch and SetInSync of a
// DoubleWrite pair are accepted through the RPC from its leader's node
// only, never from its follower or for a partition out of range.
func TestPairLeader_OnlyTheLeaderProposes(t *testing.T) {
	s := metastate.New()
	for i, c := range []metastate.Command{
		metastate.RegisterNode{ID: "a", Addr: "a:7000"}, metastate.RegisterNode{ID: "b", Addr: "b:7000"},
		metastate.CreateTopic{Name: "d", Partitions: 1, Type: metastate.TypeDoubleWrite},
		metastate.RenewEpoch{Topic: "d", Partition: 0, Version: 1},
	} {
		next, _, err := s.Apply(uint64(i+1), c)
		if err != nil {
			t.Fatalf("%T: %v", c, err)
		}
		s = next
	}
	q, _ := s.Partition("d", 0)
	for _, c := range []metastate.Command{metastate.RenewEpoch{Topic: "d", Partition: 0, Version: 2}, metastate.SetInSync{Topic: "d", Partition: 0, Version: 2, InSync: []string{q.Leader}}} {
		if err := pairLeader(s, q.Follower(), "d", 0); !errors.Is(err, ErrDenied) {
			t.Fatalf("%T from the follower: %v, want ErrDenied", c, err)
		}
		if err := pairLeader(s, q.Leader, "d", 0); err != nil {
			t.Fatalf("%T from the leader: %v", c, err)
		}
	}
	if err := pairLeader(s, q.Leader, "d", 5); !errors.Is(err, ErrDenied) {
		t.Fatalf("a partition out of range: %v", err)
	}
}
