//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Leader and Candidate, which these tests forge

package mq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/testlog"
	"github.com/zeze-go/mq/store"
)

// errRefused is a row's wanted error when the refusal is a closed
// connection or stream, whatever error the caller sees.
var errRefused = errors.New("any error")

// TestThreatModel_Nodes is the rows of docs/DESIGN.md's threat model that
// the nodes' partitions answer, on three nodes running mutual TLS (the
// default): a client identity (x9: a certificate of the cluster's CA and
// the secret, no node) and a node limited by the ACL (n3: Consume on t in
// group "mine" only, whose credentials are used by hand, as a hostile n3
// would) try the partition service, a DoubleWrite pair's appends and a
// Raft3 group's raft streams; an admin (n2: every right on "*") sets the
// ACL and creates a topic. Each refusal is the row's error with a log line
// naming the identity on the node asked, and nothing reached a store: no
// partition's next offset nor any committed offset of g moved, the ACL
// and topics are unchanged, and the Raft3 group still commits. (The
// metadata group's rows are TestThreatModel_Cluster's in internal/cluster,
// the port's TestThreatModel_Transport's in internal/transport.)
func TestThreatModel_Nodes(t *testing.T) {
	logs := map[string]*testlog.Lines{"n1": {}, "n2": {}, "n3": {}}
	c := newCluster(t, 3, withNodeOptions(func(id string) []mq.Option { return []mq.Option{mq.WithLogger(slog.New(logs[id]))} }),
		withTopic("t", 3, mq.Options{}), withRaft3(1), withDoubleWrite(3, mq.Options{}))
	n1, n2, n3 := c.nodes["n1"], c.nodes["n2"], c.nodes["n3"]
	addr := func(id string) string { return c.nodes[id].ClusterStatus().Addr }
	ctx := testCtx(t)

	on1 := slices.IndexFunc([]int{0, 1, 2}, func(i int) bool { return mq.PartitionNode(n1, "t", i) == "n1" })
	if on1 < 0 {
		t.Fatal("no partition of t on n1")
	}
	for i := range 4 {
		if err := mq.ApplyAt(ctx, n1, "t", on1, &mq.Message{ID: fmt.Sprintf("m%d", i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := n1.NewConsumer("t", "g", mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	waitFor(t, 20*time.Second, "g committed on n1", func() bool { return committedAt(t, n1, "t", "g", on1) == 4 })

	pair, pairEpoch, follower := -1, uint64(0), ""
	for i := range 3 {
		if leader, replicas, _, epoch := mq.PairRecord(n1, "d", i); !slices.Contains(replicas, "n3") {
			pair, pairEpoch, follower = i, epoch, replicas[slices.IndexFunc(replicas, func(r string) bool { return r != leader })]
		}
	}
	if pair < 0 {
		t.Fatal("every pair of d has a replica on n3")
	}
	r3Group := "raft3/" + r3 + "/0"
	r3Lead := leaderOf(t, c, 0)
	claim := r3Lead // a member in whose name n3 speaks
	if claim == "n3" {
		claim = "n1"
	}
	target := othersThan(c, claim, "n3")[0] // the member n3 speaks to
	x9Target := othersThan(c, r3Lead)[0]    // a follower x9 speaks to
	x9Voter := othersThan(c, x9Target)[0]   // and another member

	all := mq.ACLRule{Identity: "n1", Topic: "*", Rights: mq.Produce | mq.Consume | mq.Admin}
	rules := []mq.ACLRule{all, {Identity: "n2", Topic: "*", Rights: mq.Produce | mq.Consume | mq.Admin},
		{Identity: "n3", Topic: "t", Rights: mq.Consume, Group: "mine"}}
	if err := n1.SetACL(ctx, rules); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the rules on "+id, func() bool { return len(m.ACL()) == 3 })
	}

	x9, n3x := newImpostor(t, "x9"), newImpostor(t, "n3")
	apply := func(im *impostor, at, topic string, i int, cmd *store.Command) func() error {
		return func() error { _, err := im.partition(addr(at), topic, i).Apply(ctx, cmd); return err }
	}
	pairAppendFrom := func(im *impostor) func() error {
		return func() error {
			_, err := im.client(addr(follower)).Call(ctx, replica.OpPairAppend, pairAppend("d", pair, pairEpoch, 1<<20, []byte("forged")))
			return err
		}
	}
	appendAs := func(im *impostor, as, at string) func() error {
		return func() error {
			req := &raft.AppendEntriesRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(as), Addr: []byte(as)},
				Term:      1 << 32, Leader: []byte(as), PrevLogEntry: 0, PrevLogTerm: 0, LeaderCommitIndex: 1,
				Entries: []*raft.Log{{Index: 1, Term: 1 << 32, Type: raft.LogCommand, Data: []byte("forged")}},
			}
			var resp raft.AppendEntriesResponse
			return im.raft(addr(at), r3Group).AppendEntries(raft.ServerID(at), raft.ServerAddress(at), req, &resp)
		}
	}
	voteAs := func(im *impostor, as, at string) func() error {
		return func() error {
			req := &raft.RequestVoteRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(as), Addr: []byte(as)},
				Term:      1 << 32, Candidate: []byte(as), LastLogIndex: 1 << 32, LastLogTerm: 1 << 32,
			}
			var resp raft.RequestVoteResponse
			return im.raft(addr(at), r3Group).RequestVote(raft.ServerID(at), raft.ServerAddress(at), req, &resp)
		}
	}
	msg := []store.Message{{ID: "forged", Body: []byte("forged")}}

	cases := []struct {
		identity, op string
		do           func() error
		want         error    // nil: the operation is allowed
		at           string   // the node whose log names the identity
		log          []string // parts of that line
	}{
		{"ClientIdentity", "SendToPartition", apply(x9, "n1", "t", on1, &store.Command{Op: store.OpAppend, Msgs: msg}),
			cluster.ErrDenied, "n1", []string{"identity=x9"}},
		{"ClientIdentity", "CommitOffset", apply(x9, "n1", "t", on1, &store.Command{Op: store.OpCommitOffset, Group: "g", Generation: 1}),
			cluster.ErrDenied, "n1", []string{"identity=x9"}},
		{"ClientIdentity", "Claim", apply(x9, "n1", "t", on1, &store.Command{Op: store.OpClaim, Group: "g", Start: store.StartFirst}),
			cluster.ErrDenied, "n1", []string{"identity=x9"}},
		{"ClientIdentity", "PairAppend", pairAppendFrom(x9), cluster.ErrDenied, follower, []string{"identity=x9"}},
		{"ClientIdentity", "Raft3AppendEntries", appendAs(x9, "x9", x9Target),
			errRefused, x9Target, []string{"peer=x9", "group=" + r3Group, "not a member"}},
		{"ClientIdentity", "Raft3RequestVote", voteAs(x9, "x9", x9Voter),
			errRefused, x9Voter, []string{"peer=x9", "group=" + r3Group, "not a member"}},

		{"LimitedNode", "ResetOffsetWithoutGroupRight", apply(n3x, "n1", "t", on1, &store.Command{Op: store.OpResetOffset, Group: "g", Offset: 0}),
			cluster.ErrDenied, "n1", []string{"identity=n3", "group=g"}},
		{"LimitedNode", "CommitAnotherGroupsOffset", apply(n3x, "n1", "t", on1, &store.Command{Op: store.OpCommitOffset, Group: "g", Generation: 1}),
			cluster.ErrDenied, "n1", []string{"identity=n3", "right=consume", "group=g"}},
		{"LimitedNode", "ClaimPartitionItDoesNotOwn", apply(n3x, "n1", "t", on1, &store.Command{Op: store.OpClaim, Group: "mine", Start: store.StartFirst}),
			cluster.ErrDenied, "n1", []string{"identity=n3", "does not own"}},
		{"LimitedNode", "SendWithoutProduce", apply(n3x, "n1", "t", on1, &store.Command{Op: store.OpAppend, Msgs: msg}),
			cluster.ErrDenied, "n1", []string{"identity=n3", "right=produce"}},
		{"LimitedNode", "ConsumeGroupWithoutGroupRight", func() error {
			cons, err := n3.NewConsumer("t", "g", mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil }))
			if err == nil {
				cons.Close()
			}
			return err
		}, mq.ErrDenied, "n3", []string{"refused by the cluster's ACL", "identity=n3", "right=consume", "group=g"}},
		{"LimitedNode", "PairAppendNotItsLeader", pairAppendFrom(n3x), errRefused, follower, []string{"identity=n3", "d/" + strconv.Itoa(pair)}},
		{"LimitedNode", "Raft3AppendEntriesAsAnotherMember", appendAs(n3x, claim, target),
			errRefused, target, []string{"peer=n3", "group=" + r3Group, "not from the peer"}},
		{"LimitedNode", "Raft3RequestVoteAsAnotherMember", voteAs(n3x, target, claim),
			errRefused, claim, []string{"peer=n3", "group=" + r3Group, "not from the peer"}},

		{"Admin", "SetACL", func() error {
			return n2.SetACL(ctx, append(slices.Clone(rules), mq.ACLRule{Identity: "n4", Topic: "t", Rights: mq.Produce}))
		}, nil, "", nil},
		{"Admin", "CreateTopic", func() error { return n2.CreateMQ(ctx, "u", 1, mq.Options{}) }, nil, "", nil},
	}
	type state struct {
		acl            []mq.ACLRule
		topics         map[string]int
		t, r, d        []mq.PartitionLag
		committedOnAll []uint64
	}
	snapshot := func() state {
		var s state
		s.acl, s.topics = n1.ACL(), n1.Topics()
		var err error
		for _, x := range []struct {
			topic string
			to    *[]mq.PartitionLag
		}{{"t", &s.t}, {r3, &s.r}, {"d", &s.d}} {
			if *x.to, err = n1.Lag(context.Background(), x.topic, "g"); err != nil {
				t.Fatalf("lag of %s: %v", x.topic, err)
			}
		}
		for _, id := range []string{"n1", "n2", "n3"} {
			s.committedOnAll = append(s.committedOnAll, committedAt(t, c.nodes[id], "t", "g", on1))
		}
		return s
	}
	for _, tc := range cases {
		t.Run(tc.identity+"/"+tc.op, func(t *testing.T) {
			before := snapshot()
			err := tc.do()
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("%s by %s: %v, want it allowed", tc.op, tc.identity, err)
			case tc.want == nil:
				return
			case tc.want == errRefused && err == nil, tc.want != errRefused && !errors.Is(err, tc.want):
				t.Errorf("%s by %s: %v, want %v", tc.op, tc.identity, err, tc.want)
			}
			if l := logs[tc.at].AwaitMatching(5*time.Second, tc.log...); len(l) == 0 {
				t.Errorf("no log line on %s holding %q", tc.at, tc.log)
			} else {
				t.Logf("%v; logged on %s: %s", err, tc.at, l[0])
			}
			time.Sleep(50 * time.Millisecond) // let a forged entry, were it taken, be applied
			if after := snapshot(); !reflect.DeepEqual(after, before) {
				t.Errorf("the state moved:\n%+v\nbefore\n%+v", after, before)
			}
		})
	}

	// The admin's changes took; the Raft3 group the forgeries aimed at
	// still commits.
	waitFor(t, 10*time.Second, "the admin's changes on n1", func() bool { return len(n1.ACL()) == 4 && n1.Topics()["u"] == 1 })
	next := snapshot().r[0].Next
	if err := mq.ApplyAt(ctx, n1, r3, 0, &mq.Message{ID: "after", Body: []byte("x")}); err != nil {
		t.Fatalf("the Raft3 group after the forgeries: %v", err)
	}
	if got := snapshot().r[0].Next; got != next+1 {
		t.Fatalf("r/0's next offset %d after one send, before %d", got, next)
	}
}
