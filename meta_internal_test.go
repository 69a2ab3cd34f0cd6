package mq

import (
	"testing"
	"time"
)

// TestTopicMeta_EveryBit flips each bit of a topic record in turn: the
// record never decodes to something else, so bbolt's unchecked pages cannot
// silently change a topic's type, partition count or creation time.
func TestTopicMeta_EveryBit(t *testing.T) {
	tm := topicMeta{Partitions: 8, Type: Single, Created: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)}
	rec := encodeTopicMeta("orders", tm)
	for i := range len(rec) * 8 {
		d := append([]byte(nil), rec...)
		d[i/8] ^= 1 << (i % 8)
		got, _, err := decodeTopicMeta("orders", d)
		if err == nil {
			t.Fatalf("bit %d flipped: decoded %+v (from %+v), want an error", i, got, tm)
		}
	}
	// The name is covered too: a flipped byte in the key renames nothing.
	if got, _, err := decodeTopicMeta("ordets", rec); err == nil {
		t.Fatalf("record of orders read as ordets: %+v, want an error", got)
	}
}

// FuzzTopicMeta decodes arbitrary records: never a panic, and what decodes
// in the current layout encodes back to the same bytes.
func FuzzTopicMeta(f *testing.F) {
	f.Add("orders", encodeTopicMeta("orders", topicMeta{Partitions: 3, Type: Single, Created: time.Unix(1700000000, 5)}))
	f.Add("t", encodeTopicMeta("t", topicMeta{Partitions: MaxPartitions, Type: Raft3}))
	// A record of the legacy layout: msgpack {"p": 2, "t": 1, "c": time}.
	f.Add("legacy", []byte("\x83\xa1p\x02\xa1t\x01\xa1c\xd7\xff\x00\x00\x00\x00fV\x93\x00"))
	f.Fuzz(func(t *testing.T, name string, rec []byte) {
		tm, legacy, err := decodeTopicMeta(name, rec)
		if err != nil || legacy {
			return
		}
		if back := encodeTopicMeta(name, tm); string(back) != string(rec) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", rec, tm, back)
		}
	})
}
