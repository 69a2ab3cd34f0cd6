package topicdb

import (
	"os"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/fuzzseed"
)

// TestTopicMeta_EveryBit flips each bit of a topic record in turn: the
// record never decodes to something else, so bbolt's unchecked pages cannot
// silently change a topic's type, partition count or creation time.
func TestTopicMeta_EveryBit(t *testing.T) {
	tm := Topic{Partitions: 8, Type: typeSingle, Created: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)}
	rec := encodeTopic("orders", tm)
	for i := range len(rec) * 8 {
		d := append([]byte(nil), rec...)
		d[i/8] ^= 1 << (i % 8)
		got, _, err := decodeTopic("orders", d)
		if err == nil {
			t.Fatalf("bit %d flipped: decoded %+v (from %+v), want an error", i, got, tm)
		}
	}
	// The name is covered too: a flipped byte in the key renames nothing.
	if got, _, err := decodeTopic("ordets", rec); err == nil {
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
			tm     Topic
			legacy bool
			err    error
		)
		fuzzseed.CheckAlloc(t, len(rec), func() { tm, legacy, err = decodeTopic(name, rec) })
		if err != nil {
			return
		}
		back := encodeTopic(name, tm)
		if !legacy && string(back) != string(rec) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", rec, tm, back)
		}
		again, _, err := decodeTopic(name, back)
		if err != nil || again.Partitions != tm.Partitions || again.Type != tm.Type || !again.Created.Equal(tm.Created) {
			t.Fatalf("%x decodes to %+v, whose record %x decodes to %+v, %v", rec, tm, back, again, err)
		}
	})
}

// fuzzSeeds returns the seeds of FuzzTopicMeta: records by the real encoder
// and by the msgpack library that wrote the legacy ones, and edge cases (cut
// short, lengths claiming more than is there). TestWriteFuzzCorpus writes
// them to testdata/fuzz.
func fuzzSeeds() map[string][][]any {
	created := time.Unix(1700000000, 5)
	legacy, _ := msgpack.Marshal(&legacyTopic{Partitions: 2, Type: typeRaft3, Created: created})
	far, _ := msgpack.Marshal(&legacyTopic{Partitions: 2, Type: typeSingle, Created: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)})
	epoch, _ := msgpack.Marshal(&legacyTopic{Partitions: 2, Type: typeSingle, Created: time.Unix(0, 0)})
	return map[string][][]any{
		"FuzzTopicMeta": {
			{"orders", encodeTopic("orders", Topic{Partitions: 3, Type: typeSingle, Created: created})},
			{"t", encodeTopic("t", Topic{Partitions: MaxPartitions, Type: typeRaft3})},
			{"orders", encodeTopic("orders", Topic{Partitions: 3, Type: typeSingle})[:21]},
			{"legacy", []byte("\x83\xa1p\x02\xa1t\x01\xa1c\xd7\xff\x00\x00\x00\x00fV\x93\x00")},
			{"legacy", legacy},
			{"far", far},
			{"epoch", epoch},
			{"legacy", legacy[:len(legacy)-3]},
			{"huge", []byte("\xdf\xff\xff\xff\xff")},
			{"huge", []byte("\x81\xa1c\xc7\xff\xff")},
			{"huge", []byte("\x81\xa1p\xdb\xff\xff\xff\xff")},
		},
	}
}

// TestWriteFuzzCorpus writes the seeds to testdata/fuzz/<target>/:
// ZEZE_WRITE_CORPUS=1 go test -run TestWriteFuzzCorpus ./internal/topicdb.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("ZEZE_WRITE_CORPUS") != "1" {
		t.Skip("ZEZE_WRITE_CORPUS=1 writes the seed corpus")
	}
	fuzzseed.WriteCorpus(t, fuzzSeeds())
}
