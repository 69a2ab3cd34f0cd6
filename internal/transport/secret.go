package transport

import (
	"errors"
	"fmt"
	"math"
)

// Bounds of a cluster secret.
const (
	// MinSecretLen is the shortest cluster secret.
	MinSecretLen = 32
	// MinSecretBits is the least entropy CheckSecret estimates a secret
	// must have: its length times the Shannon entropy of its bytes.
	MinSecretBits = 128
)

// ErrWeakSecret is returned by CheckSecret, and so by Listen, for a cluster
// secret that is short or easy to guess.
var ErrWeakSecret = errors.New("transport: weak cluster secret")

// CheckSecret returns an error wrapping ErrWeakSecret unless secret is at
// least MinSecretLen bytes and, estimated from how often each byte value
// occurs in it, holds at least MinSecretBits bits. Random bytes pass, and
// so do their hex or base64 (64 hex digits, 44 base64 characters: what
// `openssl rand -hex 32` prints); words, repeats and short runs do not.
// An estimate from the bytes alone cannot see that a long phrase is
// guessable, so the error says what is wanted: 32 random bytes.
func CheckSecret(secret []byte) error {
	const want = "want at least 32 random bytes, or their hex or base64 (openssl rand -hex 32)"
	if len(secret) < MinSecretLen {
		return fmt.Errorf("%w: %d bytes, %s", ErrWeakSecret, len(secret), want)
	}
	if bits := secretBits(secret); bits < MinSecretBits {
		return fmt.Errorf("%w: about %.0f bits of entropy, %s", ErrWeakSecret, bits, want)
	}
	return nil
}

// secretBits is len(b) times the Shannon entropy of b's byte frequencies.
func secretBits(b []byte) float64 {
	var count [256]int
	for _, c := range b {
		count[c]++
	}
	n := float64(len(b))
	var h float64
	for _, k := range count {
		if k > 0 {
			p := float64(k) / n
			h -= p * math.Log2(p)
		}
	}
	return h * n
}
