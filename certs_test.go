package mq_test

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/testlog"
)

// TestOpen_ClusterNeedsTLS: a cluster node runs mutual TLS unless it says
// InsecurePlaintext; Open refuses, naming what is wanted, a config with
// neither, both, a weak secret, or a certificate that does not name the
// node or cannot serve both ends of a link.
func TestOpen_ClusterNeedsTLS(t *testing.T) {
	ca, err := mq.NewClusterCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	st, ct, err := ca.NodeTLS("n1")
	if err != nil {
		t.Fatal(err)
	}
	base := mq.ClusterConfig{NodeID: "n1", Bind: "127.0.0.1:0", Bootstrap: true, Secret: clusterSecret}
	cases := []struct {
		name string
		set  func(c *mq.ClusterConfig)
		want string
	}{
		{"NoTLS", func(c *mq.ClusterConfig) {}, "InsecurePlaintext"},
		{"TLSAndPlaintext", func(c *mq.ClusterConfig) { c.ServerTLS, c.ClientTLS, c.InsecurePlaintext = st, ct, true }, "choose one"},
		{"ShortSecret", func(c *mq.ClusterConfig) { c.InsecurePlaintext, c.Secret = true, []byte("0123456789abcdef") }, "32 random bytes"},
		{"GuessableSecret", func(c *mq.ClusterConfig) {
			c.InsecurePlaintext, c.Secret = true, []byte(strings.Repeat("secret", 8))
		}, "32 random bytes"},
		{"CertOfAnotherNode", func(c *mq.ClusterConfig) { c.NodeID, c.ServerTLS, c.ClientTLS = "n2", st, ct }, "n2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.set(&c)
			m, err := mq.Open(t.TempDir(), mq.WithCluster(c))
			if err == nil {
				m.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, mq.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want ErrInvalidOption naming %q", err, tc.want)
			}
		})
	}
}

// TestOpen_PlaintextWarns: a node without TLS on purpose logs a warning at
// every Open.
func TestOpen_PlaintextWarns(t *testing.T) {
	dir := t.TempDir()
	for range 2 {
		var logs testlog.Lines
		m, err := mq.Open(dir, mq.WithLogger(slog.New(&logs)), mq.WithCluster(mq.ClusterConfig{
			NodeID: "n1", Bind: "127.0.0.1:0", Bootstrap: true, Secret: clusterSecret, InsecurePlaintext: true,
		}))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if len(logs.Matching("without TLS")) == 0 {
			t.Fatalf("no warning of the plaintext mode in:\n%s", logs.String())
		}
	}
}

// TestClusterCA_Files: a CA written to PEM and read back issues
// certificates the nodes of the first accept: a node whose files come from
// the reloaded CA joins a cluster started with the original's.
func TestClusterCA_Files(t *testing.T) {
	ca, err := mq.NewClusterCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	again, err := mq.LoadClusterCA(ca.CertPEM(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mq.LoadClusterCA(ca.CertPEM(), []byte("not a key")); !errors.Is(err, mq.ErrInvalidOption) {
		t.Fatalf("LoadClusterCA of a bad key: %v", err)
	}
	if _, _, err := ca.IssueNode("bad id", 0); !errors.Is(err, mq.ErrInvalidOption) {
		t.Fatalf("IssueNode of a bad id: %v", err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", again.CertPEM())
	c := newCluster(t, 0)
	c.tls = func(id string) (server, client *tls.Config) {
		issuer := ca
		if id == "n2" {
			issuer = again
		}
		cert, key, err := issuer.IssueNode(id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		server, client, err = mq.ClusterTLSFiles(caFile, write(id+".pem", cert), write(id+"-key.pem", key))
		if err != nil {
			t.Fatal(err)
		}
		return server, client
	}
	c.startAll(2)
}
