package mq

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
)

// Validity of the certificates NewClusterCA and IssueNode make when no
// other is given.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultNodeValidity = 365 * 24 * time.Hour
)

// ClusterCA is a certificate authority for one cluster's nodes: it issues
// each node a certificate naming its NodeID (as the DNS SAN the cluster
// checks), good for both ends of a mutual TLS link. Its key signs node
// certificates only; keep it off the nodes. Safe for concurrent use.
type ClusterCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

// NewClusterCA makes a CA with a new P-256 key, named name, valid for
// validFor (DefaultCAValidity if zero).
func NewClusterCA(name string, validFor time.Duration) (*ClusterCA, error) {
	if validFor <= 0 {
		validFor = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mq: cluster CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validFor),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("mq: cluster CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("mq: cluster CA: %w", err)
	}
	return &ClusterCA{cert: cert, key: key, pem: pemBlock("CERTIFICATE", der)}, nil
}

// LoadClusterCA reads a CA that NewClusterCA made from its certificate and
// key in PEM (CertPEM and KeyPEM).
func LoadClusterCA(certPEM, keyPEM []byte) (*ClusterCA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: cluster CA: %v", ErrInvalidOption, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%w: cluster CA: %v", ErrInvalidOption, err)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !cert.IsCA || !ok {
		return nil, fmt.Errorf("%w: cluster CA: the certificate is not a CA's", ErrInvalidOption)
	}
	return &ClusterCA{cert: cert, key: key, pem: pemBlock("CERTIFICATE", pair.Certificate[0])}, nil
}

// CertPEM is the CA's certificate in PEM, which every node trusts.
func (ca *ClusterCA) CertPEM() []byte { return append([]byte(nil), ca.pem...) }

// KeyPEM is the CA's private key in PEM (PKCS #8). Keep it secret.
func (ca *ClusterCA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("mq: cluster CA key: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
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
	if validFor <= 0 {
		validFor = DefaultNodeValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("mq: node key: %w", err)
	}
	now := time.Now()
	notAfter := now.Add(validFor)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: nodeID},
		DNSNames:     []string{nodeID},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("mq: node certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("mq: node key: %w", err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", kder), nil
}

// NodeTLS issues node nodeID a certificate (IssueNode with the default
// validity) and returns ClusterConfig's ServerTLS and ClientTLS for it,
// in memory: for tests and single-process setups.
func (ca *ClusterCA) NodeTLS(nodeID string) (server, client *tls.Config, err error) {
	certPEM, keyPEM, err := ca.IssueNode(nodeID, 0)
	if err != nil {
		return nil, nil, err
	}
	return ClusterTLS(ca.pem, certPEM, keyPEM)
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
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, MinVersion: tls.VersionTLS13}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}
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

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// serial is a random 128-bit certificate serial number.
func serial() *big.Int {
	var b [16]byte
	_, _ = rand.Read(b[:])  // crypto/rand.Read never fails
	b[0] = b[0]&0x7f | 0x40 // positive, and never zero
	return new(big.Int).SetBytes(b[:])
}
