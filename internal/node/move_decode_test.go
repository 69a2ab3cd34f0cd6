package node

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// TestDecodeNodeRequests_HostileInput: malformed and extreme OpMoveFetch
// and OpRaft3Vouch requests are refused or decoded within bounds, never a
// panic.
func TestDecodeNodeRequests_HostileInput(t *testing.T) {
	cases := [][]byte{
		nil, {}, {0}, {2}, {1}, {1, 0}, {1, 0, 0, 0},
		append([]byte{1}, binary.AppendUvarint(nil, math.MaxUint64)...),
		append(append([]byte{1}, binary.AppendUvarint(nil, 1<<62)...), 'a'),
		append(AppendMoveFetch(nil, "t", 0, 1, 0), 0),
		AppendMoveFetch(nil, "t", math.MaxInt, 1, 0),
		AppendMoveFetch(nil, "t", -1, 1, 0),
		{1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01},
	}
	for i, b := range cases {
		_, idx, _, _, err := decodeMoveFetch(b)
		if err == nil && (idx < 0 || idx > 1<<20) {
			t.Errorf("case %d decoded index %d", i, idx)
		}
	}
	top, idx, v, off, err := decodeMoveFetch(AppendMoveFetch(nil, "topic", 3, math.MaxUint64, math.MaxUint64))
	if err != nil || top != "topic" || idx != 3 || v != math.MaxUint64 || off != math.MaxUint64 {
		t.Fatalf("round trip: %q %d %d %d %v", top, idx, v, off, err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		b := make([]byte, r.IntN(40))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		if len(b) > 0 && r.IntN(2) == 0 {
			b[0] = 1
		}
		_, idx, _, _, err := decodeMoveFetch(b)
		if err == nil && idx < 0 {
			t.Fatalf("%x decoded index %d", b, idx)
		}
		if _, first, err := decodeRaft3Vouch(b); err == nil && (first < 0 || first > 1<<20) {
			t.Fatalf("%x decoded first partition %d", b, first)
		}
	}
	for i, b := range [][]byte{nil, {1}, {1, 0}, append(AppendRaft3Vouch(nil, "t", 0), 0), AppendRaft3Vouch(nil, "t", math.MaxInt),
		AppendRaft3Vouch(nil, "t", -1), AppendMoveFetch(nil, "t", 0, 1, 0)} {
		if _, _, err := decodeRaft3Vouch(b); err == nil {
			t.Errorf("vouch case %d decoded", i)
		}
	}
	if top, first, err := decodeRaft3Vouch(AppendRaft3Vouch(nil, "topic", 7)); err != nil || top != "topic" || first != 7 {
		t.Fatalf("vouch round trip: %q %d %v", top, first, err)
	}
}
