package transport

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/gtank/ristretto255"
	"github.com/zeze-go/mq/internal/fuzzseed"
)

func helloSeeds() [][]byte {
	h := hello{nonce: freshNonce(), id: "node-1", share: newCPaceShare(cpaceGenerator(secret, nil, nil)).pub}
	long := hello{id: string(bytes.Repeat([]byte("x"), MaxNodeIDLen))}
	return [][]byte{
		h.marshal(false), h.marshal(true), long.marshal(false),
		[]byte("\xdd\xff\xff\xff\xff"), []byte("\xdf\xff\xff\xff\xff"), []byte("\xdb\xff\xff\xff\xff"), []byte("\xc6\xff\xff\xff\xff"),
	}
}

// FuzzParseHello: a hello parses only at its two sizes, never panics, and
// what parses encodes back to the same bytes.
func FuzzParseHello(f *testing.F) {
	for _, s := range helloSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h hello
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { h, err = parseHello(b) })
		if err != nil {
			return
		}
		if enc := h.marshal(len(b) == listenHelloSize); !bytes.Equal(enc, b) {
			t.Fatalf("%x parses to %+v, which encodes to %x", b, h, enc)
		}
	})
}

// fuzzPeer plays the dialer's bytes from in and drops what is written.
type fuzzPeer struct{ r io.Reader }

func (p fuzzPeer) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p fuzzPeer) Write(b []byte) (int, error) { return len(b), nil }

// FuzzHandshakeListener: the listener's side, fed any bytes as the
// dialer's, never panics, allocates little, and never accepts (the bytes
// cannot hold a proof over the listener's fresh nonce).
func FuzzHandshakeListener(f *testing.F) {
	share := newCPaceShare(cpaceGenerator(secret, nil, nil)).pub
	for _, s := range helloSeeds() {
		f.Add(s)
		f.Add(append(s, bytes.Repeat([]byte{0xff}, finishSize)...))
		fin := append(append(share[:], bytes.Repeat([]byte{7}, macSize)...), byte(ProtoRPC))
		f.Add(append(s[:min(len(s), dialHelloSize):min(len(s), dialHelloSize)], fin...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() {
			_, _, err = handshakeListener(fuzzPeer{bytes.NewReader(b)}, nil, "b", secret, func(Proto) bool { return true })
		})
		if err == nil {
			t.Fatalf("%x accepted", b)
		}
		if len(b) >= dialHelloSize+finishSize && !errors.Is(err, ErrHandshake) && !errors.Is(err, errMalformed) {
			t.Fatalf("%x: error %v is neither a failed proof nor malformed", b, err)
		}
	})
}

// FuzzHandshakeDialer: the dialer's side, fed any bytes as the listener's,
// never panics, allocates little, and never completes (the bytes cannot
// hold a proof over the dialer's fresh nonce).
func FuzzHandshakeDialer(f *testing.F) {
	for _, s := range helloSeeds() {
		f.Add(s)
		f.Add(append(s, hsAccept))
		f.Add(append(s, append(bytes.Repeat([]byte{7}, macSize), hsAccept)...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() {
			_, err = handshakeDialer(fuzzPeer{bytes.NewReader(b)}, nil, "a", secret, ProtoRPC)
		})
		if err == nil {
			t.Fatalf("%x accepted", b)
		}
		if len(b) >= listenHelloSize && !errors.Is(err, ErrHandshake) && !errors.Is(err, errMalformed) {
			t.Fatalf("%x: error %v is neither a failed proof nor malformed", b, err)
		}
	})
}

// FuzzCPaceShare: a peer's share is accepted only as the canonical
// encoding of an element other than the identity, which encodes back to
// the same bytes; a cut share is refused; nothing panics.
func FuzzCPaceShare(f *testing.F) {
	g := cpaceGenerator(secret, nil, nil)
	for range 4 {
		s := newCPaceShare(g)
		f.Add(s.pub[:])
	}
	f.Add(make([]byte, pointSize))
	f.Add(bytes.Repeat([]byte{0xff}, pointSize))
	own := newCPaceShare(g)
	f.Fuzz(func(t *testing.T, b []byte) {
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { _, err = own.key(b) })
		if err != nil {
			return
		}
		e := ristretto255.NewElement()
		if err := e.Decode(b); err != nil {
			t.Fatalf("%x accepted as a share but does not decode: %v", b, err)
		}
		if enc := e.Encode(nil); !bytes.Equal(enc, b) {
			t.Fatalf("%x accepted as a share, encodes back to %x", b, enc)
		}
		if _, err := own.key(b[:len(b)-1]); err == nil {
			t.Fatalf("%x cut by a byte accepted", b)
		}
	})
}
