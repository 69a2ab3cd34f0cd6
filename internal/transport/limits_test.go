package transport

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/testlog"
)

// peerDialBound is how long a peer's dial may take while a flood runs.
const peerDialBound = 2 * time.Second

// TestTransport_FloodFromOneAddressLocksNoPeerOut: while an attacker
// without credentials opens hundreds of silent connections to both nodes
// from one loopback address, the real nodes on two others keep dialing
// each other, every dial within a bound, and the attacker's refusals are
// logged once, not per connection. Before connections were bounded per
// source, the flood held every one of the 64 handshake slots and the
// peers' dials were refused.
func TestTransport_FloodFromOneAddressLocksNoPeerOut(t *testing.T) {
	for _, c := range []struct{ attacker, p1, p2 string }{
		{"127.0.0.1", "127.0.0.2", "127.0.0.3"},
		{"127.0.0.3", "127.0.0.1", "127.0.0.2"},
	} {
		t.Run("From"+c.attacker, func(t *testing.T) {
			la, lb := &testlog.Lines{}, &testlog.Lines{}
			a := listenOn(t, c.p1, Config{NodeID: "a", Logger: slog.New(la)})
			b := listenOn(t, c.p2, Config{NodeID: "b", Logger: slog.New(lb)})
			accs := map[*Transport]*acceptor{a: accept(t, a, ProtoRPC), b: accept(t, b, ProtoRPC)}
			fa := startFlood(t, a.Addr().String(), []string{c.attacker}, 300)
			fb := startFlood(t, b.Addr().String(), []string{c.attacker}, 300)
			for fa.count() < 200 || fb.count() < 200 {
				time.Sleep(10 * time.Millisecond)
			}
			for i := range 20 {
				for _, d := range []struct {
					from, to *Transport
				}{{a, b}, {b, a}} {
					ctx, cancel := context.WithTimeout(context.Background(), peerDialBound)
					start := time.Now()
					conn, err := d.from.Dial(ctx, d.to.Addr().String(), ProtoRPC)
					cancel()
					if err != nil {
						t.Fatalf("dial %d %s→%s during the flood (%d, %d connections opened): %v", i, d.from.NodeID(), d.to.NodeID(), fa.count(), fb.count(), err)
					}
					if got := conn.LocalAddr().(*net.TCPAddr).IP.String(); got != strings.Split(d.from.Addr().String(), ":")[0] {
						t.Errorf("dialed from %s, not the bound address", got)
					}
					conn.Close()
					if el := time.Since(start); el > peerDialBound {
						t.Errorf("dial took %v", el)
					}
					<-accs[d.to].next
				}
			}
			fa.close()
			fb.close()
			t.Logf("flood opened %d and %d connections", fa.count(), fb.count())
			for _, l := range []*testlog.Lines{la, lb} {
				if n := len(l.Matching("from its source")); n != 1 {
					t.Errorf("%d lines about the refused flood, want 1: %q", n, l.Matching("from its source"))
				}
			}
		})
	}
}

// TestTransport_FloodFromManyAddressesLocksNoPeerOut: an attacker with 20
// addresses, each at its per-source bound, holds no more than
// MaxHandshakes slots in all, and a peer from another address still gets
// a slot, taken from an address that holds most.
func TestTransport_FloodFromManyAddressesLocksNoPeerOut(t *testing.T) {
	const total = 32
	b := listenOn(t, "127.0.0.2", Config{NodeID: "b", MaxHandshakes: total, MaxHandshakesPerSource: 4})
	a := listenOn(t, "127.0.0.3", Config{NodeID: "a"})
	acc := accept(t, b, ProtoRPC)
	var from []string
	for i := range 20 {
		from = append(from, fmt.Sprintf("127.0.1.%d", i+1))
	}
	f := startFlood(t, b.Addr().String(), from, 400)
	deadline := time.Now().Add(10 * time.Second)
	for f.count() < 300 || b.gate.taken() < total {
		if time.Now().After(deadline) {
			t.Fatalf("the flood holds %d slots after %d connections", b.gate.taken(), f.count())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop := make(chan struct{})
	most := make(chan int, 1)
	go func() {
		m := 0
		for {
			select {
			case <-stop:
				most <- m
				return
			default:
			}
			m = max(m, b.gate.taken())
			time.Sleep(time.Millisecond)
		}
	}()
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), peerDialBound)
		conn, err := a.Dial(ctx, b.Addr().String(), ProtoRPC)
		cancel()
		if err != nil {
			t.Fatalf("dial %d during the flood: %v", i, err)
		}
		conn.Close()
		<-acc.next
	}
	close(stop)
	if m := <-most; m > total {
		t.Fatalf("%d connections in their handshake, limit %d", m, total)
	}
}

// TestGate: the per-source and total bounds, and which slot a newcomer
// takes when all are taken.
func TestGate(t *testing.T) {
	conn := func(addr string) *fakeConn { return &fakeConn{remote: &net.TCPAddr{IP: net.ParseIP(addr), Port: 1}} }
	g := newGate(2, 4, nil)
	x1, x2, x3 := conn("10.0.0.1"), conn("10.0.0.1"), conn("10.0.0.1")
	s1, why := g.enter(x1)
	if why != admitted {
		t.Fatal(why)
	}
	if _, why := g.enter(x2); why != admitted {
		t.Fatal(why)
	}
	if _, why := g.enter(x3); why != overSource {
		t.Fatalf("third from one source: %v, want overSource", why)
	}
	// An IPv6 /64 is one source; IPv4-mapped addresses count as IPv4.
	if _, why := g.enter(conn("2001:db8::1")); why != admitted {
		t.Fatal(why)
	}
	if _, why := g.enter(conn("2001:db8::2")); why != admitted {
		t.Fatal(why)
	}
	if _, why := g.enter(conn("2001:db8::3")); why != overSource {
		t.Fatalf("third from one /64: %v, want overSource", why)
	}
	if _, why := g.enter(conn("::ffff:10.0.0.1")); why != overSource {
		t.Fatalf("IPv4-mapped: %v, want overSource", why)
	}
	// Full: a new source takes the oldest slot of one holding two.
	y := conn("10.0.0.2")
	sy, why := g.enter(y)
	if why != admitted || g.taken() != 4 {
		t.Fatalf("newcomer: %v, %d taken", why, g.taken())
	}
	if !x1.closed {
		t.Fatal("the oldest slot of the source holding most was not closed")
	}
	g.leave(s1) // evicted: a no-op
	if g.taken() != 4 {
		t.Fatalf("%d taken after an evicted slot left, want 4", g.taken())
	}
	// Sources holding one or two each: a newcomer takes from one holding
	// two, then, with every source at one more than it would hold, is
	// refused.
	if _, why := g.enter(conn("10.0.0.3")); why != admitted {
		t.Fatalf("second newcomer: %v", why)
	}
	if _, why := g.enter(conn("10.0.0.4")); why != overTotal {
		t.Fatalf("third newcomer: %v, want overTotal", why)
	}
	g.leave(sy)
	if _, why := g.enter(conn("10.0.0.4")); why != admitted {
		t.Fatalf("after a leave: %v", why)
	}
}

// TestGate_KnownSourcesApart: connections from known sources take slots
// of their own pool, under the same bounds, and neither pool takes slots
// from the other.
func TestGate_KnownSourcesApart(t *testing.T) {
	conn := func(addr string) *fakeConn { return &fakeConn{remote: &net.TCPAddr{IP: net.ParseIP(addr), Port: 1}} }
	node := netip.MustParseAddr("10.0.0.9")
	g := newGate(2, 2, func(ip netip.Addr) bool { return ip == node })
	u1, u2 := conn("10.0.1.1"), conn("10.0.1.2")
	for _, c := range []*fakeConn{u1, u2} {
		if _, why := g.enter(c); why != admitted {
			t.Fatal(why)
		}
	}
	if _, why := g.enter(conn("10.0.1.3")); why != overTotal {
		t.Fatalf("unknown newcomer with every slot at one: %v, want overTotal", why)
	}
	k1, k2 := conn("10.0.0.9"), conn("::ffff:10.0.0.9")
	for _, c := range []*fakeConn{k1, k2} {
		if _, why := g.enter(c); why != admitted {
			t.Fatalf("known source with the unknown pool full: %v", why)
		}
	}
	if _, why := g.enter(conn("10.0.0.9")); why != overSource {
		t.Fatalf("third from a known source: %v, want overSource", why)
	}
	if u1.closed || u2.closed || k1.closed || k2.closed || g.taken() != 4 {
		t.Fatalf("a pool took a slot of the other: %d taken", g.taken())
	}
}

// TestLogLimit: one line per source and interval, counting the ones held
// back, and a bounded memory of sources.
func TestLogLimit(t *testing.T) {
	l := logLimit{interval: time.Minute}
	src := sourceOf(&net.TCPAddr{IP: net.ParseIP("10.0.0.1")})
	now := time.Now()
	if ok, _ := l.allow(src, now); !ok {
		t.Fatal("first line held back")
	}
	for range 100 {
		if ok, _ := l.allow(src, now.Add(time.Second)); ok {
			t.Fatal("line within the interval let through")
		}
	}
	if ok, held := l.allow(src, now.Add(time.Minute)); !ok || held != 100 {
		t.Fatalf("after the interval: %v, %d held, want true, 100", ok, held)
	}
	for i := range 2 * logLimitSources {
		l.allow(sourceOf(&net.TCPAddr{IP: net.IPv4(10, 1, byte(i>>8), byte(i))}), now.Add(time.Minute))
	}
	if len(l.seen) > logLimitSources {
		t.Fatalf("%d sources remembered, limit %d", len(l.seen), logLimitSources)
	}
}

// TestTransport_DialFromBindAddress: a transport bound to a specific
// address dials from it; one bound to the unspecified address lets the
// system choose.
func TestTransport_DialFromBindAddress(t *testing.T) {
	b := listenOn(t, "127.0.0.2", Config{NodeID: "b"})
	acc := accept(t, b, ProtoRPC)
	for _, c := range []struct{ bind, want string }{{"127.0.0.3", "127.0.0.3"}, {"0.0.0.0", "127.0.0.1"}} {
		a := listenOn(t, c.bind, Config{NodeID: "a"})
		conn, err := a.Dial(context.Background(), b.Addr().String(), ProtoRPC)
		if err != nil {
			t.Fatal(err)
		}
		s := <-acc.next
		if got := s.RemoteAddr().(*net.TCPAddr).IP.String(); got != c.want {
			t.Errorf("bound to %s: dialed from %s, want %s", c.bind, got, c.want)
		}
		conn.Close()
	}
}

// fakeConn is a net.Conn with a remote address that records Close.
type fakeConn struct {
	net.Conn
	remote net.Addr
	closed bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) Close() error         { c.closed = true; return nil }
