package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/zeze-go/mq/internal/certs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var secret = []byte("9c1f4e7a2b8d3f60e5a1c7b4d2f8e0a36b9c5d1e7f3a0b2c")

// testCA is a certificate authority made in memory, and a pool trusting
// it.
type testCA struct {
	ca   *certs.CA
	pool *x509.CertPool
}

func newCA(t testing.TB) *testCA {
	t.Helper()
	ca, err := certs.NewCA("test cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{ca: ca, pool: ca.Pool()}
}

// leaf returns a certificate for both TLS roles naming dnsNames.
func (ca *testCA) leaf(t testing.TB, dnsNames ...string) tls.Certificate {
	t.Helper()
	return ca.leafFor(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, dnsNames...)
}

// leafFor returns a certificate with the extended key usages eku naming
// dnsNames.
func (ca *testCA) leafFor(t testing.TB, eku []x509.ExtKeyUsage, dnsNames ...string) tls.Certificate {
	t.Helper()
	cert, err := ca.ca.Issue(certs.Leaf{DNSNames: dnsNames, ExtKeyUsage: eku})
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// tlsFor returns ServerTLS and ClientTLS presenting cert and trusting ca.
func (ca *testCA) tlsFor(cert tls.Certificate) (server, client *tls.Config) {
	return certs.Configs(ca.pool, cert)
}

// listen starts a transport on 127.0.0.1:0 that Cleanup closes.
func listen(t testing.TB, cfg Config) *Transport {
	t.Helper()
	return listenOn(t, "127.0.0.1", cfg)
}

// acceptor accepts p's connections on tr until Close and records them.
type acceptor struct {
	l    net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	got  []*Conn // guarded by mu
	next chan *Conn
}

func accept(t testing.TB, tr *Transport, p Proto) *acceptor {
	t.Helper()
	l, err := tr.Listener(p)
	if err != nil {
		t.Fatal(err)
	}
	a := &acceptor{l: l, next: make(chan *Conn, 16)}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("accept: %v", err)
				}
				return
			}
			a.mu.Lock()
			a.got = append(a.got, c.(*Conn))
			a.mu.Unlock()
			a.next <- c.(*Conn)
		}
	}()
	t.Cleanup(a.close)
	return a
}

func (a *acceptor) close() {
	a.l.Close()
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.got {
		c.Close()
	}
}

func (a *acceptor) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.got)
}

// waitClosed fails t unless the peer closes c within d; it returns what c
// read before.
func waitClosed(t testing.TB, c net.Conn, d time.Duration) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	var got []byte
	buf := make([]byte, 512)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("peer did not close within %v", d)
			}
			return got
		}
	}
}
