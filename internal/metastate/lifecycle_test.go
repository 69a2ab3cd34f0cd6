package metastate

import (
	"fmt"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/wire"
)

// TestDrainNode_PlacementSkipsIt: a draining node gets no replica of a new
// topic, of a pair's new follower or of a move chosen by load; the mark
// comes off again, and it survives a snapshot.
func TestDrainNode_PlacementSkipsIt(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c", "d")
	ft.refused(DrainNode{ID: "x", Draining: true}, ErrNoNode)
	ft.must(DrainNode{ID: "d", Draining: true})
	ft.must(CreateTopic{Name: "r", Partitions: 4, Type: TypeRaft3})
	ft.must(CreateTopic{Name: "d", Partitions: 4, Type: TypeDoubleWrite})
	if h := ft.s().Holds("d"); len(h) > 0 {
		t.Fatalf("the draining node holds %v", h)
	}
	if got := ft.s().LeastLoaded(); got == "d" {
		t.Fatal("LeastLoaded chose the draining node")
	}
	got, err := DecodeSnapshot(encodeSnap(t, ft.s()))
	if err != nil {
		t.Fatal(err)
	}
	if nd, _ := got.Node("d"); !nd.Draining || !sameState(got, ft.s()) {
		t.Fatalf("after a snapshot: %+v", nd)
	}
	ft.must(DrainNode{ID: "d"})
	ft.must(CreateTopic{Name: "more", Partitions: 1, Type: TypeRaft3})
	if !slices.Contains(ft.s().Holds("d"), "more/0") {
		t.Fatalf("a node no longer draining got nothing: %v", ft.s().Holds("d"))
	}
}

// TestMoveReplica_Raft3: a Raft3 replica moves for its whole group: the new
// node takes the old one's place and is lost until it rejoined; a move
// chosen by load picks a node holding none of the group; refusals change
// nothing.
func TestMoveReplica_Raft3(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c", "d", "e")
	ft.must(CreateTopic{Name: "r", Partitions: 2, Type: TypeRaft3, GroupSize: 2})
	p, _ := ft.s().Partition("r", 1)
	from := p.Replicas[1]
	var to string
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		if !slices.Contains(p.Replicas, id) {
			to = id
			break
		}
	}
	ft.refused(MoveReplica{Topic: "r", Partition: 1, From: "zz", To: to}, ErrInvalid)
	ft.refused(MoveReplica{Topic: "r", Partition: 1, From: from, To: p.Replicas[0]}, ErrInvalid)
	ft.refused(MoveReplica{Topic: "r", Partition: 1, From: from, To: "nobody"}, ErrNoNode)
	ft.must(DrainNode{ID: to, Draining: true})
	ft.refused(MoveReplica{Topic: "r", Partition: 1, From: from, To: to}, ErrInvalid)
	ft.must(DrainNode{ID: to})
	ft.must(MoveReplica{Topic: "r", Partition: 1, From: from, To: to})
	for i := range 2 {
		q, _ := ft.s().Partition("r", i)
		if slices.Contains(q.Replicas, from) || !slices.Contains(q.Replicas, to) || !slices.Equal(q.Lost, []string{to}) {
			t.Fatalf("r/%d after the move: %+v", i, q)
		}
	}
	nd, _ := ft.s().Node(to)
	ft.must(Rejoined{Topic: "r", Partition: 0, Node: to, Incarnation: nd.Incarnation})
	q, _ := ft.s().Partition("r", 1)
	ft.must(MoveReplica{Topic: "r", Partition: 0, From: q.Replicas[0]})
	q2, _ := ft.s().Partition("r", 1)
	if len(q2.Lost) != 1 || slices.Contains(q.Replicas, q2.Lost[0]) {
		t.Fatalf("a move by load: before %+v, after %+v", q, q2)
	}
}

// TestMoveReplica_Single: a Single partition's move starts with the node
// moved to as its second replica, is retargeted or cancelled from that
// node, and ends with MoveDone at the move's version only; each step
// raises the version, a snapshot keeps a move under way, and the others
// partitions of the topic stay where they are.
func TestMoveReplica_Single(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c", "d")
	ft.must(CreateTopic{Name: "s", Partitions: 2, Type: TypeSingle})
	part := func() Partition { p, _ := ft.s().Partition("s", 0); return p }
	other, _ := ft.s().Partition("s", 1)
	p := part()
	owner := p.Replicas[0]
	ft.refused(MoveReplica{Topic: "s", Partition: 0, From: "x"}, ErrInvalid)
	ft.refused(MoveReplica{Topic: "s", Partition: 0, From: owner, To: owner}, ErrInvalid)
	ft.refused(MoveDone{Topic: "s", Partition: 0, Version: p.Version, To: owner}, ErrStale)
	ft.must(MoveReplica{Topic: "s", Partition: 0, From: owner})
	m := part()
	to := m.Replicas[1]
	if len(m.Replicas) != 2 || m.Replicas[0] != owner || to == owner || m.Version != p.Version+1 || m.Leader != owner {
		t.Fatalf("a move started: before %+v, after %+v", p, m)
	}
	ft.refused(MoveReplica{Topic: "s", Partition: 0, Version: m.Version, From: owner}, ErrInvalid)       // one move at a time
	ft.refused(MoveReplica{Topic: "s", Partition: 0, Version: p.Version, From: to, To: owner}, ErrStale) // a cancel of another move
	got, err := DecodeSnapshot(encodeSnap(t, ft.s()))
	if err != nil || !sameState(got, ft.s()) {
		t.Fatalf("a snapshot of a move under way: %v", err)
	}
	var next string
	for _, id := range []string{"a", "b", "c", "d"} {
		if id != owner && id != to {
			next = id
		}
	}
	ft.must(MoveReplica{Topic: "s", Partition: 0, Version: m.Version, From: to, To: next}) // retargeted
	ft.refused(MoveDone{Topic: "s", Partition: 0, Version: m.Version, To: to}, ErrStale)
	r := part()
	if !slices.Equal(r.Replicas, []string{owner, next}) || r.Version != m.Version+1 {
		t.Fatalf("retargeted: %+v", r)
	}
	ft.must(MoveReplica{Topic: "s", Partition: 0, Version: r.Version, From: next, To: owner}) // cancelled
	ft.refused(MoveDone{Topic: "s", Partition: 0, Version: r.Version, To: next}, ErrStale)
	if c := part(); !slices.Equal(c.Replicas, []string{owner}) || c.Version != r.Version+1 {
		t.Fatalf("cancelled: %+v", c)
	}
	ft.must(MoveReplica{Topic: "s", Partition: 0, Version: r.Version + 1, From: owner, To: to})
	m = part()
	ft.must(MoveDone{Topic: "s", Partition: 0, Version: m.Version, To: to})
	if d := part(); !slices.Equal(d.Replicas, []string{to}) || d.Leader != to || d.Version != m.Version+1 {
		t.Fatalf("done: %+v", d)
	}
	if o, _ := ft.s().Partition("s", 1); !slices.Equal(o.Replicas, other.Replicas) {
		t.Fatalf("the other partition moved: %+v", o)
	}
	if h := ft.s().Holds(owner); slices.Contains(h, "s/0") {
		t.Fatalf("the node moved from still holds s/0: %v", h)
	}
	got, err = DecodeSnapshot(encodeSnap(t, ft.s()))
	if err != nil || !sameState(got, ft.s()) {
		t.Fatalf("a snapshot after the move: %v", err)
	}
}

// TestMoveReplica_DoubleWrite: a pair's follower moves to a new follower
// at the next epoch with the leader alone in sync; its leader does not
// move (it hands the pair over first), and a stale version is refused.
func TestMoveReplica_DoubleWrite(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	p := ft.dwPart(0)
	ft.refused(MoveReplica{Topic: "d", Partition: 0, Version: p.Version, From: p.Leader}, ErrInvalid)
	ft.refused(MoveReplica{Topic: "d", Partition: 0, Version: p.Version + 1, From: p.Follower()}, ErrStale)
	ft.must(MoveReplica{Topic: "d", Partition: 0, Version: p.Version, From: p.Follower()})
	q := ft.dwPart(0)
	if q.Leader != p.Leader || q.Follower() == p.Follower() || q.Epoch != p.Epoch+1 || !slices.Equal(q.InSync, []string{p.Leader}) || q.Version != p.Version+1 {
		t.Fatalf("before %+v, after %+v", p, q)
	}
}

// TestRemoveNode: a node is removed only once down and holding nothing;
// then it is gone from the state, and registering again makes it a new
// node.
func TestRemoveNode(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c", "d")
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	holder := ft.dwPart(0).Follower()
	ft.refused(RemoveNode{ID: "x"}, ErrNoNode)
	ft.refused(RemoveNode{ID: holder}, ErrNodeUp)
	nd, _ := ft.s().Node(holder)
	ft.must(NodeDown{ID: holder, Session: nd.Session})
	ft.refused(RemoveNode{ID: holder}, ErrNodeHolds)
	idle := ""
	for _, id := range []string{"a", "b", "c", "d"} {
		if len(ft.s().Holds(id)) == 0 {
			idle = id
		}
	}
	nd, _ = ft.s().Node(idle)
	ft.must(NodeDown{ID: idle, Session: nd.Session})
	ft.must(RemoveNode{ID: idle})
	if _, ok := ft.s().Node(idle); ok {
		t.Fatal("a removed node is still in the state")
	}
	res := ft.must(RegisterNode{ID: idle, Addr: idle + ":7000"})
	if nd, _ := ft.s().Node(idle); res.Session != 1 || nd.Joined != res.Index {
		t.Fatalf("registered again: session %d, %+v", res.Session, nd)
	}
}

// TestSnapshot_Version5: a version 5 snapshot (nodes without Draining)
// decodes to the state it held, no node draining.
func TestSnapshot_Version5(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "r", Partitions: 2, Type: TypeRaft3})
	want := ft.s()
	var v7 snapV7
	if err := wire.Unmarshal(encodeSnap(t, want)[len(snapMagic)+1:], &v7); err != nil {
		t.Fatal(err)
	}
	v6 := v7.v6()
	v5 := snapV5{Index: v6.Index, Topics: v6.Topics, Groups: v6.Groups, ACL: v6.ACL, ClusterID: v6.ClusterID}
	for _, n := range v6.Nodes {
		v5.Nodes = append(v5.Nodes, snapNodeV5{ID: n.ID, Addr: n.Addr, Voter: n.Voter, Up: n.Up, Joined: n.Joined, Session: n.Session, Incarnation: n.Incarnation})
	}
	body, err := msgpack.Marshal(&v5)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(append([]byte(snapMagic+"\x05"), body...))
	if err != nil {
		t.Fatal(err)
	}
	if !sameState(want, got) {
		t.Fatal("a version 5 snapshot decodes to another state")
	}
}

// TestBalanceMoves_NewNode: three nodes hold every replica of six Raft3
// groups, two Single partitions each and a DoubleWrite pair; a fourth
// joins empty. The plan moves chunks to it until no move lowers the
// spread, a Raft3 group first, each chunk once, never a DoubleWrite pair, never a Raft3 group
// with a replica lost or down; applied, its moves leave every node within
// one chunk of the others; a bound on the plan is kept.
func TestBalanceMoves_NewNode(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "r", Partitions: 6, Type: TypeRaft3})
	ft.must(CreateTopic{Name: "a", Partitions: 6, Type: TypeSingle}) // before "r" in topic order
	ft.must(CreateTopic{Name: "dw", Partitions: 1, Type: TypeDoubleWrite, AllowAlone: true})
	ft.nodes("d")
	if got := ft.s().BalanceMoves(2); len(got) != 2 {
		t.Fatalf("a plan of at most 2: %v", got)
	}
	plan := ft.s().BalanceMoves(0)
	if len(plan) == 0 || plan[0].Topic != "r" {
		t.Fatalf("a Single partition moves before a Raft3 group that evens the loads alike: %+v", plan)
	}
	seen := map[string]bool{}
	for _, mv := range plan {
		key := fmt.Sprintf("%s/%d", mv.Topic, mv.Partition)
		if seen[key] || mv.Topic == "dw" || mv.To != "d" {
			t.Fatalf("plan %+v", plan)
		}
		seen[key] = true
		ft.must(mv)
	}
	counts := ft.s().replicaCounts()
	if counts["d"] < 5 || counts["d"] > 7 {
		t.Fatalf("after %d moves: %v", len(plan), counts)
	}
	if again := ft.s().BalanceMoves(0); len(again) != 0 {
		t.Fatalf("the moves under way are planned again: %v", again)
	}
	for _, mv := range plan {
		if mv.Topic == "a" && ft.s().Balanceable("a", mv.Partition) {
			t.Fatalf("a Single partition moving is balanceable: %+v", mv)
		}
	}
	if ft.s().Balanceable("dw", 0) || ft.s().Balanceable("none", 0) || ft.s().Balanceable("r", 6) || ft.s().Balanceable("r", -1) {
		t.Fatal("a DoubleWrite pair, an unknown topic or partition is balanceable")
	}

	// A lost replica or a node down keeps a Raft3 group where it is.
	ft2 := newStateT(t)
	ft2.nodes("a", "b", "c")
	ft2.must(CreateTopic{Name: "r", Partitions: 4, Type: TypeRaft3})
	ft2.must(RegisterNode{ID: "a", Addr: "a:7000", Incarnation: "i1"})
	ft2.must(RegisterNode{ID: "a", Addr: "a:7000", Incarnation: "i2"}) // a's disk replaced: its replicas are lost
	ft2.nodes("d")
	if plan := ft2.s().BalanceMoves(0); len(plan) != 0 || ft2.s().Balanceable("r", 0) {
		t.Fatalf("groups with a lost replica moved: %v", plan)
	}
}

// TestMoveReplica_Raft3OneLostAtATime: a Raft3 group takes one new server
// at a time. A move planned while none was lost (BalanceMoves) is refused
// once another replica of the group is lost; the lost replica itself may
// be moved away, its place lost in turn.
func TestMoveReplica_Raft3OneLostAtATime(t *testing.T) {
	ft := newStateT(t)
	for _, id := range []string{"a", "b", "c"} {
		ft.must(RegisterNode{ID: id, Addr: id + ":7000", Incarnation: "i1"})
	}
	ft.must(CreateTopic{Name: "r", Partitions: 4, Type: TypeRaft3})
	ft.nodes("d")
	plan := ft.s().BalanceMoves(0)
	if len(plan) == 0 || plan[0].Topic != "r" {
		t.Fatalf("no Raft3 move planned: %+v", plan)
	}
	mv := plan[0]
	p, _ := ft.s().Partition(mv.Topic, mv.Partition)
	other := p.Replicas[0]
	if other == mv.From {
		other = p.Replicas[1]
	}
	ft.must(RegisterNode{ID: other, Addr: other + ":7000", Incarnation: "i2"}) // its disk replaced: lost
	ft.refused(mv, ErrInvalid)
	ft.must(MoveReplica{Topic: mv.Topic, Partition: mv.Partition, From: other, To: mv.To})
	q, _ := ft.s().Partition(mv.Topic, mv.Partition)
	if slices.Contains(q.Replicas, other) || !slices.Equal(q.Lost, []string{mv.To}) {
		t.Fatalf("the lost replica moved away: %+v", q)
	}
}
