package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/raftqueue/pairlog"
)

// worstPairRequests are OpPairAppend and OpPairInstall requests of about
// size bytes, after the longest head, that make the follower's decoder
// allocate the most per byte: appends of the cheapest entries (four
// zero uvarints each), at the limit and filling the bytes, and an install
// of one large piece.
func worstPairRequests(size int) map[string]struct {
	op  uint16
	req []byte
} {
	head := appendPairHead(nil, strings.Repeat("t", 255), 1<<16)
	appendOf := func(n int) []byte {
		b := append(bytes.Clone(head), pairVersion, flagReset)
		for range 4 {
			b = binary.AppendUvarint(b, 1<<64-1)
		}
		b = binary.AppendUvarint(b, uint64(n))
		return append(b, make([]byte, 4*n)...)
	}
	return map[string]struct {
		op  uint16
		req []byte
	}{
		"AppendAtLimit":    {OpPairAppend, appendOf(maxPairEntries)},
		"AppendFillsBytes": {OpPairAppend, appendOf(size / 4)},
		"Install":          {OpPairInstall, appendInstallRequest(bytes.Clone(head), pairlog.Install{Epoch: 1, Data: make([]byte, size)})},
	}
}

// TestPairRequests_AllocationBounded checks that no DoubleWrite request
// makes the follower's decoder allocate more than fuzzseed.RequestAllocK
// times its bytes plus RequestAllocC: an entry of four bytes becomes a
// raft.Log of about a hundred, so an append is bounded by maxPairEntries.
func TestPairRequests_AllocationBounded(t *testing.T) {
	for name, w := range worstPairRequests(1 << 20) {
		decode := map[uint16]func([]byte) error{
			OpPairAppend:  func(b []byte) error { _, err := decodePairRequest(b); return err },
			OpPairInstall: func(b []byte) error { _, err := decodeInstallRequest(b); return err },
		}[w.op]
		t.Run(name, func(t *testing.T) {
			fuzzseed.CheckRequestAlloc(t, w.req, fuzzseed.RequestAllocK, fuzzseed.RequestAllocC, func(b []byte) {
				_, _, rest, err := decodePairHead(b)
				if err == nil {
					err = decode(rest)
				}
				if err != nil && !errors.Is(err, pairlog.ErrBadAppend) {
					t.Errorf("error %v is not ErrBadAppend", err)
				}
			})
		})
	}
}

// TestDecodePairRequest_EntryLimit checks the limit of an append:
// maxPairEntries entries decode, one more is refused.
func TestDecodePairRequest_EntryLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries int
		ok      bool
	}{{"AtLimit", maxPairEntries, true}, {"OverLimit", maxPairEntries + 1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			a := pairlog.Append{Epoch: 1}
			for i := range tc.entries {
				a.Entries = append(a.Entries, &raft.Log{Index: uint64(i + 1), Term: 1})
			}
			got, err := decodePairRequest(appendPairRequest(nil, a))
			if tc.ok && (err != nil || len(got.Entries) != tc.entries) {
				t.Fatalf("%d entries: %d decoded, %v", tc.entries, len(got.Entries), err)
			}
			if !tc.ok && !errors.Is(err, pairlog.ErrBadAppend) {
				t.Fatalf("%d entries: %v, want ErrBadAppend", tc.entries, err)
			}
		})
	}
}

// TestPairHandler_LooksUpBeforeDecoding checks that a pair request's body
// is decoded only after lookup found the partition for the caller: a node
// that does not lead the pair costs the decoding of a head.
func TestPairHandler_LooksUpBeforeDecoding(t *testing.T) {
	errNotLeader := errors.New("not the pair's leader")
	decoded := false
	h := pairHandler(func(peer, topic string, index int) (*raftqueue.Pair, error) { return nil, errNotLeader },
		func(b []byte) (pairlog.Append, error) { decoded = true; return decodePairRequest(b) },
		func(context.Context, *raftqueue.Pair, pairlog.Append) ([]byte, error) { return nil, nil })
	req := worstPairRequests(1 << 20)["AppendAtLimit"].req
	if _, err := h(context.Background(), "outsider", req); !errors.Is(err, errNotLeader) {
		t.Fatalf("handler: %v, want the lookup's refusal", err)
	}
	if decoded {
		t.Fatal("the body was decoded for a caller lookup refused")
	}
}

// FuzzDecodePairHead: any bytes decode to an error or to a head that
// encodes back to an equivalent one; a cut head does not decode.
func FuzzDecodePairHead(f *testing.F) {
	f.Add(appendPairHead(nil, "orders", 3))
	f.Add(appendPairHead([]byte{}, "", 0))
	f.Add(appendPairHead(nil, strings.Repeat("t", 255), 1<<16))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		var topic string
		var index int
		var rest []byte
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { topic, index, rest, err = decodePairHead(b) })
		if err != nil {
			if !errors.Is(err, pairlog.ErrBadAppend) {
				t.Fatalf("error %v is not ErrBadAppend", err)
			}
			return
		}
		again := appendPairHead(nil, topic, index)
		t2, i2, r2, err := decodePairHead(append(again, rest...))
		if err != nil || t2 != topic || i2 != index || !bytes.Equal(r2, rest) {
			t.Fatalf("%x: %q/%d, which comes back as %q/%d, %v", b, topic, index, t2, i2, err)
		}
		if _, _, _, err := decodePairHead(again[:len(again)-1]); err == nil {
			t.Fatalf("%x cut to %d bytes decodes", again, len(again)-1)
		}
	})
}
