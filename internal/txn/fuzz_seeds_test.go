package txn

import (
	"os"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/store"
)

// fuzzSeeds returns the seeds of each fuzz target of this package:
// encodings by the real encoders (and the msgpack library that wrote the
// legacy records), and edge cases (cut short, lengths claiming more than is
// there). The targets add them; TestWriteFuzzCorpus writes them to
// testdata/fuzz.
func fuzzSeeds() map[string][][]any {
	msg := store.Message{ID: "id", Key: "k", Tags: []string{"a", "b"}, Properties: map[string]string{"x": "1", "y": ""},
		Body: []byte("body"), Timestamp: 1 << 62, DeliverAt: -1}
	marker := encodeMarker("node-1", []Ref{{"orders", 3}, {"audit", 0}})
	row := encodeOutboxRow(Ref{"orders", 3}, &msg)
	v1m, _ := msgpack.Marshal(&markerV1{V: txFormatV1, Halves: []partRefV1{{Topic: "orders", Part: 1}}})
	v1r, _ := msgpack.Marshal(&outboxRowV1{V: txFormatV1, Topic: "orders", Part: 2, ID: "id", Body: []byte("b"), Tags: []string{"t"},
		Properties: map[string]string{"p": "v"}, Timestamp: 5})

	return map[string][][]any{
		"FuzzTxRows": {
			{marker, row},
			{encodeMarker("", nil), encodeOutboxRow(Ref{}, &store.Message{})},
			{[]byte("ZMQM\x02\x01\x06orders\x03"), row}, // version 2: no owner
			{v1m, v1r},
			{marker[:len(marker)-2], row[:len(row)-9]},
			{[]byte("ZMQM\x09"), []byte("ZMQO")},
			{[]byte("ZMQM\x02\xff\xff\xff\xff\x0f"), []byte("ZMQO\x02\x06orders\x03\x02id\x00\x00\x00\xff\xff\xff\xff\x0f")},
			{[]byte("\x92\x01\xdd\xff\xff\xff\xff"), []byte("\x9b\x01\xdb\xff\xff\xff\xff")},
			{[]byte("\x92\x01\xdf\xff\xff\xff\xff"), []byte("\x9b\x01\xa1t\x02\xa0\xa0\xdc\xff\xff")},
			{[]byte("\x92\x01\x91\x92\xc6\xff\xff\xff\xff"), []byte("\x9b\x01\xa1t\x02\xa0\xa0\x90\x80\xc6\xff\xff\xff\xff")},
		},
	}
}

// TestWriteFuzzCorpus writes the seeds to testdata/fuzz/<target>/ in the
// fuzzer's corpus format, named like the fuzzer names them:
// ZEZE_WRITE_CORPUS=1 go test -run TestWriteFuzzCorpus ./internal/txn.
// Files already there are kept.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("ZEZE_WRITE_CORPUS") != "1" {
		t.Skip("ZEZE_WRITE_CORPUS=1 writes the seed corpus")
	}
	fuzzseed.WriteCorpus(t, fuzzSeeds())
}
