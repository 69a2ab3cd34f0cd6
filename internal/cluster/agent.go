package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/store"
)

// AgentConfig configures OpenAgent.
type AgentConfig struct {
	ID        string   // the node id: 1..64 of [A-Za-z0-9._-]
	Dir       string   // the metadata group's raft log and snapshots
	Bind      string   // the TCP address to listen on
	Advertise string   // the address other nodes dial; "" for the bound one
	Seeds     []string // addresses of nodes to join through
	Secret    []byte   // the cluster secret
	// Bootstrap lets a node without metadata state start a new cluster,
	// once no seed answers that it knows a leader (a node whose disk was
	// replaced then joins the cluster it was a member of). A node without
	// state, without Bootstrap and without seeds is ErrNoSeeds.
	Bootstrap bool
	// Incarnation is the identity of the node's data directory
	// (node.Incarnation), presented with its sessions.
	Incarnation string

	// ServerTLS and ClientTLS, both or neither, turn on mutual TLS.
	ServerTLS, ClientTLS *tls.Config
	// InsecurePlaintext lets the node run without TLS (transport.Config's).
	InsecurePlaintext bool

	SessionTimeout   time.Duration // DefaultSessionTimeout if zero
	HandshakeTimeout time.Duration // transport.DefaultHandshakeTimeout if zero
	MaxFrameBytes    int           // wire.DefaultMaxFrameBytes if zero

	// Raft timing of the metadata group; zero takes raft's defaults.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration

	// Partitions finds the partition this node serves to other nodes.
	Partitions func(topic string, index int) (partition.Partition, error)
	// Authorize, unless nil, says whether node peer may make a partition
	// request (remote.ServePartitions) on topic.
	Authorize func(peer, topic string, index int, op uint16, cmd *store.Command) error
	// CheckTx answers another node's check-back of a transaction this
	// node prepared, whose half messages it holds in parts: the decision,
	// or store.Undecided while it runs.
	CheckTx func(ctx context.Context, txid string, parts []PartRef) (store.Decision, error)
	// Serve, unless nil, registers more ops on the node's RPC server, the
	// replicas' own, before the node joins its cluster.
	Serve func(srv *remote.Server)

	Logger *slog.Logger // nil: silent
}

// Agent is this process's member of a cluster: its port, its member of the
// metadata group, the RPC service it offers and the clients of its peers.
// Safe for concurrent use.
//
// Lock order: Agent.closeMu, then Agent.mu; nothing is locked under mu.
type Agent struct {
	cfg     AgentConfig
	log     *slog.Logger
	timeout time.Duration // session timeout
	addr    string        // advertised

	tr   *transport.Transport
	mux  *transport.RaftMux
	meta *Meta
	srv  *remote.Server

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// lastAck is when the last heartbeat the metadata leader acknowledged
	// was sent, in unix ns by this node's clock: the node's session is
	// valid until lastAck + timeout at the leader, so this node stops
	// owning partitions of groups at lastAck + timeout - margin.
	lastAck atomic.Int64

	refused Refusals // the refusals logged

	clusterID atomic.Value // string: the cluster id <dir>/cluster/cluster records, "" until known

	// registeredBy is the metadata leader that last registered this node
	// (joinReply): the one its metadata replica takes entries from until
	// it votes (metaMayFollow). A string; nil until then.
	registeredBy atomic.Value
	// leaderIndex is the index of the leader's state in the last reply to
	// this process's registration or heartbeat; 0 before the first.
	leaderIndex atomic.Uint64

	book      atomic.Pointer[map[string]string] // the address book as last saved: node id → address
	announced sync.Map                          // node id → the address it announced itself at (opAnnounce, or a seed's handshake)
	contacted sync.Map                          // node id → struct{}: the nodes found at a configured seed's address, or where this node expected them (seed)
	probing   sync.Map                          // node id → true while a report of it is probed (opReport)
	reports   chan string                       // the nodes to report (ReportLater), sent by reportLoop
	metaRef   atomic.Pointer[Meta]              // meta, for resolve, which raft calls from its goroutines

	mu      sync.Mutex                  // guards peers, seeds and closed
	peers   map[string]*remote.Client   // by node id
	seeds   map[seedPeer]*remote.Client // by address and the id expected there
	closed  bool
	closeMu sync.Mutex // serializes Close
	done    bool       // guarded by closeMu
}

// maxInflight bounds the requests and replies one connection holds at once
// (remote.ServerConfig.MaxInflightBytes): one frame may pass it.
const maxInflight = 64 << 20

// errNoAddress is a dial to a node whose address the metadata group does not
// know, or not yet.
var errNoAddress = errors.New("cluster: no address known for node")

// metaGroup is the raft group id of the metadata group on the port.
const metaGroup = "meta"

// OpenAgent listens on cfg.Bind, opens this node's member of the metadata
// group, serves RPC and starts the session loop, which registers the node
// through the metadata leader and heartbeats its session, beside the loops
// that save the address book and send reports. With no cfg.Seeds and no
// state in Dir, the node bootstraps a new cluster. Close stops everything.
func OpenAgent(cfg AgentConfig) (*Agent, error) {
	if err := metastate.CheckNodeID(cfg.ID); err != nil {
		return nil, err
	}
	if cfg.Partitions == nil || cfg.CheckTx == nil {
		return nil, fmt.Errorf("%w: AgentConfig needs Partitions and CheckTx", metastate.ErrInvalid)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Agent{cfg: cfg, log: log.With("node", cfg.ID), timeout: cfg.SessionTimeout,
		peers: map[string]*remote.Client{}, seeds: map[seedPeer]*remote.Client{}, reports: make(chan string, 16)}
	if n.timeout <= 0 {
		n.timeout = DefaultSessionTimeout
	}
	var err error
	n.tr, err = transport.Listen(transport.Config{NodeID: cfg.ID, Bind: cfg.Bind, Secret: cfg.Secret,
		ServerTLS: cfg.ServerTLS, ClientTLS: cfg.ClientTLS, InsecurePlaintext: cfg.InsecurePlaintext,
		HandshakeTimeout: cfg.HandshakeTimeout, KnownSource: n.knownSource,
		MaxFrameBytes: cfg.MaxFrameBytes, Logger: n.log})
	if err != nil {
		return nil, err
	}
	n.addr = cfg.Advertise
	if n.addr == "" {
		n.addr = n.tr.Addr().String()
	}
	ok := false
	defer func() {
		if !ok {
			n.closeParts()
		}
	}()
	n.loadBook()
	if n.mux, err = transport.NewRaftMux(n.tr, transport.RaftMuxConfig{Resolve: n.resolve, Logger: n.log}); err != nil {
		return nil, err
	}
	layer, err := n.mux.Layer(metaGroup, transport.LayerConfig{Member: n.metaMember,
		Vote: func(string) bool { return n.metaMayVote() }, Campaign: n.metaMayVote, Lead: n.metaMayFollow})
	if err != nil {
		return nil, err
	}
	rt := transport.NewRaftTransport(layer)
	boot, err := n.bootstrap()
	if err != nil {
		rt.Close()
		return nil, err
	}
	n.meta, err = OpenMeta(MetaConfig{NodeID: cfg.ID, Addr: n.addr, Incarnation: cfg.Incarnation, RaftAddr: raftAddrIsID, Dir: filepath.Clean(cfg.Dir), Transport: rt,
		Logger: n.log, Bootstrap: boot, ClusterID: n.clusterID.Load().(string), SessionTimeout: n.timeout,
		HeartbeatTimeout: cfg.HeartbeatTimeout, ElectionTimeout: cfg.ElectionTimeout,
		LeaderLeaseTimeout: cfg.LeaderLeaseTimeout})
	if err != nil {
		rt.Close()
		return nil, err
	}
	n.metaRef.Store(n.meta)
	l, err := n.tr.Listener(transport.ProtoRPC)
	if err != nil {
		return nil, err
	}
	n.srv = remote.NewServer(l, remote.ServerConfig{MaxFrameBytes: cfg.MaxFrameBytes, MaxInflightBytes: maxInflight, Logger: n.log})
	remote.ServePartitions(n.srv, cfg.Partitions, cfg.Authorize)
	n.srv.Handle(opWhoLeads, n.handleWhoLeads)
	n.srv.Handle(opClusterOf, n.handleClusterOf)
	n.srv.Handle(opRegistered, n.handleRegistered)
	n.srv.Handle(opJoin, n.handleJoin)
	n.srv.Handle(opHeartbeat, n.handleHeartbeat)
	n.srv.Handle(opPropose, n.handlePropose)
	n.srv.Handle(opCheckTx, n.handleCheckTx)
	n.srv.Handle(opAnnounce, n.handleAnnounce)
	n.srv.Handle(opReport, n.handleReport)
	if cfg.Serve != nil {
		cfg.Serve(n.srv)
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Go(n.sessionLoop)
	n.wg.Go(n.bookLoop)
	n.wg.Go(n.reportLoop)
	ok = true
	return n, nil
}

// metaMayVote reports whether this node's metadata replica may vote and
// campaign (Meta.MayVote): not before it is open.
func (n *Agent) metaMayVote() bool {
	m := n.metaRef.Load()
	return m != nil && m.MayVote()
}

// metaMayFollow reports whether this node's metadata replica takes
// entries from leader: any leader once it votes; before, only the leader
// that last registered this node or renewed its session, its state having
// the node's incarnation, so its configuration no voter of an older one. A replica back without its data
// has forgotten its term too, and would take a deposed leader's entries,
// counted by that leader, whose configuration still has the old replica
// as a voter, toward a commit the group's newer leader never saw.
func (n *Agent) metaMayFollow(leader string) bool {
	if n.metaMayVote() {
		return true
	}
	by, _ := n.registeredBy.Load().(string)
	return by != "" && by == leader
}

// raftAddrIsID is the raft address of a node over the RaftMux: its id.
func raftAddrIsID(id, _ string) raft.ServerAddress { return raft.ServerAddress(id) }

// ID is the node's id.
func (n *Agent) ID() string { return n.cfg.ID }

// RaftMux is the port's carrier of raft groups: each replicated partition's
// group takes a layer of it.
func (n *Agent) RaftMux() *transport.RaftMux { return n.mux }

// Addr is the address the node advertises.
func (n *Agent) Addr() string { return n.addr }

// Meta is the node's member of the metadata group.
func (n *Agent) Meta() *Meta { return n.meta }

// Transport is the node's port, for fault tests' SetLinkDown.
func (n *Agent) Transport() *transport.Transport { return n.tr }

// SessionValid reports whether the node's session is surely still valid at
// the metadata leader: a heartbeat it acknowledged was sent less than the
// session timeout ago, less a margin for clock rates. A node whose
// session may have expired stops delivering to its consumers, since the
// leader may have given their partitions to others.
func (n *Agent) SessionValid() bool {
	return time.Now().Before(n.SessionDeadline())
}

// SessionDeadline is when SessionValid turns false unless a heartbeat is
// acknowledged before: the zero time if it is not valid now.
func (n *Agent) SessionDeadline() time.Time {
	last := n.lastAck.Load()
	if last == 0 {
		return time.Time{}
	}
	return time.Unix(0, last).Add(n.timeout - n.timeout/5)
}

// Close stops the session loop, the RPC service, the metadata member and
// the port, closes the peers' clients and waits for every goroutine. It is
// idempotent.
func (n *Agent) Close() error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.done {
		return nil
	}
	n.done = true
	n.cancel()
	n.wg.Wait()
	return n.closeParts()
}

// closeParts closes what OpenAgent opened, in reverse.
func (n *Agent) closeParts() error {
	n.mu.Lock()
	n.closed = true
	clients := make([]*remote.Client, 0, len(n.peers)+len(n.seeds))
	for _, c := range n.peers {
		clients = append(clients, c)
	}
	for _, c := range n.seeds {
		clients = append(clients, c)
	}
	n.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if n.srv != nil {
		keep(n.srv.Close())
	}
	// The raft streams' sessions close while the metadata member's raft
	// shuts down, and before it is waited for: a stream's close, a dial
	// or a write on a session that a link stalls would each wait out
	// yamux's write timeout (10 s) otherwise.
	if n.meta != nil {
		n.meta.Stop()
	}
	if n.mux != nil {
		keep(n.mux.Close())
	}
	if n.meta != nil {
		keep(n.meta.Close())
	}
	keep(n.tr.Close())
	return first
}

// resolve is the address book of the port's raft streams and RPC clients:
// a node id to the address the metadata group records for it.
func (n *Agent) resolve(id string) (string, bool) {
	if id == n.cfg.ID {
		return n.addr, true
	}
	if addr, ok := n.announced.Load(id); ok { // the node itself said so, since this process started
		return addr.(string), true
	}
	if m := n.metaRef.Load(); m != nil { // nil while OpenMeta runs, when raft may dial already
		if nd, ok := m.State().Node(id); ok && nd.Addr != "" {
			return nd.Addr, true
		}
	}
	// Not in the state, or not yet: a node restarting has an empty state
	// until a leader sends it the log, and no leader can be elected unless
	// the voters reach each other. The address book saved from the last
	// state it had fills that gap.
	if book := n.book.Load(); book != nil {
		addr, ok := (*book)[id]
		return addr, ok
	}
	return "", false
}

// metaMember says whether node id may open raft streams of the metadata
// group here: a server of the group's raft configuration, a node of the
// metadata state or of the saved address book (nodes the committed state
// registered), or a contacted node (seed): one that proved its id at a
// configured seed's address, or at an address where this node
// expected it (a book entry, or the leader a seed named). That covers a
// node joining with no state at all, which must accept the leader that
// adds it, and a node whose state misses a leader elected while it was
// away; they are nodes its operator pointed it at, or that one of them
// named. Another id found at a book address (a stale one, which anyone
// may listen at now) does not count, nor what a node only announced of
// itself (opAnnounce): anyone with a certificate of the cluster's CA may
// announce.
func (n *Agent) metaMember(id string) bool {
	if m := n.metaRef.Load(); m != nil && m.isMember(id) {
		return true
	}
	if book := n.book.Load(); book != nil {
		if _, ok := (*book)[id]; ok {
			return true
		}
	}
	_, ok := n.contacted.Load(id)
	return ok
}

// Peer returns the RPC client of node id, which dials it when first used
// and after a break, at the address resolve has for it then.
func (n *Agent) Peer(id string) (*remote.Client, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrClosed
	}
	if c, ok := n.peers[id]; ok {
		return c, nil
	}
	c := remote.NewClient(func(ctx context.Context) (*transport.Conn, error) {
		addr, ok := n.resolve(id)
		if !ok {
			return nil, fmt.Errorf("%w: %s", errNoAddress, id)
		}
		return n.dial(ctx, addr, id)
	}, remote.ClientConfig{MaxFrameBytes: n.cfg.MaxFrameBytes})
	n.peers[id] = c
	return c, nil
}

// A seedPeer is an address a seed client dials and what it expects there.
type seedPeer struct {
	addr string
	// want is the id expected at addr: the book's for it, or the one a
	// seed named as leader; "" for a configured seed (AgentConfig.Seeds),
	// whose id is not known in advance.
	want string
	// only refuses any id but want: the client asks who leads or calls the
	// leader, and takes no answer from another identity.
	only bool
}

// seed returns the RPC client of p. The id that proves itself at p.addr
// is recorded as listening there (announced) whoever it is, since the
// handshake proved it; it is recorded as contacted, a member of the
// metadata group (metaMember), if p is a configured seed or it is the
// id p expects. A client of p.only refuses to connect to another id.
func (n *Agent) seed(p seedPeer) (*remote.Client, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrClosed
	}
	if c, ok := n.seeds[p]; ok {
		return c, nil
	}
	c := remote.NewClient(func(ctx context.Context) (*transport.Conn, error) {
		c, err := n.tr.Dial(ctx, p.addr, transport.ProtoRPC)
		if err != nil {
			return nil, err
		}
		id := c.PeerID()
		if id != n.cfg.ID {
			// This is where id listens now, which the others' state and
			// books may not know yet. When a whole cluster restarted on
			// new ports, with this node among the last, the first one
			// back has no seed and a stale book, and can only be found
			// this way.
			n.announced.Store(id, p.addr)
			if p.want == "" || id == p.want {
				n.contacted.Store(id, struct{}{})
			}
		}
		if p.only && id != p.want {
			c.Close()
			return nil, fmt.Errorf("%w: %s answers as %s, not %s", errNoAddress, p.addr, id, p.want)
		}
		return c, nil
	}, remote.ClientConfig{MaxFrameBytes: n.cfg.MaxFrameBytes})
	n.seeds[p] = c
	return c, nil
}

// dial connects to addr for RPC and checks, unless want is empty, that the
// node there is want.
func (n *Agent) dial(ctx context.Context, addr, want string) (*transport.Conn, error) {
	c, err := n.tr.Dial(ctx, addr, transport.ProtoRPC)
	if err != nil {
		return nil, err
	}
	if want != "" && c.PeerID() != want {
		c.Close()
		return nil, fmt.Errorf("%w: %s answers as %s, not %s", errNoAddress, addr, c.PeerID(), want)
	}
	return c, nil
}

// sessionLoop registers the node through the metadata leader until that
// succeeds, then heartbeats its session every quarter of the session
// timeout, registering again when the leader says the node was marked
// down.
func (n *Agent) sessionLoop() {
	registered := false
	every := max(n.timeout/4, 5*time.Millisecond)
	for {
		ctx, cancel := context.WithTimeout(n.ctx, n.timeout)
		sent := time.Now()
		var err error
		n.checkVote(ctx)
		if !registered {
			// Announce first, on a budget of its own: register waits for a
			// leader until ctx ends, and the leader may need this node's
			// vote, which it cannot ask for at an address it does not know.
			n.announce()
			err = n.register(ctx)
			registered = err == nil
		} else {
			err = n.heartbeat(ctx)
			if errors.Is(err, metastate.ErrNodeDown) || errors.Is(err, metastate.ErrNoNode) {
				n.log.Warn("metadata leader marked this node down; registering again", "err", err)
				registered = false
			}
		}
		cancel()
		if registered {
			n.recordCluster()
		}
		if err == nil {
			n.lastAck.Store(sent.UnixNano())
		} else if n.ctx.Err() == nil {
			n.log.Debug("session", "registered", registered, "err", err)
		}
		wait := every
		if !registered {
			wait = min(every, 100*time.Millisecond)
		}
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// announce tells every node of the address book and the seeds where this
// node listens now. A node that restarted on another port is otherwise
// unreachable to the others' raft until it registers again, which needs a
// leader, which may need its vote. The calls run at once, each bounded by
// half the session timeout, since a handshake on a loaded machine takes
// time.
func (n *Agent) announce() {
	req, err := encodeMsg(&joinReq{ID: n.cfg.ID, Addr: n.addr})
	if err != nil {
		return
	}
	// Whoever listens at a book address is told (a node of the cluster
	// may have moved there), but only the book's id there is contacted.
	to := map[string]seedPeer{}
	if book := n.book.Load(); book != nil {
		for id, addr := range *book {
			if id != n.cfg.ID {
				to[addr] = seedPeer{addr: addr, want: id}
			}
		}
	}
	for _, addr := range n.cfg.Seeds {
		to[addr] = seedPeer{addr: addr}
	}
	ctx, cancel := context.WithTimeout(n.ctx, max(n.timeout/2, 200*time.Millisecond))
	defer cancel()
	var wg sync.WaitGroup
	for addr, p := range to {
		if addr == n.addr {
			continue
		}
		c, err := n.seed(p)
		if err != nil {
			continue
		}
		wg.Go(func() {
			if _, err := c.Call(ctx, opAnnounce, req); err != nil && n.ctx.Err() == nil {
				n.log.Debug("announce", "to", addr, "err", err)
			}
		})
	}
	wg.Wait()
}

func (n *Agent) register(ctx context.Context) error {
	req, err := encodeMsg(&joinReq{ID: n.cfg.ID, Addr: n.addr, Incarnation: n.cfg.Incarnation, Cluster: n.clusterID.Load().(string)})
	if err != nil {
		return err
	}
	resp, err := n.toLeader(ctx, opJoin, req)
	if err != nil {
		return err
	}
	n.noteRegisteredBy(resp)
	return nil
}

// checkVote, while this node's metadata replica withholds its vote
// (Meta.MayVote), asks its seeds whether their state has it registered
// with its incarnation, and lets it vote once one says so: its own state
// may lag, or it may have none to apply from, when the leader that
// registered it needs its vote to be elected again (a new cluster
// restarted while its nodes joined).
func (n *Agent) checkVote(ctx context.Context) {
	if n.metaMayVote() || n.cfg.Incarnation == "" {
		return
	}
	req, err := encodeMsg(&joinReq{ID: n.cfg.ID, Incarnation: n.cfg.Incarnation})
	if err != nil {
		return
	}
	for _, sp := range n.seedPeers() {
		c, err := n.seed(sp)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := c.Call(cctx, opRegistered, req)
		cancel()
		var r registered
		if err == nil && decodeMsg(resp, &r) == nil && r.Yes {
			if err := n.meta.VotesAgain(); err != nil {
				n.log.Warn("metadata replica cannot record that it votes again", "err", err)
			}
			return
		}
	}
}

// noteRegisteredBy records the leader a join or heartbeat's reply names
// (registeredBy).
func (n *Agent) noteRegisteredBy(resp []byte) {
	var r joinReply
	if len(resp) > 0 && decodeMsg(resp, &r) == nil && r.Leader != "" {
		n.registeredBy.Store(r.Leader)
		n.leaderIndex.Store(r.Index)
	}
}

// Behind reports whether this node's metadata state may lack what the
// cluster has committed: it has not yet applied what the metadata
// leader's state held when it last answered this process's registration
// or heartbeat (none yet, after a start), or its session may have lapsed
// (it has not heard from the leader for a while). A peer unknown to a
// state that is behind may be a node that joined since: callers tell it
// to try again rather than deny it.
func (n *Agent) Behind() bool {
	if n.meta.IsLeader() {
		return false
	}
	at := n.leaderIndex.Load()
	return at == 0 || n.meta.State().Index() < at || !n.SessionValid()
}

func (n *Agent) heartbeat(ctx context.Context) error {
	req, err := encodeMsg(&joinReq{ID: n.cfg.ID, Addr: n.addr, Incarnation: n.cfg.Incarnation, Cluster: n.clusterID.Load().(string)})
	if err != nil {
		return err
	}
	resp, err := n.toLeader(ctx, opHeartbeat, req)
	if err != nil {
		return err
	}
	n.noteRegisteredBy(resp)
	return nil
}

// Propose applies c through the metadata leader, wherever it is, and
// returns its result. It retries while no leader is known or leadership
// moves, until ctx ends; ErrUnknownOutcome means c may have been applied.
func (n *Agent) Propose(ctx context.Context, c metastate.Command) (metastate.Result, error) {
	req, err := metastate.EncodeCommand(c)
	if err != nil {
		return metastate.Result{}, err
	}
	resp, err := n.toLeader(ctx, opPropose, req)
	if err != nil {
		return metastate.Result{}, err
	}
	var r resultMsg
	if err := decodeMsg(resp, &r); err != nil {
		return metastate.Result{}, err
	}
	return r.result(), nil
}

// toLeader calls op on the metadata leader: this node's own handler when it
// leads, else the leader's over RPC. Without a known leader it asks the
// seeds who leads. It retries, backing off, while no leader answers, until
// ctx ends: it then returns ctx's error, naming the last error met. It
// returns ErrClosed once the agent closes.
func (n *Agent) toLeader(ctx context.Context, op uint16, req []byte) ([]byte, error) {
	pause := 5 * time.Millisecond
	var last error
	for attempt := 0; ; attempt++ {
		resp, err := n.callLeader(ctx, op, req, attempt)
		if err == nil || !retryable(err) {
			return resp, err
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-n.ctx.Done():
			return nil, ErrClosed
		case <-time.After(pause):
		}
		pause = min(2*pause, 250*time.Millisecond)
	}
}

func (n *Agent) callLeader(ctx context.Context, op uint16, req []byte, attempt int) ([]byte, error) {
	if n.meta.IsLeader() {
		return n.handle(ctx, n.cfg.ID, op, req)
	}
	id, _ := n.meta.Leader()
	if id != "" && id != n.cfg.ID {
		if _, ok := n.resolve(id); ok {
			c, err := n.Peer(id)
			if err != nil {
				return nil, err
			}
			return c.Call(ctx, op, req)
		}
	}
	// No leader known here: ask a seed who leads, then call it.
	seeds := n.seedPeers()
	if len(seeds) == 0 {
		return nil, &NotLeaderError{}
	}
	s, err := n.seed(seeds[attempt%len(seeds)])
	if err != nil {
		return nil, err
	}
	resp, err := s.Call(ctx, opWhoLeads, nil)
	if err != nil {
		return nil, err
	}
	var who whoLeads
	if err := decodeMsg(resp, &who); err != nil {
		return nil, err
	}
	if who.ID == "" || who.Addr == "" {
		return nil, &NotLeaderError{}
	}
	if who.ID == n.cfg.ID { // stale: this node led once
		return nil, &NotLeaderError{}
	}
	c, err := n.seed(seedPeer{addr: who.Addr, want: who.ID, only: true})
	if err != nil {
		return nil, err
	}
	return c.Call(ctx, op, req)
}

// seedPeers are the nodes to ask who leads: the configured seeds, or, for a
// node started without any (the one that bootstrapped the cluster), the
// other nodes of its address book, each only at its book address and as
// itself: an answer from whoever listens at a stale address names no
// leader. Without the book, such a node that missed the addition of a node
// now leading would refuse that leader's raft streams (metaMember) and
// never learn of it.
func (n *Agent) seedPeers() []seedPeer {
	var out []seedPeer
	if len(n.cfg.Seeds) > 0 {
		for _, addr := range n.cfg.Seeds {
			out = append(out, seedPeer{addr: addr})
		}
		return out
	}
	book := n.book.Load()
	if book == nil {
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(*book)) {
		if id != n.cfg.ID {
			out = append(out, seedPeer{addr: (*book)[id], want: id, only: true})
		}
	}
	return out
}

// retryable reports whether a call to the leader may succeed if repeated:
// no leader, or it could not be reached. An unknown outcome is not: the
// caller decides.
func retryable(err error) bool {
	var ne net.Error
	return errors.Is(err, ErrNotLeader) || errors.Is(err, remote.ErrUnavailable) ||
		errors.Is(err, transport.ErrHandshake) || errors.Is(err, errNoAddress) || errors.As(err, &ne)
}

// The address book, <Dir>/peers: the nodes' addresses as the metadata state
// last had them, saved whenever they change, read at start. It is a hint
// for reaching the other voters before the state is back, never
// authoritative: a file that cannot be read is logged and ignored.
// Layout: the line "zeze-mq peers 1", then one "id address" line per node.
const bookHeader = "zeze-mq peers 1"

func (n *Agent) bookPath() string { return filepath.Join(n.cfg.Dir, "peers") }

// loadBook reads the saved address book, if any.
func (n *Agent) loadBook() {
	b, err := os.ReadFile(n.bookPath())
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			n.log.Warn("cannot read the address book; ignored", "err", err)
		}
		return
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) == 0 || lines[0] != bookHeader {
		n.log.Warn("address book of an unknown format; ignored", "path", n.bookPath())
		return
	}
	book := map[string]string{}
	for _, l := range lines[1:] {
		id, addr, ok := strings.Cut(l, " ")
		if !ok || metastate.CheckNodeID(id) != nil || addr == "" {
			n.log.Warn("address book damaged; ignored", "path", n.bookPath())
			return
		}
		book[id] = addr
	}
	n.book.Store(&book)
}

// bookLoop saves the address book whenever the state's addresses change,
// and forgets what a node announced once the state records a new address
// for it: the node registered that address, which is newer than any
// announcement.
func (n *Agent) bookLoop() {
	prev := map[string]string{}
	for {
		st := n.meta.State()
		for _, nd := range st.Nodes() {
			if old, ok := prev[nd.ID]; ok && old != nd.Addr {
				n.announced.Delete(nd.ID)
			}
			prev[nd.ID] = nd.Addr
		}
		n.saveBook(st)
		select {
		case <-n.ctx.Done():
			return
		case <-st.Changed():
		}
	}
}

// saveBook writes the book with the addresses of st over its own, if that
// changes it: a new file, synced, renamed over the old one. Entries st does
// not have are kept: a restarted node's state is empty until a leader
// sends it the log.
func (n *Agent) saveBook(st *metastate.State) {
	book := map[string]string{}
	if old := n.book.Load(); old != nil {
		maps.Copy(book, *old)
	}
	book[n.cfg.ID] = n.addr
	for _, nd := range st.Nodes() {
		if nd.Addr != "" && nd.ID != n.cfg.ID {
			book[nd.ID] = nd.Addr
		}
	}
	if old := n.book.Load(); old != nil && maps.Equal(*old, book) {
		return
	}
	var b strings.Builder
	b.WriteString(bookHeader + "\n")
	for _, id := range slices.Sorted(maps.Keys(book)) {
		fmt.Fprintf(&b, "%s %s\n", id, book[id])
	}
	if err := boltsafe.ReplaceFile(n.bookPath(), []byte(b.String())); err != nil {
		n.log.Warn("cannot save the address book", "err", err)
		return
	}
	n.book.Store(&book)
}
