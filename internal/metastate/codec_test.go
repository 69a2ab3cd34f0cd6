package metastate

import (
	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/wire"

	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/zeze-go/mq/internal/fuzzseed"
)

var (
	genNodes   = []string{"n1", "n2", "n3", "n4", "n5"}
	genTopics  = []string{"t1", "t2", "t3"}
	genGroups  = []string{"g1", "g2"}
	genMembers = []string{"m1", "m2", "m3", "m4", "m5", "m6"}
)

// randomCommand returns a command likely to apply to s, and sometimes one
// that fails (stale, out of range, unknown names).
func randomCommand(rng *rand.Rand, s *State) Command {
	pick := func(l []string) string { return l[rng.IntN(len(l))] }
	switch x := rng.IntN(100); {
	case x < 10:
		return RegisterNode{ID: pick(genNodes), Addr: pick(genNodes) + ":7000", Voter: rng.IntN(2) == 0}
	case x < 15:
		id := pick(genNodes)
		n, _ := s.Node(id)
		return NodeDown{ID: id, Session: n.Session - uint64(rng.IntN(2))}
	case x < 25:
		types := []uint8{TypeSingle, TypeDoubleWrite, TypeRaft3, 3}
		return CreateTopic{Name: pick(genTopics), Partitions: rng.IntN(9), Type: types[rng.IntN(len(types))], Now: rng.Int64(),
			GroupSize: rng.IntN(4)}
	case x < 30:
		t, _ := s.Topic(pick(genTopics))
		return AlterTopic{Name: t.Name, Partitions: len(t.Parts) + rng.IntN(4) - 1}
	case x < 55:
		return JoinGroup{Topic: pick(genTopics), Group: pick(genGroups), Member: pick(genMembers), Node: pick(genNodes)}
	case x < 65:
		return LeaveGroup{Topic: pick(genTopics), Group: pick(genGroups), Member: pick(genMembers)}
	case x < 88:
		return randomPairCommand(rng, s, pick(genTopics))
	case x < 95:
		k := GroupKey{pick(genTopics), pick(genGroups)}
		g := s.groups[k]
		if len(g.Revoking) == 0 {
			return Released{Topic: k.Topic, Group: k.Group, Partition: rng.IntN(4), Member: pick(genMembers), Generation: g.Generation}
		}
		ps := slices.Sorted(maps.Keys(g.Revoking))
		p := ps[rng.IntN(len(ps))]
		return Released{Topic: k.Topic, Group: k.Group, Partition: p, Member: g.Owners[p], Generation: g.Generation - uint64(rng.IntN(2))}
	default:
		var rules []Rule
		for range rng.IntN(3) {
			rules = append(rules, Rule{Identity: pick(genMembers) + "*", Topic: pick(genTopics), Rights: Rights(1 + rng.IntN(7))})
		}
		return SetACL{Rules: rules}
	}
}

// randomPairCommand returns a command of a DoubleWrite partition of topic,
// or a move of a partition of any type, at its version or the one before
// (stale), often of another type's partition (refused).
func randomPairCommand(rng *rand.Rand, s *State, topic string) Command {
	t, _ := s.Topic(topic)
	if len(t.Parts) == 0 {
		return ReplaceFollower{Topic: topic}
	}
	i := rng.IntN(len(t.Parts))
	p := t.Parts[i]
	v := p.Version - uint64(rng.IntN(2))
	switch rng.IntN(8) {
	case 7:
		return HandOver{Topic: topic, Partition: i, Version: v, Leader: p.Follower()}
	case 6:
		return AcceptLoss{Topic: topic, Partition: i, Version: v, Leader: p.Replicas[rng.IntN(len(p.Replicas))]}
	case 4:
		to := ""
		if rng.IntN(2) == 0 {
			to = genNodes[rng.IntN(len(genNodes))]
		}
		return MoveReplica{Topic: topic, Partition: i, Version: v, From: p.Replicas[rng.IntN(len(p.Replicas))], To: to}
	case 5:
		return MoveDone{Topic: topic, Partition: i, Version: v, To: p.Replicas[len(p.Replicas)-1]}
	case 0:
		return Promote{Topic: topic, Partition: i, Version: v, Leader: p.Follower()}
	case 2:
		return RenewEpoch{Topic: topic, Partition: i, Version: v}
	case 1:
		return SetInSync{Topic: topic, Partition: i, Version: v, InSync: p.Replicas[:1+rng.IntN(len(p.Replicas))]}
	}
	return ReplaceFollower{Topic: topic, Partition: i, Version: v}
}

// randomState applies n random commands from seed to a new state.
func randomState(t testing.TB, seed uint64, n int) *stateT {
	rng := rand.New(rand.NewPCG(seed, 2))
	ft := newStateT(t)
	for range n {
		_, _ = ft.do(randomCommand(rng, ft.s()))
	}
	return ft
}

func encodeSnap(t testing.TB, s *State) []byte {
	t.Helper()
	b, err := EncodeSnapshot(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameState(a, b *State) bool {
	return a.index == b.index && reflect.DeepEqual(a.nodes, b.nodes) && reflect.DeepEqual(a.topics, b.topics) &&
		reflect.DeepEqual(a.groups, b.groups) && reflect.DeepEqual(a.acl, b.acl)
}

func TestSnapshot_RoundTrip(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			s := randomState(t, seed, 300).s()
			b := encodeSnap(t, s)
			got, err := DecodeSnapshot(b)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !sameState(s, got) {
				t.Fatalf("restored state differs:\n%+v\n%+v", s, got)
			}
			if again := encodeSnap(t, got); !bytes.Equal(again, b) {
				t.Fatal("restored state encodes differently")
			}
		})
	}
	t.Run("Empty", func(t *testing.T) {
		b := encodeSnap(t, New())
		got, err := DecodeSnapshot(b)
		if err != nil || !bytes.Equal(encodeSnap(t, got), b) {
			t.Fatalf("empty state: %v", err)
		}
	})
}

// TestSnapshot_Version1 reads a snapshot of version 1, before partitions
// shared raft groups: every partition is in a group of its own.
func TestSnapshot_Version1(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "r", Partitions: 3, Type: TypeRaft3})
	ft.must(CreateTopic{Name: "s", Partitions: 2, Type: TypeSingle})
	want := ft.s()
	b := encodeSnap(t, want)
	// The same state as version 1 wrote it.
	var v3 snapV7
	if err := wire.Unmarshal(b[len(snapMagic)+1:], &v3); err != nil {
		t.Fatal(err)
	}
	var v1 snapV1
	v1.Index, v1.Nodes, v1.Groups, v1.ACL = v3.Index, nodesV4(v3.Nodes), v3.Groups, rulesV4(v3.ACL)
	for _, st := range v3.Topics {
		t1 := snapTopicV1{Name: st.Name, Type: st.Type, Created: st.Created}
		for _, p := range st.Parts {
			t1.Parts = append(t1.Parts, snapPartV1{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch})
		}
		v1.Topics = append(v1.Topics, t1)
	}
	body, err := msgpack.Marshal(&v1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(append([]byte(snapMagic+"\x01"), body...))
	if err != nil {
		t.Fatal(err)
	}
	if !sameState(want, got) {
		t.Fatalf("version 1 read as\n%+v, want\n%+v", got.topics, want.topics)
	}
	// A version 3 body is not a version 1 snapshot.
	if _, err := DecodeSnapshot(append([]byte(snapMagic+"\x01"), b[len(snapMagic)+1:]...)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("v3 body as v1: %v", err)
	}
}

// TestSnapshot_BadGroups: a snapshot whose raft groups Apply could not
// have made is ErrCorrupt.
func TestSnapshot_BadGroups(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c", "d")
	ft.must(CreateTopic{Name: "r", Partitions: 4, Type: TypeRaft3, GroupSize: 2})
	ft.must(CreateTopic{Name: "s", Partitions: 2, Type: TypeSingle})
	b := encodeSnap(t, ft.s())
	for _, tc := range []struct {
		name   string
		damage func(v *snapV7)
	}{
		{"ChunkAhead", func(v *snapV7) { v.Topics[0].Parts[0].Chunk = 1 }},
		{"ChunkNegative", func(v *snapV7) { v.Topics[0].Parts[1].Chunk = -1 }},
		{"ChunkSkips", func(v *snapV7) { v.Topics[0].Parts[3].Chunk = 0 }},
		{"GroupTooLong", func(v *snapV7) { v.Topics[0].Parts[2].Chunk, v.Topics[0].Parts[3].Chunk = 0, 0 }},
		{"OtherReplicas", func(v *snapV7) { v.Topics[0].Parts[1].Replicas = v.Topics[0].Parts[2].Replicas }},
		{"SizeZero", func(v *snapV7) { v.Topics[0].GroupSize = 0 }},
		{"SizeTooBig", func(v *snapV7) { v.Topics[0].GroupSize = MaxGroupSize + 1 }},
		{"SizeNotRaft3", func(v *snapV7) { v.Topics[1].GroupSize = 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) { corruptSnapshot(t, b, tc.damage) })
	}
}

// corruptSnapshot fails the test unless snapshot b, with damage done to
// its decoded fields, is ErrCorrupt.
func corruptSnapshot(t *testing.T, b []byte, damage func(v *snapV7)) {
	t.Helper()
	var v snapV7
	if err := wire.Unmarshal(b[len(snapMagic)+1:], &v); err != nil {
		t.Fatal(err)
	}
	damage(&v)
	body, err := msgpack.Marshal(&v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeSnapshot(append(slices.Clone(b[:len(snapMagic)+1]), body...)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("decoded: %v", err)
	}
}

// TestDecodeCommand_Version1 reads a CreateTopic of version 1, without
// GroupSize.
func TestDecodeCommand_Version1(t *testing.T) {
	body, err := msgpack.Marshal(&createTopicV1{Name: "t", Partitions: 3, Type: TypeRaft3, Replicas: 3, Now: 7})
	if err != nil {
		t.Fatal(err)
	}
	c, err := DecodeCommand(append([]byte{cmdMagic, 1, kindCreateTopic}, body...))
	if want := (CreateTopic{Name: "t", Partitions: 3, Type: TypeRaft3, Replicas: 3, Now: 7}); err != nil || c != want {
		t.Fatalf("decoded %+v, %v", c, err)
	}
}

// TestApply_Deterministic feeds two states the same commands (one through
// the raft log's bytes, one as values) and compares their encoded states
// after every command, and their results.
func TestApply_Deterministic(t *testing.T) {
	for seed := range uint64(10) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 3))
			a, b := newStateT(t), newStateT(t)
			for i := range 300 {
				c := randomCommand(rng, a.s())
				ra, ea := a.do(c)
				b.index++
				rb, eb := b.apply(c)
				if fmt.Sprint(ea) != fmt.Sprint(eb) || !reflect.DeepEqual(ra, rb) {
					t.Fatalf("step %d %T: results %+v %v and %+v %v", i, c, ra, ea, rb, eb)
				}
				if !bytes.Equal(encodeSnap(t, a.s()), encodeSnap(t, b.s())) {
					t.Fatalf("step %d %T: states differ", i, c)
				}
			}
		})
	}
}

func TestDecodeCommand_Errors(t *testing.T) {
	valid, err := EncodeCommand(JoinGroup{Topic: "t", Group: "g", Member: "m", Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"Empty", nil},
		{"Short", valid[:3]},
		{"Cut", valid[:len(valid)-1]},
		{"Trailing", append(slices.Clone(valid), 0)},
		{"Magic", append([]byte{0}, valid[1:]...)},
		{"Version0", append([]byte{cmdMagic, 0}, valid[2:]...)},
		{"VersionNext", append([]byte{cmdMagic, cmdVersion + 1}, valid[2:]...)},
		{"CreateTopicV2AsV1", func() []byte {
			b, _ := EncodeCommand(CreateTopic{Name: "t", Partitions: 1, Type: TypeRaft3, GroupSize: 4})
			b[1] = 1
			return b
		}()},
		{"Kind", append([]byte{cmdMagic, cmdVersion, 99}, valid[3:]...)},
		{"Map", append([]byte{cmdMagic, cmdVersion, kindJoinGroup}, []byte("\x81\xa5Topic\xa1t")...)},
		{"Fields", append([]byte{cmdMagic, cmdVersion, kindJoinGroup}, []byte("\x92\xa1t\xa1g")...)},
		{"HugeArray", append([]byte{cmdMagic, cmdVersion, kindSetACL}, []byte("\x91\xdd\xff\xff\xff\xff")...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c, err := DecodeCommand(tc.b); err == nil || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decoded %+v, %v", c, err)
			}
		})
	}
}

// fuzzState is the state FuzzDecodeCommand applies decoded commands to.
func fuzzState(t testing.TB) *State {
	return randomState(t, 7, 200).s()
}

var hostile = [][]byte{
	[]byte("\xdd\xff\xff\xff\xff"), // array of 2^32-1
	[]byte("\xdf\xff\xff\xff\xff"), // map of 2^32-1
	[]byte("\xdb\xff\xff\xff\xff"), // str of 4 GiB
	[]byte("\xc6\xff\xff\xff\xff"), // bin of 4 GiB
}

func fuzzSeeds(t testing.TB) fuzzseed.Seeds {
	seeds := fuzzseed.Seeds{}
	rng := rand.New(rand.NewPCG(1, 1))
	ft := newStateT(t)
	for range 40 {
		c := randomCommand(rng, ft.s())
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		seeds["FuzzDecodeCommand"] = append(seeds["FuzzDecodeCommand"], []any{b})
		_, _ = ft.do(c)
	}
	for k := byte(kindRegisterNode); k <= kindSetACL; k++ {
		for _, h := range hostile {
			seeds["FuzzDecodeCommand"] = append(seeds["FuzzDecodeCommand"], []any{append([]byte{cmdMagic, cmdVersion, k}, h...)})
		}
	}
	for _, h := range hostile {
		seeds["FuzzDecodeCommand"] = append(seeds["FuzzDecodeCommand"], []any{h})
		seeds["FuzzDecodeSnapshot"] = append(seeds["FuzzDecodeSnapshot"],
			[]any{h}, []any{append([]byte(snapMagic+"\x01"), h...)}, []any{append([]byte(snapMagic+"\x01\x95\x01"), h...)})
	}
	for _, n := range []int{0, 10, 40} {
		seeds["FuzzDecodeSnapshot"] = append(seeds["FuzzDecodeSnapshot"], []any{encodeSnap(t, randomState(t, uint64(n), n).s())})
	}
	return seeds
}

// FuzzDecodeCommand: no panic and little allocation on any input; what
// decodes encodes to bytes that decode to the same command, no strict
// prefix decodes, and Apply on a populated state never panics and changes
// nothing on error.
func FuzzDecodeCommand(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds(f))
	s := fuzzState(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Command
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { c, err = DecodeCommand(b) })
		if err != nil {
			return
		}
		back, err := EncodeCommand(c)
		if err != nil {
			t.Fatalf("%x decodes to %+v, which does not encode: %v", b, c, err)
		}
		again, err := DecodeCommand(back)
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("%x decodes to %+v, whose encoding decodes to %+v, %v", b, c, again, err)
		}
		if _, err := DecodeCommand(b[:len(b)-1]); err == nil {
			t.Fatalf("%x decodes without its last byte", b)
		}
		before := encodeSnap(t, s)
		if _, _, err := s.Apply(s.index+1, c); err != nil && !bytes.Equal(before, encodeSnap(t, s)) {
			t.Fatalf("%+v failed (%v) and changed the state", c, err)
		}
		if !bytes.Equal(before, encodeSnap(t, s)) {
			t.Fatalf("%+v changed the state it was applied to", c)
		}
	})
}

// FuzzDecodeSnapshot: no panic and little allocation; what decodes
// re-encodes canonically (a second round gives the same bytes), and the
// decoded state takes further commands without panicking.
func FuzzDecodeSnapshot(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s *State
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { s, err = DecodeSnapshot(b) })
		if err != nil {
			return
		}
		back := encodeSnap(t, s)
		s2, err := DecodeSnapshot(back)
		if err != nil || !sameState(s, s2) || !bytes.Equal(encodeSnap(t, s2), back) {
			t.Fatalf("%x decodes, but its encoding %x does not round-trip: %v", b, back, err)
		}
		if _, err := DecodeSnapshot(b[:len(b)-1]); err == nil {
			t.Fatalf("%x decodes without its last byte", b)
		}
		// The decoded state is one Apply can work on.
		rng := rand.New(rand.NewPCG(uint64(len(b)), 4))
		for range 20 {
			var c Command
			switch rng.IntN(4) {
			case 0:
				nodes := s.Nodes()
				if len(nodes) == 0 {
					continue
				}
				n := nodes[rng.IntN(len(nodes))]
				c = NodeDown{ID: n.ID, Session: n.Session}
			case 1:
				names := s.Topics()
				if len(names) == 0 {
					continue
				}
				tp := s.topics[names[rng.IntN(len(names))]]
				c = AlterTopic{Name: tp.Name, Partitions: len(tp.Parts) + 1}
			default:
				for k, g := range s.groups {
					for p := range g.Revoking {
						c = Released{Topic: k.Topic, Group: k.Group, Partition: p, Member: g.Owners[p], Generation: g.Generation}
					}
					for _, n := range s.Nodes() {
						if c == nil && n.Up {
							c = JoinGroup{Topic: k.Topic, Group: k.Group, Member: "fuzz", Node: n.ID}
						}
					}
				}
			}
			if c == nil {
				continue
			}
			if next, _, err := s.Apply(s.index+1, c); err == nil {
				s = next
			}
		}
	})
}

// TestWriteFuzzCorpus writes the seeds to testdata/fuzz/<target>/:
// ZEZE_WRITE_CORPUS=1 go test -run TestWriteFuzzCorpus ./internal/cluster.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("ZEZE_WRITE_CORPUS") != "1" {
		t.Skip("ZEZE_WRITE_CORPUS=1 writes the seed corpus")
	}
	fuzzseed.WriteCorpus(t, fuzzSeeds(t))
}

// nodesV4 returns ns as a snapshot before version 5 holds them.
func nodesV4(ns []snapNode) []snapNodeV4 {
	var out []snapNodeV4
	for _, n := range ns {
		out = append(out, snapNodeV4{ID: n.ID, Addr: n.Addr, Voter: n.Voter, Up: n.Up, Joined: n.Joined, Session: n.Session})
	}
	return out
}

// rulesV4 returns rules as a snapshot before version 4 holds them.
func rulesV4(rules []Rule) []ruleV4 {
	var out []ruleV4
	for _, r := range rules {
		out = append(out, ruleV4{Identity: r.Identity, Topic: r.Topic, Rights: r.Rights})
	}
	return out
}

// TestSnapshot_Version4: a version 4 snapshot (nodes without incarnations,
// partitions without lost replicas, no cluster id) decodes to the state it
// held, with none of them.
func TestSnapshot_Version4(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c")
	ft.must(CreateTopic{Name: "r", Partitions: 3, Type: TypeRaft3})
	ft.must(CreateTopic{Name: "d", Partitions: 2, Type: TypeDoubleWrite})
	want := ft.s()
	var v5 snapV7
	if err := wire.Unmarshal(encodeSnap(t, want)[len(snapMagic)+1:], &v5); err != nil {
		t.Fatal(err)
	}
	v4 := snapV4{Index: v5.Index, Nodes: nodesV4(v5.Nodes), Groups: v5.Groups, ACL: v5.ACL}
	for _, st := range v5.Topics {
		t4 := snapTopicV4{Name: st.Name, Type: st.Type, Created: st.Created, GroupSize: st.GroupSize, Alone: st.Alone}
		for _, p := range st.Parts {
			t4.Parts = append(t4.Parts, snapPartV4{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk,
				InSync: p.InSync, Version: p.Version})
		}
		v4.Topics = append(v4.Topics, t4)
	}
	body, err := msgpack.Marshal(&v4)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(append([]byte(snapMagic+"\x04"), body...))
	if err != nil {
		t.Fatal(err)
	}
	if !sameState(want, got) || got.ClusterID() != "" {
		t.Fatal("a version 4 snapshot decodes to another state")
	}
}

// TestDecodeCommand_RegisterNodeVersion5: a RegisterNode of version 5,
// without Incarnation and Cluster, decodes with both empty.
func TestDecodeCommand_RegisterNodeVersion5(t *testing.T) {
	body, err := msgpack.Marshal(&registerNodeV5{ID: "a", Addr: "a:1", Voter: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := DecodeCommand(append([]byte{cmdMagic, 5, kindRegisterNode}, body...))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.(RegisterNode); got.ID != "a" || got.Addr != "a:1" || !got.Voter || got.Incarnation != "" || got.Cluster != "" {
		t.Fatalf("decoded %+v", got)
	}
}
