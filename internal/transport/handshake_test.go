package transport

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gtank/ristretto255"
)

var wrongSecret = []byte("4d7e1a9c3f6b0e2d8a5c7f1b3e9d0a6c2f4b8e1d7a3c5f9b")

// TestHandshake_ListenerGivesNoOracle: a dialer without the secret records
// everything the listener sends before the dialer proves anything, and
// tries each candidate secret every way those bytes allow: as a MAC of
// the handshake under the secret, and as a key confirmation under the
// key its own share gives with that candidate. Neither the true secret nor
// a wrong one verifies, so the bytes let no guess be tested offline. With
// handshake version 1 the listener's hello carried HMAC(secret, handshake),
// which the first check matched for the true secret: anyone could dial
// and test about 500k guesses a second offline.
func TestHandshake_ListenerGivesNoOracle(t *testing.T) {
	b := listen(t, Config{NodeID: "b"})
	acc := accept(t, b, ProtoRPC)
	raw, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	dh := hello{nonce: freshNonce(), id: "a"}
	if _, err := raw.Write(dh.marshal(false)); err != nil {
		t.Fatal(err)
	}
	sent := readQuiet(t, raw, 300*time.Millisecond)
	if len(sent) != listenHelloSize {
		t.Fatalf("the listener sent %d bytes before the dialer's proof, want its hello (%d)", len(sent), listenHelloSize)
	}
	for _, c := range []struct {
		name   string
		secret []byte
	}{{"TrueSecret", secret}, {"WrongSecret", wrongSecret}} {
		if what := testGuess(c.secret, dh, sent); what != "" {
			t.Errorf("%s: the listener's bytes verify it as %s", c.name, what)
		}
	}

	// The check is not blind: once the dialer proves the secret, the
	// listener's confirmation verifies the true secret and only it.
	rec := &recorder{Conn: raw}
	var tr transcript
	tr, err = dialerFinish(rec, secret, dh, sent, ProtoRPC)
	if err != nil {
		t.Fatal(err)
	}
	conf := make([]byte, confirmSize)
	if _, err := io.ReadFull(raw, conf); err != nil {
		t.Fatalf("no confirmation after the dialer's proof: %v", err)
	}
	if want := tr.confirm(labelListener); !hmac.Equal(conf[:macSize], want[:]) {
		t.Fatal("the listener's confirmation does not verify the true secret")
	}
	wrong, _ := dialerFinish(io.Discard, wrongSecret, dh, sent, ProtoRPC)
	if wrongConf := wrong.confirm(labelListener); hmac.Equal(conf[:macSize], wrongConf[:]) {
		t.Fatal("the listener's confirmation verifies a wrong secret")
	}
	<-acc.next
}

// testGuess tries candidate against the listener's bytes sent after the
// dialer's hello dh, every way they allow, and returns how it verified, or
// "" if it did not.
func testGuess(candidate []byte, dh hello, sent []byte) string {
	lh := sent[len(hsMagic)+1:]
	var nonceL nonce
	copy(nonceL[:], lh)
	listenID := lh[nonceSize : nonceSize+idSize]
	rest := sent[dialHelloSize:]
	contains := func(mac []byte) bool {
		for i := 0; i+len(mac) <= len(rest); i++ {
			if bytes.Equal(rest[i:i+len(mac)], mac) {
				return true
			}
		}
		return false
	}
	// A MAC under the secret over the handshake so far, with handshake
	// version 1's label and with this version's.
	for _, label := range []string{"zeze-mq handshake v1: listener\x00", labelListener} {
		m := hmac.New(sha256.New, candidate)
		m.Write([]byte(label))
		m.Write(make([]byte, 33)) // no TLS: binding 0 and 32 zeros
		m.Write(dh.nonce[:])
		m.Write(nonceL[:])
		m.Write(appendID(nil, dh.id))
		m.Write(listenID)
		if contains(m.Sum(nil)) {
			return "a MAC under the secret"
		}
	}
	// A key confirmation: the dialer's share for candidate and the
	// listener's share give a key, under which the listener would confirm.
	if tr, err := dialerFinish(io.Discard, candidate, dh, sent, ProtoRPC); err == nil {
		conf := tr.confirm(labelListener)
		if contains(conf[:]) {
			return "a key confirmation"
		}
	}
	return ""
}

// dialerFinish plays the dialer with secret, after its hello dh and the
// listener's hello lh, and writes its finish to w.
func dialerFinish(w io.Writer, secret []byte, dh hello, lh []byte, p Proto) (transcript, error) {
	h, err := parseHello(lh)
	if err != nil {
		return transcript{}, err
	}
	s := transcript{dialerID: dh.id, dialer: dh.nonce, secret: secret, protoByte: byte(p),
		listener: h.nonce, listenID: h.id, shareL: h.share}
	s.shareD = s.share()
	if err := s.keys(s.shareL); err != nil {
		return s, err
	}
	conf := s.confirm(labelDialer)
	fin := append(append(s.shareD[:], conf[:]...), byte(p))
	_, err = w.Write(fin)
	return s, err
}

// TestHandshake_DialedPeerGetsOneGuess: a listener without the secret that
// a node dials chooses its share for one guessed secret. The dialer's
// confirmation verifies that guess if it is right and not if it is wrong;
// the dialer then refuses the listener's wrong confirmation and sends
// nothing more on the connection, so each dial tests one guess.
func TestHandshake_DialedPeerGetsOneGuess(t *testing.T) {
	for _, c := range []struct {
		name  string
		guess []byte
	}{{"RightGuess", secret}, {"WrongGuess", wrongSecret}} {
		t.Run(c.name, func(t *testing.T) {
			a := listen(t, Config{NodeID: "a"})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			dialed := make(chan error, 1)
			go func() {
				c, err := a.Dial(context.Background(), ln.Addr().String(), ProtoRPC)
				if err == nil {
					c.Close()
				}
				dialed <- err
			}()
			raw, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			var in [dialHelloSize]byte
			if _, err := io.ReadFull(raw, in[:]); err != nil {
				t.Fatal(err)
			}
			dh, err := parseHello(in[:])
			if err != nil {
				t.Fatal(err)
			}
			// The share for the guess: x·g(guess), x known to the attacker.
			s := transcript{dialerID: dh.id, dialer: dh.nonce, listenID: "b", listener: freshNonce(), secret: c.guess, protoByte: byte(ProtoRPC)}
			s.shareL = s.share()
			lh := hello{nonce: s.listener, id: "b", share: s.shareL}
			if _, err := raw.Write(lh.marshal(true)); err != nil {
				t.Fatal(err)
			}
			var fin [finishSize]byte
			if _, err := io.ReadFull(raw, fin[:]); err != nil {
				t.Fatal(err)
			}
			copy(s.shareD[:], fin[:pointSize])
			// x·Y_D is the dialer's key only if g(guess) is its generator:
			// testing another candidate c would take the x' with
			// Y_L = x'·g(c), which the attacker does not know.
			if err := s.keys(s.shareD); err != nil {
				t.Fatal(err)
			}
			conf := s.confirm(labelDialer)
			verified := hmac.Equal(conf[:], fin[pointSize:pointSize+macSize])
			if want := bytes.Equal(c.guess, secret); verified != want {
				t.Errorf("the guess verified %v, want %v", verified, want)
			}
			if _, err := raw.Write(make([]byte, confirmSize)); err != nil {
				t.Fatal(err)
			}
			if err := <-dialed; !errors.Is(err, ErrHandshake) {
				t.Fatalf("dial: %v, want ErrHandshake", err)
			}
			if more := readQuiet(t, raw, 200*time.Millisecond); len(more) != 0 {
				t.Fatalf("the dialer sent %d more bytes after refusing the confirmation", len(more))
			}
		})
	}
}

// TestHandshake_RefusesRelayIntoAnotherTLSSession: a machine in the middle
// with a certificate of the cluster's CA naming both nodes, but without
// the secret, relays the handshake between its TLS session with a and its
// TLS session with b. The certificates pass; the handshake fails on both
// sides, since each TLS session gives the handshake another binding.
func TestHandshake_RefusesRelayIntoAnotherTLSSession(t *testing.T) {
	ca := newCA(t)
	ast, act := ca.tlsFor(ca.leaf(t, "a"))
	a := listen(t, Config{NodeID: "a", ServerTLS: ast, ClientTLS: act})
	bst, bct := ca.tlsFor(ca.leaf(t, "b"))
	b := listen(t, Config{NodeID: "b", ServerTLS: bst, ClientTLS: bct})
	acc := accept(t, b, ProtoRPC)
	mst, mct := ca.tlsFor(ca.leaf(t, "a", "b"))
	mct.InsecureSkipVerify = true
	mct.MinVersion, mst.MinVersion = tls.VersionTLS13, tls.VersionTLS13
	mst.ClientAuth = tls.RequireAnyClientCert

	ln, err := tls.Listen("tcp", "127.0.0.1:0", mst)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	relayed := make(chan struct{})
	go func() {
		defer close(relayed)
		in, err := ln.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := tls.Dial("tcp", b.Addr().String(), mct)
		if err != nil {
			return
		}
		defer out.Close()
		done := make(chan struct{})
		go func() { io.Copy(out, in); out.CloseWrite(); close(done) }()
		io.Copy(in, out)
		in.Close()
		<-done
	}()
	if _, err := a.Dial(context.Background(), ln.Addr().String(), ProtoRPC); !errors.Is(err, ErrHandshake) {
		t.Fatalf("relayed dial: %v, want ErrHandshake", err)
	}
	<-relayed
	b.Close()
	if n := acc.count(); n != 0 {
		t.Fatalf("%d relayed connections accepted", n)
	}
}

// TestCPace_Key: two sides with the same secret and session get the same
// key; with another secret, or another session, they do not.
func TestCPace_Key(t *testing.T) {
	ci, sid := []byte("ci"), []byte("sid")
	g := cpaceGenerator(secret, ci, sid)
	d, l := newCPaceShare(g), newCPaceShare(g)
	kd, err := d.key(l.pub[:])
	if err != nil {
		t.Fatal(err)
	}
	kl, err := l.key(d.pub[:])
	if err != nil {
		t.Fatal(err)
	}
	if kd != kl {
		t.Fatal("same secret, different keys")
	}
	for name, g2 := range map[string]*ristretto255.Element{
		"OtherSecret":  cpaceGenerator(wrongSecret, ci, sid),
		"OtherSession": cpaceGenerator(secret, ci, []byte("sid2")),
		"OtherIDs":     cpaceGenerator(secret, []byte("ic"), sid),
	} {
		o := newCPaceShare(g2)
		ko, err := o.key(d.pub[:])
		if err != nil {
			t.Fatal(err)
		}
		kd, err := d.key(o.pub[:])
		if err != nil {
			t.Fatal(err)
		}
		if ko == kd {
			t.Errorf("%s: same key", name)
		}
	}
}

// TestCPace_RefusesBadShares: the identity, a non-canonical encoding, bytes
// that encode no element, and a cut share fail the exchange.
func TestCPace_RefusesBadShares(t *testing.T) {
	s := newCPaceShare(cpaceGenerator(secret, nil, nil))
	nonCanonical := bytes.Repeat([]byte{0xff}, pointSize) // >= p
	negative := make([]byte, pointSize)
	negative[0] = 1 // s = 1 is negative
	for name, b := range map[string][]byte{
		"Identity":     make([]byte, pointSize),
		"NonCanonical": nonCanonical,
		"Negative":     negative,
		"Cut":          s.pub[:pointSize-1],
	} {
		if _, err := s.key(b); !errors.Is(err, errBadShare) {
			t.Errorf("%s: %v, want errBadShare", name, err)
		}
	}
}

// TestHandshake_RefusesIdentityShare: a dialer sending the identity as
// its share, which would make the key independent of the secret, is
// refused without a confirmation.
func TestHandshake_RefusesIdentityShare(t *testing.T) {
	b := listen(t, Config{NodeID: "b", HandshakeTimeout: time.Second})
	acc := accept(t, b, ProtoRPC)
	raw, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	dh := hello{nonce: freshNonce(), id: "a"}
	if _, err := raw.Write(dh.marshal(false)); err != nil {
		t.Fatal(err)
	}
	var lh [listenHelloSize]byte
	if _, err := io.ReadFull(raw, lh[:]); err != nil {
		t.Fatal(err)
	}
	// K would be the identity: its ISK is one anyone can compute.
	s := transcript{dialerID: "a", dialer: dh.nonce, listenID: "b", protoByte: byte(ProtoRPC)}
	h, _ := parseHello(lh[:])
	s.listener, s.shareL = h.nonce, h.share
	var zero [pointSize]byte
	s.isk = cpaceISK(s.sid(), zero, zero, s.shareL)
	conf := s.confirm(labelDialer)
	if _, err := raw.Write(append(append(zero[:], conf[:]...), byte(ProtoRPC))); err != nil {
		t.Fatal(err)
	}
	if got := waitClosed(t, raw, 5*time.Second); len(got) != 0 {
		t.Fatalf("identity share got %x", got)
	}
	b.Close()
	if n := acc.count(); n != 0 {
		t.Fatalf("%d connections accepted", n)
	}
}
