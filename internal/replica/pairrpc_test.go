package replica

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue/pairlog"
)

// TestPairCodec_RoundTrip: an append and each reply cross the wire intact:
// the fields the leader reads of a refusal (the epoch served, where to
// resume) come back as the pairlog errors they were.
func TestPairCodec_RoundTrip(t *testing.T) {
	a := pairlog.Append{Epoch: 7, PrevIndex: 41, PrevEpoch: 6, Commit: 40, Reset: true, Entries: []*raft.Log{
		{Index: 42, Term: 6, Type: raft.LogCommand, Data: []byte("one")},
		{Index: 43, Term: 7, Type: raft.LogCommand, Data: []byte{}},
		{Index: 44, Term: 7, Type: raft.LogCommand, Data: bytes.Repeat([]byte{0xAB}, 70000)},
	}}
	req := appendPairHead(nil, "orders", 3)
	req = appendPairRequest(req, a)
	topic, index, rest, err := decodePairHead(req)
	if err != nil || topic != "orders" || index != 3 {
		t.Fatalf("head: %q %d %v", topic, index, err)
	}
	got, err := decodePairRequest(rest)
	if err != nil {
		t.Fatal(err)
	}
	got.Entries[1].Data = []byte{} // nil and empty are the same on the wire
	if !reflect.DeepEqual(got, a) {
		t.Fatalf("decoded %+v, sent %+v", got, a)
	}
	for _, c := range []struct {
		end uint64
		err error
	}{{44, nil}, {0, &pairlog.EpochError{Epoch: 9}}, {0, &pairlog.MismatchError{Last: 12}}} {
		b, err := pairReply(c.end, c.err)
		if err != nil {
			t.Fatal(err)
		}
		end, err := decodePairReply(b)
		if end != c.end || fmt.Sprint(err) != fmt.Sprint(c.err) {
			t.Fatalf("reply %d %v came back %d %v", c.end, c.err, end, err)
		}
	}
	var ee *pairlog.EpochError
	if _, err := decodePairReply(must(pairReply(0, fmt.Errorf("wrapped: %w", &pairlog.EpochError{Epoch: 3})))); !errors.As(err, &ee) || ee.Epoch != 3 {
		t.Fatalf("a wrapped epoch refusal: %v", err)
	}
	if _, err := pairReply(0, pairlog.ErrCommitted); !errors.Is(err, pairlog.ErrCommitted) {
		t.Fatalf("another error is returned as is: %v", err)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestPairCodec_Malformed: every cut of a request or reply, a wrong
// version, unknown flags and a count past the bytes are refused
// (ErrBadAppend), never a panic or an allocation out of proportion.
func TestPairCodec_Malformed(t *testing.T) {
	a := pairlog.Append{Epoch: 2, PrevIndex: 1, PrevEpoch: 1, Commit: 1, Entries: []*raft.Log{{Index: 2, Term: 2, Data: []byte("abc")}}}
	req := appendPairRequest(nil, a)
	for n := range len(req) {
		if _, err := decodePairRequest(req[:n]); !errors.Is(err, pairlog.ErrBadAppend) {
			t.Fatalf("a request cut at %d: %v", n, err)
		}
	}
	for _, bad := range [][]byte{
		append([]byte{2}, req[1:]...),              // version
		append([]byte{1, 2}, req[2:]...),           // flags
		append(append([]byte{}, req...), 0),        // a byte after
		{1, 0, 1, 1, 1, 1, 0xff, 0xff, 0xff, 0x0f}, // 2^28 entries in no bytes
	} {
		if _, err := decodePairRequest(bad); !errors.Is(err, pairlog.ErrBadAppend) {
			t.Fatalf("request %x: %v", bad, err)
		}
	}
	rep := must(pairReply(5, nil))
	for n := range len(rep) {
		if _, err := decodePairReply(rep[:n]); !errors.Is(err, pairlog.ErrBadAppend) {
			t.Fatalf("a reply cut at %d: %v", n, err)
		}
	}
	if _, err := decodePairReply([]byte{1, 9, 0}); !errors.Is(err, pairlog.ErrBadAppend) {
		t.Fatalf("an unknown status: %v", err)
	}
	if _, _, _, err := decodePairHead([]byte{200}); !errors.Is(err, pairlog.ErrBadAppend) {
		t.Fatalf("a topic past the bytes: %v", err)
	}
}

// FuzzDecodePairRequest: any bytes decode to an error or to an append that
// encodes back to the same bytes.
// TestInstallCodec: an install request round-trips, and a malformed one is
// refused.
func TestInstallCodec(t *testing.T) {
	for _, in := range []pairlog.Install{
		{Epoch: 1, Index: 0, Offset: 0, Data: nil, Done: false},
		{Epoch: 9, Index: 1 << 40, Offset: 1<<63 + 5, Data: []byte("abc"), Done: true},
	} {
		got, err := decodeInstallRequest(appendInstallRequest(nil, in))
		if err != nil || got.Epoch != in.Epoch || got.Index != in.Index || got.Offset != in.Offset || got.Done != in.Done || !bytes.Equal(got.Data, in.Data) {
			t.Fatalf("%+v round-trips to %+v, %v", in, got, err)
		}
	}
	for _, b := range [][]byte{nil, {pairVersion}, {2, 0, 1, 1, 1}, {pairVersion, 2, 1, 1, 1}, {pairVersion, 0, 1, 0x80}} {
		if _, err := decodeInstallRequest(b); !errors.Is(err, pairlog.ErrBadAppend) {
			t.Errorf("%x: %v, want ErrBadAppend", b, err)
		}
	}
}

func FuzzDecodePairRequest(f *testing.F) {
	f.Add(appendPairRequest(nil, pairlog.Append{Epoch: 1, Entries: []*raft.Log{{Index: 1, Term: 1, Data: []byte("x")}}}))
	f.Add(appendPairRequest(nil, pairlog.Append{Epoch: 3, PrevIndex: 9, PrevEpoch: 2, Commit: 9, Reset: true}))
	f.Add(appendInstallRequest(nil, pairlog.Install{Epoch: 2, Index: 7, Offset: 1 << 20, Data: []byte("piece"), Done: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		// The same bytes as an install request: decoded or refused, never
		// a panic; what decodes encodes to an equivalent request.
		if in, err := decodeInstallRequest(b); err == nil {
			again := appendInstallRequest(nil, in)
			if in2, err := decodeInstallRequest(again); err != nil || !reflect.DeepEqual(in2, in) && len(in.Data)+len(in2.Data) > 0 {
				t.Fatalf("install %x decodes to %+v, which encodes to %x", b, in, again)
			}
		}
		a, err := decodePairRequest(b)
		if err != nil {
			return
		}
		if again := appendPairRequest(nil, a); !bytes.Equal(again, b) {
			// Uvarints have one shortest form; a longer one decodes too.
			if b2, err := decodePairRequest(again); err != nil || !reflect.DeepEqual(b2, a) {
				t.Fatalf("%x decodes to %+v, which encodes to %x", b, a, again)
			}
		}
	})
}
