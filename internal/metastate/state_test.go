package metastate

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// stateT drives a State in tests: every command gets the next log index,
// and a command applied without error makes the next State current.
type stateT struct {
	t     testing.TB
	cur   *State
	index uint64
}

func newStateT(t testing.TB) *stateT {
	return &stateT{t: t, cur: New()}
}

// do applies c and returns its result and error.
func (ft *stateT) do(c Command) (Result, error) {
	ft.t.Helper()
	ft.index++
	// Through the encoding, as raft does.
	b, err := EncodeCommand(c)
	if err != nil {
		ft.t.Fatal(err)
	}
	dc, err := DecodeCommand(b)
	if errors.Is(err, ErrInvalid) { // over a decoder's limit: the FSM answers the error
		return Result{Index: ft.index}, err
	}
	if err != nil {
		ft.t.Fatalf("%T does not decode: %v", c, err)
	}
	return ft.apply(dc)
}

// apply applies c as it is, without the encoding.
func (ft *stateT) apply(c Command) (Result, error) {
	next, res, err := ft.cur.Apply(ft.index, c)
	if err == nil {
		ft.cur = next
	}
	return res, err
}

// must applies c and fails the test on an error.
func (ft *stateT) must(c Command) Result {
	ft.t.Helper()
	res, err := ft.do(c)
	if err != nil {
		ft.t.Fatalf("%T %+v: %v", c, c, err)
	}
	return res
}

func (ft *stateT) nodes(ids ...string) {
	ft.t.Helper()
	for _, id := range ids {
		ft.must(RegisterNode{ID: id, Addr: id + ":7000"})
	}
}

func (ft *stateT) s() *State { return ft.cur }

func replicas(t Topic) [][]string {
	var out [][]string
	for _, p := range t.Parts {
		out = append(out, p.Replicas)
	}
	return out
}

func TestState_Placement(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodes   []string
		down    []string
		before  []CreateTopic
		create  CreateTopic
		want    [][]string
		wantErr error
	}{
		{
			name:   "SingleSpread",
			nodes:  []string{"c", "a", "b"},
			create: CreateTopic{Name: "t", Partitions: 5, Type: TypeSingle},
			want:   [][]string{{"a"}, {"b"}, {"c"}, {"a"}, {"b"}},
		},
		{
			name:   "Raft3",
			nodes:  []string{"a", "b", "c", "d"},
			create: CreateTopic{Name: "t", Partitions: 4, Type: TypeRaft3},
			want:   [][]string{{"a", "b", "c"}, {"d", "a", "b"}, {"c", "d", "a"}, {"b", "c", "d"}},
		},
		{
			// Groups of 2 partitions: each group on the 3 least loaded
			// nodes, counting both its partitions.
			name:   "Raft3Groups",
			nodes:  []string{"a", "b", "c", "d"},
			create: CreateTopic{Name: "t", Partitions: 5, Type: TypeRaft3, GroupSize: 2},
			want:   [][]string{{"a", "b", "c"}, {"a", "b", "c"}, {"d", "a", "b"}, {"d", "a", "b"}, {"c", "d", "a"}},
		},
		{
			name:   "LoadFromOtherTopics",
			nodes:  []string{"a", "b", "c"},
			before: []CreateTopic{{Name: "x", Partitions: 2, Type: TypeSingle}},
			create: CreateTopic{Name: "t", Partitions: 3, Type: TypeDoubleWrite},
			want:   [][]string{{"c", "a"}, {"b", "c"}, {"a", "b"}},
		},
		{
			name:   "DownNodesSkipped",
			nodes:  []string{"a", "b", "c"},
			down:   []string{"a"},
			create: CreateTopic{Name: "t", Partitions: 3, Type: TypeSingle},
			want:   [][]string{{"b"}, {"c"}, {"b"}},
		},
		{
			name:    "NotEnoughNodes",
			nodes:   []string{"a", "b", "c"},
			down:    []string{"c"},
			create:  CreateTopic{Name: "t", Partitions: 1, Type: TypeRaft3},
			wantErr: ErrNotEnoughNodes,
		},
		{
			name:    "NoNodes",
			create:  CreateTopic{Name: "t", Partitions: 1, Type: TypeSingle},
			wantErr: ErrNotEnoughNodes,
		},
		{
			name:    "Exists",
			nodes:   []string{"a"},
			before:  []CreateTopic{{Name: "t", Partitions: 1, Type: TypeSingle}},
			create:  CreateTopic{Name: "t", Partitions: 1, Type: TypeSingle},
			wantErr: ErrTopicExists,
		},
		{name: "ZeroPartitions", nodes: []string{"a"}, create: CreateTopic{Name: "t", Type: TypeSingle}, wantErr: ErrInvalid},
		{name: "TooManyPartitions", nodes: []string{"a"}, create: CreateTopic{Name: "t", Partitions: MaxPartitions + 1, Type: TypeSingle}, wantErr: ErrInvalid},
		{name: "BadType", nodes: []string{"a"}, create: CreateTopic{Name: "t", Partitions: 1, Type: 3}, wantErr: ErrInvalid},
		{name: "ReplicasMismatch", nodes: []string{"a", "b"}, create: CreateTopic{Name: "t", Partitions: 1, Type: TypeSingle, Replicas: 2}, wantErr: ErrInvalid},
		{name: "GroupSizeSingle", nodes: []string{"a"}, create: CreateTopic{Name: "t", Partitions: 2, Type: TypeSingle, GroupSize: 2}, wantErr: ErrInvalid},
		{name: "GroupSizeTooBig", nodes: []string{"a", "b", "c"}, create: CreateTopic{Name: "t", Partitions: 2, Type: TypeRaft3, GroupSize: MaxGroupSize + 1}, wantErr: ErrInvalid},
		{name: "GroupSizeNegative", nodes: []string{"a", "b", "c"}, create: CreateTopic{Name: "t", Partitions: 2, Type: TypeRaft3, GroupSize: -1}, wantErr: nil, want: [][]string{{"a", "b", "c"}, {"a", "b", "c"}}},
		{name: "EmptyName", nodes: []string{"a"}, create: CreateTopic{Partitions: 1, Type: TypeSingle}, wantErr: ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := newStateT(t)
			ft.nodes(tc.nodes...)
			for _, id := range tc.down {
				n, _ := ft.s().Node(id)
				ft.must(NodeDown{ID: id, Session: n.Session})
			}
			for _, c := range tc.before {
				ft.must(c)
			}
			before := ft.s()
			res, err := ft.do(tc.create)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				if ft.s() != before {
					t.Fatal("a failed command published a new state")
				}
				return
			}
			got, _ := ft.s().Topic("t")
			if !slices.EqualFunc(replicas(got), tc.want, slices.Equal) {
				t.Fatalf("placement %v, want %v", replicas(got), tc.want)
			}
			if !slices.EqualFunc(replicas(res.Topic), tc.want, slices.Equal) {
				t.Fatalf("result placement %v, want %v", replicas(res.Topic), tc.want)
			}
			size := max(tc.create.GroupSize, 1)
			if got.GroupSize != size {
				t.Fatalf("group size %d, want %d", got.GroupSize, size)
			}
			for i, p := range got.Parts {
				if p.Leader != p.Replicas[0] || p.Epoch != 1 {
					t.Fatalf("partition %d: leader %s epoch %d", i, p.Leader, p.Epoch)
				}
				if first, n := got.Chunk(i); p.Chunk != i/size*size || first != p.Chunk || n != min(size, len(got.Parts)-first) {
					t.Fatalf("partition %d: chunk %d, Chunk() %d %d", i, p.Chunk, first, n)
				}
			}
		})
	}
}

func TestState_AlterTopic(t *testing.T) {
	setup := func(t *testing.T) *stateT {
		ft := newStateT(t)
		ft.nodes("a", "b", "c")
		ft.must(CreateTopic{Name: "t", Partitions: 2, Type: TypeSingle, Now: 42})
		return ft
	}
	t.Run("OK", func(t *testing.T) {
		ft := setup(t)
		ft.must(RegisterNode{ID: "d", Addr: "d:1"})
		ft.must(AlterTopic{Name: "t", Partitions: 5})
		got, _ := ft.s().Topic("t")
		// The first two keep a and b; the added ones go to the least loaded.
		want := [][]string{{"a"}, {"b"}, {"c"}, {"d"}, {"a"}}
		if !slices.EqualFunc(replicas(got), want, slices.Equal) || got.Created != 42 {
			t.Fatalf("placement %v created %d, want %v", replicas(got), got.Created, want)
		}
	})
	t.Run("Same", func(t *testing.T) {
		ft := setup(t)
		ft.must(AlterTopic{Name: "t", Partitions: 2})
	})
	t.Run("Raft3Groups", func(t *testing.T) {
		// The added partitions make groups of their own: the first group
		// keeps its size and replicas.
		ft := newStateT(t)
		ft.nodes("a", "b", "c", "d")
		ft.must(CreateTopic{Name: "t", Partitions: 3, Type: TypeRaft3, GroupSize: 4})
		ft.must(AlterTopic{Name: "t", Partitions: 8})
		got, _ := ft.s().Topic("t")
		want := [][]string{{"a", "b", "c"}, {"a", "b", "c"}, {"a", "b", "c"},
			{"d", "a", "b"}, {"d", "a", "b"}, {"d", "a", "b"}, {"d", "a", "b"}, {"c", "d", "a"}}
		if !slices.EqualFunc(replicas(got), want, slices.Equal) {
			t.Fatalf("placement %v, want %v", replicas(got), want)
		}
		var chunks []int
		for i, p := range got.Parts {
			chunks = append(chunks, p.Chunk)
			first, n := got.Chunk(i)
			if first != p.Chunk || n != map[int]int{0: 3, 3: 4, 7: 1}[first] {
				t.Fatalf("partition %d: Chunk() %d %d", i, first, n)
			}
		}
		if want := []int{0, 0, 0, 3, 3, 3, 3, 7}; !slices.Equal(chunks, want) {
			t.Fatalf("chunks %v, want %v", chunks, want)
		}
	})
	for _, tc := range []struct {
		name string
		c    AlterTopic
		want error
	}{
		{"ErrPartitionDecrease", AlterTopic{Name: "t", Partitions: 1}, ErrPartitionDecrease},
		{"ErrNoTopic", AlterTopic{Name: "u", Partitions: 3}, ErrNoTopic},
		{"TooMany", AlterTopic{Name: "t", Partitions: MaxPartitions + 1}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := setup(t)
			if _, err := ft.do(tc.c); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("ErrNotEnoughNodes", func(t *testing.T) {
		ft := setup(t)
		for _, id := range []string{"a", "b", "c"} {
			ft.must(NodeDown{ID: id, Session: 1})
		}
		if _, err := ft.do(AlterTopic{Name: "t", Partitions: 3}); !errors.Is(err, ErrNotEnoughNodes) {
			t.Fatalf("err %v", err)
		}
		// A node's partitions stay where they are while it is down.
		got, _ := ft.s().Topic("t")
		if want := [][]string{{"a"}, {"b"}}; !slices.EqualFunc(replicas(got), want, slices.Equal) {
			t.Fatalf("placement %v", replicas(got))
		}
	})
}

func TestState_Nodes(t *testing.T) {
	ft := newStateT(t)
	if r := ft.must(RegisterNode{ID: "a", Addr: "a:1", Voter: true}); r.Session != 1 {
		t.Fatalf("session %d", r.Session)
	}
	// Registering again while up keeps the session.
	if r := ft.must(RegisterNode{ID: "a", Addr: "a:2", Voter: true}); r.Session != 1 {
		t.Fatalf("session %d", r.Session)
	}
	ft.must(NodeDown{ID: "a", Session: 1})
	if n, _ := ft.s().Node("a"); n.Up || n.Addr != "a:2" || !n.Voter || n.Joined != 1 {
		t.Fatalf("node %+v", n)
	}
	if _, err := ft.do(NodeDown{ID: "a", Session: 1}); !errors.Is(err, ErrStaleSession) {
		t.Fatalf("second NodeDown: %v", err)
	}
	if r := ft.must(RegisterNode{ID: "a", Addr: "a:3"}); r.Session != 2 {
		t.Fatalf("session %d", r.Session)
	}
	// The old session's expiry, proposed late, changes nothing.
	if _, err := ft.do(NodeDown{ID: "a", Session: 1}); !errors.Is(err, ErrStaleSession) {
		t.Fatalf("stale NodeDown: %v", err)
	}
	if n, _ := ft.s().Node("a"); !n.Up || n.Session != 2 {
		t.Fatalf("node %+v", n)
	}
	for _, tc := range []struct {
		name string
		c    Command
		want error
	}{
		{"NoNode", NodeDown{ID: "x", Session: 1}, ErrNoNode},
		{"BadID", RegisterNode{ID: "a b", Addr: "x"}, ErrInvalid},
		{"LongID", RegisterNode{ID: string(make([]byte, MaxNodeIDLen+1)), Addr: "x"}, ErrInvalid},
		{"NoAddr", RegisterNode{ID: "b"}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ft.do(tc.c); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func TestState_ACL(t *testing.T) {
	ft := newStateT(t)
	if !ft.s().Allowed("anyone", "t", RightAdmin) {
		t.Fatal("no rules: everything is allowed")
	}
	ft.must(SetACL{Rules: []Rule{
		{Identity: "app-*", Topic: "orders", Rights: RightProduce | RightConsume},
		{Identity: "ops", Topic: "*", Rights: RightAdmin},
		{Identity: "*", Topic: "public.*", Rights: RightConsume},
	}})
	for _, tc := range []struct {
		identity, topic string
		right           Rights
		want            bool
	}{
		{"app-1", "orders", RightProduce, true},
		{"app-1", "orders", RightConsume, true},
		{"app-1", "orders", RightAdmin, false},
		{"app-1", "orders2", RightProduce, false},
		{"ap", "orders", RightProduce, false},
		{"ops", "x", RightAdmin, true},
		{"ops", "x", RightProduce, false},
		{"guest", "public.news", RightConsume, true},
		{"guest", "public.news", RightProduce, false},
		{"app-1", "orders", RightProduce | RightConsume, true},
		{"app-1", "orders", RightProduce | RightAdmin, false},
	} {
		t.Run(fmt.Sprintf("%s/%s/%d", tc.identity, tc.topic, tc.right), func(t *testing.T) {
			if got := ft.s().Allowed(tc.identity, tc.topic, tc.right); got != tc.want {
				t.Fatalf("Allowed %t, want %t", got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name  string
		rules []Rule
	}{
		{"NoRights", []Rule{{Identity: "a", Topic: "b"}}},
		{"UnknownRight", []Rule{{Identity: "a", Topic: "b", Rights: 8}}},
		{"EmptyIdentity", []Rule{{Topic: "b", Rights: RightAdmin}}},
		{"TooMany", make([]Rule, MaxRules+1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ft.do(SetACL{Rules: tc.rules}); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err %v", err)
			}
		})
	}
	ft.must(SetACL{})
	if len(ft.s().ACL()) != 0 || !ft.s().Allowed("x", "y", RightAdmin) {
		t.Fatal("an empty rule list disables access control")
	}
}

// groupState returns a state with nodes n1..n3 and topic t of parts partitions.
func groupState(t testing.TB, parts int) *stateT {
	ft := newStateT(t)
	ft.nodes("n1", "n2", "n3")
	ft.must(CreateTopic{Name: "t", Partitions: parts, Type: TypeSingle})
	return ft
}

func (ft *stateT) assignment(member string) []int {
	_, p := ft.s().Assignment("t", "g", member)
	return p
}

// releaseAll releases every partition being revoked, as the owners' nodes
// would.
func (ft *stateT) releaseAll() {
	ft.t.Helper()
	for {
		g, _ := ft.s().Group("t", "g")
		if len(g.Revoking) == 0 {
			return
		}
		p := slices.Sorted(maps.Keys(g.Revoking))[0]
		ft.must(Released{Topic: "t", Group: "g", Partition: p, Member: g.Owners[p], Generation: g.Generation})
	}
}

func TestState_GroupAssignment(t *testing.T) {
	ft := groupState(t, 6)
	r := ft.must(JoinGroup{Topic: "t", Group: "g", Member: "m1", Node: "n1"})
	if r.Generation != 1 || !slices.Equal(ft.assignment("m1"), []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("gen %d, m1 %v", r.Generation, ft.assignment("m1"))
	}
	// Joining again from the same node changes nothing.
	if r := ft.must(JoinGroup{Topic: "t", Group: "g", Member: "m1", Node: "n1"}); r.Generation != 1 {
		t.Fatalf("rejoin: gen %d", r.Generation)
	}

	// m2 joins: m1 keeps 0..2, 3..5 are revoked from m1, still its own.
	r = ft.must(JoinGroup{Topic: "t", Group: "g", Member: "m2", Node: "n2"})
	if r.Generation != 2 {
		t.Fatalf("gen %d", r.Generation)
	}
	if got := ft.assignment("m1"); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("m1 owns %v before releasing", got)
	}
	if got := ft.assignment("m2"); len(got) != 0 {
		t.Fatalf("m2 owns %v before m1 released", got)
	}
	if _, rev := ft.s().Revoking("t", "g", "m1"); !slices.Equal(rev, []int{3, 4, 5}) {
		t.Fatalf("revoking %v", rev)
	}
	if !ft.s().Owns("t", "g", "m1", 3, 2) || ft.s().Owns("t", "g", "m2", 3, 2) || ft.s().Owns("t", "g", "m1", 3, 1) {
		t.Fatal("fence: m1 owns 3 in generation 2, nobody else, not in generation 1")
	}

	// Releases: stale, by the wrong member, out of range: refused.
	for _, bad := range []Released{
		{Topic: "t", Group: "g", Partition: 3, Member: "m1", Generation: 1},
		{Topic: "t", Group: "g", Partition: 3, Member: "m1", Generation: 3},
		{Topic: "t", Group: "g", Partition: 3, Member: "m2", Generation: 2},
		{Topic: "t", Group: "g", Partition: 0, Member: "m1", Generation: 2},
		{Topic: "t", Group: "g", Partition: 6, Member: "m1", Generation: 2},
		{Topic: "t", Group: "g", Partition: -1, Member: "m1", Generation: 2},
	} {
		if _, err := ft.do(bad); !errors.Is(err, ErrNotRevoking) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if _, err := ft.do(Released{Topic: "t", Group: "x", Partition: 3, Member: "m1", Generation: 2}); !errors.Is(err, ErrNoGroup) {
		t.Fatalf("no group: %v", err)
	}

	r = ft.must(Released{Topic: "t", Group: "g", Partition: 4, Member: "m1", Generation: 2})
	if r.Generation != 3 || !slices.Equal(ft.assignment("m2"), []int{4}) {
		t.Fatalf("gen %d, m2 %v", r.Generation, ft.assignment("m2"))
	}
	// The release of generation 2 still counts at generation 3: the
	// revocation started at 2.
	ft.must(Released{Topic: "t", Group: "g", Partition: 3, Member: "m1", Generation: 2})
	ft.releaseAll()
	if !slices.Equal(ft.assignment("m1"), []int{0, 1, 2}) || !slices.Equal(ft.assignment("m2"), []int{3, 4, 5}) {
		t.Fatalf("m1 %v m2 %v", ft.assignment("m1"), ft.assignment("m2"))
	}

	// m3 joins: each gives one up, nothing else moves (sticky).
	ft.must(JoinGroup{Topic: "t", Group: "g", Member: "m3", Node: "n3"})
	ft.releaseAll()
	if a, b, c := ft.assignment("m1"), ft.assignment("m2"), ft.assignment("m3"); !slices.Equal(a, []int{0, 1}) ||
		!slices.Equal(b, []int{3, 4}) || !slices.Equal(c, []int{2, 5}) {
		t.Fatalf("m1 %v m2 %v m3 %v", a, b, c)
	}

	// m2 leaves: its partitions are free at once, no revocation.
	ft.must(LeaveGroup{Topic: "t", Group: "g", Member: "m2"})
	if g, _ := ft.s().Group("t", "g"); len(g.Revoking) != 0 {
		t.Fatalf("revoking %v after a leave", g.Revoking)
	}
	if a, c := ft.assignment("m1"), ft.assignment("m3"); !slices.Equal(a, []int{0, 1, 3}) || !slices.Equal(c, []int{2, 4, 5}) {
		t.Fatalf("m1 %v m3 %v", a, c)
	}

	// n3 is marked down: m3 leaves, m1 has everything.
	ft.must(NodeDown{ID: "n3", Session: 1})
	if g, _ := ft.s().Group("t", "g"); len(g.Members) != 1 || !slices.Equal(ft.assignment("m1"), []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("members %v, m1 %v", g.Members, ft.assignment("m1"))
	}
	if _, err := ft.do(JoinGroup{Topic: "t", Group: "g", Member: "m3", Node: "n3"}); !errors.Is(err, ErrNodeDown) {
		t.Fatalf("join from a down node: %v", err)
	}

	// Growing the topic spreads the added partitions.
	ft.must(JoinGroup{Topic: "t", Group: "g", Member: "m2", Node: "n2"})
	ft.releaseAll()
	ft.must(AlterTopic{Name: "t", Partitions: 8})
	if a, b := ft.assignment("m1"), ft.assignment("m2"); !slices.Equal(a, []int{0, 1, 2, 6}) || !slices.Equal(b, []int{3, 4, 5, 7}) {
		t.Fatalf("m1 %v m2 %v", a, b)
	}
	ft.releaseAll()

	for _, tc := range []struct {
		name string
		c    Command
		want error
	}{
		{"JoinNoTopic", JoinGroup{Topic: "u", Group: "g", Member: "m", Node: "n1"}, ErrNoTopic},
		{"JoinNoNode", JoinGroup{Topic: "t", Group: "g", Member: "m", Node: "n9"}, ErrNoNode},
		{"JoinOtherNode", JoinGroup{Topic: "t", Group: "g", Member: "m1", Node: "n2"}, ErrMemberExists},
		{"JoinEmptyMember", JoinGroup{Topic: "t", Group: "g", Node: "n1"}, ErrInvalid},
		{"LeaveNoGroup", LeaveGroup{Topic: "t", Group: "h", Member: "m1"}, ErrNoGroup},
		{"LeaveNoMember", LeaveGroup{Topic: "t", Group: "g", Member: "m9"}, ErrNoMember},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ft.do(tc.c); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func TestState_GroupEvenness(t *testing.T) {
	for _, tc := range []struct{ parts, members int }{{1, 3}, {3, 3}, {7, 3}, {10, 4}, {2, 5}, {1024, 7}} {
		t.Run(fmt.Sprintf("%dParts%dMembers", tc.parts, tc.members), func(t *testing.T) {
			ft := groupState(t, tc.parts)
			for i := range tc.members {
				ft.must(JoinGroup{Topic: "t", Group: "g", Member: fmt.Sprintf("m%d", i), Node: "n1"})
				ft.releaseAll()
			}
			lo, hi := tc.parts, 0
			for i := range tc.members {
				n := len(ft.assignment(fmt.Sprintf("m%d", i)))
				lo, hi = min(lo, n), max(hi, n)
			}
			if hi-lo > 1 {
				t.Fatalf("shares from %d to %d", lo, hi)
			}
		})
	}
}

// TestState_OneOwner applies seeded random sequences of joins, leaves,
// node downs and re-registrations, releases (current and stale) and topic
// growth, and checks after every step:
//   - every partition of a group with members has one owner, a member;
//   - a partition moves from one member to another only by that member's
//     Released, or because the member is gone (left or its node down);
//   - once nothing is being revoked, the shares differ by at most one;
//   - the generation never goes down, and changes with the owners.
func TestState_OneOwner(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			ft := newStateT(t)
			nodes := []string{"n1", "n2", "n3", "n4"}
			ft.nodes(nodes...)
			ft.must(CreateTopic{Name: "t", Partitions: 1 + rng.IntN(12), Type: TypeSingle})
			var stale []Released
			for step := range 400 {
				before := ft.s()
				g0, _ := before.Group("t", "g")
				var c Command
				switch x := rng.IntN(100); {
				case x < 30:
					c = JoinGroup{Topic: "t", Group: "g", Member: fmt.Sprintf("m%d", rng.IntN(8)), Node: nodes[rng.IntN(len(nodes))]}
				case x < 40:
					c = LeaveGroup{Topic: "t", Group: "g", Member: fmt.Sprintf("m%d", rng.IntN(8))}
				case x < 45:
					id := nodes[rng.IntN(len(nodes))]
					n, _ := before.Node(id)
					c = NodeDown{ID: id, Session: n.Session}
				case x < 52:
					c = RegisterNode{ID: nodes[rng.IntN(len(nodes))], Addr: "x:1"}
				case x < 55:
					tp, _ := before.Topic("t")
					c = AlterTopic{Name: "t", Partitions: len(tp.Parts) + rng.IntN(3)}
				case x < 62 && len(stale) > 0:
					c = stale[rng.IntN(len(stale))]
				default:
					if len(g0.Revoking) == 0 {
						continue
					}
					ps := slices.Sorted(maps.Keys(g0.Revoking))
					p := ps[rng.IntN(len(ps))]
					r := Released{Topic: "t", Group: "g", Partition: p, Member: g0.Owners[p], Generation: g0.Generation}
					stale = append(stale, r)
					c = r
				}
				_, err := ft.do(c)
				after := ft.s()
				g1, _ := after.Group("t", "g")
				if err != nil {
					if after != before {
						t.Fatalf("step %d: %T failed (%v) but changed the state", step, c, err)
					}
					continue
				}
				checkGroup(t, step, c, g0, g1)
			}
		})
	}
}

func checkGroup(t *testing.T, step int, c Command, g0, g1 ConsumerGroup) {
	t.Helper()
	if g1.Generation < g0.Generation {
		t.Fatalf("step %d: generation %d after %d", step, g1.Generation, g0.Generation)
	}
	changed := !slices.Equal(g0.Owners, g1.Owners) || !maps.Equal(g0.Revoking, g1.Revoking)
	if changed && g1.Generation == g0.Generation && g0.Generation != 0 {
		t.Fatalf("step %d: %T changed the assignment within generation %d", step, c, g1.Generation)
	}
	count := map[string]int{}
	for p, o := range g1.Owners {
		if len(g1.Members) == 0 {
			if o != "" {
				t.Fatalf("step %d: partition %d owned by %s in an empty group", step, p, o)
			}
			continue
		}
		if _, ok := g1.Members[o]; !ok {
			t.Fatalf("step %d: partition %d owned by %q, not a member of %v", step, p, o, g1.Members)
		}
		count[o]++
		if p >= len(g0.Owners) {
			continue
		}
		prev := g0.Owners[p]
		if prev == "" || prev == o {
			continue
		}
		_, stillMember := g1.Members[prev]
		rel, isRelease := c.(Released)
		if stillMember && !(isRelease && rel.Partition == p && rel.Member == prev) {
			t.Fatalf("step %d: partition %d moved from %s (still a member) to %s by %T %+v", step, p, prev, o, c, c)
		}
		if !stillMember {
			continue
		}
	}
	for p := range g1.Revoking {
		if g1.Owners[p] == "" {
			t.Fatalf("step %d: unowned partition %d revoking", step, p)
		}
	}
	if len(g1.Revoking) == 0 && len(g1.Members) > 0 {
		lo, hi := len(g1.Owners), 0
		for id := range g1.Members {
			lo, hi = min(lo, count[id]), max(hi, count[id])
		}
		if hi-lo > 1 {
			t.Fatalf("step %d: shares from %d to %d with nothing revoking: %v", step, lo, hi, g1.Owners)
		}
	}
}

// TestState_StaleRelease: a release proposed for a revocation that was
// cancelled must not complete a later revocation of the same partition, for
// which the member, having resumed the partition, has not stopped again.
func TestState_StaleRelease(t *testing.T) {
	ft := groupState(t, 2)
	ft.must(JoinGroup{Topic: "t", Group: "g", Member: "m1", Node: "n1"})
	ft.must(JoinGroup{Topic: "t", Group: "g", Member: "m2", Node: "n2"}) // gen 2: 1 revoking from m1
	stale := Released{Topic: "t", Group: "g", Partition: 1, Member: "m1", Generation: 2}
	ft.must(LeaveGroup{Topic: "t", Group: "g", Member: "m2"}) // gen 3: cancelled, m1 resumes 1
	if _, rev := ft.s().Revoking("t", "g", "m1"); len(rev) != 0 {
		t.Fatalf("revoking %v after the target left", rev)
	}
	ft.must(JoinGroup{Topic: "t", Group: "g", Member: "m3", Node: "n3"}) // gen 4: revoking again
	if _, err := ft.do(stale); !errors.Is(err, ErrNotRevoking) {
		t.Fatalf("stale release: %v", err)
	}
	if o, _ := ft.s().Owner("t", "g", 1); o != "m1" {
		t.Fatalf("owner %q after a stale release", o)
	}
	ft.must(Released{Topic: "t", Group: "g", Partition: 1, Member: "m1", Generation: 4})
	if o, gen := ft.s().Owner("t", "g", 1); o != "m3" || gen != 5 {
		t.Fatalf("owner %q gen %d", o, gen)
	}
}
