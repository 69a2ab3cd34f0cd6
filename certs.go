package mq

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/zeze-go/mq/internal/certs"
	"github.com/zeze-go/mq/internal/metastate"
)

// Validity of the certificates NewClusterCA and IssueNode make when no
// other is given.
const (
	DefaultCAValidity   = certs.DefaultCAValidity
	DefaultNodeValidity = certs.DefaultLeafValidity
)

// ClusterCA is a certificate authority for one cluster's nodes: it issues
// each node a certificate naming its NodeID (as the DNS SAN the cluster
// checks), good for both ends of a mutual TLS link. Its key signs node
// certificates only; keep it off the nodes. Safe for concurrent use.
type ClusterCA struct {
	ca *certs.CA
}

// NewClusterCA makes a CA with a new P-256 key, named name, valid for
// validFor (DefaultCAValidity if zero).
func NewClusterCA(name string, validFor time.Duration) (*ClusterCA, error) {
	ca, err := certs.NewCA(name, validFor)
	if err != nil {
		return nil, fmt.Errorf("mq: cluster CA: %w", err)
	}
	return &ClusterCA{ca: ca}, nil
}

// LoadClusterCA reads a CA that NewClusterCA made from its certificate and
// key in PEM (CertPEM and KeyPEM).
func LoadClusterCA(certPEM, keyPEM []byte) (*ClusterCA, error) {
	ca, err := certs.LoadCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: cluster CA: %v", ErrInvalidOption, err)
	}
	return &ClusterCA{ca: ca}, nil
}

// CertPEM is the CA's certificate in PEM, which every node trusts.
func (ca *ClusterCA) CertPEM() []byte { return ca.ca.CertPEM() }

// KeyPEM is the CA's private key in PEM (PKCS #8). Keep it secret.
func (ca *ClusterCA) KeyPEM() ([]byte, error) {
	b, err := ca.ca.KeyPEM()
	if err != nil {
		return nil, fmt.Errorf("mq: cluster CA key: %w", err)
	}
	return b, nil
}

// IssueNode makes node nodeID a certificate and a new P-256 key, in PEM:
// the certificate names nodeID as its DNS SAN and its common name, is good
// for serving and dialing (server and client auth), and is valid for
// validFor (DefaultNodeValidity if zero). The node's ClusterConfig takes
// it through ClusterTLS.
func (ca *ClusterCA) IssueNode(nodeID string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	if err := metastate.CheckNodeID(nodeID); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrInvalidOption, err)
	}
	cert, err := ca.ca.Issue(certs.Node(nodeID, validFor))
	if err != nil {
		return nil, nil, fmt.Errorf("mq: node certificate: %w", err)
	}
	if certPEM, keyPEM, err = certs.PEM(cert); err != nil {
		return nil, nil, fmt.Errorf("mq: node certificate: %w", err)
	}
	return certPEM, keyPEM, nil
}

// NodeTLS issues node nodeID a certificate (IssueNode with the default
// validity) and returns ClusterConfig's ServerTLS and ClientTLS for it,
// in memory: for tests and single-process setups.
func (ca *ClusterCA) NodeTLS(nodeID string) (server, client *tls.Config, err error) {
	certPEM, keyPEM, err := ca.IssueNode(nodeID, 0)
	if err != nil {
		return nil, nil, err
	}
	return ClusterTLS(ca.CertPEM(), certPEM, keyPEM)
}

// ClusterTLS builds ClusterConfig's ServerTLS and ClientTLS from the
// cluster CA's certificate and a node's certificate and key, all in PEM.
// Open checks that the certificate names the node's NodeID.
func ClusterTLS(caPEM, certPEM, keyPEM []byte) (server, client *tls.Config, err error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("%w: cluster TLS: no CA certificate in the CA's PEM", ErrInvalidOption)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: cluster TLS: %v", ErrInvalidOption, err)
	}
	server, client = certs.Configs(pool, cert)
	return server, client, nil
}

// ClusterTLSFiles is ClusterTLS of the PEM files at the three paths, as
// cmd/mqcert writes them.
func ClusterTLSFiles(caFile, certFile, keyFile string) (server, client *tls.Config, err error) {
	var b [3][]byte
	for i, f := range []string{caFile, certFile, keyFile} {
		if b[i], err = os.ReadFile(f); err != nil {
			return nil, nil, fmt.Errorf("%w: cluster TLS: %v", ErrInvalidOption, err)
		}
	}
	return ClusterTLS(b[0], b[1], b[2])
}
