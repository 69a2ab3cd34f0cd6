package cluster

import (
	"net/netip"
)

// knownSource says whether ip is the address of a node this node knows:
// one in the saved address book, in the metadata state (once the
// metadata group is open) or among the configured seeds. The transport
// gives connections from these addresses handshake slots of their own
// (transport.Config.KnownSource), which no flood from other addresses can
// take. Addresses given as host names are not resolved, so they count
// for nothing here; a node dialing from an address not yet known competes
// with every other source. Called from the transport's accept goroutine
// for every connection: it reads atomics and the state, takes no lock of
// the agent and never blocks.
func (n *Agent) knownSource(ip netip.Addr) bool {
	is := func(addr string) bool {
		ap, err := netip.ParseAddrPort(addr)
		return err == nil && ap.Addr().Unmap().WithZone("") == ip
	}
	if book := n.book.Load(); book != nil {
		for _, addr := range *book {
			if is(addr) {
				return true
			}
		}
	}
	if m := n.metaRef.Load(); m != nil {
		for _, nd := range m.State().Nodes() {
			if is(nd.Addr) {
				return true
			}
		}
	}
	for _, addr := range n.cfg.Seeds {
		if is(addr) {
			return true
		}
	}
	return false
}
