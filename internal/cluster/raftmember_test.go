//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Leader and Candidate, and the codec handle raft uses, which these tests forge

package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
)

// TestAgent_MetaRaftOnlyFromMembers: a follower of the metadata group gets,
// through raft's own NetworkTransport, an AppendEntries that would commit
// a SetACL giving its sender every right on every topic, and a heartbeat
// of a far higher term: from x9, which holds the cluster secret but is no
// node of the cluster, and from n3, a node, in the leader's name. Both are
// refused before raft reads them: no ACL on any node, no entry at that
// index, the follower's term unchanged, and the group still commits.
// (Before, x9's SetACL was applied and its term taken.)
func TestAgent_MetaRaftOnlyFromMembers(t *testing.T) {
	a := newAgents(t, 3)
	leader := a.leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	var follower, other *Agent
	for _, ag := range a.all {
		switch {
		case ag == leader:
		case follower == nil:
			follower = ag
		default:
			other = ag
		}
	}
	term := raftStat(t, leader.meta.raft, "term")
	for _, c := range []struct{ dialer, claim string }{{"x9", "x9"}, {other.ID(), leader.ID()}} {
		nt := forgeMeta(t, c.dialer, follower.Addr())
		target := raft.ServerAddress(follower.ID())
		req := forgedSetACL(t, follower.meta, c.claim)
		var resp raft.AppendEntriesResponse
		if err := nt.AppendEntries("x", target, req, &resp); err == nil {
			t.Errorf("%s's SetACL as %s was answered: %+v", c.dialer, c.claim, resp)
		}
		hb := &raft.AppendEntriesRequest{RPCHeader: req.RPCHeader, Term: term + 100, Leader: req.Leader}
		if err := nt.AppendEntries("x", target, hb, &resp); err == nil {
			t.Errorf("%s's heartbeat as %s was answered: %+v", c.dialer, c.claim, resp)
		}
	}
	if got := raftStat(t, follower.meta.raft, "term"); got >= term+100 {
		t.Errorf("the follower took the forged term: %d", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := follower.Propose(ctx, metastate.CreateTopic{Name: "after", Partitions: 1, Type: metastate.TypeSingle, Now: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	for id, ag := range a.all {
		eventually(t, "the topic on "+id, func() bool { _, ok := ag.Meta().State().Topic("after"); return ok })
		if acl := ag.Meta().State().ACL(); len(acl) != 0 {
			t.Errorf("%s has the forged ACL %+v", id, acl)
		}
	}
}

// TestAgent_BootstrapNodeFindsANewLeader: the node that started the
// cluster, which has no seeds, was away while a fourth node joined and
// came to lead. Back on its data, its own state does not name the new
// node, so the metadata group refuses the leader's streams until the node
// learns of it: it asks the nodes of its address book who leads, dials
// that leader, and so accepts it, catches up and registers again.
func TestAgent_BootstrapNodeFindsANewLeader(t *testing.T) {
	a := newAgents(t, 3)
	// n2 and n3 must hold the configuration naming all three before n1
	// goes: a node's state shows another up before raft adds it as a
	// voter, and without n1 the two could not elect a leader otherwise.
	eventually(t, "three voters everywhere", func() bool {
		for _, ag := range a.all {
			f := ag.Meta().raft.GetConfiguration()
			if f.Error() != nil || len(f.Configuration().Servers) != 3 {
				return false
			}
		}
		return true
	})
	a.all["n1"].Close()
	delete(a.all, "n1")
	n4 := a.start("n4", a.all["n2"].Addr())
	eventually(t, "n4 up in n2's state", func() bool {
		nd, ok := a.all["n2"].Meta().State().Node("n4")
		return ok && nd.Up
	})
	eventually(t, "n4 leading", func() bool {
		if n4.Meta().IsLeader() {
			return true
		}
		if l := a.leader(); l != nil {
			l.Meta().raft.LeadershipTransferToServer("n4", "n4")
		}
		time.Sleep(100 * time.Millisecond)
		return n4.Meta().IsLeader()
	})
	n1 := a.start("n1")
	eventually(t, "n1 follows n4 and knows it", func() bool {
		id, _ := n1.Meta().Leader()
		_, known := n1.Meta().State().Node("n4")
		return id == "n4" && known
	})
	eventually(t, "n1's session", n1.SessionValid)
}
