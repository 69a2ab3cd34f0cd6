package cluster

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
)

// TestMeta_JoiningReplicaVotesOnceRegistered: a metadata replica opened
// without state and not to start a cluster neither votes nor campaigns,
// across a restart, until the group registered its node; then it votes
// from then on. Back with the vote file (a crash after the registration,
// before the file went), it votes again from its own log and state, with
// no leader to ask. A vote file that is not one is ErrCorrupt.
func TestMeta_JoiningReplicaVotesOnceRegistered(t *testing.T) {
	c := newTestCluster(t, 5*time.Second)
	c.start("n1", true)
	if !c.leader().MayVote() {
		t.Fatal("the node that started the group does not vote")
	}
	if m := c.start("n2", false); m.MayVote() {
		t.Fatal("a joining replica votes before it is registered")
	}
	c.stop("n2")
	if m := c.start("n2", false); m.MayVote() {
		t.Fatal("a joining replica, restarted, votes before it is registered")
	}
	eventually(t, "n2 registered", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.leader().AddNode(ctx, metastate.RegisterNode{ID: "n2", Addr: "n2"}) == nil
	})
	eventually(t, "n2 votes", func() bool { return c.meta("n2").MayVote() })
	if _, err := os.Stat(voteFilePath(c.dirs["n2"])); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the vote file after the registration: %v", err)
	}

	c.stop("n1")
	c.stop("n2")
	if err := os.WriteFile(voteFilePath(c.dirs["n2"]), []byte(voteFileHeader+"-\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := c.start("n2", false)
	eventually(t, "n2 votes, registered in its own log", func() bool { return m.MayVote() })
	c.stop("n2")

	if err := os.WriteFile(voteFilePath(c.dirs["n2"]), []byte("votes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, tr := raft.NewInmemTransport("n2")
	defer tr.Close()
	_, err := OpenMeta(MetaConfig{NodeID: "n2", Dir: c.dirs["n2"], Transport: tr})
	if !errors.Is(err, metastate.ErrCorrupt) {
		t.Fatalf("open with a damaged vote file: %v, want ErrCorrupt", err)
	}
}

// TestMeta_VoterWithAnotherIncarnationRejoinsAsNewServer: a voter that
// registers with another incarnation than the state records leaves the
// metadata voters before the state records the new one, and joins again
// as a voter, a new server; while a majority of the other voters is not up, its
// registration is refused and nothing changes.
func TestMeta_VoterWithAnotherIncarnationRejoinsAsNewServer(t *testing.T) {
	c := newTestCluster(t, time.Minute)
	c.start("n1", true)
	add := func(id, inc string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.leader().AddNode(ctx, metastate.RegisterNode{ID: id, Addr: id, Incarnation: inc})
	}
	for _, id := range []string{"n2", "n3"} {
		c.start(id, false)
		eventually(t, "add "+id, func() bool { return add(id, "first") == nil })
	}
	voters := func() []string {
		var out []string
		for _, s := range c.leader().Raft().GetConfiguration().Configuration().Servers {
			if s.Suffrage == raft.Voter {
				out = append(out, string(s.ID))
			}
		}
		return out
	}
	eventually(t, "three voters", func() bool { return len(voters()) == 3 }) // AddNode does not wait for the change
	lead := c.leader()
	logs := c.logs[string(lead.id)]
	if err := add("n3", "second"); err != nil {
		t.Fatal(err)
	}
	if n := len(logs.Matching("leaves the voters", "n3")); n != 1 {
		t.Fatalf("%d removals of n3 logged, want 1", n)
	}
	if nd, _ := lead.State().Node("n3"); nd.Incarnation != "second" || !nd.Voter {
		t.Fatalf("n3 recorded as %+v", nd)
	}
	eventually(t, "three voters after the rejoin", func() bool { return len(voters()) == 3 })
	if err := add("n3", "second"); err != nil {
		t.Fatal(err)
	}
	if n := len(logs.Matching("leaves the voters", "n3")); n != 1 {
		t.Fatalf("%d removals of n3 logged after registering the same incarnation again, want 1", n)
	}

	nd, _ := lead.State().Node("n2")
	c.mustPropose(metastate.NodeDown{ID: "n2", Session: nd.Session})
	if err := add("n3", "third"); err == nil || !strings.Contains(err.Error(), "metadata voters are up") {
		t.Fatalf("a rejoin with one of the other two voters down: %v", err)
	}
	if nd, _ := lead.State().Node("n3"); nd.Incarnation != "second" {
		t.Fatalf("n3 recorded as %+v after a refused rejoin", nd)
	}
	if v := voters(); len(v) != 3 {
		t.Fatalf("voters after a refused rejoin %v", v)
	}
}
