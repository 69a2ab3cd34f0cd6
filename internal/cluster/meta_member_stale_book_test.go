//lint:file-ignore SA1019 raft's deprecated fields are what is forged

package cluster

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/testlog"
)

// TestAgent_BookAddressAnsweredByAnotherIDGrantsNoMetaMembership: node
// n1's saved address book says n2 listens at an address where now x9
// listens: an identity with a certificate of the cluster's CA and the
// secret, no node of the cluster (n2 moved, and x9 took its old port). At
// start n1 announces itself to every address of its book through
// Agent.seed, and metaMember accepts the ids contacted there as members of
// the metadata group. x9 must not thereby become a member: its raft
// heartbeat of a far higher term must not reach n1's raft. (Before, seed
// recorded whatever id proved itself as contacted, and n1 took the term
// and stepped down.)
func TestAgent_BookAddressAnsweredByAnotherIDGrantsNoMetaMembership(t *testing.T) {
	ca := newCertAuthority(t)
	x9 := newTLSOutsider(t, ca, "x9")

	dir := filepath.Join(t.TempDir(), "n1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "peers"), []byte(bookHeader+"\nn2 "+x9.Addr()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, ct := ca.tlsFor(t, "n1")
	n1, err := OpenAgent(AgentConfig{ID: "n1", Dir: dir, Bind: "127.0.0.1:0", Bootstrap: true, Secret: testSecret, ServerTLS: st, ClientTLS: ct,
		SessionTimeout: time.Second, HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: agentElection,
		LeaderLeaseTimeout: 100 * time.Millisecond, Partitions: noPartitions, CheckTx: noTx, Logger: slog.New(&testlog.Lines{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n1.Close() })
	eventually(t, "n1 leads", n1.Meta().IsLeader)
	eventually(t, "n1's session", n1.SessionValid) // announce ran before register

	term := raftStat(t, n1.meta.raft, "term")
	nt := forgeMetaOver(t, x9.tr, n1.Addr())
	hb := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("x9"), Addr: []byte("x9")},
		Term:      term + 100, Leader: []byte("x9"),
	}
	var resp raft.AppendEntriesResponse
	if err := nt.AppendEntries("x9", "n1", hb, &resp); err == nil {
		t.Errorf("x9's heartbeat of term %d was answered: %+v", hb.Term, resp)
	}
	if got := raftStat(t, n1.meta.raft, "term"); got >= term+100 {
		t.Errorf("n1 took x9's term %d (was %d); leads: %v", got, term, n1.Meta().IsLeader())
	}
}
