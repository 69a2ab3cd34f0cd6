package metastate

import (
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/wire"
)

// v6 is v in version 6, without Accepted: what a release before version 7
// wrote.
func (v snapV7) v6() snapV6 {
	out := snapV6{Index: v.Index, Nodes: v.Nodes, Groups: v.Groups, ACL: v.ACL, ClusterID: v.ClusterID}
	for _, t := range v.Topics {
		st := snapTopicV6{Name: t.Name, Type: t.Type, Created: t.Created, GroupSize: t.GroupSize, Alone: t.Alone}
		for _, p := range t.Parts {
			st.Parts = append(st.Parts, snapPartV6{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk,
				InSync: p.InSync, Version: p.Version, Lost: p.Lost})
		}
		out.Topics = append(out.Topics, st)
	}
	return out
}

// TestSnapshot_Version6: a version 6 snapshot (partitions without
// Accepted) decodes to the state it held, no pair having given up a
// copy's tail; a version 7 one keeps Accepted, which only a DoubleWrite
// partition at or past that epoch may hold.
func TestSnapshot_Version6(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "d", Partitions: 2, Type: TypeDoubleWrite, GroupSize: 2})
	ft.must(CreateTopic{Name: "r", Partitions: 1, Type: TypeRaft3})
	tp, _ := ft.s().Topic("d")
	tp.Parts = slices.Clone(tp.Parts)
	for i := range tp.Parts {
		tp.Parts[i].Epoch, tp.Parts[i].Accepted = 3, 3
		tp.Parts[i].InSync = tp.Parts[i].InSync[:1] // the leader alone, as after AcceptLoss
	}
	ft.s().topics["d"] = tp
	want := ft.s()
	got, err := DecodeSnapshot(encodeSnap(t, want))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := got.Partition("d", 0); p.Accepted != 3 || !sameState(want, got) {
		t.Fatalf("version 7 round trip: accepted %d, want 3", p.Accepted)
	}
	var v7 snapV7
	if err := wire.Unmarshal(encodeSnap(t, want)[len(snapMagic)+1:], &v7); err != nil {
		t.Fatal(err)
	}
	body, err := msgpack.Marshal(v7.v6())
	if err != nil {
		t.Fatal(err)
	}
	old, err := DecodeSnapshot(append([]byte(snapMagic+"\x06"), body...))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := old.Partition("d", 0); p.Accepted != 0 || p.Epoch != 3 {
		t.Fatalf("version 6: %+v, want no Accepted", p)
	}
	b := encodeSnap(t, want)
	for name, damage := range map[string]func(v *snapV7){
		"PastTheEpoch": func(v *snapV7) { v.Topics[0].Parts[0].Accepted, v.Topics[0].Parts[1].Accepted = 4, 4 },
		"NotItsPairs":  func(v *snapV7) { v.Topics[0].Parts[1].Accepted = 0 },
		"Raft3":        func(v *snapV7) { v.Topics[1].Parts[0].Accepted = 1 },
	} {
		t.Run(name, func(t *testing.T) { corruptSnapshot(t, b, damage) })
	}
}
