package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/testlog"
	"github.com/zeze-go/mq/internal/transport"
)

// certAuthority is a cluster CA made in memory, issuing certificates that
// name a node id (a DNS SAN) for both ends of a link.
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCertAuthority(t testing.TB) *certAuthority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cluster CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &certAuthority{cert: cert, key: key, pool: pool}
}

// tlsFor returns ServerTLS and ClientTLS presenting a new certificate
// naming id.
func (ca *certAuthority) tlsFor(t testing.TB, id string) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: id},
		DNSNames: []string{id}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.pool},
		&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.pool}
}

// startTLS starts agent id of a, as agents.start does, with mutual TLS
// under ca, logging to the Lines it returns.
func (a *agents) startTLS(ca *certAuthority, id string, seeds ...string) (*Agent, *testlog.Lines) {
	a.t.Helper()
	logs := &testlog.Lines{}
	dir := filepath.Join(a.t.TempDir(), id)
	a.dirs[id] = dir
	st, ct := ca.tlsFor(a.t, id)
	ag, err := OpenAgent(AgentConfig{ID: id, Dir: dir, Bind: "127.0.0.1:0", Seeds: seeds, Secret: testSecret, ServerTLS: st, ClientTLS: ct,
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
	tr, err := transport.Listen(transport.Config{NodeID: id, Bind: "127.0.0.1:0", Secret: testSecret,
		ServerTLS: st, ClientTLS: ct, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	o := &outsider{tr: tr, cli: map[string]*remote.Client{}}
	if o.ln, err = tr.Listener(transport.ProtoRPC); err != nil {
		t.Fatal(err)
	}
	o.wg.Go(func() {
		for {
			c, err := o.ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	t.Cleanup(func() {
		for _, c := range o.cli {
			c.Close()
		}
		o.ln.Close()
		tr.Close()
		o.wg.Wait()
	})
	return o
}

// forgeMetaOver is forgeMeta over tr: requests of the metadata group sent,
// from tr's proven identity, to the node at addr.
func forgeMetaOver(t testing.TB, tr *transport.Transport, addr string) *raft.NetworkTransport {
	t.Helper()
	f := &forger{tr: tr, addr: addr, done: make(chan struct{})}
	nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: f, MaxPool: 1, Timeout: 5 * time.Second,
		Logger: hclog.NewNullLogger()})
	t.Cleanup(func() { nt.Close() })
	return nt
}
