package remote

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/certs"
	"github.com/zeze-go/mq/internal/transport"
)

// proxy forwards the connections it accepts on 127.0.0.1 to target. After
// freeze, the connections it holds forward nothing more and stay open, as
// those of a paused process or a dropped link do: no reset ever comes. The
// connections it accepts later forward again.
type proxy struct {
	l      net.Listener
	target string
	closed chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	frozen   chan struct{} // guarded by mu: closed by freeze, for the connections accepted before
	conns    []net.Conn    // guarded by mu
	accepted int           // guarded by mu
}

// newProxy starts a proxy to target; Cleanup closes it and its
// connections.
func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, closed: make(chan struct{}), frozen: make(chan struct{})}
	p.wg.Go(p.acceptLoop)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) acceptLoop() {
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		select {
		case <-p.closed:
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		default:
		}
		p.accepted++
		p.conns = append(p.conns, in, out)
		frozen := p.frozen
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(out, in, frozen) })
		p.wg.Go(func() { p.pipe(in, out, frozen) })
	}
}

// pipe copies src to dst until either fails or frozen is closed; frozen,
// it holds both open, reading and writing nothing, until the proxy closes.
func (p *proxy) pipe(dst, src net.Conn, frozen <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-frozen:
			<-p.closed
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// freeze stops the connections accepted so far from forwarding.
func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.frozen)
	p.frozen = make(chan struct{})
}

// connections is the number of connections the proxy accepted.
func (p *proxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *proxy) close() {
	p.mu.Lock()
	close(p.closed)
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.l.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

// proxiedEcho starts a server answering opEcho on a transport of node id
// "server", with mutual TLS if withTLS, and returns a client of it through
// a proxy, with cfg. Cleanup closes them.
func proxiedEcho(t testing.TB, withTLS bool, cfg ClientConfig) (*Client, *proxy) {
	t.Helper()
	var srvTr, cliTr *transport.Transport
	if withTLS {
		ca := newTestCA(t)
		srvTr, cliTr = ca.transport(t, "server"), ca.transport(t, "client")
	} else {
		srvTr, cliTr = newTransport(t, "server", 0), newTransport(t, "client", 0)
	}
	l, err := srvTr.Listener(transport.ProtoRPC)
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(l, ServerConfig{})
	s.Handle(opEcho, func(_ context.Context, _ string, req []byte) ([]byte, error) { return req, nil })
	t.Cleanup(func() { s.Close() })
	p := newProxy(t, srvTr.Addr().String())
	c := NewClient(func(ctx context.Context) (*transport.Conn, error) {
		return cliTr.Dial(ctx, p.addr(), transport.ProtoRPC)
	}, cfg)
	t.Cleanup(func() { c.Close() })
	return c, p
}

// testCA is a cluster CA made in memory.
type testCA struct{ *certs.CA }

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	ca, err := certs.NewCA("test cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{ca}
}

// transport listens on 127.0.0.1:0 as node id, on mutual TLS with a
// certificate of ca naming id; Cleanup closes it.
func (ca *testCA) transport(t testing.TB, id string) *transport.Transport {
	t.Helper()
	cert, err := ca.Issue(certs.Node(id, 0))
	if err != nil {
		t.Fatal(err)
	}
	st, ct := certs.Configs(ca.Pool(), cert)
	return listen(t, transport.Config{NodeID: id, ServerTLS: st, ClientTLS: ct})
}

// connected reports that c holds a connection.
func (c *Client) connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cn != nil
}

// isDeadline reports that err is a ctx's deadline.
func isDeadline(err error) bool { return errors.Is(err, context.DeadlineExceeded) }
