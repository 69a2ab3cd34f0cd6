package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"slices"
	"testing"
	"time"
)

// verify checks cert, presented by a server named name if usage is
// server auth, against the CAs of pool as a TLS peer does.
func verify(cert tls.Certificate, pool *x509.CertPool, name string, usage x509.ExtKeyUsage) error {
	_, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

func newCA(t testing.TB) *CA {
	t.Helper()
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t testing.TB, ca *CA, l Leaf) tls.Certificate {
	t.Helper()
	c, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCA_Issue: a node's certificate names it, is capped at the CA's end,
// and is good for both ends of a link under its CA only; the odd shapes
// tests need (no SAN, server auth only) come out as asked.
func TestCA_Issue(t *testing.T) {
	ca := newCA(t)
	node := issue(t, ca, Node("n1", 0))
	if node.Leaf.Subject.CommonName != "n1" || !slices.Equal(node.Leaf.DNSNames, []string{"n1"}) {
		t.Fatalf("node certificate names %q and %q, want n1", node.Leaf.Subject.CommonName, node.Leaf.DNSNames)
	}
	if node.Leaf.NotAfter.After(ca.cert.NotAfter) {
		t.Fatalf("node certificate valid until %v, past its CA's %v", node.Leaf.NotAfter, ca.cert.NotAfter)
	}
	serverOnly := issue(t, ca, Leaf{DNSNames: []string{"n1"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	noSAN := issue(t, ca, Leaf{ExtKeyUsage: node.Leaf.ExtKeyUsage})
	other := newCA(t)
	cases := []struct {
		name  string
		cert  tls.Certificate
		pool  *x509.CertPool
		usage x509.ExtKeyUsage
		ok    bool
	}{
		{"Server", node, ca.Pool(), x509.ExtKeyUsageServerAuth, true},
		{"Client", node, ca.Pool(), x509.ExtKeyUsageClientAuth, true},
		{"AnotherCA", issue(t, other, Node("n1", 0)), ca.Pool(), x509.ExtKeyUsageServerAuth, false},
		{"ServerAuthOnlyServes", serverOnly, ca.Pool(), x509.ExtKeyUsageServerAuth, true},
		{"ServerAuthOnlyDials", serverOnly, ca.Pool(), x509.ExtKeyUsageClientAuth, false},
		{"NoSAN", noSAN, ca.Pool(), x509.ExtKeyUsageServerAuth, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := verify(tc.cert, tc.pool, "n1", tc.usage); (err == nil) != tc.ok {
				t.Fatalf("verify: %v, want success %v", err, tc.ok)
			}
		})
	}
	t.Run("Configs", func(t *testing.T) {
		pool := ca.Pool()
		server, client := Configs(pool, node)
		if server.ClientCAs != pool || client.RootCAs != pool || len(server.Certificates) != 1 || len(client.Certificates) != 1 ||
			server.MinVersion != tls.VersionTLS13 || client.MinVersion != tls.VersionTLS13 {
			t.Fatalf("Configs: server %+v, client %+v", server, client)
		}
	})
}

// TestLoadCA: a CA read back from its PEM issues certificates its
// original's pool trusts; a node's certificate is no CA.
func TestLoadCA(t *testing.T) {
	ca := newCA(t)
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(ca.CertPEM(), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(issue(t, loaded, Node("n1", 0)), ca.Pool(), "n1", x509.ExtKeyUsageClientAuth); err != nil {
		t.Fatalf("a certificate of the loaded CA: %v", err)
	}
	certPEM, keyPEM, err := PEM(issue(t, ca, Node("n1", 0)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(certPEM, keyPEM); !errors.Is(err, ErrNotCA) {
		t.Fatalf("LoadCA of a node's certificate: %v, want ErrNotCA", err)
	}
}
