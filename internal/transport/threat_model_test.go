package transport

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/testlog"
)

// TestThreatModel_Transport is the rows of docs/DESIGN.md's threat model
// that the port answers alone, against a node running mutual TLS:
// someone with neither a certificate of the cluster's CA nor the secret,
// someone with the secret only, someone with a CA certificate only. Each
// tries what it must not do and is refused with a log line naming its
// source or its claimed id, and no connection reaches the node's
// protocols. (The identities that hold both are TestThreatModel_Cluster's,
// in internal/cluster, and TestThreatModel_Nodes', in package mq.)
func TestThreatModel_Transport(t *testing.T) {
	ca := newCA(t)
	cases := []struct {
		identity, op string
		host         string // the node's address; 127.0.0.1 if ""
		attack       func(t *testing.T, b *Transport)
		want         []string // parts of the node's log line
		accepted     int      // connections the node's protocol gets: a real peer's
	}{
		{"Neither", "HandshakeWithSelfSignedCert", "", func(t *testing.T, b *Transport) {
			own := newCA(t) // a self-signed chain the node does not trust
			st, ct := own.tlsFor(own.leaf(t, "x9"))
			x := listen(t, Config{NodeID: "x9", Secret: wrongSecret, ServerTLS: st, ClientTLS: ct})
			refusedDial(t, x, b)
		}, []string{"transport: refused connection", "remote=127.0.0.1", "certificate"}, 0},
		{"Neither", "HandshakeInPlaintext", "", func(t *testing.T, b *Transport) {
			c, err := net.Dial("tcp", b.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			h := hello{nonce: freshNonce(), id: "x9"}
			c.Write(h.marshal(false))
			waitClosed(t, c, 5*time.Second)
		}, []string{"transport: refused connection", "remote=127.0.0.1"}, 0},
		{"Neither", "FloodHandshakesFromOneAddress", "127.0.0.2", func(t *testing.T, b *Transport) {
			st, ct := ca.tlsFor(ca.leaf(t, "n2"))
			peer := listenOn(t, "127.0.0.3", Config{NodeID: "n2", ServerTLS: st, ClientTLS: ct})
			f := startFlood(t, b.Addr().String(), []string{"127.0.0.1"}, 300)
			for f.count() < 200 {
				time.Sleep(10 * time.Millisecond)
			}
			for i := range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), peerDialBound)
				conn, err := peer.Dial(ctx, b.Addr().String(), ProtoRPC)
				cancel()
				if err != nil {
					t.Fatalf("the peer's dial %d during the flood (%d connections opened): %v", i, f.count(), err)
				}
				conn.Close()
			}
			f.close()
		}, []string{"too many handshakes in progress from its source", "remote=127.0.0.1"}, 10},
		{"SecretOnly", "HandshakeWithSelfSignedCert", "", func(t *testing.T, b *Transport) {
			own := newCA(t)
			st, ct := own.tlsFor(own.leaf(t, "x9"))
			x := listen(t, Config{NodeID: "x9", ServerTLS: st, ClientTLS: ct})
			refusedDial(t, x, b)
		}, []string{"transport: refused connection", "remote=127.0.0.1", "certificate"}, 0},
		{"SecretOnly", "HandshakeInPlaintext", "", func(t *testing.T, b *Transport) {
			x := listen(t, Config{NodeID: "x9"}) // InsecurePlaintext, the true secret
			refusedDial(t, x, b)
		}, []string{"transport: refused connection", "remote=127.0.0.1"}, 0},
		{"CACertOnly", "HandshakeWithWrongSecret", "", func(t *testing.T, b *Transport) {
			st, ct := ca.tlsFor(ca.leaf(t, "x9"))
			x := listen(t, Config{NodeID: "x9", Secret: wrongSecret, ServerTLS: st, ClientTLS: ct})
			refusedDial(t, x, b)
		}, []string{"transport: refused connection", `"x9"`}, 0},
		{"CACertOnly", "ReadsNoProofBeforeItsOwn", "", func(t *testing.T, b *Transport) {
			// What the node sends a dialer that does not prove the secret
			// is its hello alone (nonce, id, a share uniformly random
			// whatever the secret), then nothing: no confirmation to test
			// a guess against offline.
			_, ct := ca.tlsFor(ca.leaf(t, "x9"))
			ct.MinVersion, ct.ServerName = tls.VersionTLS13, "n1"
			tc, err := tls.Dial("tcp", b.Addr().String(), ct)
			if err != nil {
				t.Fatal(err)
			}
			defer tc.Close()
			dh := hello{nonce: freshNonce(), id: "x9"}
			if _, err := tc.Write(dh.marshal(false)); err != nil {
				t.Fatal(err)
			}
			sent := readQuiet(t, tc, 300*time.Millisecond)
			if len(sent) != listenHelloSize {
				t.Fatalf("the node sent %d bytes before x9's proof, want its hello (%d)", len(sent), listenHelloSize)
			}
			if _, err := dialerFinish(tc, wrongSecret, dh, sent, ProtoRPC); err != nil {
				t.Fatal(err)
			}
			if more := waitClosed(t, tc, 5*time.Second); len(more) != 0 {
				t.Fatalf("the node answered a wrong proof with %d bytes", len(more))
			}
		}, []string{"transport: refused connection", `"x9"`}, 0},
	}
	for _, c := range cases {
		t.Run(c.identity+"/"+c.op, func(t *testing.T) {
			logs := &testlog.Lines{}
			st, ct := ca.tlsFor(ca.leaf(t, "n1"))
			host := c.host
			if host == "" {
				host = "127.0.0.1"
			}
			b := listenOn(t, host, Config{NodeID: "n1", ServerTLS: st, ClientTLS: ct,
				HandshakeTimeout: time.Second, Logger: slog.New(logs)})
			acc := accept(t, b, ProtoRPC)
			c.attack(t, b)
			deadline := time.Now().Add(10 * time.Second)
			for len(logs.Matching(c.want...)) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("no log line holding %q in:\n%s", c.want, logs.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			b.Close()
			if n := acc.count(); n != c.accepted {
				t.Fatalf("%d connections reached the node's protocol, want %d", n, c.accepted)
			}
		})
	}
}

// refusedDial fails t unless x's dial to b fails.
func refusedDial(t testing.TB, x, b *Transport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := x.Dial(ctx, b.Addr().String(), ProtoRPC); err == nil {
		c.Close()
		t.Fatalf("%s's dial succeeded", x.NodeID())
	}
}
