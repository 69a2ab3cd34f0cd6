package transport

import (
	"maps"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// links records, under Transport.mu, every live Conn by peer, so that a cut
// closes them, and the peers whose link SetLinkDown cut.
type links struct {
	live map[string]map[*Conn]struct{}
	down map[string]struct{}
}

// SetLinkDown cuts the link to node peerID when down, or restores it. While
// it is cut, Dial fails with ErrLinkDown when the listener proves to be
// peerID, connections accepted from peerID are closed after the handshake,
// and SetLinkDown closes every established connection with peerID at once:
// both directions, every protocol, and so the yamux sessions over them.
//
// It is a hook for fault tests, which cut links between nodes of one
// process; an operator may use it too: it only refuses and closes. It cuts
// one side: isolating a node means calling it on both ends.
func (t *Transport) SetLinkDown(peerID string, down bool) {
	t.mu.Lock()
	if !down {
		delete(t.links.down, peerID)
		t.mu.Unlock()
		return
	}
	if t.links.down == nil {
		t.links.down = make(map[string]struct{})
	}
	t.links.down[peerID] = struct{}{}
	conns := t.links.live[peerID]
	delete(t.links.live, peerID)
	t.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

// admit records c as live, or returns ErrLinkDown if its peer's link is cut.
func (t *Transport) admit(c *Conn) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, cut := t.links.down[c.peer]; cut {
		return ErrLinkDown
	}
	if t.links.live == nil {
		t.links.live = make(map[string]map[*Conn]struct{})
	}
	m := t.links.live[c.peer]
	if m == nil {
		m = make(map[*Conn]struct{})
		t.links.live[c.peer] = m
	}
	m[c] = struct{}{}
	return nil
}

// release forgets c, for Conn.Close.
func (t *Transport) release(c *Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.links.live[c.peer]; m != nil {
		delete(m, c)
		if len(m) == 0 {
			delete(t.links.live, c.peer)
		}
	}
}

// SetLinkMuted mutes this node's side of the link to node peerID when
// muted, or restores it: while it is muted, what this node writes on its
// connections with peerID, once their handshakes are done, stalls, as on
// a link cut one way TCP holds what it cannot deliver, while what peerID
// writes still arrives. Restored, the stalled writes go on in order; a
// write whose deadline passed meanwhile fails, as does every write on a
// connection closed meanwhile.
//
// It is a hook for fault tests, which cut links one way; handshakes pass,
// so a node whose side is muted still dials and accepts, and each of its
// new connections is muted in turn.
func (t *Transport) SetLinkMuted(peerID string, muted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	next := map[string]struct{}{}
	if cur := t.muted.Load(); cur != nil {
		maps.Copy(next, *cur)
	}
	if muted {
		next[peerID] = struct{}{}
	} else {
		delete(next, peerID)
	}
	if len(next) == 0 {
		t.muted.Store(nil)
		return
	}
	t.muted.Store(&next)
}

// mutable is a raw connection whose writes SetLinkMuted may stall: one
// atomic load per write when nothing is muted. Its peer is set once the
// handshake proved it; the handshake itself is never muted.
type mutable struct {
	net.Conn
	t      *Transport
	peer   atomic.Pointer[string]
	wdl    atomic.Int64 // the write deadline in Unix nanoseconds; 0: none
	closed atomic.Bool
}

// muteTick is how often a stalled write looks whether its link was
// restored.
const muteTick = 5 * time.Millisecond

func (m *mutable) muted() bool {
	cur, peer := m.t.muted.Load(), m.peer.Load()
	if cur == nil || peer == nil {
		return false
	}
	_, ok := (*cur)[*peer]
	return ok
}

// Write stalls while the link is muted, as TCP holds what it cannot
// deliver, until the link is restored, the connection is closed or its
// write deadline passes.
func (m *mutable) Write(b []byte) (int, error) {
	for m.muted() {
		if m.closed.Load() {
			return 0, net.ErrClosed
		}
		if dl := m.wdl.Load(); dl != 0 && time.Now().UnixNano() >= dl {
			return 0, os.ErrDeadlineExceeded
		}
		time.Sleep(muteTick)
	}
	return m.Conn.Write(b)
}

func (m *mutable) Close() error {
	m.closed.Store(true)
	return m.Conn.Close()
}

func (m *mutable) SetDeadline(t time.Time) error {
	m.setWriteDeadline(t)
	return m.Conn.SetDeadline(t)
}

func (m *mutable) SetWriteDeadline(t time.Time) error {
	m.setWriteDeadline(t)
	return m.Conn.SetWriteDeadline(t)
}

func (m *mutable) setWriteDeadline(t time.Time) {
	if t.IsZero() {
		m.wdl.Store(0)
		return
	}
	m.wdl.Store(t.UnixNano())
}
