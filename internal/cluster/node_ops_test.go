package cluster

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/store"
)

// countingTx answers every check-back Committed and counts them.
func countingTx(asked *atomic.Int32) func(context.Context, string, []PartRef) (store.Decision, error) {
	return func(context.Context, string, []PartRef) (store.Decision, error) {
		asked.Add(1)
		return store.Committed, nil
	}
}

// TestAgent_NodeOpsRefusedToOutsiders: an identity that knows the secret
// but is no node of the cluster is refused every node-only op, each
// refusal logged once with a line naming it, and nothing it sent takes
// effect. Before the ops checked for a node, its SetACL was applied, its
// announce recorded, its report probed and its check-back answered.
func TestAgent_NodeOpsRefusedToOutsiders(t *testing.T) {
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	var asked atomic.Int32
	n1, logs := a.startLogged("n1", countingTx(&asked))
	eventually(t, "n1 up", func() bool { return a.allUp(1) })
	o := newOutsider(t, "x1")
	enc := func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name, cause string
		op          uint16
		req         []byte
		want        error
	}{
		{"Propose", "not a node: propose", opPropose, enc(metastate.EncodeCommand(metastate.SetACL{Rules: []metastate.Rule{
			{Identity: "x1", Topic: "*", Rights: metastate.RightAdmin}}})), ErrDenied},
		{"Heartbeat", "not a node: heartbeat", opHeartbeat, enc(encodeMsg(&joinReq{ID: "x1", Addr: o.Addr()})), metastate.ErrNoNode},
		{"Announce", "not a node: announce", opAnnounce, enc(encodeMsg(&joinReq{ID: "x1", Addr: o.Addr()})), ErrDenied},
		{"Report", "not a node: report", opReport, enc(encodeMsg(&joinReq{ID: "n9"})), ErrDenied},
		{"CheckTx", "not a node: check-back", opCheckTx, enc(encodeMsg(&checkTxReq{TxID: "tx1", Parts: []PartRef{{Topic: "t", Part: 0}}})), ErrDenied},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for range 2 {
				if _, err := o.call(n1.Addr(), c.op, c.req); !errors.Is(err, c.want) {
					t.Fatalf("%s from x1: %v, want %v", c.name, err, c.want)
				}
			}
			if got := logs.count("identity=x1", c.cause); got != 1 {
				t.Errorf("%d log lines naming x1 for %q, want 1", got, c.cause)
			}
		})
	}
	if acl := n1.Meta().State().ACL(); len(acl) != 0 {
		t.Errorf("ACL after x1's SetACL: %v", acl)
	}
	if addr, ok := n1.announced.Load("x1"); ok {
		t.Errorf("x1's announce recorded: %v", addr)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("%d check-backs of x1 answered", n)
	}
}

// TestAgent_JoinProvesTheJoiner: an identity that is no node yet joins
// only where it listens as itself, and, with the ACL on, only if a rule
// names it; a node that the ACL names joins. Before the join checked, an
// outsider registered itself at another node's address.
func TestAgent_JoinProvesTheJoiner(t *testing.T) {
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	var asked atomic.Int32
	n1, logs := a.startLogged("n1", countingTx(&asked))
	eventually(t, "n1 up", func() bool { return a.allUp(1) })

	x1 := newOutsider(t, "x1")
	req, _ := encodeMsg(&joinReq{ID: "x1", Addr: n1.Addr()}) // n1's port: the node there is not x1
	if _, err := x1.call(n1.Addr(), opJoin, req); !errors.Is(err, ErrDenied) {
		t.Fatalf("x1 joins at n1's address: %v, want ErrDenied", err)
	}
	if _, ok := n1.Meta().State().Node("x1"); ok {
		t.Fatal("x1 registered at n1's address")
	}
	if logs.count("identity=x1", "dial-back") != 1 {
		t.Error("no log line naming x1's refused join")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := n1.Propose(ctx, metastate.SetACL{Rules: []metastate.Rule{
		{Identity: "n1", Topic: "*", Rights: metastate.RightAdmin | metastate.RightConsume | metastate.RightProduce},
		{Identity: "n2", Topic: "t", Rights: metastate.RightConsume}}}); err != nil {
		t.Fatal(err)
	}
	x2 := newOutsider(t, "x2")
	req, _ = encodeMsg(&joinReq{ID: "x2", Addr: x2.Addr()})
	if _, err := x2.call(n1.Addr(), opJoin, req); !errors.Is(err, ErrDenied) {
		t.Fatalf("x2, which no rule names, joins: %v, want ErrDenied", err)
	}
	if _, ok := n1.Meta().State().Node("x2"); ok {
		t.Fatal("x2 registered")
	}
	a.start("n2", n1.Addr())
	eventually(t, "n2, which a rule names, joined", func() bool { return a.allUp(2) })
}

// TestAgent_RejoinAtAnotherAddressProvesTheNode: a registered node that
// registers again at another address is dialed back there as a new joiner
// is: n2 registering x9's address, where x9 answers, is refused and keeps
// its address; at its own address it registers again freely. Before, a
// node registered anything, so the state sent every node's raft and RPC
// for n2 to x9.
func TestAgent_RejoinAtAnotherAddressProvesTheNode(t *testing.T) {
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	n1, logs := a.startLogged("n1", noTx)
	eventually(t, "n1 up", func() bool { return a.allUp(1) })
	n2 := a.start("n2", n1.Addr())
	eventually(t, "n2 up", func() bool { return a.allUp(2) })
	n2rpc := &outsider{tr: n2.Transport(), cli: map[string]*remote.Client{}} // n2's own calls, as a hostile n2 makes them
	t.Cleanup(func() {
		for _, c := range n2rpc.cli {
			c.Close()
		}
	})
	x9 := newOutsider(t, "x9")
	req, _ := encodeMsg(&joinReq{ID: "n2", Addr: x9.Addr()})
	if _, err := n2rpc.call(n1.Addr(), opJoin, req); !errors.Is(err, ErrDenied) {
		t.Fatalf("n2 registers x9's address: %v, want ErrDenied", err)
	}
	if nd, _ := n1.Meta().State().Node("n2"); nd.Addr != n2.Addr() {
		t.Errorf("n2 registered at %s, want %s", nd.Addr, n2.Addr())
	}
	if logs.count("identity=n2", "dial-back") != 1 {
		t.Error("no log line naming n2's refused join")
	}
	req, _ = encodeMsg(&joinReq{ID: "n2", Addr: n2.Addr()})
	if _, err := n2rpc.call(n1.Addr(), opJoin, req); err != nil {
		t.Fatalf("n2 registers its own address again: %v", err)
	}
}

// TestAgent_ProposalsCheckEveryKind: a node whose ACL rights are limited
// (n2: Produce on t, then Consume on t in group "mine" only) cannot gain
// rights or change the cluster through any kind of metadata command, and
// the state is unchanged; the group it may consume in it joins.
func TestAgent_ProposalsCheckEveryKind(t *testing.T) {
	a := newAgents(t, 2)
	n1, n2 := a.all["n1"], a.all["n2"]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := n1.Propose(ctx, metastate.CreateTopic{Name: "t", Partitions: 2, Type: metastate.TypeSingle, Now: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := n1.Propose(ctx, metastate.CreateTopic{Name: "d", Partitions: 2, Type: metastate.TypeDoubleWrite, GroupSize: 1, Now: 1})
	if err != nil {
		t.Fatal(err)
	}
	led := -1
	for i, p := range r.Topic.Parts {
		if p.Leader == "n1" {
			led = i
		}
	}
	if led < 0 {
		t.Fatalf("no partition of d led by n1: %+v", r.Topic.Parts)
	}
	if _, err := n1.Propose(ctx, metastate.JoinGroup{Topic: "t", Group: "g", Member: "n1/1", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	admin := metastate.Rule{Identity: "n1", Topic: "*", Rights: metastate.RightAdmin | metastate.RightConsume | metastate.RightProduce}
	if _, err := n1.Propose(ctx, metastate.SetACL{Rules: []metastate.Rule{admin,
		{Identity: "n2", Topic: "t", Rights: metastate.RightProduce}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rules on n2", func() bool { return len(n2.Meta().State().ACL()) == 2 })
	rec := r.Topic.Parts[led]
	for _, c := range []metastate.Command{
		metastate.RegisterNode{ID: "n3", Addr: "127.0.0.1:1", Voter: true},
		metastate.NodeDown{ID: "n1", Session: 1},
		metastate.CreateTopic{Name: "u", Partitions: 1, Type: metastate.TypeSingle, Now: 1},
		metastate.AlterTopic{Name: "t", Partitions: 3},
		metastate.JoinGroup{Topic: "t", Group: "g", Member: "n2/1", Node: "n2"},
		metastate.LeaveGroup{Topic: "t", Group: "g", Member: "n1/1"},
		metastate.Released{Topic: "t", Group: "g", Partition: 0, Member: "n1/1", Generation: 1},
		metastate.SetACL{Rules: []metastate.Rule{{Identity: "n2", Topic: "*", Rights: metastate.RightAdmin}}},
		metastate.SetInSync{Topic: "d", Partition: led, Version: rec.Version, InSync: []string{"n1"}},
		metastate.Promote{Topic: "d", Partition: led, Version: rec.Version, Leader: "n2"},
		metastate.HandOver{Topic: "d", Partition: led, Version: rec.Version, Leader: "n2"},
		metastate.ReplaceFollower{Topic: "d", Partition: led, Version: rec.Version},
		metastate.RenewEpoch{Topic: "d", Partition: led, Version: rec.Version},
		metastate.Rejoined{Topic: "d", Partition: led, Node: "n1"},
	} {
		if _, err := n2.Propose(ctx, c); !errors.Is(err, ErrDenied) {
			t.Errorf("%T from n2: %v, want ErrDenied", c, err)
		}
	}
	st := n1.Meta().State()
	if len(st.ACL()) != 2 || len(st.Nodes()) != 2 || len(st.Topics()) != 2 {
		t.Errorf("state changed: ACL %v, %d nodes, topics %v", st.ACL(), len(st.Nodes()), st.Topics())
	}
	if p, _ := st.Partition("d", led); p.Version != rec.Version || p.Leader != "n1" {
		t.Errorf("d/%d changed: %+v", led, p)
	}

	// A rule limited to group "mine": n2 joins it, and not g.
	if _, err := n1.Propose(ctx, metastate.SetACL{Rules: []metastate.Rule{admin,
		{Identity: "n2", Topic: "t", Rights: metastate.RightConsume, Group: "mine"}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the group rule on n2", func() bool { return n2.Meta().State().ACL()[1].Group == "mine" })
	if _, err := n2.Propose(ctx, metastate.JoinGroup{Topic: "t", Group: "g", Member: "n2/1", Node: "n2"}); !errors.Is(err, ErrDenied) {
		t.Errorf("n2 joins g: %v, want ErrDenied", err)
	}
	if _, err := n2.Propose(ctx, metastate.JoinGroup{Topic: "t", Group: "mine", Member: "n2/1", Node: "n2"}); err != nil {
		t.Errorf("n2 joins mine: %v", err)
	}
}

// TestAgent_CheckTxOnlyFromReplicaHolders: a check-back is answered to a
// node holding a replica of every partition it names, and refused for a
// partition it does not hold or for none. Before, any peer got an answer
// for any partition, and the preparer would roll back what it did not
// find in its host stores.
func TestAgent_CheckTxOnlyFromReplicaHolders(t *testing.T) {
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	var asked atomic.Int32
	n1, _ := a.startLogged("n1", countingTx(&asked))
	a.start("n2", n1.Addr())
	eventually(t, "both up", func() bool { return a.allUp(2) })
	n2 := a.all["n2"]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := n1.Propose(ctx, metastate.CreateTopic{Name: "t", Partitions: 2, Type: metastate.TypeSingle, Now: 1})
	if err != nil {
		t.Fatal(err)
	}
	mine, other := -1, -1
	for i, p := range r.Topic.Parts {
		if p.Replicas[0] == "n2" {
			mine = i
		} else {
			other = i
		}
	}
	if mine < 0 || other < 0 {
		t.Fatalf("placement %+v", r.Topic.Parts)
	}
	eventually(t, "t on n1", func() bool { _, ok := n1.Meta().State().Topic("t"); return ok })
	for _, parts := range [][]PartRef{{{Topic: "t", Part: other}}, {{Topic: "t", Part: mine}, {Topic: "t", Part: other}}, nil} {
		if _, err := n2.CheckTx(ctx, "n1", "tx1", parts); !errors.Is(err, ErrDenied) {
			t.Errorf("check-back of %v from n2: %v, want ErrDenied", parts, err)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("%d refused check-backs answered", n)
	}
	if d, err := n2.CheckTx(ctx, "n1", "tx1", []PartRef{{Topic: "t", Part: mine}}); err != nil || d != store.Committed {
		t.Fatalf("check-back of n2's partition: %v, %v", d, err)
	}
}
