package mq

import (
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/fuzzseed"
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

// FuzzTopicMeta decodes arbitrary records: never a panic, little is
// allocated, what decodes in the current layout encodes back to the same
// bytes, and a legacy record (which Open rewrites in the current layout)
// encodes to a record that decodes the same.
func FuzzTopicMeta(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	f.Fuzz(func(t *testing.T, name string, rec []byte) {
		var (
			tm     topicMeta
			legacy bool
			err    error
		)
		fuzzseed.CheckAlloc(t, len(rec), func() { tm, legacy, err = decodeTopicMeta(name, rec) })
		if err != nil {
			return
		}
		back := encodeTopicMeta(name, tm)
		if !legacy && string(back) != string(rec) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", rec, tm, back)
		}
		again, _, err := decodeTopicMeta(name, back)
		if err != nil || again.Partitions != tm.Partitions || again.Type != tm.Type || !again.Created.Equal(tm.Created) {
			t.Fatalf("%x decodes to %+v, whose record %x decodes to %+v, %v", rec, tm, back, again, err)
		}
	})
}
