package store

import (
	"encoding/binary"
	"errors"
	"reflect"
	"runtime"
	"testing"
)

// TestDecode_ClaimedCounts: a count read from the input is believed only as
// far as the elements are there. Commands now arrive from the network, so a
// 1 MiB frame claiming a million messages (or tags, or properties) must
// cost about a megabyte, not a Message struct (or string header, or map
// entry) per claimed element.
func TestDecode_ClaimedCounts(t *testing.T) {
	const n = 1 << 20
	zeros := make([]byte, n) // each decodes as nothing valid
	cmd := AppendCommand(nil, &Command{Op: OpAppend, Now: 1})
	cmd = binary.AppendUvarint(cmd[:len(cmd)-1], n) // replaces the count 0
	record := func(claim ...byte) []byte {
		b := mpArrayLen(nil, recordFields)
		b = mpUint8(b, recordVersion)
		b = mpString(b, "id")
		b = mpString(b, "key")
		return append(append(b, claim...), zeros...)
	}
	cases := []struct {
		name   string
		decode func() error
	}{
		{"Messages", func() error { _, err := DecodeCommand(append(cmd, zeros...)); return err }},
		{"Tags", func() error { var m Message; return DecodeMessage(record(0xdd, 0, 0x10, 0, 0), &m) }},
		{"Properties", func() error {
			var m Message
			return DecodeMessage(record(0x90, 0xdf, 0, 0x08, 0, 0), &m)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			got := allocated(func() { err = c.decode() })
			if err == nil {
				t.Fatal("decoded")
			}
			// The input is built inside decode: 4 MiB covers it and its
			// copies while append grows it.
			if limit := uint64(4 * n); got > limit {
				t.Fatalf("decoding %d bytes allocated %d bytes (limit %d)", n, got, limit)
			}
		})
	}
}

// allocated returns the bytes fn allocated on the heap.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestDecodeMessage_RoundTrip: the exported codec of a record payload, which
// carries messages between nodes, keeps every stored field; damage is
// ErrCorrupt.
func TestDecodeMessage_RoundTrip(t *testing.T) {
	in := Message{ID: "id", Key: "k", Tags: []string{"a", "b"}, Properties: map[string]string{"p": "v"},
		Body: []byte("body"), Timestamp: -5, DeliverAt: 7, StoredAt: 9, ReconsumeTimes: -3}
	b := AppendMessage([]byte("prefix"), &in)
	out := Message{Offset: 42, FreshID: true}
	if err := DecodeMessage(b[len("prefix"):], &out); err != nil {
		t.Fatal(err)
	}
	in.Offset = 42
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("decoded %+v, want %+v", out, in)
	}
	for i := range len(b) - len("prefix") {
		if err := DecodeMessage(b[len("prefix"):len(b)-i-1], &out); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("cut by %d: %v, want ErrCorrupt", i+1, err)
		}
	}
}
