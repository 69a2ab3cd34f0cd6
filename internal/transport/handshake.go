package transport

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
)

// The handshake, on every connection, inside TLS when TLS is configured,
// before anything else is read. It is CPace (cpace.go) with explicit key
// confirmation, the dialer confirming first. Every message has a fixed
// size, so nothing is allocated from what the peer claims. D is the
// dialer, L the listener.
//
//	D→L hello    magic "ZMQH", version, nonceD[32], id(D)
//	L→D hello    magic "ZMQH", version, nonceL[32], id(L), Y_L[32]
//	D→L finish   Y_D[32], confD[32], proto
//	L→D confirm  confL[32], 0x01 (sent only if confD holds and proto has
//	             a listener)
//
// id is one length byte (1..MaxNodeIDLen) then the id padded with zeros to
// MaxNodeIDLen. With
//
//	sid = binding[33], nonceD, nonceL
//	ci  = id(D), id(L)
//	g   = CPace generator of (secret, ci, sid)
//	Y_D = y_D·g, Y_L = y_L·g, for scalars y_D, y_L fresh per connection
//	K   = y_D·Y_L = y_L·Y_D
//	ISK = SHA-512 of the CPace ISK string over sid, K, Y_D, Y_L
//	conf = HMAC-SHA256(ISK, label, sid, ci, Y_D, Y_L, proto)
//
// with a label per direction, so that one side's confirmation can never be
// played back as the other's, which rules out reflection. Both fresh
// nonces are in sid, so a recorded handshake fails against a new one
// (replay). binding is 0 and 32 zeros without TLS, or 1 and 32 bytes of the
// TLS session's ExportKeyingMaterial, so a handshake relayed into another
// TLS session fails. A share that is not the canonical encoding of a
// ristretto255 element, or is the identity, fails the handshake.
//
// Y_L and Y_D are uniformly random elements whatever the secret, so
// neither lets anyone test a guess of it offline. The first message that
// depends on the secret is confD, which the dialer sends only after the
// listener's share: a listener without the secret that chose Y_L for one
// guessed secret can test that guess, and no other, per connection it is
// dialed. The listener checks confD before it sends confL, so a dialer
// without the secret gets no confirmation to test anything against: at
// most one online guess per connection, bounded by the connection limits
// (limits.go). The dialer checks confL before it uses the connection.
const (
	hsMagic   = "ZMQH"
	hsVersion = 2
	nonceSize = 32
	macSize   = sha256.Size
	idSize    = 1 + MaxNodeIDLen

	dialHelloSize   = len(hsMagic) + 1 + nonceSize + idSize
	listenHelloSize = dialHelloSize + pointSize
	finishSize      = pointSize + macSize + 1
	confirmSize     = macSize + 1
	hsAccept        = 0x01

	labelListener = "zeze-mq handshake v2: listener\x00"
	labelDialer   = "zeze-mq handshake v2: dialer\x00\x00\x00"
	ekmLabel      = "EXPORTER-zeze-mq-handshake-v2"
)

// MaxNodeIDLen is the longest node id.
const MaxNodeIDLen = 64

type nonce [nonceSize]byte

// hello is either side's first message; share is only in the listener's.
type hello struct {
	nonce nonce
	id    string
	share [pointSize]byte
}

var errMalformed = errors.New("malformed handshake message")

// checkNodeID returns an error unless id is 1..MaxNodeIDLen bytes of
// letters, digits, '.', '-' and '_', so that it can be a certificate's DNS
// SAN.
func checkNodeID(id string) error {
	if len(id) == 0 || len(id) > MaxNodeIDLen {
		return fmt.Errorf("node id of %d bytes, want 1..%d", len(id), MaxNodeIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("node id %q: byte %#x is not a letter, digit, '.', '-' or '_'", id, c)
		}
	}
	return nil
}

func appendID(b []byte, id string) []byte {
	b = append(b, byte(len(id)))
	b = append(b, id...)
	return append(b, make([]byte, MaxNodeIDLen-len(id))...)
}

func parseID(b []byte) (string, error) {
	n := int(b[0])
	if n > MaxNodeIDLen {
		return "", errMalformed
	}
	for _, c := range b[1+n : idSize] {
		if c != 0 {
			return "", errMalformed
		}
	}
	id := string(b[1 : 1+n])
	if err := checkNodeID(id); err != nil {
		return "", fmt.Errorf("%w: %v", errMalformed, err)
	}
	return id, nil
}

// marshal encodes h as the dialer's hello, or with withShare the
// listener's.
func (h *hello) marshal(withShare bool) []byte {
	b := make([]byte, 0, listenHelloSize)
	b = append(b, hsMagic...)
	b = append(b, hsVersion)
	b = append(b, h.nonce[:]...)
	b = appendID(b, h.id)
	if withShare {
		b = append(b, h.share[:]...)
	}
	return b
}

// parseHello decodes a dialer's hello of dialHelloSize bytes or a
// listener's of listenHelloSize. The share is checked when it is used.
func parseHello(b []byte) (hello, error) {
	var h hello
	if len(b) != dialHelloSize && len(b) != listenHelloSize {
		return h, errMalformed
	}
	if string(b[:len(hsMagic)]) != hsMagic {
		return h, fmt.Errorf("%w: not a zeze-mq handshake", errMalformed)
	}
	if v := b[len(hsMagic)]; v != hsVersion {
		return h, fmt.Errorf("%w: version %d, want %d", errMalformed, v, hsVersion)
	}
	b = b[len(hsMagic)+1:]
	copy(h.nonce[:], b)
	id, err := parseID(b[nonceSize : nonceSize+idSize])
	if err != nil {
		return h, err
	}
	h.id = id
	copy(h.share[:], b[nonceSize+idSize:])
	return h, nil
}

// transcript is one side's view of a handshake.
type transcript struct {
	binding   [1 + 32]byte
	dialer    nonce
	listener  nonce
	dialerID  string
	listenID  string
	secret    []byte
	protoByte byte

	own            cpaceShare // this side's scalar and share
	shareD, shareL [pointSize]byte
	isk            [iskSize]byte
}

// sid is binding, nonceD, nonceL; ci is id(D), id(L).
func (s *transcript) sid() []byte {
	b := make([]byte, 0, len(s.binding)+2*nonceSize)
	b = append(b, s.binding[:]...)
	b = append(b, s.dialer[:]...)
	return append(b, s.listener[:]...)
}

func (s *transcript) ci() []byte {
	return appendID(appendID(make([]byte, 0, 2*idSize), s.dialerID), s.listenID)
}

// share draws this side's CPace scalar and share, once both nonces and
// both ids are known.
func (s *transcript) share() [pointSize]byte {
	s.own = newCPaceShare(cpaceGenerator(s.secret, s.ci(), s.sid()))
	return s.own.pub
}

// keys derives ISK from the peer's share, with shareD and shareL set.
func (s *transcript) keys(peer [pointSize]byte) error {
	k, err := s.own.key(peer[:])
	if err != nil {
		return fmt.Errorf("%w: %v", errMalformed, err)
	}
	s.isk = cpaceISK(s.sid(), k, s.shareD, s.shareL)
	return nil
}

// confirm is the key confirmation under label.
func (s *transcript) confirm(label string) [macSize]byte {
	m := hmac.New(sha256.New, s.isk[:])
	b := make([]byte, 0, len(label)+len(s.binding)+2*nonceSize+2*idSize+2*pointSize+1)
	b = append(b, label...)
	b = append(b, s.sid()...)
	b = append(b, s.ci()...)
	b = append(b, s.shareD[:]...)
	b = append(b, s.shareL[:]...)
	b = append(b, s.protoByte)
	m.Write(b)
	var out [macSize]byte
	m.Sum(out[:0])
	return out
}

// bind sets the channel binding from the TLS session, if there is one.
func (s *transcript) bind(tc *tls.Conn) error {
	if tc == nil {
		return nil
	}
	st := tc.ConnectionState()
	ekm, err := st.ExportKeyingMaterial(ekmLabel, nil, 32)
	if err != nil {
		return fmt.Errorf("tls channel binding: %w", err)
	}
	s.binding[0] = 1
	copy(s.binding[1:], ekm)
	return nil
}

func freshNonce() nonce {
	var n nonce
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails
	return n
}

// handshakeListener runs the listener's side on rw and returns the dialer's
// id and protocol. accept reports whether the protocol has a listener.
func handshakeListener(rw io.ReadWriter, tc *tls.Conn, id string, secret []byte, accept func(Proto) bool) (peer string, p Proto, err error) {
	s := transcript{listenID: id, secret: secret, listener: freshNonce()}
	if err := s.bind(tc); err != nil {
		return "", 0, err
	}
	var in [dialHelloSize]byte
	if _, err := io.ReadFull(rw, in[:]); err != nil {
		return "", 0, fmt.Errorf("read hello: %w", err)
	}
	h, err := parseHello(in[:])
	if err != nil {
		return "", 0, err
	}
	if err := checkPeerCert(tc, h.id); err != nil {
		return h.id, 0, err
	}
	s.dialer, s.dialerID = h.nonce, h.id
	s.shareL = s.share()
	out := hello{nonce: s.listener, id: id, share: s.shareL}
	if _, err := rw.Write(out.marshal(true)); err != nil {
		return h.id, 0, fmt.Errorf("write hello: %w", err)
	}
	var fin [finishSize]byte
	if _, err := io.ReadFull(rw, fin[:]); err != nil {
		return h.id, 0, fmt.Errorf("read finish: %w", err)
	}
	copy(s.shareD[:], fin[:pointSize])
	s.protoByte = fin[finishSize-1]
	if err := s.keys(s.shareD); err != nil {
		return h.id, 0, err
	}
	want := s.confirm(labelDialer)
	if !hmac.Equal(fin[pointSize:pointSize+macSize], want[:]) {
		return h.id, 0, fmt.Errorf("%w: the dialer's proof does not hold (wrong secret, replay or relay)", ErrHandshake)
	}
	p = Proto(s.protoByte)
	if !accept(p) {
		return h.id, p, fmt.Errorf("%w: %d", ErrUnknownProto, p)
	}
	conf := s.confirm(labelListener)
	if _, err := rw.Write(append(conf[:], hsAccept)); err != nil {
		return h.id, p, fmt.Errorf("write confirm: %w", err)
	}
	return h.id, p, nil
}

// handshakeDialer runs the dialer's side on rw and returns the listener's
// id.
func handshakeDialer(rw io.ReadWriter, tc *tls.Conn, id string, secret []byte, p Proto) (peer string, err error) {
	s := transcript{dialerID: id, secret: secret, dialer: freshNonce(), protoByte: byte(p)}
	if err := s.bind(tc); err != nil {
		return "", err
	}
	out := hello{nonce: s.dialer, id: id}
	if _, err := rw.Write(out.marshal(false)); err != nil {
		return "", fmt.Errorf("write hello: %w", err)
	}
	var in [listenHelloSize]byte
	if _, err := io.ReadFull(rw, in[:]); err != nil {
		return "", fmt.Errorf("read hello: %w", err)
	}
	h, err := parseHello(in[:])
	if err != nil {
		return "", err
	}
	if err := checkPeerCert(tc, h.id); err != nil {
		return h.id, err
	}
	s.listener, s.listenID, s.shareL = h.nonce, h.id, h.share
	s.shareD = s.share()
	if err := s.keys(s.shareL); err != nil {
		return h.id, err
	}
	conf := s.confirm(labelDialer)
	fin := make([]byte, 0, finishSize)
	fin = append(fin, s.shareD[:]...)
	fin = append(fin, conf[:]...)
	if _, err := rw.Write(append(fin, byte(p))); err != nil {
		return h.id, fmt.Errorf("write finish: %w", err)
	}
	var ack [confirmSize]byte
	if _, err := io.ReadFull(rw, ack[:]); err != nil {
		return h.id, fmt.Errorf("%w: the listener refused (protocol %d not served, or our proof failed): %v", ErrHandshake, p, err)
	}
	want := s.confirm(labelListener)
	if !hmac.Equal(ack[:macSize], want[:]) {
		return h.id, fmt.Errorf("%w: the listener's proof does not hold (wrong secret or relay)", ErrHandshake)
	}
	if ack[macSize] != hsAccept {
		return h.id, fmt.Errorf("%w: accept byte %#x", errMalformed, ack[macSize])
	}
	return h.id, nil
}

// checkPeerCert returns an error unless, with TLS, the peer's certificate
// names node id as one of its DNS SANs.
func checkPeerCert(tc *tls.Conn, id string) error {
	if tc == nil {
		return nil
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return fmt.Errorf("%w: no peer certificate", ErrHandshake)
	}
	for _, n := range certs[0].DNSNames {
		if n == id {
			return nil
		}
	}
	return fmt.Errorf("%w: peer claims node id %q, its certificate names %q", ErrHandshake, id, certs[0].DNSNames)
}
