//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Candidate, which these tests forge

package cluster

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/testlog"
)

// errAnyRefusal is a row's wanted error when the refusal is a closed
// connection or stream, whatever error the caller sees.
var errAnyRefusal = errors.New("any error")

// TestThreatModel_Cluster is the rows of docs/DESIGN.md's threat model
// that the metadata group answers, on three nodes running mutual TLS under
// one CA: a client identity (x9: a certificate of the cluster's CA and the
// secret, no node), a node limited by the ACL (n3: Consume on t in group
// "mine" only) and an admin (n2: every right on "*"). Each identity tries
// each operation it must not perform and is refused, with the error the
// row names and a log line naming it on the node it asked; and nothing it
// sent reached the state: every node's metadata log keeps its last index
// and term, the ACL and the topics are unchanged. The admin's rows are
// the control: they succeed and change the state. (The identities without
// both credentials are TestThreatModel_Transport's; the partition
// service, pair appends and Raft3 groups are TestThreatModel_Nodes'.)
func TestThreatModel_Cluster(t *testing.T) {
	ca := newCertAuthority(t)
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	logs := map[string]*testlog.Lines{}
	n1, l1 := a.startTLS(ca, "n1")
	eventually(t, "n1 up", func() bool { return a.allUp(1) })
	n2, l2 := a.startTLS(ca, "n2", n1.Addr())
	n3, l3 := a.startTLS(ca, "n3", n1.Addr())
	logs["n1"], logs["n2"], logs["n3"] = l1, l2, l3
	eventually(t, "every node up", func() bool { return a.allUp(3) })
	if !n1.Meta().IsLeader() {
		t.Fatal("n1, which started the cluster, does not lead")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range []metastate.Command{
		metastate.CreateTopic{Name: "t", Partitions: 2, Type: metastate.TypeSingle, Now: 1},
		metastate.JoinGroup{Topic: "t", Group: "g", Member: "n1/1", Node: "n1"},
		metastate.SetACL{Rules: []metastate.Rule{
			{Identity: "n1", Topic: "*", Rights: metastate.RightAdmin | metastate.RightProduce | metastate.RightConsume},
			{Identity: "n2", Topic: "*", Rights: metastate.RightAdmin | metastate.RightProduce | metastate.RightConsume},
			{Identity: "n3", Topic: "t", Rights: metastate.RightConsume, Group: "mine"},
		}},
	} {
		if _, err := n1.Propose(ctx, c); err != nil {
			t.Fatalf("%T: %v", c, err)
		}
	}
	for id, ag := range a.all {
		eventually(t, "the ACL on "+id, func() bool { return len(ag.Meta().State().ACL()) == 3 })
	}

	x9 := newTLSOutsider(t, ca, "x9")
	n3rpc := &outsider{tr: n3.Transport(), cli: map[string]*remote.Client{}} // n3's own calls, as a hostile n3 makes them
	t.Cleanup(func() {
		for _, c := range n3rpc.cli {
			c.Close()
		}
	})
	enc := func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	call := func(o *outsider, at *Agent, op uint16, req []byte) func() error {
		return func() error { _, err := o.call(at.Addr(), op, req); return err }
	}
	propose := func(from *Agent, c metastate.Command) func() error {
		return func() error { _, err := from.Propose(ctx, c); return err }
	}
	// appendAs sends, over tr's proven identity, an AppendEntries claiming
	// to come from claim that would commit a SetACL at the target's next
	// index; voteAs a RequestVote of a far higher term.
	appendAs := func(o *outsider, claim string, at *Agent) func() error {
		return func() error {
			nt := forgeMetaOver(t, o.tr, at.Addr())
			var resp raft.AppendEntriesResponse
			return nt.AppendEntries(raft.ServerID(at.ID()), raft.ServerAddress(at.ID()), forgedSetACL(t, at.meta, claim), &resp)
		}
	}
	voteAs := func(o *outsider, claim string, at *Agent) func() error {
		return func() error {
			nt := forgeMetaOver(t, o.tr, at.Addr())
			req := &raft.RequestVoteRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(claim), Addr: []byte(claim)},
				Term:      raftStat(t, at.meta.raft, "term") + 100, Candidate: []byte(claim),
				LastLogIndex: at.meta.raft.LastIndex() + 100, LastLogTerm: raftStat(t, at.meta.raft, "last_log_term") + 100,
			}
			var resp raft.RequestVoteResponse
			return nt.RequestVote(raft.ServerID(at.ID()), raft.ServerAddress(at.ID()), req, &resp)
		}
	}
	adminOnStar := func(id string) metastate.SetACL {
		return metastate.SetACL{Rules: []metastate.Rule{{Identity: id, Topic: "*",
			Rights: metastate.RightAdmin | metastate.RightProduce | metastate.RightConsume}}}
	}

	cases := []struct {
		identity, op string
		do           func() error
		want         error    // nil: the operation is allowed
		at           string   // the node whose log names the identity
		log          []string // parts of that line
		changes      bool     // an allowed operation that changes the state
	}{
		{"ClientIdentity", "WhoLeads", call(x9, n1, opWhoLeads, nil), nil, "", nil, false},
		{"ClientIdentity", "ProposeSetACL", call(x9, n1, opPropose, enc(metastate.EncodeCommand(adminOnStar("x9")))),
			ErrDenied, "n1", []string{"identity=x9", "not a node: propose"}, false},
		{"ClientIdentity", "Heartbeat", call(x9, n1, opHeartbeat, enc(encodeMsg(&joinReq{ID: "x9", Addr: x9.Addr()}))),
			metastate.ErrNoNode, "n1", []string{"identity=x9", "not a node: heartbeat"}, false},
		{"ClientIdentity", "Announce", call(x9, n1, opAnnounce, enc(encodeMsg(&joinReq{ID: "x9", Addr: x9.Addr()}))),
			ErrDenied, "n1", []string{"identity=x9", "not a node: announce"}, false},
		{"ClientIdentity", "Report", call(x9, n1, opReport, enc(encodeMsg(&joinReq{ID: "n2"}))),
			ErrDenied, "n1", []string{"identity=x9", "not a node: report"}, false},
		{"ClientIdentity", "CheckTx", call(x9, n2, opCheckTx, enc(encodeMsg(&checkTxReq{TxID: "tx1", Parts: []PartRef{{Topic: "t", Part: 0}}}))),
			ErrDenied, "n2", []string{"identity=x9", "not a node: check-back"}, false},
		{"ClientIdentity", "JoinNamedByNoRule", call(x9, n1, opJoin, enc(encodeMsg(&joinReq{ID: "x9", Addr: x9.Addr()}))),
			ErrDenied, "n1", []string{"identity=x9", "join: not in the ACL"}, false},
		{"ClientIdentity", "MetaAppendEntries", appendAs(x9, "x9", n2),
			errAnyRefusal, "n2", []string{"peer=x9", "group=" + metaGroup, "not a member"}, false},
		{"ClientIdentity", "MetaRequestVote", voteAs(x9, "x9", n3),
			errAnyRefusal, "n3", []string{"peer=x9", "group=" + metaGroup, "not a member"}, false},

		{"LimitedNode", "ProposeSetACL", propose(n3, adminOnStar("n3")),
			ErrDenied, "n1", []string{"identity=n3", "SetACL"}, false},
		{"LimitedNode", "CreateTopic", propose(n3, metastate.CreateTopic{Name: "u3", Partitions: 1, Type: metastate.TypeSingle, Now: 1}),
			ErrDenied, "n1", []string{"identity=n3", "CreateTopic"}, false},
		{"LimitedNode", "AlterTopic", propose(n3, metastate.AlterTopic{Name: "t", Partitions: 3}),
			ErrDenied, "n1", []string{"identity=n3", "AlterTopic"}, false},
		{"LimitedNode", "JoinGroupForAnotherNodesMember", propose(n3, metastate.JoinGroup{Topic: "t", Group: "mine", Member: "n1/2", Node: "n1"}),
			ErrDenied, "n1", []string{"identity=n3", "JoinGroup", "n1/2"}, false},
		{"LimitedNode", "JoinGroupWithoutGroupRight", propose(n3, metastate.JoinGroup{Topic: "t", Group: "g", Member: "n3/1", Node: "n3"}),
			ErrDenied, "n1", []string{"identity=n3", "JoinGroup", "in group g"}, false},
		{"LimitedNode", "LeaveGroupForAnotherNodesMember", propose(n3, metastate.LeaveGroup{Topic: "t", Group: "g", Member: "n1/1"}),
			ErrDenied, "n1", []string{"identity=n3", "LeaveGroup"}, false},
		{"LimitedNode", "ReleaseAnotherNodesPartition", propose(n3, metastate.Released{Topic: "t", Group: "g", Partition: 0, Member: "n1/1", Generation: 1}),
			ErrDenied, "n1", []string{"identity=n3", "Released"}, false},
		{"LimitedNode", "RegisterAnotherNode", propose(n3, metastate.RegisterNode{ID: "n9", Addr: "127.0.0.1:1", Voter: true}),
			ErrDenied, "n1", []string{"identity=n3", "RegisterNode"}, false},
		{"LimitedNode", "MarkAnotherNodeDown", propose(n3, metastate.NodeDown{ID: "n2", Session: 1}),
			ErrDenied, "n1", []string{"identity=n3", "NodeDown"}, false},
		{"LimitedNode", "JoinAsAnotherNode", call(n3rpc, n1, opJoin, enc(encodeMsg(&joinReq{ID: "n2", Addr: n3.Addr()}))),
			ErrDenied, "n1", []string{"identity=n3", "join as another"}, false},
		{"LimitedNode", "AnnounceAsAnotherNode", call(n3rpc, n1, opAnnounce, enc(encodeMsg(&joinReq{ID: "n2", Addr: n3.Addr()}))),
			ErrDenied, "n1", []string{"identity=n3", "announce as another"}, false},
		{"LimitedNode", "HeartbeatAsAnotherNode", call(n3rpc, n1, opHeartbeat, enc(encodeMsg(&joinReq{ID: "n2", Addr: n2.Addr()}))),
			ErrDenied, "n1", []string{"identity=n3", "heartbeat"}, false},
		{"LimitedNode", "MetaAppendEntriesAsTheLeader", appendAs(n3rpc, "n1", n2),
			errAnyRefusal, "n2", []string{"peer=n3", "group=" + metaGroup, "not from the peer"}, false},
		{"LimitedNode", "MetaRequestVoteAsAnotherNode", voteAs(n3rpc, "n2", n1),
			errAnyRefusal, "n1", []string{"peer=n3", "group=" + metaGroup, "not from the peer"}, false},

		{"Admin", "SetACL", propose(n2, metastate.SetACL{Rules: append(slices.Clone(n1.Meta().State().ACL()),
			metastate.Rule{Identity: "n4", Topic: "t", Rights: metastate.RightProduce})}), nil, "", nil, true},
		{"Admin", "CreateTopic", propose(n2, metastate.CreateTopic{Name: "u", Partitions: 1, Type: metastate.TypeSingle, Now: 1}),
			nil, "", nil, true},
	}
	type mark struct{ index, term uint64 }
	marks := func() map[string]mark {
		m := map[string]mark{}
		for id, ag := range a.all {
			m[id] = mark{ag.meta.raft.LastIndex(), raftStat(t, ag.meta.raft, "term")}
		}
		return m
	}
	// The leader's own entries (it registers itself) end before the rows.
	last, quiet := marks(), time.Now()
	for time.Since(quiet) < time.Second {
		time.Sleep(50 * time.Millisecond)
		if m := marks(); !reflect.DeepEqual(m, last) {
			last, quiet = m, time.Now()
		}
	}
	for _, c := range cases {
		t.Run(c.identity+"/"+c.op, func(t *testing.T) {
			st := n1.Meta().State()
			acl, topics, before := st.ACL(), st.Topics(), marks()
			err := c.do()
			switch {
			case c.want == nil && err != nil:
				t.Fatalf("%s by %s: %v, want it allowed", c.op, c.identity, err)
			case c.want == nil:
			case c.want == errAnyRefusal && err == nil, c.want != errAnyRefusal && !errors.Is(err, c.want):
				t.Errorf("%s by %s: %v, want %v", c.op, c.identity, err, c.want)
			}
			if c.want != nil {
				if l := logs[c.at].AwaitMatching(5*time.Second, c.log...); len(l) == 0 {
					t.Errorf("no log line on %s holding %q", c.at, c.log)
				} else {
					t.Logf("%v; logged on %s: %s", err, c.at, l[0])
				}
			}
			if c.changes {
				for id, ag := range a.all {
					eventually(t, "the change on "+id, func() bool { return ag.meta.raft.AppliedIndex() > before[id].index })
				}
				return
			}
			time.Sleep(50 * time.Millisecond) // let a forged entry, were it taken, be applied
			if after := marks(); !reflect.DeepEqual(after, before) {
				t.Errorf("the metadata logs moved: %v, before %v", after, before)
			}
			st = n1.Meta().State()
			if !reflect.DeepEqual(st.ACL(), acl) || !reflect.DeepEqual(st.Topics(), topics) {
				t.Errorf("the state changed: ACL %v, topics %v; before %v, %v", st.ACL(), st.Topics(), acl, topics)
			}
			for id, ag := range a.all {
				if slices.ContainsFunc(ag.Meta().State().ACL(), func(r metastate.Rule) bool { return r.Identity == "x9" }) {
					t.Errorf("%s holds a rule for x9", id)
				}
			}
		})
	}
}
