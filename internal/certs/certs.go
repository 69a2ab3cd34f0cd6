// Package certs makes a cluster's certificates: a certificate authority
// with a P-256 key, the certificates it issues, and the ServerTLS and
// ClientTLS of a node presenting one. The root's ClusterCA wraps it; the
// internal packages' tests use it directly, also to issue the odd
// certificates (no SAN, one key usage, another CA) a node must refuse.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Validity of the certificates NewCA and Issue make when no other is
// given.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultLeafValidity = 365 * 24 * time.Hour
)

// ErrNotCA is returned by LoadCA for a certificate that is not a CA's or
// a key that cannot sign.
var ErrNotCA = errors.New("the certificate is not a CA's")

// CA is a certificate authority whose key signs the certificates it
// issues. Safe for concurrent use.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// NewCA makes a CA with a new P-256 key, named name, valid for validFor
// (DefaultCAValidity if zero) from an hour ago, so that clocks a little
// behind accept it.
func NewCA(name string, validFor time.Duration) (*CA, error) {
	if validFor <= 0 {
		validFor = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
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
		return nil, fmt.Errorf("certs: CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: CA: %w", err)
	}
	return &CA{cert: cert, key: key}, nil
}

// LoadCA reads a CA from its certificate and key in PEM, as CertPEM and
// KeyPEM write them. It returns ErrNotCA if the certificate is no CA's.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !cert.IsCA || !ok {
		return nil, ErrNotCA
	}
	return &CA{cert: cert, key: key}, nil
}

// CertPEM is the CA's certificate in PEM, which the nodes trust.
func (ca *CA) CertPEM() []byte { return pemBlock("CERTIFICATE", ca.cert.Raw) }

// KeyPEM is the CA's private key in PEM (PKCS #8).
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

// Pool is a new pool holding the CA's certificate only.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// Leaf says what a certificate Issue makes holds. A node's is Node(id);
// the other shapes are for tests of refusals.
type Leaf struct {
	// CommonName is the subject's; empty means the first of DNSNames.
	CommonName string
	// DNSNames are the DNS SANs, which the cluster reads as node ids.
	DNSNames []string
	// ExtKeyUsage is what the certificate may be used for.
	ExtKeyUsage []x509.ExtKeyUsage
	// ValidFor is how long it is valid from an hour ago, never past the
	// CA's end; zero means DefaultLeafValidity.
	ValidFor time.Duration
}

// Node is the Leaf of node id: id as its common name and its only DNS SAN,
// good for serving and dialing (server and client auth), valid for
// validFor.
func Node(id string, validFor time.Duration) Leaf {
	return Leaf{DNSNames: []string{id}, ValidFor: validFor,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
}

// Issue makes a new P-256 key and a certificate for it signed by the CA,
// as l says. The certificate's Leaf is set.
func (ca *CA) Issue(l Leaf) (tls.Certificate, error) {
	if l.ValidFor <= 0 {
		l.ValidFor = DefaultLeafValidity
	}
	if l.CommonName == "" && len(l.DNSNames) > 0 {
		l.CommonName = l.DNSNames[0]
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: key: %w", err)
	}
	now := time.Now()
	notAfter := now.Add(l.ValidFor)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.CommonName},
		DNSNames:     l.DNSNames,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  l.ExtKeyUsage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// PEM is cert's first certificate and its key (PKCS #8) in PEM.
func PEM(cert tls.Certificate) (certPEM, keyPEM []byte, err error) {
	kder, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: key: %w", err)
	}
	return pemBlock("CERTIFICATE", cert.Certificate[0]), pemBlock("PRIVATE KEY", kder), nil
}

// Configs returns a node's ServerTLS and ClientTLS: both present cert and
// trust the CAs in pool (the server to verify clients, the client to
// verify servers), TLS 1.3 at least.
func Configs(pool *x509.CertPool, cert tls.Certificate) (server, client *tls.Config) {
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, MinVersion: tls.VersionTLS13},
		&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}
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
