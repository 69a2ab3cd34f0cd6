package transport

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// TestTransport_FloodFromMaxHandshakesAddressesLocksNoPeerOut: an attacker
// without credentials holding one silent connection from each of
// MaxHandshakes addresses (an IPv6 attacker has that many /64s in a /58)
// fills every handshake slot with one slot per source. A newcomer from
// another source takes a slot only from a source holding more than one,
// so no peer gets in: each of its dials is closed at once, for as long as
// the attacker re-opens a connection when one times out. A peer from an
// address the listener knows (KnownSource) must still get through.
func TestTransport_FloodFromMaxHandshakesAddressesLocksNoPeerOut(t *testing.T) {
	const total = 16
	peer := netip.MustParseAddr("127.0.0.3")
	b := listenOn(t, "127.0.0.2", Config{NodeID: "b", MaxHandshakes: total,
		KnownSource: func(ip netip.Addr) bool { return ip == peer }})
	a := listenOn(t, "127.0.0.3", Config{NodeID: "a"})
	acc := accept(t, b, ProtoRPC)
	var from []string
	for i := range total {
		from = append(from, fmt.Sprintf("127.0.2.%d", i+1))
	}
	f := startFlood(t, b.Addr().String(), from, 400)
	deadline := time.Now().Add(10 * time.Second)
	for b.gate.taken() < total {
		if time.Now().After(deadline) {
			t.Fatalf("the flood holds %d slots after %d connections", b.gate.taken(), f.count())
		}
		time.Sleep(5 * time.Millisecond)
	}
	failed := 0
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), peerDialBound)
		conn, err := a.Dial(ctx, b.Addr().String(), ProtoRPC)
		cancel()
		if err != nil {
			failed++
			t.Logf("dial %d during the flood: %v", i, err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		conn.Close()
		<-acc.next
	}
	if failed > 0 {
		t.Errorf("%d of 10 dials of a peer from another address failed while %d attacker addresses held one slot each", failed, total)
	}
}
