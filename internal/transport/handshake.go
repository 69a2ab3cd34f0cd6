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
// before anything else is read. Every message has a fixed size, so nothing
// is allocated from what the peer claims. D is the dialer, L the listener.
//
//	D→L hello   magic "ZMQH", version, nonceD[32], id(D)
//	L→D hello   magic "ZMQH", version, nonceL[32], id(L), macL[32]
//	D→L finish  macD[32], proto
//	L→D accept  0x01 (sent only if macD holds and proto has a listener)
//
// id is one length byte (1..MaxNodeIDLen) then the id padded with zeros to
// MaxNodeIDLen. The MACs are HMAC-SHA256 under the cluster secret over
//
//	label, binding[33], nonceD, nonceL, id(D), id(L)     (macL)
//	label, binding[33], nonceD, nonceL, id(D), id(L), proto   (macD)
//
// with a label per direction, so that a MAC one side sends can never be
// played back as the other side's, which rules out reflection; and over
// both fresh nonces, so that a recorded handshake fails against a new
// nonce, which rules out replay. binding is 0 and 32 zeros without TLS, or
// 1 and 32 bytes of the TLS session's ExportKeyingMaterial, so a handshake
// relayed into another TLS session fails. The dialer checks macL before it
// sends macD.
const (
	hsMagic   = "ZMQH"
	hsVersion = 1
	nonceSize = 32
	macSize   = sha256.Size
	idSize    = 1 + MaxNodeIDLen

	dialHelloSize   = len(hsMagic) + 1 + nonceSize + idSize
	listenHelloSize = dialHelloSize + macSize
	finishSize      = macSize + 1
	hsAccept        = 0x01

	labelListener = "zeze-mq handshake v1: listener\x00"
	labelDialer   = "zeze-mq handshake v1: dialer\x00\x00\x00"
	ekmLabel      = "EXPORTER-zeze-mq-handshake-v1"
)

// MaxNodeIDLen is the longest node id.
const MaxNodeIDLen = 64

type nonce [nonceSize]byte

// hello is either side's first message; mac is only in the listener's.
type hello struct {
	nonce nonce
	id    string
	mac   [macSize]byte
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

// marshal encodes h as the dialer's hello, or with withMAC the listener's.
func (h *hello) marshal(withMAC bool) []byte {
	b := make([]byte, 0, listenHelloSize)
	b = append(b, hsMagic...)
	b = append(b, hsVersion)
	b = append(b, h.nonce[:]...)
	b = appendID(b, h.id)
	if withMAC {
		b = append(b, h.mac[:]...)
	}
	return b
}

// parseHello decodes a dialer's hello of dialHelloSize bytes or a
// listener's of listenHelloSize.
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
	copy(h.mac[:], b[nonceSize+idSize:])
	return h, nil
}

// transcript is what both MACs cover.
type transcript struct {
	binding   [1 + 32]byte
	dialer    nonce
	listener  nonce
	dialerID  string
	listenID  string
	secret    []byte
	protoByte byte
}

func (s *transcript) mac(label string, withProto bool) [macSize]byte {
	m := hmac.New(sha256.New, s.secret)
	b := make([]byte, 0, len(label)+len(s.binding)+2*nonceSize+2*idSize+1)
	b = append(b, label...)
	b = append(b, s.binding[:]...)
	b = append(b, s.dialer[:]...)
	b = append(b, s.listener[:]...)
	b = appendID(b, s.dialerID)
	b = appendID(b, s.listenID)
	if withProto {
		b = append(b, s.protoByte)
	}
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
	out := hello{nonce: s.listener, id: id, mac: s.mac(labelListener, false)}
	if _, err := rw.Write(out.marshal(true)); err != nil {
		return h.id, 0, fmt.Errorf("write hello: %w", err)
	}
	var fin [finishSize]byte
	if _, err := io.ReadFull(rw, fin[:]); err != nil {
		return h.id, 0, fmt.Errorf("read finish (the dialer may have refused our proof): %w", err)
	}
	s.protoByte = fin[macSize]
	want := s.mac(labelDialer, true)
	if !hmac.Equal(fin[:macSize], want[:]) {
		return h.id, 0, fmt.Errorf("%w: the dialer's proof does not hold (wrong secret, replay or relay)", ErrHandshake)
	}
	p = Proto(s.protoByte)
	if !accept(p) {
		return h.id, p, fmt.Errorf("%w: %d", ErrUnknownProto, p)
	}
	if _, err := rw.Write([]byte{hsAccept}); err != nil {
		return h.id, p, fmt.Errorf("write accept: %w", err)
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
	s.listener, s.listenID = h.nonce, h.id
	want := s.mac(labelListener, false)
	if !hmac.Equal(h.mac[:], want[:]) {
		return h.id, fmt.Errorf("%w: the listener's proof does not hold (wrong secret or relay)", ErrHandshake)
	}
	mac := s.mac(labelDialer, true)
	if _, err := rw.Write(append(mac[:], byte(p))); err != nil {
		return h.id, fmt.Errorf("write finish: %w", err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(rw, ack[:]); err != nil {
		return h.id, fmt.Errorf("%w: the listener refused (protocol %d not served, or our proof failed): %v", ErrHandshake, p, err)
	}
	if ack[0] != hsAccept {
		return h.id, fmt.Errorf("%w: accept byte %#x", errMalformed, ack[0])
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
