package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/yamux"
)

// The raft stream header, written by the dialer at the start of every
// stream, before raft's own bytes:
//
//	[uvarint n][group id, n bytes]     1 <= n <= MaxGroupIDLen
//
// The uvarint is minimal, one byte below 128 and two up to 255; anything
// else closes the stream. The header has no version of its own: another
// layout would come with another protocol byte than ProtoRaft.
const (
	MaxGroupIDLen = 255
	maxHeaderLen  = 2 + MaxGroupIDLen
)

// Defaults and bounds of the raft mux.
const (
	// DefaultHeaderTimeout bounds reading a stream's header.
	DefaultHeaderTimeout = 5 * time.Second
	// DefaultKeepAlive is the yamux keepalive interval, and how long a
	// ping or a write to the connection may take before the session is
	// dropped; the next Dial redials it.
	DefaultKeepAlive = 10 * time.Second
	// DefaultRaftDialTimeout bounds a layer's Dial when raft passes no
	// timeout.
	DefaultRaftDialTimeout = 10 * time.Second
	// MaxQueuedStreams bounds a layer's streams waiting for its Accept;
	// further ones are closed, and raft redials.
	MaxQueuedStreams = 16
	// MaxPeerStreams bounds the inbound streams of one group from one
	// peer, over all its sessions; further ones are closed. Raft opens a
	// few: one per RPC in flight (heartbeat, append, vote, snapshot) and
	// up to 3 pooled.
	MaxPeerStreams = 16
	// DefaultIdleTimeout is how long an inbound stream may stay without a
	// byte before it is closed; a dialed stream idle half as long is
	// replaced by a new one when raft writes to it again.
	DefaultIdleTimeout = 2 * time.Minute
	// maxHeaderReads bounds an inbound session's streams still in their
	// header; further ones wait in yamux's accept backlog.
	maxHeaderReads = 64
	// maxRefusedStreams bounds the streams an inbound session may have
	// refused since it last had one accepted, counting those raft never
	// opens (bad or late headers, a group the peer is no member of, a
	// request failing the sender check) and, from a peer that is a member
	// of no registered group, those of a group not registered here; one
	// more closes the session. A refused yamux stream stays in its
	// session until the peer's FIN or StreamCloseTimeout.
	maxRefusedStreams = 32
)

var (
	// ErrGroupTaken is returned by Layer for a group that already has one.
	ErrGroupTaken = errors.New("transport: raft group already has a layer")
	// ErrUnknownNode is returned by a layer's Dial when Resolve does not
	// know the node.
	ErrUnknownNode = errors.New("transport: unknown node")
	// ErrWrongPeer is returned by a layer's Dial when the node at the
	// resolved address proves another id than the one dialed.
	ErrWrongPeer = errors.New("transport: address answered as another node")
)

var errBadHeader = errors.New("bad raft stream header")

// RaftMuxConfig configures a RaftMux.
type RaftMuxConfig struct {
	// Resolve is the address book: a node id to its current address. raft
	// ServerAddress values are node ids, because a node's address may
	// change when it restarts; the mux resolves them on every Dial.
	// Required; called without the mux's locks held.
	Resolve func(nodeID string) (addr string, ok bool)
	// Logger receives refused streams, and yamux's lines at Debug; nil is
	// silent.
	Logger *slog.Logger
	// HeaderTimeout bounds reading an inbound stream's header. Zero means
	// DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// KeepAlive is the yamux keepalive interval and connection write
	// timeout. Zero means DefaultKeepAlive. A session whose peer sends
	// more than 64 pings in a second is closed, so every node's
	// KeepAlive must be well above 1/64 s.
	KeepAlive time.Duration
	// IdleTimeout closes an inbound stream that carried no byte for that
	// long. Zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
}

// LayerConfig configures a group's RaftLayer.
type LayerConfig struct {
	// Member says whether node peer, proven by the connection's
	// handshake, may open streams of the group: a stream from any other
	// node is closed before raft reads a byte of it. Required; called
	// from the mux's goroutines without its locks held, so it must not
	// wait for the group's raft.
	Member func(peer string) bool
	// Vote, unless nil, says whether this replica may vote for node
	// candidate: a RequestVote or RequestPreVote from a peer it returns
	// false for is not given to raft, and its stream is closed, which
	// raft's candidate counts as a vote not granted (not a refusal of the
	// peer). Called from raft's goroutines; it must not wait for the
	// group's raft.
	Vote func(candidate string) bool
	// Campaign, unless nil, says whether this replica may ask for votes:
	// while it returns false, the RequestVote and RequestPreVote calls of
	// the layer's NewRaftTransport fail before they are sent, so that the
	// replica's raft, a candidate, counts its own vote only and never
	// wins; and a TimeoutNow (a leader handing its leadership over) is
	// not given to raft, as a withheld vote is not. A replica whose log
	// lacks what it acknowledged must neither vote nor lead. Called from
	// raft's goroutines, like Vote.
	Campaign func() bool
	// Lead, unless nil, says whether this replica takes entries from node
	// leader: an AppendEntries or InstallSnapshot from a peer it returns
	// false for is not given to raft, and its stream is closed. Called
	// from raft's goroutines, like Vote.
	Lead func(leader string) bool
}

// InConfiguration reports whether node id is a server of r's latest
// configuration, which raft keeps without waiting for its main loop: the
// part of a Member check that follows the group's own membership.
func InConfiguration(r *raft.Raft, id string) bool {
	f := r.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id {
			return true
		}
	}
	return false
}

// RaftMux carries many raft groups between nodes over the transport's
// ProtoRaft connections: one outbound yamux session per peer node, one
// inbound session per accepted connection, a stream per raft connection
// starting with its group's header. Each group gets a RaftLayer, a
// raft.StreamLayer for raft.NewNetworkTransport. Safe for concurrent use.
//
// Lock order: RaftMux.mu and RaftLayer.mu are never held together, and
// neither is held while calling yamux, the Transport or Resolve.
type RaftMux struct {
	t      *Transport
	cfg    RaftMuxConfig
	log    *slog.Logger
	ycfg   *yamux.Config
	ln     net.Listener
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool                    // guarded by mu
	layers  map[string]*RaftLayer   // guarded by mu
	peers   map[string]*peer        // guarded by mu: outbound sessions by node id
	inbound map[*inSession]struct{} // guarded by mu

	logged sync.Map // refusals logged once: peer, group and reason → struct{}

	closeOnce sync.Once
}

// peer is the outbound session to one node.
type peer struct {
	dialing chan struct{}  // one dialer at a time; a channel so waiters honour their timeout
	sess    *yamux.Session // guarded by RaftMux.mu
	addr    string         // guarded by RaftMux.mu: where sess was dialed
}

// NewRaftMux takes t's ProtoRaft listener and starts the goroutine that
// accepts its connections; each becomes a yamux session with a goroutine
// accepting its streams, and each stream a goroutine until its header is
// read. Close stops and waits for all of them. It returns ErrProtoTaken if
// t's ProtoRaft listener is taken, or ErrClosed after t's Close. The mux
// does not own t: close the mux first, then t.
func NewRaftMux(t *Transport, cfg RaftMuxConfig) (*RaftMux, error) {
	if cfg.Resolve == nil {
		return nil, errors.New("transport: RaftMuxConfig.Resolve is required")
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = DefaultHeaderTimeout
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	m := &RaftMux{
		t:       t,
		cfg:     cfg,
		log:     cfg.Logger,
		layers:  make(map[string]*RaftLayer),
		peers:   make(map[string]*peer),
		inbound: make(map[*inSession]struct{}),
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.ycfg = yamux.DefaultConfig()
	m.ycfg.KeepAliveInterval = cfg.KeepAlive
	m.ycfg.ConnectionWriteTimeout = cfg.KeepAlive
	m.ycfg.StreamOpenTimeout = 3 * cfg.KeepAlive
	m.ycfg.StreamCloseTimeout = 6 * cfg.KeepAlive
	m.ycfg.LogOutput = nil
	m.ycfg.Logger = yamuxLogger{m.log}
	if err := yamux.VerifyConfig(m.ycfg); err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	var err error
	if m.ln, err = t.Listener(ProtoRaft); err != nil {
		return nil, err
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.wg.Go(m.acceptLoop)
	return m, nil
}

// Layer registers group and returns its stream layer, which accepts
// streams only from the nodes cfg.Member names. It returns ErrGroupTaken if
// the group has a layer that is not closed, or ErrClosed after Close.
func (m *RaftMux) Layer(group string, cfg LayerConfig) (*RaftLayer, error) {
	if len(group) == 0 || len(group) > MaxGroupIDLen {
		return nil, fmt.Errorf("transport: raft group id of %d bytes, want 1..%d", len(group), MaxGroupIDLen)
	}
	if cfg.Member == nil {
		return nil, errors.New("transport: LayerConfig.Member is required")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if m.layers[group] != nil {
		return nil, fmt.Errorf("%w: %q", ErrGroupTaken, group)
	}
	l := &RaftLayer{
		m:        m,
		group:    group,
		member:   cfg.Member,
		vote:     cfg.Vote,
		campaign: cfg.Campaign,
		follow:   cfg.Lead,
		queue:    make(chan *stream, MaxQueuedStreams),
		done:     make(chan struct{}),
		streams:  make(map[*stream]struct{}),
		perPeer:  make(map[string]int),
	}
	l.ctx, l.cancel = context.WithCancel(m.ctx)
	m.layers[group] = l
	return l, nil
}

// Close closes every session and layer, and so every stream, gives back
// the ProtoRaft listener and waits for the mux's goroutines. Dial and
// Accept return ErrClosed afterwards. Safe to call more than once.
func (m *RaftMux) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.cancel()
		var sessions []*yamux.Session
		for _, p := range m.peers {
			if p.sess != nil {
				sessions = append(sessions, p.sess)
			}
		}
		for in := range m.inbound {
			sessions = append(sessions, in.sess)
		}
		layers := make([]*RaftLayer, 0, len(m.layers))
		for _, l := range m.layers {
			layers = append(layers, l)
		}
		m.mu.Unlock()
		m.ln.Close()
		for _, s := range sessions {
			s.Close()
		}
		for _, l := range layers {
			l.Close()
		}
		m.wg.Wait()
	})
	return nil
}

func (m *RaftMux) acceptLoop() {
	for {
		nc, err := m.ln.Accept()
		if err != nil {
			// Only the listener's or the transport's Close end it.
			if m.ctx.Err() == nil {
				m.log.Warn("transport: raft listener closed", "err", err)
			}
			return
		}
		c := nc.(*Conn)
		s, err := yamux.Server(m.guard(c), m.ycfg)
		if err != nil { // only a bad config, checked in NewRaftMux
			c.Close()
			continue
		}
		in := &inSession{sess: s, peer: c.PeerID()}
		m.mu.Lock()
		closed := m.closed
		if !closed {
			m.inbound[in] = struct{}{}
		}
		m.mu.Unlock()
		if closed {
			s.Close()
			return
		}
		m.wg.Go(func() { m.serveSession(in) })
	}
}

// guard wraps c, a session's connection, in a pingGuard that logs once
// per peer when it closes the session.
func (m *RaftMux) guard(c *Conn) *pingGuard {
	return &pingGuard{Conn: c, flood: func() {
		m.logOnce(c.PeerID(), "", "transport: closed raft session: the peer sent pings faster than the bound",
			"peer", c.PeerID(), "limit", maxPings, "per", pingWindow)
	}}
}

// inSession is an inbound session and the streams it had refused.
type inSession struct {
	sess    *yamux.Session
	peer    string       // the id the connection's handshake proved
	refused atomic.Int32 // streams refused and counted since the last one accepted
}

// refuse counts a refused stream of in: past maxRefusedStreams since the
// last accepted one, it closes the session, logged once per peer.
func (m *RaftMux) refuse(in *inSession) {
	if in.refused.Add(1) <= maxRefusedStreams {
		return
	}
	m.logOnce(in.peer, "", "transport: closed raft session: too many streams refused", "peer", in.peer, "limit", maxRefusedStreams)
	in.sess.Close()
}

// serveSession accepts in's streams until its session dies, each read by
// a goroutine of its own, up to maxHeaderReads at once: a stalled header
// holds back no other stream, and stalled ones hold back the session's
// new streams for at most HeaderTimeout.
func (m *RaftMux) serveSession(in *inSession) {
	s := in.sess
	defer func() {
		m.mu.Lock()
		delete(m.inbound, in)
		m.mu.Unlock()
		s.Close()
	}()
	reading := make(chan struct{}, maxHeaderReads)
	for {
		ys, err := s.AcceptStream()
		if err != nil {
			return
		}
		// With maxHeaderReads in progress, wait for one to end: within
		// HeaderTimeout. Meanwhile new streams queue in yamux's accept
		// backlog, which resets those beyond it (a reset stream leaves
		// its session at once, where a closed one lingers).
		select {
		case reading <- struct{}{}:
		case <-m.ctx.Done():
			ys.Close()
			return
		}
		m.wg.Go(func() {
			defer func() { <-reading }()
			m.route(ys, in)
		})
	}
}

// route reads ys's header and queues it for its group's Accept if in's
// peer is a member of the group, or closes it.
func (m *RaftMux) route(ys *yamux.Stream, in *inSession) {
	peerID := in.peer
	err := ys.SetReadDeadline(time.Now().Add(m.cfg.HeaderTimeout))
	var group string
	if err == nil {
		group, err = readStreamHeader(ys)
	}
	if err == nil {
		err = ys.SetReadDeadline(time.Time{})
	}
	if err != nil {
		if m.ctx.Err() == nil {
			m.log.Warn("transport: refused raft stream", "peer", peerID, "err", err)
		}
		ys.Close()
		m.refuse(in)
		return
	}
	m.mu.Lock()
	l := m.layers[group]
	m.mu.Unlock()
	if l == nil {
		// A group not started here, or not yet: raft retries. Counted
		// only from a peer that is a member of no group here, since a
		// member's raft keeps dialing a group this node opens later.
		m.log.Debug("transport: raft stream for an unknown group", "peer", peerID, "group", group)
		ys.Close()
		if !m.memberOfAny(peerID) {
			m.refuse(in)
		}
		return
	}
	if !l.member(peerID) {
		m.refused(peerID, group, "transport: refused raft stream: the peer is not a member of the group")
		ys.Close()
		m.refuse(in)
		return
	}
	s := &stream{ys: ys, l: l, peer: peerID, check: newRPCCheck(peerID, l.vote, l.campaign, l.follow), in: in}
	switch l.queueStream(s) {
	case queued:
		in.refused.Store(0)
	case peerFull:
		// Not counted: raft's redials while its old streams close may
		// pass the bound for a moment.
		m.refused(peerID, group, "transport: refused raft stream: too many streams of the group from the peer", "limit", MaxPeerStreams)
		ys.Close()
	default:
		m.log.Warn("transport: refused raft stream: layer closed or its queue full", "peer", peerID, "group", group)
		ys.Close()
	}
}

// refused logs msg once per peer, group and msg: a peer that keeps
// trying is not logged again.
func (m *RaftMux) refused(peer, group, msg string, args ...any) {
	m.logOnce(peer, group, msg, append([]any{"peer", peer, "group", group}, args...)...)
}

// logOnce logs msg with args once per peer, group and msg.
func (m *RaftMux) logOnce(peer, group, msg string, args ...any) {
	if _, seen := m.logged.LoadOrStore(peer+"\x00"+group+"\x00"+msg, struct{}{}); seen {
		return
	}
	m.log.Warn(msg, args...)
}

// memberOfAny says whether peer is a member of a group registered here.
func (m *RaftMux) memberOfAny(peer string) bool {
	m.mu.Lock()
	layers := make([]*RaftLayer, 0, len(m.layers))
	for _, l := range m.layers {
		layers = append(layers, l)
	}
	m.mu.Unlock()
	for _, l := range layers {
		if l.member(peer) {
			return true
		}
	}
	return false
}

// dial opens a stream of l's group to node id.
func (m *RaftMux) dial(l *RaftLayer, id string, timeout time.Duration) (net.Conn, error) {
	ys, err := m.openStream(l, id, timeout)
	if err != nil {
		return nil, err
	}
	s := &stream{ys: ys, l: l, peer: id}
	s.touch()
	if !l.track(s) {
		ys.Close()
		return nil, ErrClosed
	}
	return s, nil
}

// openStream opens a yamux stream of l's group to node id and writes its
// header. timeout, or DefaultRaftDialTimeout if zero, and l's Close end it.
func (m *RaftMux) openStream(l *RaftLayer, id string, timeout time.Duration) (*yamux.Stream, error) {
	if timeout <= 0 {
		timeout = DefaultRaftDialTimeout
	}
	ctx, cancel := context.WithTimeout(l.ctx, timeout)
	defer cancel()
	sess, err := m.session(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("transport: raft group %q: dial %s: %w", l.group, id, err)
	}
	ys, err := m.openOn(ctx, sess)
	if err != nil {
		return nil, fmt.Errorf("transport: raft group %q: dial %s: %w", l.group, id, err)
	}
	deadline, _ := ctx.Deadline()
	err = ys.SetWriteDeadline(deadline)
	if err == nil {
		_, err = ys.Write(appendStreamHeader(make([]byte, 0, maxHeaderLen), l.group))
	}
	if err == nil {
		err = ys.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		ys.Close()
		return nil, fmt.Errorf("transport: raft group %q: dial %s: %w", l.group, id, err)
	}
	return ys, nil
}

// openOn opens a stream on sess, giving up when ctx ends: yamux's
// OpenStream has no ctx, and waits for a session whose writes stall until
// its ConnectionWriteTimeout. A stream it opens after ctx ended is closed.
func (m *RaftMux) openOn(ctx context.Context, sess *yamux.Session) (*yamux.Stream, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	m.wg.Add(1)
	m.mu.Unlock()
	type opened struct {
		ys  *yamux.Stream
		err error
	}
	got, abandon := make(chan opened), make(chan struct{})
	go func() {
		defer m.wg.Done()
		ys, err := sess.OpenStream()
		select {
		case got <- opened{ys, err}:
		case <-abandon:
			if ys != nil {
				ys.Close()
			}
		}
	}()
	select {
	case o := <-got:
		return o.ys, o.err
	case <-ctx.Done():
		close(abandon)
		return nil, ctx.Err()
	}
}

// session returns the live outbound session to node id, dialing one if
// there is none, it died, or the node's address changed.
func (m *RaftMux) session(ctx context.Context, id string) (*yamux.Session, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	p := m.peers[id]
	if p == nil {
		p = &peer{dialing: make(chan struct{}, 1)}
		m.peers[id] = p
	}
	m.mu.Unlock()
	select {
	case p.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, m.ctxErr(ctx)
	}
	defer func() { <-p.dialing }()

	addr, ok := m.cfg.Resolve(id)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownNode, id)
	}
	m.mu.Lock()
	old, oldAddr := p.sess, p.addr
	m.mu.Unlock()
	if old != nil && !old.IsClosed() && oldAddr == addr {
		return old, nil
	}
	if old != nil {
		old.Close() // dead, or the node moved
	}
	c, err := m.t.Dial(ctx, addr, ProtoRaft)
	if err != nil {
		return nil, err
	}
	if c.PeerID() != id {
		c.Close()
		return nil, fmt.Errorf("%w: %s is %q", ErrWrongPeer, addr, c.PeerID())
	}
	s, err := yamux.Client(m.guard(c), m.ycfg)
	if err != nil {
		c.Close()
		return nil, err
	}
	m.mu.Lock()
	closed := m.closed
	if !closed {
		p.sess, p.addr = s, addr
	}
	m.mu.Unlock()
	if closed {
		s.Close()
		return nil, ErrClosed
	}
	return s, nil
}

func (m *RaftMux) ctxErr(ctx context.Context) error {
	if m.ctx.Err() != nil {
		return ErrClosed
	}
	return ctx.Err()
}

// RaftLayer is one raft group's raft.StreamLayer on a RaftMux: its Accept
// returns the group's inbound streams, its Dial opens streams of the
// group to other nodes, whose ServerAddress values are node ids. Safe for
// concurrent use.
type RaftLayer struct {
	m        *RaftMux
	group    string
	member   func(peer string) bool
	vote     func(candidate string) bool // LayerConfig.Vote
	campaign func() bool                 // LayerConfig.Campaign
	follow   func(leader string) bool    // LayerConfig.Lead
	queue    chan *stream                // inbound streams waiting for Accept
	done     chan struct{}               // closed by Close
	ctx      context.Context             // cancelled by Close: ends Dial
	cancel   context.CancelFunc

	mu      sync.Mutex
	closed  bool                 // guarded by mu
	streams map[*stream]struct{} // guarded by mu: every open stream, queued, accepted or dialed
	perPeer map[string]int       // guarded by mu: inbound streams open by peer

	closeOnce sync.Once
}

var _ raft.StreamLayer = (*RaftLayer)(nil)

// Accept waits for the group's next inbound stream. It returns ErrClosed,
// which wraps net.ErrClosed, after the layer's or the mux's Close.
func (l *RaftLayer) Accept() (net.Conn, error) {
	select {
	case s := <-l.queue:
		return s, nil
	case <-l.done:
		return nil, fmt.Errorf("%w: %w", ErrClosed, net.ErrClosed)
	}
}

// Dial opens a stream of the group to node string(address). timeout, or
// DefaultRaftDialTimeout if zero, bounds resolving, dialing a session if
// there is no live one, and writing the header; the mux's Close ends it.
// It returns ErrUnknownNode, ErrWrongPeer, ErrClosed, or the dial's error.
func (l *RaftLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	select {
	case <-l.done:
		return nil, ErrClosed
	default:
	}
	return l.m.dial(l, string(address), timeout)
}

// Close unregisters the group, whose streams are then refused, ends Accept
// and closes every stream of the group, so raft's connection goroutines
// on both ends return. Safe to call more than once.
func (l *RaftLayer) Close() error {
	l.closeOnce.Do(func() {
		l.m.mu.Lock()
		if l.m.layers[l.group] == l {
			delete(l.m.layers, l.group)
		}
		l.m.mu.Unlock()
		l.cancel()
		l.mu.Lock()
		l.closed = true
		close(l.done)
		streams := l.streams
		l.streams = nil
		for len(l.queue) > 0 { // all of them are in streams too
			<-l.queue
		}
		l.mu.Unlock()
		for s := range streams {
			s.kill()
		}
	})
	return nil
}

// Addr is this node's id: raft takes it as its local ServerAddress.
func (l *RaftLayer) Addr() net.Addr { return nodeAddr(l.m.t.NodeID()) }

// queueResult is what queueStream did.
type queueResult int

const (
	queued    queueResult = iota
	peerFull              // MaxPeerStreams of the peer are open
	notQueued             // the layer is closed or its queue full
)

// queueStream hands s, an inbound stream, to Accept.
func (l *RaftLayer) queueStream(s *stream) queueResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return notQueued
	}
	if l.perPeer[s.peer] >= MaxPeerStreams {
		return peerFull
	}
	select {
	case l.queue <- s:
		l.streams[s] = struct{}{}
		l.perPeer[s.peer]++
		return queued
	default:
		return notQueued
	}
}

// track records a dialed stream; false if the layer is closed.
func (l *RaftLayer) track(s *stream) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.streams[s] = struct{}{}
	return true
}

func (l *RaftLayer) forget(s *stream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.streams[s]; !ok {
		return
	}
	delete(l.streams, s)
	if s.check != nil {
		if l.perPeer[s.peer]--; l.perPeer[s.peer] <= 0 {
			delete(l.perPeer, s.peer)
		}
	}
}

// nodeAddr is a node id as a net.Addr.
type nodeAddr string

func (a nodeAddr) Network() string { return "zeze-mq" }
func (a nodeAddr) String() string  { return string(a) }

// appendStreamHeader appends group's header, laid out above MaxGroupIDLen.
func appendStreamHeader(b []byte, group string) []byte {
	b = binary.AppendUvarint(b, uint64(len(group)))
	return append(b, group...)
}

// readStreamHeader reads one stream header from r, and not a byte more.
func readStreamHeader(r io.Reader) (string, error) {
	var b [MaxGroupIDLen]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return "", fmt.Errorf("%w: %w", errBadHeader, err)
	}
	n := int(b[0])
	if n >= 0x80 {
		if _, err := io.ReadFull(r, b[1:2]); err != nil {
			return "", fmt.Errorf("%w: %w", errBadHeader, err)
		}
		if b[1] == 0 || b[1] >= 0x80 {
			return "", fmt.Errorf("%w: length %#x %#x is not a minimal two-byte uvarint", errBadHeader, b[0], b[1])
		}
		n = n&0x7f | int(b[1])<<7
	}
	if n == 0 || n > MaxGroupIDLen {
		return "", fmt.Errorf("%w: group id of %d bytes, want 1..%d", errBadHeader, n, MaxGroupIDLen)
	}
	if _, err := io.ReadFull(r, b[:n]); err != nil {
		return "", fmt.Errorf("%w: %w", errBadHeader, err)
	}
	return string(b[:n]), nil
}

// yamuxLogger sends yamux's lines to the mux's logger at Debug: they are
// about sessions ending, which the mux redials.
type yamuxLogger struct{ l *slog.Logger }

func (y yamuxLogger) Print(v ...any) { y.l.Debug(strings.TrimSpace(fmt.Sprint(v...))) }
func (y yamuxLogger) Printf(format string, v ...any) {
	y.l.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)))
}
func (y yamuxLogger) Println(v ...any) { y.l.Debug(strings.TrimSpace(fmt.Sprintln(v...))) }

// NewRaftTransport is the raft.NetworkTransport every raft group of a node
// runs on: layer's streams, 3 pooled connections a peer, a 10 s timeout
// per RPC, raft's transport log discarded.
//
// It replicates without raft's pipeline: MaxRPCsInFlight 1, one
// AppendEntries in flight per follower, of up to MaxAppendEntries entries.
// In hashicorp/raft v1.7.3 the pipeline deadlocks when a follower answers
// an AppendEntries with Success=false over a healthy connection, as one
// whose log write failed does (hashicorp/raft#612): the pipeline's decoder
// returns, the sender's next AppendEntries parks on the pipeline's
// unbuffered channels, and their only way out is a Close that the parked
// goroutine itself defers. The follower then gets heartbeats and never
// another entry, and the leader's Shutdown waits for the goroutine forever.
// raftqueue's TestGroup_FollowerRejectsThenCatchesUp checks this transport.
//
// Over a RaftLayer with LayerConfig.Campaign, its vote requests are sent
// only while Campaign allows them.
func NewRaftTransport(layer raft.StreamLayer) *RaftTransport {
	t := &RaftTransport{NetworkTransport: raft.NewNetworkTransportWithConfig(RaftTransportConfig(layer))}
	if l, ok := layer.(*RaftLayer); ok {
		t.campaign = l.campaign
	}
	return t
}

// RaftTransport is NewRaftTransport's transport: a raft.NetworkTransport
// whose vote requests fail while its layer's Campaign says no.
type RaftTransport struct {
	*raft.NetworkTransport
	campaign func() bool // LayerConfig.Campaign; nil: always
}

// ErrNoCampaign is a vote request of a replica that may not ask for votes
// (LayerConfig.Campaign): raft counts it as a vote not granted.
var ErrNoCampaign = errors.New("transport: this replica may not ask for votes")

// RequestVote sends a RequestVote unless the replica may not campaign.
func (t *RaftTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if t.campaign != nil && !t.campaign() {
		return ErrNoCampaign
	}
	return t.NetworkTransport.RequestVote(id, target, args, resp)
}

// RequestPreVote sends a RequestPreVote unless the replica may not
// campaign.
func (t *RaftTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if t.campaign != nil && !t.campaign() {
		return ErrNoCampaign
	}
	return t.NetworkTransport.RequestPreVote(id, target, args, resp)
}

// RaftTransportConfig is NewRaftTransport's configuration, for tests that
// change its timeout and keep the rest.
func RaftTransportConfig(layer raft.StreamLayer) *raft.NetworkTransportConfig {
	return &raft.NetworkTransportConfig{
		Stream: layer, MaxPool: 3, Timeout: 10 * time.Second, MaxRPCsInFlight: 1,
		Logger: hclog.NewNullLogger(),
	}
}

// ShutdownRaft waits for the shutdown of a raft, f its Shutdown's future,
// closing its transport tr first: a dial or a write of raft's that a link
// stalls ends then, instead of at its timeout (10 s), which the shutdown
// would wait out. A raft.NetworkTransport's pooled connections are closed
// too, which its own Close leaves open.
func ShutdownRaft(f raft.Future, tr raft.Transport) error {
	if c, ok := tr.(raft.WithClose); ok {
		c.Close()
	}
	if nt, ok := tr.(*raft.NetworkTransport); ok {
		nt.CloseStreams()
	}
	return f.Error()
}
