package raftqueue

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// The network of the fault tests. Replicas talk through a faultTransport,
// which passes each RPC through the cluster's faultNet: a request crosses
// the link from its sender to its target, its response the link back. With
// one direction down a request may be applied by its target and its answer
// lost, as on a real network. A paused replica neither sends nor receives:
// the RPCs to and from it wait, unanswered, and go through late when it
// resumes. A frozen one is paused and its raft log writes wait too
// (hookedLog), which stops raft's main loop at its next write, as in a
// process that was stopped (SIGSTOP) and then resumed.
//
// Over TCP the links are cut lower down instead, in the stream layer
// (tcpLayer): its connections are closed and it neither dials nor accepts.

var (
	errLinkDown        = errors.New("raftqueue test: link down")
	errTransportClosed = errors.New("raftqueue test: transport closed")
)

// link is the direction from one replica to another, by index.
type link struct{ from, to int }

// faultNet holds the state of a cluster's links, shared by its replicas'
// transports, and what they saw: which replica sent AppendEntries in each
// term, that is, who led it.
type faultNet struct {
	addrs []raft.ServerAddress // replica i's address

	mu      sync.Mutex // guards the fields below
	down    map[link]bool
	paused  map[int]bool
	frozen  map[int]bool
	resumed chan struct{}            // closed, and replaced, when pauses end
	leaders map[uint64]raft.ServerID // term → the replica that sent AppendEntries in it
	split   []string                 // terms in which two replicas sent AppendEntries
}

func newFaultNet(addrs []raft.ServerAddress) *faultNet {
	return &faultNet{
		addrs:   addrs,
		down:    map[link]bool{},
		paused:  map[int]bool{},
		frozen:  map[int]bool{},
		resumed: make(chan struct{}),
		leaders: map[uint64]raft.ServerID{},
	}
}

// index returns the replica at addr, or -1.
func (n *faultNet) index(addr raft.ServerAddress) int {
	for i, a := range n.addrs {
		if a == addr {
			return i
		}
	}
	return -1
}

// setLink takes the link from→to down or up.
func (n *faultNet) setLink(from, to int, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down[link{from, to}] = down
}

// isolate takes down every link to and from replica i.
func (n *faultNet) isolate(i int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for j := range n.addrs {
		if j != i {
			n.down[link{i, j}] = true
			n.down[link{j, i}] = true
		}
	}
}

// pause freezes replica i's links until resume.
func (n *faultNet) pause(i int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.paused[i] = true
}

// freeze pauses replica i and holds its raft log writes until resume.
func (n *faultNet) freeze(i int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.paused[i], n.frozen[i] = true, true
}

// heal brings every link up and resumes every paused replica: the RPCs and
// writes held for them go through.
func (n *faultNet) heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.down)
	if len(n.paused) > 0 {
		clear(n.paused)
		clear(n.frozen)
		close(n.resumed)
		n.resumed = make(chan struct{})
	}
}

// thawed waits while replica i is frozen (until it resumes or closed is
// closed).
func (n *faultNet) thawed(i int, closed <-chan struct{}) error {
	for {
		n.mu.Lock()
		frozen, resumed := n.frozen[i], n.resumed
		n.mu.Unlock()
		if !frozen {
			return nil
		}
		select {
		case <-resumed:
		case <-closed:
			return errTransportClosed
		}
	}
}

// cross waits while either end of the link from→to is paused (until the
// pause ends or closed is closed), then reports whether the link is up.
func (n *faultNet) cross(from, to int, closed <-chan struct{}) error {
	for {
		n.mu.Lock()
		if !n.paused[from] && !n.paused[to] {
			down := n.down[link{from, to}]
			n.mu.Unlock()
			if down {
				return errLinkDown
			}
			return nil
		}
		resumed := n.resumed
		n.mu.Unlock()
		select {
		case <-resumed:
		case <-closed:
			return errTransportClosed
		}
	}
}

// sentAppend records that id sent AppendEntries in term: only the leader
// of a term does.
func (n *faultNet) sentAppend(term uint64, id raft.ServerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch prev, ok := n.leaders[term]; {
	case !ok:
		n.leaders[term] = id
	case prev != id:
		n.split = append(n.split, fmt.Sprintf("term %d: %s and %s", term, prev, id))
	}
}

// leaderOf returns the replica that led term (sent AppendEntries in it).
func (n *faultNet) leaderOf(term uint64) (raft.ServerID, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	id, ok := n.leaders[term]
	return id, ok
}

// terms returns how many terms had a leader that sent AppendEntries, and
// the terms that had two.
func (n *faultNet) terms() (int, []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.leaders), append([]string(nil), n.split...)
}

// faultTransport is one replica's raft.Transport in the fault tests: an
// inner transport (raft's InmemTransport, or a NetworkTransport over a
// tcpLayer) whose RPCs go through the faultNet. Links are cut by refusing
// AppendEntriesPipeline, so that every AppendEntries passes here; with
// pipeline set (TCP, whose links are cut in the stream layer) pipelines go
// through, their AppendEntries only observed.
type faultTransport struct {
	raft.Transport
	net      *faultNet
	self     int
	id       raft.ServerID
	pipeline bool
	closed   chan struct{}
	once     sync.Once
}

var (
	_ raft.WithClose   = (*faultTransport)(nil)
	_ raft.WithPreVote = (*faultTransport)(nil)
)

func newFaultTransport(inner raft.Transport, n *faultNet, self int, id raft.ServerID, pipeline bool) *faultTransport {
	return &faultTransport{Transport: inner, net: n, self: self, id: id, pipeline: pipeline, closed: make(chan struct{})}
}

// deliver makes one RPC to target, rpc, as the links allow.
func (t *faultTransport) deliver(target raft.ServerAddress, rpc func() error) error {
	to := t.net.index(target)
	if to < 0 {
		return fmt.Errorf("raftqueue test: unknown address %s", target)
	}
	if err := t.net.cross(t.self, to, t.closed); err != nil {
		return err
	}
	if err := rpc(); err != nil {
		return err
	}
	return t.net.cross(to, t.self, t.closed) // the answer comes back
}

func (t *faultTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	if !t.pipeline {
		return nil, raft.ErrPipelineReplicationNotSupported
	}
	p, err := t.Transport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return observedPipeline{AppendPipeline: p, t: t}, nil
}

func (t *faultTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	t.net.sentAppend(args.Term, t.id)
	return t.deliver(target, func() error { return t.Transport.AppendEntries(id, target, args, resp) })
}

func (t *faultTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return t.deliver(target, func() error { return t.Transport.RequestVote(id, target, args, resp) })
}

func (t *faultTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	pv, ok := t.Transport.(raft.WithPreVote)
	if !ok {
		return errors.New("raftqueue test: the inner transport has no pre-vote")
	}
	return t.deliver(target, func() error { return pv.RequestPreVote(id, target, args, resp) })
}

func (t *faultTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	return t.deliver(target, func() error { return t.Transport.InstallSnapshot(id, target, args, resp, data) })
}

func (t *faultTransport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return t.deliver(target, func() error { return t.Transport.TimeoutNow(id, target, args, resp) })
}

// Close ends the waits of RPCs held for a paused replica and closes the
// inner transport (raft's Shutdown calls it).
func (t *faultTransport) Close() error {
	t.once.Do(func() { close(t.closed) })
	if c, ok := t.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// observedPipeline records the term of each AppendEntries it sends.
type observedPipeline struct {
	raft.AppendPipeline
	t *faultTransport
}

func (p observedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	p.t.net.sentAppend(args.Term, p.t.id)
	return p.AppendPipeline.AppendEntries(args, resp)
}

// tcpLayer is a replica's raft.StreamLayer on 127.0.0.1 whose connections
// the test can cut: while cut it neither dials nor accepts, and cutting
// closes every connection it dialed or accepted, so its peers see their
// connections to it fail. Close closes them all too.
type tcpLayer struct {
	net.Listener
	mu    sync.Mutex // guards conns and cut
	conns map[*tcpConn]struct{}
	cut   bool
}

var _ raft.StreamLayer = (*tcpLayer)(nil)

// listenTCP listens on addr: "127.0.0.1:0" for a new replica, the address
// it had for one restarted.
func listenTCP(addr string) (*tcpLayer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &tcpLayer{Listener: ln, conns: map[*tcpConn]struct{}{}}, nil
}

type tcpConn struct {
	net.Conn
	l *tcpLayer
}

func (c *tcpConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// track registers c, or closes it and returns nil while l is cut.
func (l *tcpLayer) track(c net.Conn) *tcpConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		c.Close()
		return nil
	}
	tc := &tcpConn{Conn: c, l: l}
	l.conns[tc] = struct{}{}
	return tc
}

func (l *tcpLayer) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if tc := l.track(c); tc != nil {
			return tc, nil
		}
	}
}

func (l *tcpLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	l.mu.Lock()
	cut := l.cut
	l.mu.Unlock()
	if cut {
		return nil, errLinkDown
	}
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	if tc := l.track(c); tc != nil {
		return tc, nil
	}
	return nil, errLinkDown
}

// setCut cuts l off (closing its connections) or lets it connect again.
func (l *tcpLayer) setCut(cut bool) {
	l.mu.Lock()
	l.cut = cut
	if cut {
		l.closeConnsLocked()
	}
	l.mu.Unlock()
}

func (l *tcpLayer) closeConnsLocked() {
	for c := range l.conns {
		c.Conn.Close()
	}
	clear(l.conns)
}

func (l *tcpLayer) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closeConnsLocked()
	l.mu.Unlock()
	return err
}

// hookedLog is a replica's raft log whose writes call before first: its
// error fails the write. The fault matrix's before waits while the replica
// is frozen (net.thawed): raft's main loop, which writes the leader's
// entries, stops at its next write as in a stopped process, and no longer
// checks its lease, so a frozen leader still says it leads.
type hookedLog struct {
	raft.LogStore
	before func() error
}

var _ raft.MonotonicLogStore = (*hookedLog)(nil)

// IsMonotonic passes on the inner log's answer.
func (l *hookedLog) IsMonotonic() bool {
	m, ok := l.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (l *hookedLog) StoreLog(e *raft.Log) error {
	return l.StoreLogs([]*raft.Log{e})
}

func (l *hookedLog) StoreLogs(es []*raft.Log) error {
	if err := l.before(); err != nil {
		return err
	}
	return l.LogStore.StoreLogs(es)
}
