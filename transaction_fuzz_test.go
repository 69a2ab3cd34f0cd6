package mq

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/store"
)

// FuzzTxRows decodes arbitrary marker and outbox rows: no panic, any error
// is ErrCorrupt, and what decodes comes back the same from its version 2
// encoding.
func FuzzTxRows(f *testing.F) {
	msg := store.Message{ID: "id", Key: "k", Tags: []string{"a", "b"}, Properties: map[string]string{"x": "1", "y": ""},
		Body: []byte("body"), Timestamp: 1 << 62, DeliverAt: -1}
	f.Add(encodeMarker([]partRef{{"orders", 3}, {"audit", 0}}), encodeOutboxRow(partRef{"orders", 3}, &msg))
	f.Add(encodeMarker(nil), encodeOutboxRow(partRef{}, &store.Message{}))
	v1m, _ := msgpack.Marshal(&markerV1{V: txFormatV1, Halves: []partRefV1{{Topic: "orders", Part: 1}}})
	v1r, _ := msgpack.Marshal(&outboxRowV1{V: txFormatV1, Topic: "orders", Part: 2, ID: "id", Body: []byte("b"), Tags: []string{"t"}})
	f.Add(v1m, v1r)
	f.Add([]byte("ZMQM\x09"), []byte("ZMQO"))
	f.Fuzz(func(t *testing.T, marker, row []byte) {
		halves, err := decodeMarker("tx", marker)
		switch {
		case err != nil && !errors.Is(err, ErrCorrupt):
			t.Fatalf("marker error %v is not ErrCorrupt", err)
		case err == nil:
			again, err := decodeMarker("tx", encodeMarker(halves))
			if err != nil || !slices.Equal(again, halves) {
				t.Fatalf("marker %v came back as %v, %v", halves, again, err)
			}
		}
		ref, m, err := decodeOutboxRow("tx", row)
		switch {
		case err != nil && !errors.Is(err, ErrCorrupt):
			t.Fatalf("outbox error %v is not ErrCorrupt", err)
		case err == nil:
			ref2, m2, err := decodeOutboxRow("tx", encodeOutboxRow(ref, &m))
			if err != nil || ref2 != ref || !reflect.DeepEqual(m2, m) {
				t.Fatalf("outbox row %v %+v came back as %v %+v, %v", ref, m, ref2, m2, err)
			}
		}
	})
}
