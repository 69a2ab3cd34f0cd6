package node

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// piecesOf serves snap as OpMoveFetch does, in pieces of n bytes, saying
// size (the snapshot's, unless a test lies).
func piecesOf(snap []byte, n int, size func(off uint64) uint64) func(off uint64) ([]byte, error) {
	return func(off uint64) ([]byte, error) {
		end := min(int(off)+n, len(snap))
		return append(binary.AppendUvarint(nil, size(off)), snap[off:end]...), nil
	}
}

// TestFetchPieces_HoldsThePeerToItsFirstSize: a snapshot arrives whole
// in pieces; a peer that changes the size it gave, sends more than it,
// sends an empty piece before the end, or a reply with no size, is
// refused with errRequestFormat, and nothing past the first size is written.
func TestFetchPieces_HoldsThePeerToItsFirstSize(t *testing.T) {
	snap := bytes.Repeat([]byte("0123456789"), 100)
	honest := func(uint64) uint64 { return uint64(len(snap)) }
	var got bytes.Buffer
	if err := fetchPieces(piecesOf(snap, 64, honest), &got); err != nil || !bytes.Equal(got.Bytes(), snap) {
		t.Fatalf("honest pieces: %v, %d of %d bytes", err, got.Len(), len(snap))
	}
	for name, fetch := range map[string]func(off uint64) ([]byte, error){
		"size grows": piecesOf(snap, 64, func(off uint64) uint64 { return uint64(len(snap)) + off }),
		"size huge, then true": piecesOf(snap, 64, func(off uint64) uint64 {
			if off == 0 {
				return 1 << 62
			}
			return uint64(len(snap))
		}),
		"more than the size": piecesOf(snap, 64, func(uint64) uint64 { return 10 }),
		"empty before the end": func(off uint64) ([]byte, error) {
			return binary.AppendUvarint(nil, uint64(len(snap))), nil
		},
		"no size":  func(uint64) ([]byte, error) { return nil, nil },
		"bad size": func(uint64) ([]byte, error) { return bytes.Repeat([]byte{0xFF}, 11), nil },
	} {
		var w bytes.Buffer
		err := fetchPieces(fetch, &w)
		if !errors.Is(err, errRequestFormat) {
			t.Errorf("%s: %v, want errRequestFormat", name, err)
		}
		if w.Len() > len(snap) {
			t.Errorf("%s: wrote %d bytes, more than the %d snapshot", name, w.Len(), len(snap))
		}
	}
}
