package transport

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
