package cluster

import (
	"crypto/tls"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/certs"
	"github.com/zeze-go/mq/internal/testlog"
	"github.com/zeze-go/mq/internal/transport"
)

// certAuthority is a cluster CA made in memory, issuing certificates that
// name a node id (a DNS SAN) for both ends of a link.
type certAuthority struct{ *certs.CA }

func newCertAuthority(t testing.TB) *certAuthority {
	t.Helper()
	ca, err := certs.NewCA("cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &certAuthority{ca}
}

// tlsFor returns ServerTLS and ClientTLS presenting a new certificate
// naming id.
func (ca *certAuthority) tlsFor(t testing.TB, id string) (server, client *tls.Config) {
	t.Helper()
	cert, err := ca.Issue(certs.Node(id, 0))
	if err != nil {
		t.Fatal(err)
	}
	return certs.Configs(ca.Pool(), cert)
}

// startTLS starts agent id of a, as agents.start does, with mutual TLS
// under ca, logging to the Lines it returns.
func (a *agents) startTLS(ca *certAuthority, id string, seeds ...string) (*Agent, *testlog.Lines) {
	a.t.Helper()
	logs := &testlog.Lines{}
	dir := filepath.Join(a.t.TempDir(), id)
	a.dirs[id] = dir
	st, ct := ca.tlsFor(a.t, id)
	ag, err := OpenAgent(AgentConfig{ID: id, Dir: dir, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: testSecret, ServerTLS: st, ClientTLS: ct,
		SessionTimeout: time.Second, HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: agentElection,
		LeaderLeaseTimeout: 100 * time.Millisecond, Partitions: noPartitions, CheckTx: noTx, Logger: slog.New(logs)})
	if err != nil {
		a.t.Fatalf("open agent %s: %v", id, err)
	}
	a.all[id] = ag
	a.t.Cleanup(func() { ag.Close() })
	return ag, logs
}

// newTLSOutsider is newOutsider with a certificate of ca naming id and
// the cluster secret: a client identity of the cluster, no node of it.
func newTLSOutsider(t testing.TB, ca *certAuthority, id string) *outsider {
	t.Helper()
	st, ct := ca.tlsFor(t, id)
	return outsiderOn(t, transport.Config{NodeID: id, ServerTLS: st, ClientTLS: ct})
}
