package transport

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/testlog"
)

// refused is the refusals a transport logged.
func refused(logs *testlog.Lines) []string {
	var out []string
	for _, l := range logs.Matching("transport: refused connection") {
		if strings.HasPrefix(l, "transport: refused connection") {
			out = append(out, l)
		}
	}
	return out
}

// refusalAllocLimit bounds what one refused connection allocates, in the
// listener and the attacker together: the handshake reads fixed-size
// messages only, whatever MaxFrameBytes is.
const refusalAllocLimit = 1 << 20

// TestTransport_RefusalsLogged: every connection the listener refuses
// (wrong secret, a replayed handshake, bytes that are no handshake, a peer
// sending a byte at a time, no client certificate, a certificate of another
// CA or naming another node) leaves one log line naming why, allocates
// little (runtime.MemStats), and nothing is accepted.
func TestTransport_RefusalsLogged(t *testing.T) {
	ca := newCA(t)
	rawDial := func(t *testing.T, b *Transport) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", b.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	cases := []struct {
		name   string
		tls    bool
		ok     int // connections accepted: the replay's original only
		attack func(t *testing.T, b *Transport)
		want   string // in the refusal's line
	}{
		{"WrongSecret", false, 0, func(t *testing.T, b *Transport) {
			a := listen(t, Config{NodeID: "a", Secret: []byte("4d7e1a9c3f6b0e2d8a5c7f1b3e9d0a6c2f4b8e1d7a3c5f9b")})
			a.Dial(context.Background(), b.Addr().String(), ProtoRPC)
		}, `claiming "a"`},
		{"Replay", false, 1, func(t *testing.T, b *Transport) {
			rec := &recorder{Conn: rawDial(t, b)}
			if _, err := handshakeDialer(rec, nil, "a", secret, ProtoRPC); err != nil {
				t.Fatal(err)
			}
			again := rawDial(t, b)
			again.Write(rec.wrote.Bytes())
			waitClosed(t, again, 5*time.Second)
		}, "does not hold"},
		{"Garbage", false, 0, func(t *testing.T, b *Transport) {
			c := rawDial(t, b)
			c.Write([]byte(strings.Repeat("garbage!", 64)))
			waitClosed(t, c, 5*time.Second)
		}, "err="},
		{"ByteAtATime", false, 0, func(t *testing.T, b *Transport) {
			c := rawDial(t, b)
			h := hello{nonce: freshNonce(), id: "a"}
			for _, x := range h.marshal(false) {
				if _, err := c.Write([]byte{x}); err != nil {
					return // closed: the deadline passed
				}
				time.Sleep(50 * time.Millisecond)
			}
		}, "timeout"},
		{"NoClientCert", true, 0, func(t *testing.T, b *Transport) {
			tc, err := tls.Dial("tcp", b.Addr().String(), &tls.Config{RootCAs: ca.pool, ServerName: "b", MinVersion: tls.VersionTLS13})
			if err == nil {
				handshakeDialer(tc, tc, "a", secret, ProtoRPC)
				tc.Close()
			}
		}, "certificate"},
		{"WrongCA", true, 0, func(t *testing.T, b *Transport) {
			ast, act := ca.tlsFor(newCA(t).leaf(t, "a"))
			a := listen(t, Config{NodeID: "a", ServerTLS: ast, ClientTLS: act})
			a.Dial(context.Background(), b.Addr().String(), ProtoRPC)
		}, "certificate"},
		{"CertNamesOther", true, 0, func(t *testing.T, b *Transport) {
			ast, act := ca.tlsFor(ca.leaf(t, "a"))
			a := listen(t, Config{NodeID: "a", ServerTLS: ast, ClientTLS: act})
			var err error
			if a.serverTLS, a.clientTLS, err = tlsConfigs(ca.tlsFor(ca.leaf(t, "c"))); err != nil {
				t.Fatal(err)
			}
			a.Dial(context.Background(), b.Addr().String(), ProtoRPC)
		}, "a"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			logs := &testlog.Lines{}
			cfg := Config{NodeID: "b", HandshakeTimeout: 500 * time.Millisecond, Logger: slog.New(logs)}
			if c.tls {
				cfg.ServerTLS, cfg.ClientTLS = ca.tlsFor(ca.leaf(t, "b"))
			}
			b := listen(t, cfg)
			acc := accept(t, b, ProtoRPC)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			c.attack(t, b)
			deadline := time.Now().Add(10 * time.Second)
			for len(refused(logs)) == 0 && time.Now().Before(deadline) { // the replay's original is not refused
				time.Sleep(10 * time.Millisecond)
			}
			runtime.ReadMemStats(&after)
			// Both ends of the attack are in this process: the attacker's
			// transport, TLS and certificates count too.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > refusalAllocLimit {
				t.Errorf("the refused attack allocated %d bytes, limit %d", alloc, refusalAllocLimit)
			} else {
				t.Logf("allocated %d KiB", alloc>>10)
			}
			got := refused(logs)
			if len(got) == 0 {
				t.Fatal("no refusal logged")
			}
			t.Logf("logged: %s", got[0])
			if !strings.Contains(got[0], c.want) {
				t.Errorf("refusal %q does not name %q", got[0], c.want)
			}
			// The replay's original finished its handshake on the dialer's
			// side before the listener hands it to Accept.
			for acc.count() < c.ok && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			b.Close()
			if n := acc.count(); n != c.ok {
				t.Fatalf("%d connections accepted, want %d", n, c.ok)
			}
		})
	}
}
