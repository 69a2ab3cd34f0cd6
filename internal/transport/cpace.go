package transport

import (
	"crypto/rand"
	"crypto/sha512"
	"encoding/binary"
	"errors"

	"github.com/gtank/ristretto255"
)

// CPace (draft-irtf-cfrg-cpace) over ristretto255 with SHA-512, the
// password-authenticated key exchange of the handshake: both sides derive
// a generator from the cluster secret and the session, each sends a
// random multiple of it, and both get the same intermediate session key
// only if they used the same secret. A share is a uniformly random group
// element whatever the secret, so it lets no one test a guess; a side
// that chose its share for a guessed secret can test that one guess
// against the peer's key confirmation, and no other.
const (
	cpaceDSI    = "CPaceRistretto255"
	cpaceHashIn = 128 // SHA-512's input block, s_in_bytes in the draft
	pointSize   = 32
	iskSize     = sha512.Size
)

var errBadShare = errors.New("peer's share is not a valid ristretto255 element other than the identity")

// lv appends b to dst prefixed by its length as LEB128, the draft's
// prepend_len.
func lv(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// cpaceGenerator is the draft's calculate_generator: the element that
// SHA-512 of lv(DSI), lv(secret), zero padding to the hash's block, lv(ci)
// and lv(sid) maps to.
func cpaceGenerator(secret, ci, sid []byte) *ristretto255.Element {
	h := sha512.New()
	var b []byte
	b = lv(b, []byte(cpaceDSI))
	b = lv(b, secret)
	pad := cpaceHashIn - len(binary.AppendUvarint(nil, uint64(len(secret)))) - len(secret) -
		len(binary.AppendUvarint(nil, uint64(len(cpaceDSI)))) - len(cpaceDSI) - 1
	b = lv(b, make([]byte, max(pad, 0)))
	b = lv(b, ci)
	b = lv(b, sid)
	h.Write(b)
	return ristretto255.NewElement().FromUniformBytes(h.Sum(nil))
}

// cpaceShare is one side's secret scalar and the share it sends.
type cpaceShare struct {
	y   *ristretto255.Scalar
	pub [pointSize]byte
}

// newCPaceShare draws a scalar y and returns it with y·g.
func newCPaceShare(g *ristretto255.Element) cpaceShare {
	var r [64]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails
	s := cpaceShare{y: ristretto255.NewScalar().FromUniformBytes(r[:])}
	ristretto255.NewElement().ScalarMult(s.y, g).Encode(s.pub[:0])
	return s
}

// key returns y·peer, refusing a peer share that is not the canonical
// encoding of an element, or is the identity, and a result that is the
// identity.
func (s *cpaceShare) key(peer []byte) ([pointSize]byte, error) {
	var out [pointSize]byte
	p := ristretto255.NewElement()
	if err := p.Decode(peer); err != nil {
		return out, errBadShare
	}
	id := ristretto255.NewElement()
	if p.Equal(id) == 1 {
		return out, errBadShare
	}
	k := ristretto255.NewElement().ScalarMult(s.y, p)
	if k.Equal(id) == 1 {
		return out, errBadShare
	}
	k.Encode(out[:0])
	return out, nil
}

// cpaceISK is the draft's intermediate session key in initiator-responder
// order, the dialer initiating, without associated data:
// SHA-512(lv(DSI "_ISK"), lv(sid), lv(K), lv(Y_D), lv(""), lv(Y_L), lv("")).
func cpaceISK(sid []byte, k, yD, yL [pointSize]byte) [iskSize]byte {
	var b []byte
	b = lv(b, []byte(cpaceDSI+"_ISK"))
	b = lv(b, sid)
	b = lv(b, k[:])
	b = lv(b, yD[:])
	b = lv(b, nil)
	b = lv(b, yL[:])
	b = lv(b, nil)
	return sha512.Sum512(b)
}
