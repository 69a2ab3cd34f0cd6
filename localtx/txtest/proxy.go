package txtest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/zeze-go/mq/localtx"
)

// Wire is the protocol a Proxy reads.
type Wire int

// Wire protocols.
const (
	// PostgresWire is PostgreSQL's frontend/backend protocol, version 3.
	PostgresWire Wire = iota + 1
	// MySQLWire is the MySQL client/server protocol, MariaDB's too,
	// without TLS or compression.
	MySQLWire
)

// ProxyFault is what a Proxy does to the COMMIT it was armed for.
type ProxyFault int

// Proxy faults.
const (
	// DropCommitReply forwards the COMMIT, waits for the server's reply to
	// it, by which the server has ended the transaction, discards the reply
	// and closes both sides of the connection: the client's COMMIT fails
	// though the server committed.
	DropCommitReply ProxyFault = iota + 1
	// CutBeforeCommit closes both sides of the connection without
	// forwarding the COMMIT: the server rolls the transaction back when it
	// sees the connection closed.
	CutBeforeCommit
)

func (f ProxyFault) String() string {
	switch f {
	case DropCommitReply:
		return "DropCommitReply"
	case CutBeforeCommit:
		return "CutBeforeCommit"
	}
	return "ProxyFault(" + strconv.Itoa(int(f)) + ")"
}

// Cut is what a Proxy did to a COMMIT.
type Cut struct {
	Fault ProxyFault
	// Reply is the server's reply to the COMMIT that DropCommitReply
	// discarded: PostgreSQL's command tag ("COMMIT"; "ROLLBACK" for a
	// transaction that had failed) or "ERROR <SQLSTATE>"; MySQL's "OK" or
	// "ERROR <number>". Empty for CutBeforeCommit.
	Reply string
}

// Proxy is a loopback TCP proxy in front of a database server that can
// break the connection that carries a COMMIT (see Arm). It reads the
// protocol only to find the commands; every byte else passes unchanged,
// except PostgreSQL's requests for TLS or GSS encryption, which the proxy
// itself declines so that the protocol stays readable.
//
// The proxy owns every goroutine it starts: the accept loop and two pumps
// per connection, one for each direction. Close stops them all. It is safe
// for concurrent use.
type Proxy struct {
	wire   Wire
	target string
	ln     net.Listener
	ctx    context.Context // ends at Close; bounds dials to the target
	stop   context.CancelFunc
	wg     sync.WaitGroup // the accept loop and the pumps

	mu     sync.Mutex // guards the fields below
	closed bool
	conns  map[*proxyConn]struct{}
	fault  ProxyFault // armed for the next COMMIT; 0: none
	tag    []byte     // the COMMIT must be on a connection that carried tag since Arm
	gen    int        // counts the Arms
	cuts   []Cut
	errs   []error
}

// NewProxy starts a proxy on 127.0.0.1 to target, a server's host:port,
// reading wire. The proxy closes at the test's cleanup, which fails the
// test if the proxy met a connection it could not read.
func NewProxy(t testing.TB, wire Wire, target string) *Proxy {
	t.Helper()
	if wire != PostgresWire && wire != MySQLWire {
		t.Fatalf("txtest: proxy of wire %d", wire)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("txtest: proxy: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Proxy{wire: wire, target: target, ln: ln, ctx: ctx, stop: stop, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		for _, err := range p.Close() {
			t.Errorf("txtest: proxy to %s: %v", target, err)
		}
	})
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Arm makes the proxy do fault to the next COMMIT sent on a connection
// that carried tag anywhere in what the client sent since this call;
// with tag empty, to the next COMMIT on any connection. A tag such as the
// transaction's id keeps the fault from hitting another transaction's
// COMMIT. Arm replaces a fault armed before that has not fired.
func (p *Proxy) Arm(fault ProxyFault, tag string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault, p.tag = fault, []byte(tag)
	p.gen++
}

// DropNextCommitReply is Arm(DropCommitReply, "").
func (p *Proxy) DropNextCommitReply() { p.Arm(DropCommitReply, "") }

// CutBeforeNextCommit is Arm(CutBeforeCommit, "").
func (p *Proxy) CutBeforeNextCommit() { p.Arm(CutBeforeCommit, "") }

// Armed reports whether a fault is armed and has not fired yet.
func (p *Proxy) Armed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fault != 0
}

// Cuts returns what the proxy did to COMMITs, in order. A cut is listed
// before the client's side of its connection closes, so a client whose
// COMMIT failed finds it here.
func (p *Proxy) Cuts() []Cut {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Cut(nil), p.cuts...)
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines to end. It returns the errors the proxy met: a
// connection whose protocol it could not read, for TLS, compression or a
// malformed message, where a fault could not fire.
func (p *Proxy) Close() []error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.stop()
	p.ln.Close()
	for c := range conns {
		c.close()
	}
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.errs...)
}

func (p *Proxy) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// accept is the accept loop; it ends when Close closes the listener.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			if client != nil {
				client.Close()
			}
			return
		}
		if err != nil {
			p.errs = append(p.errs, fmt.Errorf("accept: %w", err))
			p.mu.Unlock()
			return
		}
		c := &proxyConn{p: p, client: client}
		p.conns[c] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go c.serve()
	}
}

// proxyConn is one client's connection and the proxy's to the server.
type proxyConn struct {
	p      *Proxy
	client net.Conn

	mu     sync.Mutex // guards the fields below
	server net.Conn   // set by serve once dialled, unless closed before
	closed bool
	// awaiting is set once a COMMIT whose reply is to be dropped went to
	// the server: what the server sends next is withheld.
	awaiting bool
	seen     int // the Arm whose tag this connection carried; 0: none
}

// serve dials the server and pumps the server's bytes to the client; it
// starts the pump of the client's bytes once connected. Both count in the
// proxy's wait group, to which accept adds them.
func (c *proxyConn) serve() {
	defer c.p.wg.Done()
	ctx, cancel := context.WithTimeout(c.p.ctx, 10*time.Second)
	server, err := (&net.Dialer{}).DialContext(ctx, "tcp", c.p.target)
	cancel()
	if err != nil {
		c.p.wg.Done() // the client pump that will not run
		c.close()
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		server.Close()
		c.p.wg.Done()
		return
	}
	c.server = server
	c.mu.Unlock()
	go c.fromClient()
	c.fromServer()
}

// close closes both sides; the pumps then end. It may be called more than
// once.
func (c *proxyConn) close() {
	c.mu.Lock()
	c.closed = true
	s := c.server
	c.mu.Unlock()
	c.client.Close()
	if s != nil {
		s.Close()
	}
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
}

// unreadable gives up reading the connection's protocol: a fault armed for
// it could not fire, so the connection closes and the proxy reports why.
func (c *proxyConn) unreadable(err error) {
	c.p.fail(fmt.Errorf("connection from %s: %w", c.client.RemoteAddr(), err))
	c.close()
}

// take returns the armed fault if it applies to this connection's COMMIT,
// disarming it.
func (c *proxyConn) take() ProxyFault {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == 0 {
		return 0
	}
	if len(p.tag) > 0 {
		c.mu.Lock()
		seen := c.seen == p.gen
		c.mu.Unlock()
		if !seen {
			return 0
		}
	}
	f := p.fault
	p.fault, p.tag = 0, nil
	return f
}

// cut records what was done to a COMMIT, then closes the connection.
func (c *proxyConn) cut(cut Cut) {
	c.p.mu.Lock()
	c.p.cuts = append(c.p.cuts, cut)
	c.p.mu.Unlock()
	c.close()
}

// watchTag notes that the connection carried the armed tag when b, after
// the tail of what came before, holds it. It returns the new tail.
func (c *proxyConn) watchTag(tail, b []byte) []byte {
	p := c.p
	p.mu.Lock()
	tag, gen := p.tag, p.gen
	p.mu.Unlock()
	if len(tag) == 0 {
		return tail[:0]
	}
	joined := append(tail, b...)
	if bytes.Contains(joined, tag) {
		c.mu.Lock()
		c.seen = gen
		c.mu.Unlock()
	}
	keep := min(len(tag)-1, len(joined))
	return append(tail[:0], joined[len(joined)-keep:]...)
}

// fromClient pumps the client's bytes to the server, finding the
// commands.
func (c *proxyConn) fromClient() {
	defer c.p.wg.Done()
	defer c.close()
	f := newFramer(c.p.wire, true)
	buf := make([]byte, 64<<10)
	var tail []byte
	for {
		n, err := c.client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			tail = c.watchTag(tail, chunk)
			msgs, ferr := f.feed(chunk)
			if ferr != nil {
				c.unreadable(ferr)
				return
			}
			if !c.forward(chunk, msgs) {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// forward sends chunk to the server, acting on the messages that ended in
// it; false means the connection closed.
func (c *proxyConn) forward(chunk []byte, msgs []message) bool {
	from := 0 // chunk[:from] is dealt with
	for _, m := range msgs {
		switch {
		case c.p.wire == PostgresWire && m.typ == 0 && m.code() == pgEncryptionRequest:
			// Declined by the proxy itself: forward what came before, answer 'N'.
			start := m.end - m.len
			if start < from {
				c.unreadable(errors.New("encryption request split across reads"))
				return false
			}
			if !c.write(c.server, chunk[from:start]) || !c.write(c.client, []byte{'N'}) {
				return false
			}
			from = m.end
		case c.p.wire == MySQLWire && m.handshake:
			if caps := m.capabilities(); caps&(mysqlClientSSL|mysqlClientCompress) != 0 {
				c.unreadable(fmt.Errorf("client asks for TLS or compression (capabilities %#x): COMMIT cannot be seen", caps))
				return false
			}
		case m.commit:
			switch c.take() {
			case CutBeforeCommit:
				// What came before the COMMIT goes on; the COMMIT does not.
				if start := m.end - m.len; start > from {
					if !c.write(c.server, chunk[from:start]) {
						return false
					}
				}
				c.cut(Cut{Fault: CutBeforeCommit})
				return false
			case DropCommitReply:
				c.mu.Lock()
				c.awaiting = true
				c.mu.Unlock()
			}
		}
	}
	return c.write(c.server, chunk[from:])
}

func (c *proxyConn) write(to net.Conn, b []byte) bool {
	if len(b) == 0 {
		return true
	}
	if _, err := to.Write(b); err != nil {
		c.close()
		return false
	}
	return true
}

// fromServer pumps the server's bytes to the client, withholding the
// reply to a COMMIT armed with DropCommitReply.
func (c *proxyConn) fromServer() {
	defer c.close()
	f := newFramer(c.p.wire, false)
	buf := make([]byte, 64<<10)
	reply := ""
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			msgs, ferr := f.feed(chunk)
			if ferr != nil {
				c.unreadable(ferr)
				return
			}
			c.mu.Lock()
			awaiting := c.awaiting
			c.mu.Unlock()
			if !awaiting {
				if !c.write(c.client, chunk) {
					return
				}
			} else {
				// The COMMIT went to the server before anything of its
				// reply could come: all of this chunk is withheld.
				for _, m := range msgs {
					r, done := c.replyPart(m)
					if r != "" {
						reply = r
					}
					if done {
						c.cut(Cut{Fault: DropCommitReply, Reply: reply})
						return
					}
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// replyPart reads message m of the server's reply to a COMMIT: what it
// says of the outcome, if anything, and whether the reply is complete.
func (c *proxyConn) replyPart(m message) (string, bool) {
	if c.p.wire == MySQLWire {
		// One packet: OK, or ERR with a 2-byte error number.
		switch {
		case len(m.head) > 0 && m.head[0] == 0x00:
			return "OK", true
		case len(m.head) >= 3 && m.head[0] == 0xff:
			return "ERROR " + strconv.Itoa(int(binary.LittleEndian.Uint16(m.head[1:3]))), true
		}
		return fmt.Sprintf("packet %#x", m.head), true
	}
	switch m.typ {
	case 'C': // CommandComplete: the tag
		return string(bytes.TrimRight(m.head, "\x00")), false
	case 'E': // ErrorResponse: fields of a type byte and a string
		for f := m.head; len(f) > 1; {
			i := bytes.IndexByte(f, 0)
			if i < 0 {
				break
			}
			if f[0] == 'C' {
				return "ERROR " + string(f[1:i]), false
			}
			f = f[i+1:]
		}
		return "ERROR", false
	case 'Z': // ReadyForQuery: the reply is complete
		return "", true
	}
	return "", false
}

// ProxyDSN returns dsn, of server ("postgres": a pgx URL
// postgres://user@host:port/db?...; "mysql": user:pass@tcp(host:port)/db),
// with its server's address replaced by addr, and the address it
// replaced.
func ProxyDSN(server, dsn, addr string) (proxied, target string, err error) {
	switch server {
	case "postgres":
		u, err := url.Parse(dsn)
		if err != nil {
			return "", "", err
		}
		if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			return "", "", fmt.Errorf("want a postgres:// URL, not %q", u.Scheme+":")
		}
		q := u.Query()
		if q.Has("host") || q.Has("port") || strings.Contains(u.Host, ",") {
			return "", "", errors.New("want one server in the URL's host:port")
		}
		host, port := u.Hostname(), u.Port()
		if host == "" {
			return "", "", errors.New("want the server's host in the URL")
		}
		if port == "" {
			port = "5432"
		}
		u.Host = addr
		return u.String(), net.JoinHostPort(host, port), nil
	case "mysql":
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return "", "", err
		}
		if cfg.Net != "tcp" {
			return "", "", fmt.Errorf("want tcp(host:port), not %s(%s)", cfg.Net, cfg.Addr)
		}
		if cfg.TLS != nil {
			return "", "", errors.New("the proxy cannot read TLS: drop tls from the DSN")
		}
		target = cfg.Addr
		cfg.Addr = addr
		return cfg.FormatDSN(), target, nil
	}
	return "", "", fmt.Errorf("no server %q", server)
}

// ProxiedServerDB opens the database of server ("postgres" or "mysql",
// see ServerDB) through a new Proxy: the DSN with the proxy's address. The
// database and then the proxy close at cleanup.
func ProxiedServerDB(t testing.TB, server string) (*sql.DB, localtx.Dialect, *Proxy) {
	t.Helper()
	srv, dsn := serverDSN(t, server)
	wire := PostgresWire
	if server == "mysql" {
		wire = MySQLWire
	}
	_, target, err := ProxyDSN(server, dsn, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("txtest: %s: %v", srv.env, err)
	}
	p := NewProxy(t, wire, target)
	proxied, _, err := ProxyDSN(server, dsn, p.Addr())
	if err != nil {
		t.Fatalf("txtest: %s: %v", srv.env, err)
	}
	if server != "mysql" {
		return openServer(t, server, proxied), srv.dialect, p
	}
	// The driver logs the connections the proxy breaks: to the test's log.
	cfg, err := mysql.ParseDSN(proxied)
	if err != nil {
		t.Fatalf("txtest: %s: %v", srv.env, err)
	}
	cfg.Logger = testLogger{t}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("txtest: %s: %v", srv.env, err)
	}
	return pingServer(t, server, sql.OpenDB(conn)), srv.dialect, p
}

// testLogger is a mysql.Logger writing to the test's log.
type testLogger struct{ t testing.TB }

func (l testLogger) Print(v ...any) { l.t.Log(append([]any{"mysql:"}, v...)...) }

// ProxiedServer is Server through a Proxy (see ProxiedServerDB).
func ProxiedServer(t testing.TB, server, path string) (*Host, *Proxy) {
	t.Helper()
	db, dialect, p := ProxiedServerDB(t, server)
	return serverHost(t, server, db, dialect, path), p
}
