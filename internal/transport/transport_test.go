package transport

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/internal/wire"
)

func TestListen_Config(t *testing.T) {
	ca := newCA(t)
	st, ct := ca.tlsFor(ca.leaf(t, "a"))
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"NoNodeID", Config{Secret: secret}, "node id"},
		{"BadNodeID", Config{NodeID: "a b", Secret: secret}, "node id"},
		{"LongNodeID", Config{NodeID: strings.Repeat("a", MaxNodeIDLen+1), Secret: secret}, "node id"},
		{"NoSecret", Config{NodeID: "a"}, "secret"},
		{"ShortSecret", Config{NodeID: "a", Secret: secret[:MinSecretLen-1]}, "secret"},
		{"ServerTLSOnly", Config{NodeID: "a", Secret: secret, ServerTLS: st}, "together"},
		{"NoClientCAs", Config{NodeID: "a", Secret: secret, ServerTLS: &tls.Config{Certificates: st.Certificates}, ClientTLS: ct}, "ClientCAs"},
		{"NoRootCAs", Config{NodeID: "a", Secret: secret, ServerTLS: st, ClientTLS: &tls.Config{Certificates: ct.Certificates}}, "RootCAs"},
		{"NoTLS", Config{NodeID: "a", Secret: secret}, "no TLS"},
		{"OwnCertNamesAnother", Config{NodeID: "b", Secret: secret, ServerTLS: st, ClientTLS: ct}, "not this node's id"},
		{"OwnCertServerOnly", func() Config {
			st, ct := ca.tlsFor(ca.leafFor(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, "a"))
			return Config{NodeID: "a", Secret: secret, ServerTLS: st, ClientTLS: ct}
		}(), "both ends"},
		{"TLSAndPlaintext", Config{NodeID: "a", Secret: secret, ServerTLS: st, ClientTLS: ct, InsecurePlaintext: true}, "choose one"},
		{"RepeatedSecret", Config{NodeID: "a", Secret: []byte(strings.Repeat("ab", 32)), InsecurePlaintext: true}, "random bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Bind = "127.0.0.1:0"
			tr, err := Listen(c.cfg)
			if err == nil {
				tr.Close()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

// pair returns transports "a" and "b", with TLS if ca is not nil.
func pair(t *testing.T, ca *testCA) (a, b *Transport) {
	cfg := func(id string) Config {
		c := Config{NodeID: id}
		if ca != nil {
			c.ServerTLS, c.ClientTLS = ca.tlsFor(ca.leaf(t, id))
		}
		return c
	}
	return listen(t, cfg("a")), listen(t, cfg("b"))
}

func TestTransport_Dial(t *testing.T) {
	for _, mode := range []string{"Plain", "TLS"} {
		t.Run(mode, func(t *testing.T) {
			var ca *testCA
			if mode == "TLS" {
				ca = newCA(t)
			}
			a, b := pair(t, ca)
			acc := accept(t, b, ProtoRaft)
			c, err := a.Dial(context.Background(), b.Addr().String(), ProtoRaft)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.PeerID() != "b" || c.Proto() != ProtoRaft {
				t.Fatalf("dialed %q proto %d", c.PeerID(), c.Proto())
			}
			if _, isTLS := c.Conn.(*tls.Conn); isTLS != (ca != nil) {
				t.Fatalf("dialed conn is TLS: %v", isTLS)
			}
			s := <-acc.next
			if s.PeerID() != "a" || s.Proto() != ProtoRaft {
				t.Fatalf("accepted %q proto %d", s.PeerID(), s.Proto())
			}
			if err := c.WriteFrame(wire.Frame{ReqID: 7, Op: 3, Payload: []byte("ping")}); err != nil {
				t.Fatal(err)
			}
			f, err := s.FrameReader().ReadFrame()
			if err != nil || f.ReqID != 7 || f.Op != 3 || string(f.Payload) != "ping" {
				t.Fatalf("read %+v, %v", f, err)
			}
		})
	}
}

func TestTransport_WrongSecret(t *testing.T) {
	for _, side := range []string{"Dialer", "Listener"} {
		t.Run(side, func(t *testing.T) {
			other := []byte("4d7e1a9c3f6b0e2d8a5c7f1b3e9d0a6c2f4b8e1d7a3c5f9b")
			da, lb := Config{NodeID: "a"}, Config{NodeID: "b"}
			if side == "Dialer" {
				da.Secret = other
			} else {
				lb.Secret = other
			}
			a, b := listen(t, da), listen(t, lb)
			acc := accept(t, b, ProtoRPC)
			_, err := a.Dial(context.Background(), b.Addr().String(), ProtoRPC)
			if !errors.Is(err, ErrHandshake) {
				t.Fatalf("dial: %v, want ErrHandshake", err)
			}
			b.Close()
			if n := acc.count(); n != 0 {
				t.Fatalf("%d connections accepted", n)
			}
		})
	}
}

func TestTransport_UnknownProto(t *testing.T) {
	a, b := pair(t, nil)
	acc := accept(t, b, ProtoRaft)
	for _, p := range []Proto{ProtoRPC, 0, 255} {
		if _, err := a.Dial(context.Background(), b.Addr().String(), p); !errors.Is(err, ErrHandshake) {
			t.Fatalf("proto %d: %v, want ErrHandshake", p, err)
		}
	}
	b.Close()
	if n := acc.count(); n != 0 {
		t.Fatalf("%d connections accepted", n)
	}
}

// recorder keeps what is written through it.
type recorder struct {
	net.Conn
	wrote bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote.Write(b)
	return r.Conn.Write(b)
}

func TestTransport_Replay(t *testing.T) {
	_, b := pair(t, nil)
	acc := accept(t, b, ProtoRPC)
	raw, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Conn: raw}
	if _, err := handshakeDialer(rec, nil, "a", secret, ProtoRPC); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	<-acc.next

	// The dialer's bytes of that handshake, sent again: the listener's new
	// nonce makes the recorded proof wrong.
	again, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, err := again.Write(rec.wrote.Bytes()); err != nil {
		t.Fatal(err)
	}
	got := waitClosed(t, again, 5*time.Second)
	if len(got) != listenHelloSize {
		t.Fatalf("replay read %d bytes, want only the listener's hello (%d)", len(got), listenHelloSize)
	}
	b.Close()
	if n := acc.count(); n != 1 {
		t.Fatalf("%d connections accepted, want the first only", n)
	}
}

// TestTransport_Reflection: the listener's own proof, sent back as the
// dialer's, does not pass (the labels differ).
func TestTransport_Reflection(t *testing.T) {
	_, b := pair(t, nil)
	acc := accept(t, b, ProtoRPC)
	raw, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	h := hello{nonce: freshNonce(), id: "a"}
	if _, err := raw.Write(h.marshal(false)); err != nil {
		t.Fatal(err)
	}
	var in [listenHelloSize]byte
	if _, err := io.ReadFull(raw, in[:]); err != nil {
		t.Fatal(err)
	}
	lh, err := parseHello(in[:])
	if err != nil {
		t.Fatal(err)
	}
	// The listener's share as the dialer's, and a confirmation made by
	// the key that share gives without the secret: the labels and the
	// shares differ.
	fin := append(lh.share[:], make([]byte, macSize)...)
	if _, err := raw.Write(append(fin, byte(ProtoRPC))); err != nil {
		t.Fatal(err)
	}
	if got := waitClosed(t, raw, 5*time.Second); len(got) != 0 {
		t.Fatalf("reflected proof got %x", got)
	}
	b.Close()
	if n := acc.count(); n != 0 {
		t.Fatalf("%d connections accepted", n)
	}
}

func TestTransport_HostilePeer(t *testing.T) {
	h := hello{nonce: freshNonce(), id: "a"}
	cases := []struct {
		name string
		send []byte
	}{
		{"Garbage", bytes.Repeat([]byte("garbage!"), 64)},
		{"HugeLength", append([]byte{0xff, 0xff, 0xff, 0xff}, make([]byte, dialHelloSize)...)},
		{"MsgpackPrefix", append([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, make([]byte, dialHelloSize)...)},
		{"TLSHello", append([]byte{0x16, 0x03, 0x01, 0x02, 0x00}, make([]byte, dialHelloSize)...)},
		{"BadVersion", func() []byte { b := h.marshal(false); b[4] = 9; return b }()},
		{"BadIDPadding", func() []byte { b := h.marshal(false); b[len(b)-1] = 'x'; return b }()},
		{"StallMidHello", h.marshal(false)[:40]},
		{"StallBeforeFinish", h.marshal(false)},
		{"StallMidFinish", append(h.marshal(false), 1, 2, 3)},
		{"Nothing", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := listen(t, Config{NodeID: "b", HandshakeTimeout: 300 * time.Millisecond})
			acc := accept(t, b, ProtoRPC)
			raw, err := net.Dial("tcp", b.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			fuzzseed.CheckAlloc(t, len(c.send), func() {
				if _, err := raw.Write(c.send); err != nil {
					t.Fatal(err)
				}
				got := waitClosed(t, raw, 5*time.Second)
				if len(got) > listenHelloSize {
					t.Fatalf("read %d bytes: more than the listener's hello", len(got))
				}
			})
			b.Close()
			if n := acc.count(); n != 0 {
				t.Fatalf("%d connections accepted", n)
			}
		})
	}
}

func TestTransport_TLS(t *testing.T) {
	ca := newCA(t)
	cases := []struct {
		name     string
		dialCert []string // DNS SANs of the dialer's certificate
		lisCert  []string
		dialCA   *testCA // the CA the dialer's certificate is from
	}{
		{"DialerNamesOther", []string{"c"}, []string{"b"}, ca},
		{"ListenerNamesOther", []string{"a"}, []string{"c"}, ca},
		{"DialerNamesNone", nil, []string{"b"}, ca},
		{"DialerWrongCA", []string{"a"}, []string{"b"}, newCA(t)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Listen refuses a certificate that does not name its own
			// node: each side starts right, then presents the one of
			// the case, as a peer that is not a Transport could.
			ast, act := ca.tlsFor(ca.leaf(t, "a"))
			a := listen(t, Config{NodeID: "a", ServerTLS: ast, ClientTLS: act})
			bst, bct := ca.tlsFor(ca.leaf(t, "b"))
			b := listen(t, Config{NodeID: "b", ServerTLS: bst, ClientTLS: bct})
			var err error
			if a.serverTLS, a.clientTLS, err = tlsConfigs(ca.tlsFor(c.dialCA.leaf(t, c.dialCert...))); err != nil {
				t.Fatal(err)
			}
			if b.serverTLS, b.clientTLS, err = tlsConfigs(ca.tlsFor(ca.leaf(t, c.lisCert...))); err != nil {
				t.Fatal(err)
			}
			acc := accept(t, b, ProtoRPC)
			if _, err := a.Dial(context.Background(), b.Addr().String(), ProtoRPC); err == nil {
				t.Fatal("dial succeeded")
			}
			b.Close()
			if n := acc.count(); n != 0 {
				t.Fatalf("%d connections accepted", n)
			}
		})
	}
	t.Run("NoClientCert", func(t *testing.T) {
		bst, bct := ca.tlsFor(ca.leaf(t, "b"))
		b := listen(t, Config{NodeID: "b", ServerTLS: bst, ClientTLS: bct})
		acc := accept(t, b, ProtoRPC)
		tc, err := tls.Dial("tcp", b.Addr().String(), &tls.Config{RootCAs: ca.pool, ServerName: "b", MinVersion: tls.VersionTLS13})
		if err == nil {
			// TLS 1.3 reports the refused certificate on the first read.
			_, err = handshakeDialer(tc, tc, "a", secret, ProtoRPC)
			tc.Close()
		}
		if err == nil {
			t.Fatal("handshake without a client certificate succeeded")
		}
		b.Close()
		if n := acc.count(); n != 0 {
			t.Fatalf("%d connections accepted", n)
		}
	})
	t.Run("PlainToTLS", func(t *testing.T) {
		bst, bct := ca.tlsFor(ca.leaf(t, "b"))
		b := listen(t, Config{NodeID: "b", ServerTLS: bst, ClientTLS: bct})
		acc := accept(t, b, ProtoRPC)
		a := listen(t, Config{NodeID: "a"})
		if _, err := a.Dial(context.Background(), b.Addr().String(), ProtoRPC); err == nil {
			t.Fatal("plain dial to a TLS listener succeeded")
		}
		b.Close()
		if n := acc.count(); n != 0 {
			t.Fatalf("%d connections accepted", n)
		}
	})
}

// silent accepts TCP connections and never answers, until Cleanup.
func silent(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

func TestTransport_DialEnds(t *testing.T) {
	addr := silent(t)
	t.Run("Deadline", func(t *testing.T) {
		a := listen(t, Config{NodeID: "a"})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := a.Dial(ctx, addr, ProtoRPC); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("dial: %v, want DeadlineExceeded", err)
		}
	})
	t.Run("Cancel", func(t *testing.T) {
		a := listen(t, Config{NodeID: "a"})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		if _, err := a.Dial(ctx, addr, ProtoRPC); !errors.Is(err, context.Canceled) {
			t.Fatalf("dial: %v, want Canceled", err)
		}
	})
	t.Run("HandshakeTimeout", func(t *testing.T) {
		a := listen(t, Config{NodeID: "a", HandshakeTimeout: 100 * time.Millisecond})
		if _, err := a.Dial(context.Background(), addr, ProtoRPC); err == nil {
			t.Fatal("dial succeeded")
		}
	})
	t.Run("Close", func(t *testing.T) {
		a := listen(t, Config{NodeID: "a"})
		time.AfterFunc(100*time.Millisecond, func() { a.Close() })
		if _, err := a.Dial(context.Background(), addr, ProtoRPC); !errors.Is(err, ErrClosed) {
			t.Fatalf("dial: %v, want ErrClosed", err)
		}
		if _, err := a.Dial(context.Background(), addr, ProtoRPC); !errors.Is(err, ErrClosed) {
			t.Fatalf("dial after Close: %v, want ErrClosed", err)
		}
	})
}

// TestTransport_CloseInFlight: Close with handshakes stalled, connections
// waiting for an Accept nobody calls, and an Accept blocked, returns, and
// leaves no goroutine (goleak in TestMain).
func TestTransport_CloseInFlight(t *testing.T) {
	a, b := pair(t, nil)
	l, err := b.Listener(ProtoRPC)
	if err != nil {
		t.Fatal(err)
	}
	lr, err := b.Listener(ProtoRaft)
	if err != nil {
		t.Fatal(err)
	}
	var raws []net.Conn
	for range 5 {
		raw, err := net.Dial("tcp", b.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		raws = append(raws, raw)
	}
	dialed := make(chan error, 3)
	for range 3 {
		go func() {
			c, err := a.Dial(context.Background(), b.Addr().String(), ProtoRaft)
			if err == nil {
				c.Close()
			}
			dialed <- err
		}()
	}
	for range 3 { // handshakes done: nobody accepts ProtoRaft
		if err := <-dialed; err != nil {
			t.Fatal(err)
		}
	}
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	done := make(chan error, 1)
	go func() { done <- b.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := <-accepted; !errors.Is(err, net.ErrClosed) || !errors.Is(err, ErrClosed) {
		t.Fatalf("accept: %v", err)
	}
	if _, err := lr.Accept(); !errors.Is(err, ErrClosed) {
		t.Fatalf("accept after Close: %v", err)
	}
	for _, raw := range raws {
		waitClosed(t, raw, 5*time.Second)
	}
	if _, err := b.Listener(ProtoRepl); !errors.Is(err, ErrClosed) {
		t.Fatalf("Listener after Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestTransport_Listener(t *testing.T) {
	_, b := pair(t, nil)
	l, err := b.Listener(ProtoRPC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Listener(ProtoRPC); !errors.Is(err, ErrProtoTaken) {
		t.Fatalf("second Listener: %v", err)
	}
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after Close: %v", err)
	}
	l2, err := b.Listener(ProtoRPC)
	if err != nil {
		t.Fatalf("Listener after the first's Close: %v", err)
	}
	l2.Close()
}

func TestTransport_TooManyHandshakes(t *testing.T) {
	b := listen(t, Config{NodeID: "b", MaxHandshakes: 2, HandshakeTimeout: 5 * time.Second})
	a := listen(t, Config{NodeID: "a"})
	acc := accept(t, b, ProtoRPC)
	var raws []net.Conn
	for range 2 {
		raw, err := net.Dial("tcp", b.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		raws = append(raws, raw)
	}
	// The two stalled handshakes hold every slot: poll until a dial is
	// refused, then free the slots and dial again.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := a.Dial(context.Background(), b.Addr().String(), ProtoRPC)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("dials not refused with every handshake slot taken")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, raw := range raws {
		raw.Close()
	}
	for {
		c, err := a.Dial(context.Background(), b.Addr().String(), ProtoRPC)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial after the slots were freed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = acc
}

// TestCheckSecret: random bytes and their hex and base64 pass; short,
// repeated and word-like secrets are refused, saying what is wanted.
func TestCheckSecret(t *testing.T) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	ok := map[string][]byte{
		"Raw32":    raw,
		"Hex32":    []byte(hex.EncodeToString(raw)),
		"Base64":   []byte(base64.StdEncoding.EncodeToString(raw)),
		"TestOnes": secret,
	}
	for name, s := range ok {
		if err := CheckSecret(s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	weak := map[string][]byte{
		"Empty":     nil,
		"Raw31":     raw[:31],
		"Repeated":  []byte(strings.Repeat("x", 64)),
		"TwoBytes":  []byte(strings.Repeat("01", 40)),
		"Phrase":    []byte("our-cluster-secret-our-cluster-secret"),
		"Hex16Only": []byte(hex.EncodeToString(raw[:16]))[:31],
	}
	for name, s := range weak {
		err := CheckSecret(s)
		if !errors.Is(err, ErrWeakSecret) || !strings.Contains(err.Error(), "32 random bytes") {
			t.Errorf("%s: %v, want ErrWeakSecret saying what is wanted", name, err)
		}
	}
}
