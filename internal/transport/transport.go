// Package transport is a node's one TCP port: every connection, accepted or
// dialed, is mutual TLS 1.3 (unless InsecurePlaintext), then a
// password-authenticated key exchange over the cluster secret (CPace) with
// key confirmation both ways, then one byte that picks the protocol: RPC or
// raft. ProtoRepl is reserved for replication, which DoubleWrite does over
// RPC. Accepted connections go to that protocol's listener. Frames on the
// connections are internal/wire's.
//
// # Security
//
// With TLS, both sides present certificates from the configured CAs, and a
// peer's certificate must name the node id the peer claims in the
// handshake as one of its DNS SANs; node ids are limited to characters a
// DNS SAN can hold. The handshake is bound to the TLS session with
// ExportKeyingMaterial, so it cannot be relayed into another session.
// Nothing either side sends lets anyone test a guess of the secret
// offline; a peer without it gets one online guess per connection.
// Without TLS the secret authenticates both ends but nothing is encrypted,
// and a machine in the middle can relay an authenticated connection.
//
// Accepted connections that have not completed the handshake are bounded
// per source address and in total, and each has HandshakeTimeout to
// complete it (limits.go), so that connections from one address cannot
// keep the node's peers out.
//
// docs/DESIGN.md §7 gives the reasons for these choices.
package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/internal/wire"
)

// Proto is the protocol byte a dialer sends after the handshake.
type Proto byte

// The protocols of the node's port.
const (
	ProtoRPC  Proto = 1
	ProtoRaft Proto = 2
	ProtoRepl Proto = 3
)

// Defaults of Config's zero values.
const (
	DefaultHandshakeTimeout       = 5 * time.Second
	DefaultMaxHandshakes          = 64
	DefaultMaxHandshakesPerSource = 16
)

var (
	// ErrClosed is returned by Dial and by a listener's Accept after Close.
	ErrClosed = errors.New("transport: closed")
	// ErrHandshake is returned by Dial when the peer fails the handshake,
	// with a wrong secret or a certificate naming another node, or refuses
	// ours.
	ErrHandshake = errors.New("transport: handshake failed")
	// ErrUnknownProto is what a listener logs when a dialer asks for a
	// protocol no listener serves; the connection is closed.
	ErrUnknownProto = errors.New("transport: unknown protocol")
	// ErrProtoTaken is returned by Listener for a protocol already served.
	ErrProtoTaken = errors.New("transport: protocol already has a listener")
	// ErrConfig wraps every error of Listen about its Config.
	ErrConfig = errors.New("transport: bad config")
	// ErrNoTLS is returned by Listen for a config with neither TLS nor
	// InsecurePlaintext.
	ErrNoTLS = errors.New("transport: no TLS: set ServerTLS and ClientTLS, or InsecurePlaintext to run without it on purpose")
	// ErrLinkDown is returned by Dial, and logged for an accepted
	// connection, when the peer's link is cut by SetLinkDown.
	ErrLinkDown = errors.New("transport: link down")
)

// Config configures a Transport.
type Config struct {
	// NodeID names this node to its peers: 1..MaxNodeIDLen letters, digits,
	// '.', '-', '_'. Required.
	NodeID string
	// Bind is the TCP address to listen on ("127.0.0.1:0" in tests). When
	// its host is an IP address other than the unspecified one, Dial
	// connects from that address too, so that a node on a multi-homed host
	// reaches its peers from the address they know it by.
	Bind string
	// Secret is the cluster secret, which CheckSecret must accept.
	// Required.
	Secret []byte
	// ServerTLS and ClientTLS, both or neither, turn on mutual TLS. They are
	// cloned and forced to TLS 1.3 with client certificates required.
	// ServerTLS needs a certificate and ClientCAs; ClientTLS a certificate
	// and RootCAs. The listener's host name is not checked: its certificate
	// must name the node id it claims instead.
	ServerTLS, ClientTLS *tls.Config
	// InsecurePlaintext says the transport runs without TLS on purpose:
	// node ids are then claimed, not proven, and nothing is encrypted.
	// Without TLS and without it, Listen fails with ErrNoTLS; with it,
	// Listen logs a warning.
	InsecurePlaintext bool
	// HandshakeTimeout bounds TLS and the secret handshake together. Zero
	// means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds accepted connections still in their handshake,
	// those from known sources (KnownSource) counted apart. When it is
	// reached, a connection from a source holding fewer of them than the
	// source holding most takes that source's oldest one, which is
	// closed; otherwise the new connection is closed at once. Zero means
	// DefaultMaxHandshakes.
	MaxHandshakes int
	// MaxHandshakesPerSource bounds accepted connections still in their
	// handshake from one source address (an IPv6 /64); further ones are
	// closed at once, with a log line per source a minute. Zero means
	// DefaultMaxHandshakesPerSource, which leaves room for several nodes
	// of one host dialing at once.
	MaxHandshakesPerSource int
	// KnownSource says whether ip, the source address of an accepted
	// connection (IPv4-mapped addresses unmapped), is a known node's.
	// Connections from known sources take their handshake slots from a
	// pool of their own, under the same two bounds, which connections
	// from other sources never take from; so no number of attacker
	// addresses keeps a known node out. Called from the accept goroutine
	// for every connection before its handshake, so it must be cheap and
	// must not block. Nil knows no source.
	KnownSource func(ip netip.Addr) bool
	// MaxFrameBytes is the frame limit of the connections' frame readers.
	// Zero means wire.DefaultMaxFrameBytes.
	MaxFrameBytes int
	// Logger receives a line for every refused connection; nil is silent.
	Logger *slog.Logger
}

// Transport is a node's listening port and its dialer. Safe for concurrent
// use.
//
// Lock order: Transport.mu, then nothing.
type Transport struct {
	cfg       Config
	serverTLS *tls.Config
	clientTLS *tls.Config
	log       *slog.Logger
	ln        net.Listener
	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	gate      *gate    // a slot per accepted connection in its handshake
	refusals  logLimit // lines about connections the gate refused
	failures  logLimit // lines about handshakes that failed
	localAddr net.Addr // Dial's local address: Bind's IP, or nil
	wg        sync.WaitGroup

	mu        sync.Mutex
	pending   map[net.Conn]struct{}               // guarded by mu: accepted, not yet handed over
	listeners map[Proto]*listener                 // guarded by mu
	closed    bool                                // guarded by mu
	links     links                               // guarded by mu: live connections per peer, SetLinkDown's cuts
	muted     atomic.Pointer[map[string]struct{}] // SetLinkMuted's peers, copied on write under mu; nil: none

	closeOnce sync.Once
	closeErr  error
}

// Listen checks cfg, listens on cfg.Bind and starts the goroutine that
// accepts connections; each accepted connection gets a goroutine for its
// handshake. Close stops and waits for all of them.
func Listen(cfg Config) (*Transport, error) {
	if err := checkNodeID(cfg.NodeID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := CheckSecret(cfg.Secret); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxHandshakes <= 0 {
		cfg.MaxHandshakes = DefaultMaxHandshakes
	}
	if cfg.MaxHandshakesPerSource <= 0 {
		cfg.MaxHandshakesPerSource = DefaultMaxHandshakesPerSource
	}
	if cfg.MaxFrameBytes <= 0 {
		cfg.MaxFrameBytes = wire.DefaultMaxFrameBytes
	}
	cfg.Secret = append([]byte(nil), cfg.Secret...)
	t := &Transport{
		cfg:       cfg,
		log:       cfg.Logger,
		gate:      newGate(cfg.MaxHandshakesPerSource, cfg.MaxHandshakes, cfg.KnownSource),
		refusals:  logLimit{interval: refusalLogInterval},
		failures:  logLimit{interval: refusalLogInterval},
		pending:   make(map[net.Conn]struct{}),
		listeners: make(map[Proto]*listener),
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if t.serverTLS, t.clientTLS, err = tlsConfigs(cfg.ServerTLS, cfg.ClientTLS); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if t.serverTLS != nil {
		for _, c := range [][]tls.Certificate{t.serverTLS.Certificates, t.clientTLS.Certificates} {
			for _, cert := range c {
				if err := checkOwnCert(cert, cfg.NodeID); err != nil {
					return nil, fmt.Errorf("%w: %w", ErrConfig, err)
				}
			}
		}
	}
	switch {
	case t.serverTLS == nil && !cfg.InsecurePlaintext:
		return nil, fmt.Errorf("%w: %w", ErrConfig, ErrNoTLS)
	case t.serverTLS == nil:
		t.log.Warn("transport: running without TLS (InsecurePlaintext): node ids are claimed, not proven, and nothing is encrypted", "node", cfg.NodeID)
	case cfg.InsecurePlaintext:
		return nil, fmt.Errorf("%w: InsecurePlaintext with ServerTLS and ClientTLS: choose one", ErrConfig)
	}
	if t.ln, err = net.Listen("tcp", cfg.Bind); err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	t.localAddr = bindIP(cfg.Bind)
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.wg.Go(t.acceptLoop)
	return t, nil
}

func tlsConfigs(server, client *tls.Config) (*tls.Config, *tls.Config, error) {
	switch {
	case server == nil && client == nil:
		return nil, nil, nil
	case server == nil || client == nil:
		return nil, nil, errors.New("transport: ServerTLS and ClientTLS go together")
	case server.ClientCAs == nil:
		return nil, nil, errors.New("transport: ServerTLS without ClientCAs")
	case len(server.Certificates) == 0 && server.GetCertificate == nil:
		return nil, nil, errors.New("transport: ServerTLS without a certificate")
	case client.RootCAs == nil:
		return nil, nil, errors.New("transport: ClientTLS without RootCAs")
	case len(client.Certificates) == 0 && client.GetClientCertificate == nil:
		return nil, nil, errors.New("transport: ClientTLS without a certificate")
	}
	s := server.Clone()
	s.MinVersion, s.MaxVersion = tls.VersionTLS13, tls.VersionTLS13
	s.ClientAuth = tls.RequireAndVerifyClientCert
	c := client.Clone()
	c.MinVersion, c.MaxVersion = tls.VersionTLS13, tls.VersionTLS13
	// The chain is verified below without a host name: the handshake then
	// checks that the certificate names the node id the listener claims.
	c.InsecureSkipVerify = true
	roots, next := c.RootCAs, c.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("transport: listener sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots:         roots,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}); err != nil {
			return fmt.Errorf("transport: listener's certificate: %w", err)
		}
		if next != nil {
			return next(cs)
		}
		return nil
	}
	return s, c, nil
}

// checkOwnCert returns an error unless cert's leaf names node id as a DNS
// SAN and may serve both ends of a mutual link: server and client auth
// (or no extended key usage, which allows any), and a digital signature
// key usage if it has key usages at all.
func checkOwnCert(cert tls.Certificate, id string) error {
	if len(cert.Certificate) == 0 {
		return errors.New("transport: own TLS certificate is empty")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("transport: own TLS certificate: %w", err)
	}
	if !slices.Contains(leaf.DNSNames, id) {
		return fmt.Errorf("transport: own TLS certificate names %q, not this node's id %q as a DNS SAN", leaf.DNSNames, id)
	}
	if len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) {
		if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
			return errors.New("transport: own TLS certificate cannot serve both ends of a link: it needs the server auth and client auth extended key usages")
		}
	}
	if leaf.KeyUsage != 0 && leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return errors.New("transport: own TLS certificate lacks the digital signature key usage TLS 1.3 needs")
	}
	if time.Now().After(leaf.NotAfter) {
		return fmt.Errorf("transport: own TLS certificate expired at %v", leaf.NotAfter)
	}
	return nil
}

// Addr is the address the transport listens on.
func (t *Transport) Addr() net.Addr { return t.ln.Addr() }

// NodeID is this node's id.
func (t *Transport) NodeID() string { return t.cfg.NodeID }

// AcceptEach accepts connections from l and hands each to handle, until l
// is closed, ctx ends or handle returns false. Any other accept error, such
// as running out of file descriptors, is logged as what and retried after
// a pause that doubles up to a second.
func AcceptEach(ctx context.Context, l net.Listener, log *slog.Logger, what string, handle func(net.Conn) bool) {
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) || errors.Is(err, ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			log.Warn(what, "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		if !handle(c) {
			return
		}
	}
}

// bindIP is the local address for dialing from bind's host, if it is an
// IP address other than the unspecified one.
func bindIP(bind string) net.Addr {
	host, _, err := net.SplitHostPort(bind)
	if err != nil {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.IsUnspecified() {
		return nil
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, 0))
}

func (t *Transport) acceptLoop() {
	AcceptEach(t.ctx, t.ln, t.log, "transport: accept", func(c net.Conn) bool {
		s, why := t.gate.enter(c)
		if why != admitted {
			c.Close()
			t.logRefusal(c.RemoteAddr(), why)
			return true
		}
		if !t.track(c) {
			t.gate.leave(s)
			c.Close()
			return false
		}
		t.wg.Go(func() { t.serve(c, s) })
		return true
	})
}

// logRefusal logs a connection the gate refused, at most a line per source
// and refusalLogInterval.
func (t *Transport) logRefusal(remote net.Addr, why refusal) {
	ok, held := t.refusals.allow(sourceOf(remote), time.Now())
	if !ok {
		return
	}
	msg, limit := "transport: refused connection: too many handshakes in progress from its source", t.cfg.MaxHandshakesPerSource
	if why == overTotal {
		msg, limit = "transport: refused connection: too many handshakes in progress", t.cfg.MaxHandshakes
	}
	t.log.Warn(msg, "remote", remote, "limit", limit, "refused_unlogged", held)
}

// track records c as pending, so Close closes it; false after Close.
func (t *Transport) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.pending[c] = struct{}{}
	return true
}

func (t *Transport) untrack(c net.Conn) {
	t.mu.Lock()
	delete(t.pending, c)
	t.mu.Unlock()
}

// serve runs the handshake on an accepted connection and hands it to its
// protocol's listener.
func (t *Transport) serve(raw net.Conn, s *slot) {
	defer t.untrack(raw)
	c, err := t.handshakeAccepted(raw)
	t.gate.leave(s)
	if err != nil {
		raw.Close()
		if t.ctx.Err() == nil {
			// At most a line per source and refusalLogInterval: a peer
			// failing handshakes as fast as it can dial fills no disk.
			if ok, held := t.failures.allow(sourceOf(raw.RemoteAddr()), time.Now()); ok {
				t.log.Warn("transport: refused connection", "remote", raw.RemoteAddr(), "err", err, "refused_unlogged", held)
			}
		}
		return
	}
	if err := t.admit(c); err != nil {
		raw.Close()
		t.log.Warn("transport: refused connection", "remote", raw.RemoteAddr(), "peer", c.peer, "err", err)
		return
	}
	t.mu.Lock()
	l := t.listeners[c.proto]
	t.mu.Unlock()
	if l == nil { // closed since the handshake
		c.Close()
		return
	}
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	case <-t.ctx.Done():
		c.Close()
	}
}

func (t *Transport) handshakeAccepted(raw net.Conn) (*Conn, error) {
	if err := raw.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout)); err != nil {
		return nil, err
	}
	m := &mutable{Conn: raw, t: t}
	var rw net.Conn = m
	var tc *tls.Conn
	if t.serverTLS != nil {
		tc = tls.Server(m, t.serverTLS)
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		rw = tc
	}
	served := func(p Proto) bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.listeners[p] != nil
	}
	peer, p, err := handshakeListener(rw, tc, t.cfg.NodeID, t.cfg.Secret, served)
	if err != nil {
		if peer != "" {
			err = fmt.Errorf("peer claiming %q: %w", peer, err)
		}
		return nil, err
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	m.peer.Store(&peer)
	return &Conn{Conn: rw, raw: m, t: t, peer: peer, proto: p, maxFrame: t.cfg.MaxFrameBytes}, nil
}

// Dial connects to the node at addr and runs the handshake for protocol p.
// ctx, Close and the handshake timeout end it. It returns ErrHandshake if
// either side fails the other's proof or p is not served there, ErrClosed
// after Close, or ctx's error.
func (t *Transport) Dial(ctx context.Context, addr string, p Proto) (*Conn, error) {
	if t.ctx.Err() != nil {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()
	d := net.Dialer{LocalAddr: t.localAddr}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, t.dialErr(ctx, addr, err)
	}
	// Unblocks the reads and writes below when ctx ends. There is no socket
	// deadline of its own, so a timeout is always reported as ctx's.
	stopAbort := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	c, err := t.handshakeDialed(ctx, raw, p)
	if !stopAbort() || err != nil {
		raw.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, t.dialErr(ctx, addr, err)
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		raw.Close()
		return nil, err
	}
	if err := t.admit(c); err != nil {
		raw.Close()
		return nil, t.dialErr(ctx, addr, err)
	}
	return c, nil
}

func (t *Transport) dialErr(ctx context.Context, addr string, err error) error {
	switch {
	case t.ctx.Err() != nil:
		return ErrClosed
	case ctx.Err() != nil && !errors.Is(err, ErrHandshake):
		return fmt.Errorf("transport: dial %s: %w", addr, context.Cause(ctx))
	}
	return fmt.Errorf("transport: dial %s: %w", addr, err)
}

func (t *Transport) handshakeDialed(ctx context.Context, raw net.Conn, p Proto) (*Conn, error) {
	m := &mutable{Conn: raw, t: t}
	var rw net.Conn = m
	var tc *tls.Conn
	if t.clientTLS != nil {
		tc = tls.Client(m, t.clientTLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		rw = tc
	}
	peer, err := handshakeDialer(rw, tc, t.cfg.NodeID, t.cfg.Secret, p)
	if err != nil {
		return nil, err
	}
	m.peer.Store(&peer)
	return &Conn{Conn: rw, raw: m, t: t, peer: peer, proto: p, maxFrame: t.cfg.MaxFrameBytes}, nil
}

// Close stops accepting, closes connections still in their handshake or
// waiting for a listener, ends Accept and Dial calls, and waits for the
// transport's goroutines. Connections already handed over are their
// owners' to close. Safe to call more than once.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.cancel()
		t.closeErr = t.ln.Close()
		for c := range t.pending {
			c.Close()
		}
		t.mu.Unlock()
		t.wg.Wait()
	})
	return t.closeErr
}

// Listener returns the listener of protocol p: dialers asking for p are
// handed to its Accept. Until it is called, or after its Close, such
// dialers are refused.
func (t *Transport) Listener(p Proto) (net.Listener, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	if t.listeners[p] != nil {
		return nil, fmt.Errorf("%w: %d", ErrProtoTaken, p)
	}
	l := &listener{t: t, proto: p, ch: make(chan *Conn), done: make(chan struct{})}
	t.listeners[p] = l
	return l, nil
}

// listener is one protocol's net.Listener.
type listener struct {
	t     *Transport
	proto Proto
	ch    chan *Conn
	done  chan struct{}
	once  sync.Once
}

// Accept waits for the next connection of the listener's protocol; it
// returns an error wrapping net.ErrClosed after the listener's or the
// transport's Close.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
	case <-l.t.ctx.Done():
	}
	return nil, fmt.Errorf("%w: %w", ErrClosed, net.ErrClosed)
}

// Close stops the protocol's listener; dialers asking for it are refused.
func (l *listener) Close() error {
	l.once.Do(func() {
		l.t.mu.Lock()
		if l.t.listeners[l.proto] == l {
			delete(l.t.listeners, l.proto)
		}
		l.t.mu.Unlock()
		close(l.done)
	})
	return nil
}

func (l *listener) Addr() net.Addr { return l.t.Addr() }

// Conn is an authenticated connection.
type Conn struct {
	net.Conn
	raw      net.Conn   // below TLS: Conn itself without it; nil only in tests
	t        *Transport // nil only in tests
	peer     string
	proto    Proto
	maxFrame int
}

// PeerID is the node id the peer proved, which with TLS its certificate
// names.
func (c *Conn) PeerID() string { return c.peer }

// closeGrace bounds how long Close waits to tell the peer, over TLS, that
// the connection ends (crypto/tls's close_notify, which waits for a write
// under way and then up to 5 s for its own) before it closes the raw
// connection under it: a link that stalls writes must not stall a node's
// Close. The peer then reads an unexpected EOF instead of an EOF.
const closeGrace = 200 * time.Millisecond

// Close closes the connection.
func (c *Conn) Close() error {
	if c.t != nil {
		c.t.release(c)
	}
	if c.raw == nil || c.raw == c.Conn {
		return c.Conn.Close()
	}
	done := make(chan error, 1)
	go func() { done <- c.Conn.Close() }()
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		c.raw.Close() // ends the stalled writes, then close_notify's
		<-done
		return nil
	}
}

// Proto is the connection's protocol.
func (c *Conn) Proto() Proto { return c.proto }

// FrameReader returns a reader of c's frames under the transport's
// MaxFrameBytes.
func (c *Conn) FrameReader() *wire.FrameReader { return wire.NewFrameReader(c.Conn, c.maxFrame) }

// WriteFrame writes f, refusing one above MaxFrameBytes before writing.
func (c *Conn) WriteFrame(f wire.Frame) error {
	b, err := wire.AppendFrame(nil, f, c.maxFrame)
	if err != nil {
		return err
	}
	_, err = c.Conn.Write(b)
	return err
}

var _ io.ReadWriteCloser = (*Conn)(nil)
