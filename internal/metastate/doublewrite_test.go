package metastate

import (
	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/wire"

	"errors"
	"slices"
	"testing"
)

// dwPart returns partition i of DoubleWrite topic "d" as ft's state has it.
func (ft *stateT) dwPart(i int) Partition {
	ft.t.Helper()
	p, ok := ft.s().Partition("d", i)
	if !ok {
		ft.t.Fatalf("no partition d/%d", i)
	}
	return p
}

// refused applies c and fails the test unless it returns want, leaving the
// state as it was.
func (ft *stateT) refused(c Command, want error) {
	ft.t.Helper()
	before := ft.s()
	if _, err := ft.do(c); !errors.Is(err, want) {
		ft.t.Fatalf("%T %+v: %v, want %v", c, c, err, want)
	}
	if !sameState(before, ft.s()) {
		ft.t.Fatalf("%T %+v refused, and the state changed", c, c)
	}
}

// TestDoubleWrite_Placement: a DoubleWrite partition is placed as a pair
// both in sync at version 1 and epoch 1, also when AlterTopic adds it;
// the risk stage is an option of DoubleWrite only.
func TestDoubleWrite_Placement(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	top := ft.must(CreateTopic{Name: "d", Partitions: 3, Type: TypeDoubleWrite, AllowAlone: true}).Topic
	if !top.Alone {
		t.Fatal("AllowAlone not recorded")
	}
	ft.must(AlterTopic{Name: "d", Partitions: 5})
	load := map[string]int{}
	for i := range 5 {
		p := ft.dwPart(i)
		if len(p.Replicas) != 2 || p.Leader != p.Replicas[0] || p.Follower() != p.Replicas[1] ||
			!slices.Equal(p.InSync, p.Replicas) || p.Version != 1 || p.Epoch != 1 {
			t.Fatalf("d/%d placed as %+v", i, p)
		}
		for _, id := range p.Replicas {
			load[id]++
		}
	}
	if slices.Max([]int{load["a"], load["b"], load["c"]})-slices.Min([]int{load["a"], load["b"], load["c"]}) > 1 {
		t.Fatalf("replicas per node %v: not spread by load", load)
	}
	ft.refused(CreateTopic{Name: "r", Partitions: 1, Type: TypeRaft3, AllowAlone: true}, ErrInvalid)
	ft.refused(CreateTopic{Name: "s", Partitions: 1, Type: TypeSingle, AllowAlone: true}, ErrInvalid)
	r := ft.must(CreateTopic{Name: "r", Partitions: 1, Type: TypeRaft3}).Topic
	if r.Parts[0].InSync != nil || r.Parts[0].Version != 0 || r.Alone {
		t.Fatalf("a Raft3 partition with a pair's record: %+v", r)
	}
}

// TestDoubleWrite_SetInSync: the leader shrinks and expands the in-sync
// set with the version it read; a stale version, a set not led by the
// leader, or one naming another node is refused and changes nothing.
func TestDoubleWrite_SetInSync(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	p := ft.dwPart(0)
	l, f := p.Leader, p.Follower()
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 1, InSync: []string{f}}, ErrInvalid)
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 1, InSync: nil}, ErrInvalid)
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 1, InSync: []string{l, l}}, ErrInvalid)
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 1, InSync: []string{l, "c"}}, ErrInvalid)
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 1, InSync: []string{l, f, "c"}}, ErrInvalid)
	ft.refused(SetInSync{Topic: "d", Partition: 1, Version: 1, InSync: []string{l}}, ErrInvalid)
	ft.refused(SetInSync{Topic: "d", Partition: -1, Version: 1, InSync: []string{l}}, ErrInvalid)
	ft.refused(SetInSync{Topic: "x", Partition: 0, Version: 1, InSync: []string{l}}, ErrNoTopic)
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 0, InSync: []string{l}}, ErrStale)
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 2, InSync: []string{l}}, ErrStale)

	ft.must(SetInSync{Topic: "d", Partition: 0, Version: 1, InSync: []string{l}})
	if p := ft.dwPart(0); !slices.Equal(p.InSync, []string{l}) || p.Version != 2 || p.Epoch != 1 || p.Leader != l {
		t.Fatalf("after the shrink: %+v", p)
	}
	// A second proposal made from version 1 lost the race.
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 1, InSync: []string{l}}, ErrStale)
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: 2, InSync: []string{l, f}})
	if p := ft.dwPart(0); !slices.Equal(p.InSync, []string{l, f}) || p.Version != 3 {
		t.Fatalf("after the expand: %+v", p)
	}

	ft.must(CreateTopic{Name: "r", Partitions: 1, Type: TypeRaft3})
	ft.refused(SetInSync{Topic: "r", Partition: 0, Version: 0, InSync: []string{ft.s().topics["r"].Parts[0].Leader}}, ErrInvalid)
}

// TestDoubleWrite_Promote: only an in-sync follower on a live node is
// promoted, to the next epoch, alone in sync, with a new follower chosen
// by load among the other live nodes (the old leader when there is none);
// of a promotion and a shrink made from the same version, one wins.
func TestDoubleWrite_Promote(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c", "d")
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	ft.must(CreateTopic{Name: "load", Partitions: 1, Type: TypeSingle}) // one replica on c (the least loaded after d's pair)
	p := ft.dwPart(0)
	l, f := p.Leader, p.Follower()
	if l != "a" || f != "b" {
		t.Fatalf("d/0 on %q: the test expects a and b", p.Replicas)
	}
	ft.refused(Promote{Topic: "d", Partition: 0, Version: 1, Leader: l}, ErrInvalid)
	ft.refused(Promote{Topic: "d", Partition: 0, Version: 1, Leader: "c"}, ErrNotInSync)
	ft.refused(Promote{Topic: "d", Partition: 0, Version: 0, Leader: f}, ErrStale)
	ft.refused(Promote{Topic: "load", Partition: 0, Version: 0, Leader: "c"}, ErrInvalid)

	// The leader, cut from its follower, shrinks; the master, finding it
	// gone, promotes: both read version 1, the shrink lands first.
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: 1, InSync: []string{l}})
	ft.refused(Promote{Topic: "d", Partition: 0, Version: 1, Leader: f}, ErrStale)
	ft.refused(Promote{Topic: "d", Partition: 0, Version: 2, Leader: f}, ErrNotInSync) // it may lack acked batches
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: 2, InSync: []string{l, f}})

	ft.must(NodeDown{ID: "b", Session: 1})
	ft.refused(Promote{Topic: "d", Partition: 0, Version: 3, Leader: f}, ErrNodeDown)
	ft.must(RegisterNode{ID: "b", Addr: "b:7000"})
	ft.must(NodeDown{ID: "a", Session: 1})
	ft.must(Promote{Topic: "d", Partition: 0, Version: 3, Leader: f})
	p = ft.dwPart(0)
	if p.Leader != f || p.Epoch != 2 || p.Version != 4 || !slices.Equal(p.InSync, []string{f}) ||
		!slices.Equal(p.Replicas, []string{f, "d"}) {
		t.Fatalf("promoted: %+v, want b leading at epoch 2 alone in sync, d (least loaded, up) its follower", p)
	}
	// The old leader's master view is stale: its shrink is refused.
	ft.refused(SetInSync{Topic: "d", Partition: 0, Version: 3, InSync: []string{l}}, ErrStale)

	// With no other node up the old leader stays as the follower.
	ft.must(RegisterNode{ID: "a", Addr: "a:7000"})
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: 4, InSync: []string{f, "d"}})
	ft.must(NodeDown{ID: "a", Session: 2})
	ft.must(NodeDown{ID: "c", Session: 1})
	ft.must(NodeDown{ID: "b", Session: 2})
	ft.must(Promote{Topic: "d", Partition: 0, Version: 5, Leader: "d"})
	if p := ft.dwPart(0); p.Leader != "d" || p.Epoch != 3 || !slices.Equal(p.Replicas, []string{"d", "b"}) {
		t.Fatalf("promoted with no other node up: %+v, want b kept as the follower", p)
	}
}

// TestDoubleWrite_ReplaceFollower: a lost follower is replaced by the
// least loaded live node other than the pair, at the next epoch, the
// leader alone in sync until the new one caught up; with no such node it is
// refused.
func TestDoubleWrite_ReplaceFollower(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	p := ft.dwPart(0)
	ft.must(ReplaceFollower{Topic: "d", Partition: 0, Version: 1})
	q := ft.dwPart(0)
	if q.Leader != p.Leader || q.Epoch != p.Epoch+1 || q.Follower() != "c" || !slices.Equal(q.InSync, []string{p.Leader}) || q.Version != 2 {
		t.Fatalf("after ReplaceFollower: %+v (before %+v)", q, p)
	}
	ft.refused(ReplaceFollower{Topic: "d", Partition: 0, Version: 1}, ErrStale)
	ft.must(NodeDown{ID: p.Follower(), Session: 1})
	ft.refused(ReplaceFollower{Topic: "d", Partition: 0, Version: 2}, ErrNotEnoughNodes)
}

// TestDoubleWrite_RenewEpoch: the leader's new epoch changes nothing else;
// a stale version is refused (internal/cluster's
// TestPairLeader_OnlyTheLeaderProposes: only the leader's node may propose
// it through the RPC).
func TestDoubleWrite_RenewEpoch(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b")
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	p := ft.dwPart(0)
	ft.must(RenewEpoch{Topic: "d", Partition: 0, Version: 1})
	q := ft.dwPart(0)
	if q.Epoch != p.Epoch+1 || q.Leader != p.Leader || !slices.Equal(q.Replicas, p.Replicas) || !slices.Equal(q.InSync, p.InSync) || q.Version != 2 {
		t.Fatalf("after RenewEpoch: %+v (before %+v)", q, p)
	}
	ft.refused(RenewEpoch{Topic: "d", Partition: 0, Version: 1}, ErrStale)
	ft.refused(RenewEpoch{Topic: "x", Partition: 0, Version: 2}, ErrNoTopic)
}

// TestDoubleWrite_Snapshot: a pair round-trips; a version 2 snapshot's DoubleWrite
// partitions read with both replicas in sync at version 1; damaged pair
// fields are ErrCorrupt.
func TestDoubleWrite_Snapshot(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "d", Partitions: 2, Type: TypeDoubleWrite, AllowAlone: true})
	ft.must(CreateTopic{Name: "r", Partitions: 1, Type: TypeRaft3})
	ft.must(Promote{Topic: "d", Partition: 1, Version: 1, Leader: ft.dwPart(1).Follower()})
	s := ft.s()
	b := encodeSnap(t, s)
	got, err := DecodeSnapshot(b)
	if err != nil || !sameState(s, got) {
		t.Fatalf("round trip: %v", err)
	}

	var v3 snapV7
	if err := wire.Unmarshal(b[len(snapMagic)+1:], &v3); err != nil {
		t.Fatal(err)
	}
	var v2 snapV2
	v2.Index, v2.Nodes, v2.Groups, v2.ACL = v3.Index, nodesV4(v3.Nodes), v3.Groups, rulesV4(v3.ACL)
	for _, st := range v3.Topics {
		t2 := snapTopicV2{Name: st.Name, Type: st.Type, Created: st.Created, GroupSize: st.GroupSize}
		for _, p := range st.Parts {
			t2.Parts = append(t2.Parts, snapPartV2{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk})
		}
		v2.Topics = append(v2.Topics, t2)
	}
	body, err := msgpack.Marshal(&v2)
	if err != nil {
		t.Fatal(err)
	}
	old, err := DecodeSnapshot(append([]byte(snapMagic+"\x02"), body...))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		p, _ := old.Partition("d", i)
		if !slices.Equal(p.InSync, p.Replicas) || p.Version != 1 {
			t.Fatalf("d/%d of a version 2 snapshot: %+v", i, p)
		}
	}
	if p, _ := old.Partition("r", 0); p.InSync != nil || p.Version != 0 {
		t.Fatalf("r/0 of a version 2 snapshot: %+v", p)
	}

	for name, damage := range map[string]func(v *snapV7){
		"VersionZero":   func(v *snapV7) { v.Topics[0].Parts[0].Version = 0 },
		"FollowerAlone": func(v *snapV7) { p := &v.Topics[0].Parts[0]; p.InSync = []string{p.Replicas[1]} },
		"FollowerFirst": func(v *snapV7) { p := &v.Topics[0].Parts[0]; p.InSync = []string{p.Replicas[1], p.Replicas[0]} },
		"LeaderTwice":   func(v *snapV7) { p := &v.Topics[0].Parts[0]; p.InSync = []string{p.Leader, p.Leader} },
		"OtherInSync":   func(v *snapV7) { p := &v.Topics[0].Parts[0]; p.InSync = []string{p.Leader, "zz"} },
		"ThreeInSync":   func(v *snapV7) { p := &v.Topics[0].Parts[0]; p.InSync = append(p.InSync, "c") },
		"Raft3InSync":   func(v *snapV7) { v.Topics[1].Parts[0].InSync = []string{v.Topics[1].Parts[0].Leader} },
		"Raft3Version":  func(v *snapV7) { v.Topics[1].Parts[0].Version = 1 },
		"Raft3Alone":    func(v *snapV7) { v.Topics[1].Alone = true },
	} {
		t.Run(name, func(t *testing.T) { corruptSnapshot(t, b, damage) })
	}
}

// TestDoubleWrite_CommandVersion2: a CreateTopic of version 2 (without
// AllowAlone) still decodes.
func TestDoubleWrite_CommandVersion2(t *testing.T) {
	body, err := msgpack.Marshal(&createTopicV2{Name: "d", Partitions: 2, Type: TypeDoubleWrite, Now: 5, GroupSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	c, err := DecodeCommand(append([]byte{cmdMagic, 2, kindCreateTopic}, body...))
	if err != nil {
		t.Fatal(err)
	}
	if want := (CreateTopic{Name: "d", Partitions: 2, Type: TypeDoubleWrite, Now: 5, GroupSize: 1}); c != want {
		t.Fatalf("decoded %+v, want %+v", c, want)
	}
}

// TestDoubleWrite_Chunks: the partitions placed together share a pair and
// its record: a command naming any of them changes all of them, and none
// of another chunk; a snapshot round-trips them, and one whose chunk
// members disagree is ErrCorrupt.
func TestDoubleWrite_Chunks(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c", "d")
	top := ft.must(CreateTopic{Name: "d", Partitions: 5, Type: TypeDoubleWrite, GroupSize: 2}).Topic
	for i, want := range []int{0, 0, 2, 2, 4} {
		if got := top.Parts[i].Chunk; got != want {
			t.Fatalf("d/%d in chunk %d, want %d", i, got, want)
		}
	}
	if slices.Equal(top.Parts[0].Replicas, top.Parts[2].Replicas) {
		t.Fatalf("two chunks on the same pair %q: not spread by load", top.Parts[0].Replicas)
	}
	p := ft.dwPart(1)
	ft.must(SetInSync{Topic: "d", Partition: 1, Version: 1, InSync: []string{p.Leader}})
	for i := range 2 {
		if q := ft.dwPart(i); q.Version != 2 || !slices.Equal(q.InSync, []string{p.Leader}) || q.Chunk != 0 {
			t.Fatalf("d/%d after SetInSync on d/1: %+v", i, q)
		}
	}
	if q := ft.dwPart(2); q.Version != 1 || len(q.InSync) != 2 {
		t.Fatalf("d/2, another chunk, changed: %+v", q)
	}
	ft.refused(RenewEpoch{Topic: "d", Partition: 0, Version: 1}, ErrStale)
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: 2, InSync: p.Replicas})
	ft.must(NodeDown{ID: p.Leader, Session: 1})
	ft.must(Promote{Topic: "d", Partition: 0, Version: 3, Leader: p.Follower()})
	a, b := ft.dwPart(0), ft.dwPart(1)
	if a.Leader != p.Follower() || a.Epoch != 2 || a.Version != 4 || !slices.Equal(a.Replicas, b.Replicas) ||
		a.Leader != b.Leader || a.Epoch != b.Epoch || a.Version != b.Version || !slices.Equal(a.InSync, b.InSync) || b.Chunk != 0 {
		t.Fatalf("after Promote on d/0: d/0 %+v, d/1 %+v", a, b)
	}
	ft.must(AlterTopic{Name: "d", Partitions: 6})
	if q := ft.dwPart(5); q.Chunk != 5 || q.Version != 1 {
		t.Fatalf("d/5 added by AlterTopic: %+v, want a chunk of its own", q)
	}

	s := ft.s()
	b64 := encodeSnap(t, s)
	got, err := DecodeSnapshot(b64)
	if err != nil || !sameState(s, got) {
		t.Fatalf("round trip: %v", err)
	}
	for name, damage := range map[string]func(v *snapV7){
		"Epoch":   func(v *snapV7) { v.Topics[0].Parts[1].Epoch++ },
		"Version": func(v *snapV7) { v.Topics[0].Parts[3].Version++ },
		"InSync":  func(v *snapV7) { p := &v.Topics[0].Parts[1]; p.InSync = p.Replicas },
		"Leader": func(v *snapV7) {
			p := &v.Topics[0].Parts[3]
			p.Leader, p.InSync = p.Replicas[1], []string{p.Replicas[1]}
		},
	} {
		t.Run(name, func(t *testing.T) { corruptSnapshot(t, b64, damage) })
	}
	ft.refused(CreateTopic{Name: "s", Partitions: 2, Type: TypeSingle, GroupSize: 2}, ErrInvalid)
	ft.refused(CreateTopic{Name: "big", Partitions: 2, Type: TypeDoubleWrite, GroupSize: MaxGroupSize + 1}, ErrInvalid)
}

// TestDoubleWrite_NewIncarnation: a node registering with another
// incarnation than recorded (its data directory replaced) loses every
// replica's place in sync at once: as a follower it is out of sync and its
// leader replicates to it anew at the next epoch; as a leader with a
// follower in sync, the follower leads at the next epoch, with the node as
// its follower; as a leader without one, no replica is in sync and none
// may vouch for itself. The same incarnation, or none (an older release),
// changes nothing, and a snapshot keeps the incarnations.
func TestDoubleWrite_NewIncarnation(t *testing.T) {
	ft := newStateT(t)
	for _, id := range []string{"a", "b", "c"} {
		ft.must(RegisterNode{ID: id, Addr: id + ":7000", Incarnation: "i1-" + id})
	}
	ft.must(CreateTopic{Name: "d", Partitions: 3, Type: TypeDoubleWrite, AllowAlone: true})
	var asFollower, asLeader, alone int = -1, -1, -1
	for i := range 3 {
		switch p := ft.dwPart(i); {
		case p.Follower() == "b" && asFollower < 0:
			asFollower = i
		case p.Leader == "b" && asLeader < 0:
			asLeader = i
		}
	}
	if asFollower < 0 || asLeader < 0 {
		t.Fatalf("b neither leads nor follows one of d's pairs: %+v %+v %+v", ft.dwPart(0), ft.dwPart(1), ft.dwPart(2))
	}
	// One pair b leads alone in sync (the risk stage): no intact copy
	// but b's.
	ft.must(CreateTopic{Name: "e", Partitions: 1, Type: TypeDoubleWrite, AllowAlone: true})
	e, _ := ft.s().Partition("e", 0)
	if e.Leader == "b" {
		alone = 0
		ft.must(SetInSync{Topic: "e", Partition: 0, Version: e.Version, InSync: []string{"b"}})
	}
	before := map[int]Partition{}
	for i := range 3 {
		before[i] = ft.dwPart(i)
	}
	nd, _ := ft.s().Node("b")

	// The same incarnation, and none, change nothing.
	ft.must(RegisterNode{ID: "b", Addr: "b:7000", Incarnation: "i1-b"})
	ft.must(RegisterNode{ID: "b", Addr: "b:7000"})
	for i := range 3 {
		if p := ft.dwPart(i); p.Version != before[i].Version {
			t.Fatalf("d/%d changed by a registration of the same incarnation: %+v", i, p)
		}
	}

	ft.must(RegisterNode{ID: "b", Addr: "b:7000", Incarnation: "i2-b"})
	if got, _ := ft.s().Node("b"); got.Incarnation != "i2-b" || got.Session != nd.Session+1 || !got.Up {
		t.Fatalf("b after its new incarnation: %+v (before %+v)", got, nd)
	}
	f := ft.dwPart(asFollower)
	if want := before[asFollower]; f.Leader != want.Leader || !slices.Equal(f.InSync, []string{want.Leader}) || f.Epoch != want.Epoch+1 {
		t.Fatalf("the pair b followed: %+v, want %s alone in sync at epoch %d", f, want.Leader, want.Epoch+1)
	}
	l := ft.dwPart(asLeader)
	if want := before[asLeader]; l.Leader != want.Follower() || !slices.Equal(l.Replicas, []string{want.Follower(), "b"}) ||
		!slices.Equal(l.InSync, []string{want.Follower()}) || l.Epoch != want.Epoch+1 {
		t.Fatalf("the pair b led: %+v, want %s leading alone in sync at epoch %d, b its follower", l, want.Follower(), want.Epoch+1)
	}
	// b caught up is recorded in sync by its leader as before.
	ft.must(SetInSync{Topic: "d", Partition: asFollower, Version: f.Version, InSync: []string{f.Leader, "b"}})
	if alone == 0 {
		p, _ := ft.s().Partition("e", 0)
		if p.Leader != "b" || len(p.InSync) != 0 {
			t.Fatalf("the pair b led alone: %+v, want no replica in sync", p)
		}
		ft.refused(SetInSync{Topic: "e", Partition: 0, Version: p.Version, InSync: []string{"b"}}, ErrNotInSync)
	}
	b, err := EncodeSnapshot(ft.s())
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if !sameState(back, ft.s()) {
		t.Fatal("the snapshot lost a node's incarnation or a record")
	}
	if got, _ := back.Node("b"); got.Incarnation != "i2-b" {
		t.Fatalf("b's incarnation after a snapshot: %q", got.Incarnation)
	}
}

// TestRaft3_LostAndRejoined: a node registering as a new incarnation marks
// its replicas of every Raft3 group lost, all the partitions of a group
// alike, and the snapshot keeps them; Rejoined from its current
// incarnation clears its mark in the whole group, and from an older one
// is ErrStale, changing nothing; a Rejoined of a replica not lost changes
// nothing; other types refuse it.
func TestRaft3_LostAndRejoined(t *testing.T) {
	ft := newStateT(t)
	for _, id := range []string{"a", "b", "c"} {
		ft.must(RegisterNode{ID: id, Addr: id + ":7000", Incarnation: "i1-" + id})
	}
	ft.must(CreateTopic{Name: "r", Partitions: 4, Type: TypeRaft3, GroupSize: 2})
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	ft.must(RegisterNode{ID: "b", Addr: "b:7000", Incarnation: "i2-b"})
	for i := range 4 {
		if p, _ := ft.s().Partition("r", i); !slices.Equal(p.Lost, []string{"b"}) {
			t.Fatalf("r/%d after b's new incarnation: lost %q", i, p.Lost)
		}
	}
	b, err := EncodeSnapshot(ft.s())
	if err != nil {
		t.Fatal(err)
	}
	if back, err := DecodeSnapshot(b); err != nil || !sameState(back, ft.s()) {
		t.Fatalf("a snapshot with lost replicas: %v", err)
	}
	ft.refused(Rejoined{Topic: "r", Partition: 1, Node: "b", Incarnation: "i1-b"}, ErrStale)
	ft.refused(Rejoined{Topic: "d", Partition: 0, Node: "b", Incarnation: "i2-b"}, ErrInvalid)
	ft.refused(Rejoined{Topic: "r", Partition: 4, Node: "b", Incarnation: "i2-b"}, ErrInvalid)
	ft.must(Rejoined{Topic: "r", Partition: 1, Node: "b", Incarnation: "i2-b"})
	for i := range 4 {
		p, _ := ft.s().Partition("r", i)
		if want := i >= 2; (len(p.Lost) > 0) != want {
			t.Fatalf("r/%d after b rejoined the group of r/0: lost %q", i, p.Lost)
		}
	}
	ft.must(Rejoined{Topic: "r", Partition: 0, Node: "b", Incarnation: "i2-b"})
	for i := range 4 {
		p, _ := ft.s().Partition("r", i)
		if want := i >= 2; (len(p.Lost) > 0) != want {
			t.Fatalf("r/%d after a Rejoined of a replica not lost: lost %q", i, p.Lost)
		}
	}
}

// TestHandOver: a pair's leader and follower, both in sync and up, swap
// at the next epoch, both staying in sync, the new leader first; it is
// refused at a stale version, for the leader itself, with either replica
// out of sync, with either node down, or to a node that drains.
func TestHandOver(t *testing.T) {
	ft := newStateT(t)
	for _, id := range []string{"a", "b", "c"} {
		ft.must(RegisterNode{ID: id, Addr: id + ":7000", Incarnation: "i1-" + id})
	}
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite})
	p := ft.dwPart(0)
	leader, follower := p.Leader, p.Follower()
	ft.refused(HandOver{Topic: "d", Partition: 0, Version: p.Version - 1, Leader: follower}, ErrStale)
	ft.refused(HandOver{Topic: "d", Partition: 0, Version: p.Version, Leader: leader}, ErrInvalid)
	ft.refused(HandOver{Topic: "x", Partition: 0, Version: p.Version, Leader: follower}, ErrNoTopic)
	for _, down := range []string{leader, follower} {
		nd, _ := ft.s().Node(down)
		ft.must(NodeDown{ID: down, Session: nd.Session})
		ft.refused(HandOver{Topic: "d", Partition: 0, Version: ft.dwPart(0).Version, Leader: follower}, ErrNodeDown)
		ft.must(RegisterNode{ID: down, Addr: down + ":7000", Incarnation: "i1-" + down})
	}
	ft.must(DrainNode{ID: follower, Draining: true})
	ft.refused(HandOver{Topic: "d", Partition: 0, Version: ft.dwPart(0).Version, Leader: follower}, ErrInvalid)
	ft.must(DrainNode{ID: follower, Draining: false})
	if p := ft.dwPart(0); len(p.InSync) == 2 {
		ft.must(SetInSync{Topic: "d", Partition: 0, Version: p.Version, InSync: []string{leader}})
	}
	ft.refused(HandOver{Topic: "d", Partition: 0, Version: ft.dwPart(0).Version, Leader: follower}, ErrNotInSync)
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: ft.dwPart(0).Version, InSync: []string{leader, follower}})
	before := ft.dwPart(0)
	ft.must(HandOver{Topic: "d", Partition: 0, Version: before.Version, Leader: follower})
	got := ft.dwPart(0)
	if got.Leader != follower || !slices.Equal(got.Replicas, []string{follower, leader}) || !slices.Equal(got.InSync, []string{follower, leader}) ||
		got.Epoch != before.Epoch+1 || got.Version == before.Version {
		t.Fatalf("after HandOver: %+v (before %+v)", got, before)
	}
	back, err := DecodeSnapshot(encodeSnap(t, ft.s()))
	if err != nil || !sameState(back, ft.s()) {
		t.Fatalf("a snapshot after HandOver: %v", err)
	}
}

// TestAcceptLoss: a pair whose leader acked alone and came back as a new
// incarnation holds no replica in sync; AcceptLoss, at the record's
// version, makes the named replica lead alone in sync at the next epoch,
// the other its follower. It is refused with a replica in sync, a stale
// version, a node that is no replica or one that is down; a snapshot
// keeps the result.
func TestAcceptLoss(t *testing.T) {
	ft := newStateT(t)
	for _, id := range []string{"a", "b", "c"} {
		ft.must(RegisterNode{ID: id, Addr: id + ":7000", Incarnation: "i1-" + id})
	}
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite, AllowAlone: true})
	p := ft.dwPart(0)
	leader, follower := p.Leader, p.Follower()
	third := "c"
	for _, id := range []string{"a", "b", "c"} {
		if id != leader && id != follower {
			third = id
		}
	}
	ft.refused(AcceptLoss{Topic: "d", Partition: 0, Version: p.Version, Leader: follower}, ErrInvalid) // both in sync after creation
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: p.Version, InSync: []string{leader}})
	ft.refused(AcceptLoss{Topic: "d", Partition: 0, Version: ft.dwPart(0).Version, Leader: follower}, ErrInvalid) // the leader in sync
	ft.must(RegisterNode{ID: leader, Addr: leader + ":7000", Incarnation: "i2-" + leader})
	lost := ft.dwPart(0)
	if lost.Leader != leader || len(lost.InSync) != 0 {
		t.Fatalf("the pair after its lone leader's new incarnation: %+v", lost)
	}
	ft.refused(AcceptLoss{Topic: "d", Partition: 0, Version: lost.Version - 1, Leader: follower}, ErrStale)
	ft.refused(AcceptLoss{Topic: "d", Partition: 0, Version: lost.Version, Leader: third}, ErrInvalid)
	ft.refused(AcceptLoss{Topic: "x", Partition: 0, Version: lost.Version, Leader: follower}, ErrNoTopic)
	nd, _ := ft.s().Node(follower)
	ft.must(NodeDown{ID: follower, Session: nd.Session})
	ft.refused(AcceptLoss{Topic: "d", Partition: 0, Version: lost.Version, Leader: follower}, ErrNodeDown)
	ft.must(RegisterNode{ID: follower, Addr: follower + ":7000", Incarnation: "i1-" + follower})
	lost = ft.dwPart(0)
	ft.must(AcceptLoss{Topic: "d", Partition: 0, Version: lost.Version, Leader: follower})
	got := ft.dwPart(0)
	if got.Leader != follower || !slices.Equal(got.Replicas, []string{follower, leader}) || !slices.Equal(got.InSync, []string{follower}) ||
		got.Epoch != lost.Epoch+1 || got.Accepted != got.Epoch {
		t.Fatalf("after AcceptLoss: %+v (before %+v)", got, lost)
	}
	back, err := DecodeSnapshot(encodeSnap(t, ft.s()))
	if err != nil || !sameState(back, ft.s()) {
		t.Fatalf("a snapshot after AcceptLoss: %v", err)
	}
	// Accepted lasts while the leader alone holds the fence, and ends once
	// its follower is in sync too.
	ft.must(RenewEpoch{Topic: "d", Partition: 0, Version: got.Version})
	if p := ft.dwPart(0); p.Accepted != got.Epoch || p.Epoch != got.Epoch+1 {
		t.Fatalf("after RenewEpoch: %+v, want Accepted %d kept", p, got.Epoch)
	}
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: ft.dwPart(0).Version, InSync: []string{follower}})
	if p := ft.dwPart(0); p.Accepted == 0 {
		t.Fatalf("the leader alone in sync: %+v, want Accepted kept", p)
	}
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: ft.dwPart(0).Version, InSync: []string{follower, leader}})
	if p := ft.dwPart(0); p.Accepted != 0 {
		t.Fatalf("both in sync: %+v, want Accepted 0", p)
	}
}

// lostPair returns a state whose DoubleWrite pair d/0 has no intact copy:
// its leader acked alone, then came back as a new incarnation
// (lostCopies). It returns the leader, the follower and the third node.
func lostPair(t *testing.T) (ft *stateT, leader, follower, third string) {
	ft = newStateT(t)
	for _, id := range []string{"a", "b", "c"} {
		ft.must(RegisterNode{ID: id, Addr: id + ":7000", Incarnation: "i1-" + id})
	}
	ft.must(CreateTopic{Name: "d", Partitions: 1, Type: TypeDoubleWrite, AllowAlone: true})
	p := ft.dwPart(0)
	leader, follower = p.Leader, p.Follower()
	for _, id := range []string{"a", "b", "c"} {
		if id != leader && id != follower {
			third = id
		}
	}
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: p.Version, InSync: []string{leader}})
	ft.must(RegisterNode{ID: leader, Addr: leader + ":7000", Incarnation: "i2-" + leader})
	if lost := ft.dwPart(0); lost.Leader != leader || len(lost.InSync) != 0 {
		t.Fatalf("the pair after its lone leader's new incarnation: %+v", lost)
	}
	return ft, leader, follower, third
}

// TestNoIntactCopy_OnlyAcceptLossEndsIt: a pair whose leader acked alone
// and came back as a new incarnation holds no replica in sync. Neither
// ReplaceFollower (the failover's, its follower down) nor a MoveReplica
// of its follower ends that, recording the wiped leader in sync (before,
// both did: it led its empty log, every acked batch given up with no
// operator's decision); AcceptLoss naming the leader is refused too.
func TestNoIntactCopy_OnlyAcceptLossEndsIt(t *testing.T) {
	ft, leader, follower, third := lostPair(t)
	lost := ft.dwPart(0)
	ft.refused(MoveReplica{Topic: "d", Partition: 0, Version: lost.Version, From: follower, To: third}, ErrNotInSync)
	ft.refused(AcceptLoss{Topic: "d", Partition: 0, Version: lost.Version, Leader: leader}, ErrInvalid)
	nd, _ := ft.s().Node(follower)
	ft.must(NodeDown{ID: follower, Session: nd.Session})
	ft.refused(ReplaceFollower{Topic: "d", Partition: 0, Version: ft.dwPart(0).Version}, ErrNotInSync)
}
