package replica

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openOne opens a one-replica group of parts partitions in dir, on an
// in-memory transport, bootstrapped: it elects itself.
func openOne(t *testing.T, dir string, parts int) *raftqueue.Group {
	t.Helper()
	_, trans := raft.NewInmemTransport("a")
	conf := raft.DefaultConfig()
	conf.HeartbeatTimeout, conf.ElectionTimeout, conf.LeaderLeaseTimeout = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	g, err := raftqueue.Open(raftqueue.Config{ID: "a", Dir: dir, Transport: trans, Raft: conf, Partitions: parts})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Bootstrap([]raft.Server{{ID: "a", Address: trans.LocalAddr()}}); err != nil {
		g.Close()
		t.Fatal(err)
	}
	return g
}

func newPart(index int) *Partition {
	return NewRaft3(Raft3Config{Config: Config{Topic: "t", Index: index, First: 0, Self: "a", Now: time.Now, CallTimeout: 5 * time.Second}, Partitions: 2, Replicas: []string{"a"}})
}

// TestGroups_Shared: two partitions of one group share one replica, opened
// once; it serves each partition's commands into its own file, outlives
// the first partition's Close, and is closed with the last; the name is
// then opened anew.
func TestGroups_Shared(t *testing.T) {
	dir := t.TempDir()
	var gs RaftGroups
	opened := 0
	open := func() (*raftqueue.Group, error) {
		opened++
		return openOne(t, dir, 2), nil
	}
	p0, p1 := newPart(0), newPart(1)
	for _, p := range []*Partition{p0, p1} {
		if err := gs.Attach(p, "g", open); err != nil {
			t.Fatal(err)
		}
	}
	if opened != 1 || p0.RaftGroup() == nil || p0.RaftGroup() != p1.RaftGroup() {
		t.Fatalf("opened %d, replicas %p %p", opened, p0.RaftGroup(), p1.RaftGroup())
	}
	g := p0.RaftGroup()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, p := range []*Partition{p0, p1, p1} {
		if _, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: string(rune(65 + i)), Body: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
	}
	for part, want := range []uint64{1, 2} {
		sp, err := g.LeaderPartition(ctx, part)
		if err != nil {
			t.Fatal(err)
		}
		if next := sp.Stats().Next; next != want {
			t.Fatalf("partition %d: next offset %d, want %d", part, next, want)
		}
	}

	if err := p0.Close(); err != nil {
		t.Fatal(err)
	}
	if g.State() == raft.Shutdown {
		t.Fatal("the group closed with a partition still holding it")
	}
	if _, err := p1.Apply(ctx, &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: "after", Body: []byte("x")}}}); err != nil {
		t.Fatalf("apply after the other partition closed: %v", err)
	}
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}
	if g.State() != raft.Shutdown {
		t.Fatalf("the group is %v after its last partition closed", g.State())
	}
	if err := p1.Close(); err != nil { // a second Close releases nothing twice
		t.Fatal(err)
	}

	// Opened anew, on the same files.
	p2 := newPart(1)
	if err := gs.Attach(p2, "g", open); err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if opened != 2 || p2.RaftGroup() == g {
		t.Fatalf("opened %d times; the closed group reused: %v", opened, p2.RaftGroup() == g)
	}
	var sp *store.Partition
	var err error
	for sp, err = p2.RaftGroup().LeaderPartition(ctx, 1); errors.Is(err, raftqueue.ErrNotLeader) && ctx.Err() == nil; {
		time.Sleep(10 * time.Millisecond) // elected again
		sp, err = p2.RaftGroup().LeaderPartition(ctx, 1)
	}
	if err != nil {
		t.Fatal(err)
	}
	if next := sp.Stats().Next; next != 3 {
		t.Fatalf("partition 1 reopened: next offset %d, want 3", next)
	}
}

// TestGroups_AttachClosedOrFailing: a partition closed before its group
// is attached does not keep the group open; a failed open leaves nothing,
// and the next Attach opens again.
func TestGroups_AttachClosedOrFailing(t *testing.T) {
	dir := t.TempDir()
	var gs RaftGroups
	var last *raftqueue.Group
	open := func() (*raftqueue.Group, error) {
		last = openOne(t, dir, 2)
		return last, nil
	}
	closed := newPart(0)
	closed.Close()
	if err := gs.Attach(closed, "g", open); err != nil {
		t.Fatal(err)
	}
	if closed.RaftGroup() != nil || last.State() != raft.Shutdown {
		t.Fatalf("a closed partition attached (%v) or left its group open (%v)", closed.RaftGroup() != nil, last.State())
	}

	boom := errors.New("boom")
	p := newPart(0)
	defer p.Close()
	if err := gs.Attach(p, "g", func() (*raftqueue.Group, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Attach: %v, want the open's error", err)
	}
	if p.RaftGroup() != nil {
		t.Fatal("a failed open attached something")
	}
	if err := gs.Attach(p, "g", open); err != nil || p.RaftGroup() != last {
		t.Fatalf("Attach after a failure: %v", err)
	}
	// A second Attach of the same partition keeps its replica and takes
	// no second hold: its Close then closes the group.
	if err := gs.Attach(p, "g", open); err != nil || p.RaftGroup() != last {
		t.Fatalf("second Attach: %v", err)
	}
	p.Close()
	if last.State() != raft.Shutdown {
		t.Fatalf("the group is %v after its only partition closed", last.State())
	}
}
