package mq_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/store"
)

// corruptBody is the body of message i in the corruption tests; each one is
// unique in the partition file, so the test can find its bytes.
func corruptBody(i int) string { return fmt.Sprintf("corruption-test-body-%03d", i) }

// TestMQ_Corrupt damages one stored record of a closed partition file and
// checks that the reopened node reports ErrCorrupt for it, never wrong data:
// ReadMessage returns the error, and a consumer delivers the messages before
// it, then stops there and logs the error.
func TestMQ_Corrupt(t *testing.T) {
	const (
		topic = "damaged"
		n     = 10
		bad   = 5 // offset of the damaged record
	)
	tests := []struct {
		name    string
		corrupt func(t *testing.T, path string)
	}{
		// A byte of the value changed through bbolt: the file stays a valid
		// bbolt file, only the record's own CRC can notice.
		{"BoltValue", func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			err = db.Update(func(tx *bolt.Tx) error {
				b := tx.Bucket([]byte("log"))
				var key [8]byte
				binary.BigEndian.PutUint64(key[:], bad)
				v := bytes.Clone(b.Get(key[:]))
				i := bytes.Index(v, []byte(corruptBody(bad)))
				if i < 0 {
					return fmt.Errorf("record %d (%q) does not hold its body", bad, v)
				}
				v[i+3] ^= 0x01 // "corruption" becomes "cosruption"
				return b.Put(key[:], v)
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
		// Bytes flipped in the file, as a bad disk would: bbolt checksums
		// only its meta pages and reads the damaged leaf page as it is.
		{"FileBytes", func(t *testing.T, path string) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			body := []byte(corruptBody(bad))
			hits := 0
			for i := 0; ; {
				j := bytes.Index(data[i:], body)
				if j < 0 {
					break
				}
				data[i+j+len(body)-1] ^= 0x40 // the last digit: '5' becomes 'u'
				i += j + len(body)
				hits++
			}
			if hits == 0 {
				t.Fatalf("body %q not found in %s", body, path)
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			m, err := mq.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			mustCreate(t, m, topic, 1)
			p, err := m.NewProducer(topic)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				res, err := p.SendMessage(ctx, &mq.Message{Key: "k", Body: []byte(corruptBody(i))})
				if err != nil {
					t.Fatal(err)
				}
				if res[0].Offset != int64(i) {
					t.Fatalf("message %d stored at offset %d", i, res[0].Offset)
				}
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}

			tt.corrupt(t, filepath.Join(dir, "topics", topic, "0.db"))

			logs := &errorLog{}
			m = openNode(t, dir, mq.WithLogger(slog.New(logs)))
			_, err = m.ReadMessage(ctx, topic, 0, bad)
			if !errors.Is(err, mq.ErrCorrupt) {
				t.Fatalf("ReadMessage(%d) = %v, want an error wrapping ErrCorrupt", bad, err)
			}
			for _, off := range []int64{bad - 1, bad + 1} {
				msg, err := m.ReadMessage(ctx, topic, 0, off)
				if err != nil {
					t.Fatalf("ReadMessage(%d) next to the damage: %v", off, err)
				}
				if string(msg.Body) != corruptBody(int(off)) {
					t.Fatalf("ReadMessage(%d) = %q, want %q", off, msg.Body, corruptBody(int(off)))
				}
			}

			// A consumer delivers what comes before the damage, then is
			// stopped by it: it logs ErrCorrupt and delivers nothing past it.
			var mu sync.Mutex
			var got []int64
			_, err = m.NewConsumer(topic, "reader", mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
				mu.Lock()
				got = append(got, msg.Offset)
				mu.Unlock()
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "the consumer to log the corrupt record", func() bool {
				return logs.has(func(err error) bool { return errors.Is(err, store.ErrCorrupt) || errors.Is(err, mq.ErrCorrupt) })
			})
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(got) != "[0 1 2 3 4]" {
				t.Fatalf("consumer delivered offsets %v, want [0 1 2 3 4]", got)
			}
		})
	}
}

// TestMQ_ReadMessage checks the answers of ReadMessage for each kind of
// request.
func TestMQ_ReadMessage(t *testing.T) {
	ctx := context.Background()
	m := openNode(t, "")
	mustCreate(t, m, "orders", 2)
	p, err := m.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	sent := &mq.Message{Key: "user-1", Body: []byte("hello"), Tags: []string{"a"}, Properties: map[string]string{"p": "v"}}
	if _, err := p.SendMessage(ctx, sent.ToPartition(1)); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	tests := []struct {
		name      string
		ctx       context.Context
		topic     string
		partition int
		offset    int64
		want      error
	}{
		{"OK", ctx, "orders", 1, 0, nil},
		{"ErrNoMessage", ctx, "orders", 1, 1, mq.ErrNoMessage},
		{"EmptyPartition", ctx, "orders", 0, 0, mq.ErrNoMessage},
		{"NegativeOffset", ctx, "orders", 1, -1, mq.ErrNoMessage},
		{"ErrInvalidPartition", ctx, "orders", 2, 0, mq.ErrInvalidPartition},
		{"NegativePartition", ctx, "orders", -1, 0, mq.ErrInvalidPartition},
		{"ErrNoTopic", ctx, "nope", 0, 0, mq.ErrNoTopic},
		{"Cancelled", cancelled, "orders", 1, 0, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := m.ReadMessage(tt.ctx, tt.topic, tt.partition, tt.offset)
			if !errors.Is(err, tt.want) || (tt.want != nil && err == nil) {
				t.Fatalf("ReadMessage = %v, want %v", err, tt.want)
			}
			if tt.want != nil {
				return
			}
			if msg.ID != sent.ID || msg.Topic != "orders" || msg.PartitionIndex != 1 || msg.Offset != 0 ||
				msg.Key != "user-1" || string(msg.Body) != "hello" || fmt.Sprint(msg.Tags) != "[a]" ||
				msg.Properties["p"] != "v" || !msg.Timestamp.Equal(sent.Timestamp) {
				t.Fatalf("ReadMessage = %+v, sent %+v", msg, sent)
			}
		})
	}

	t.Run("ErrClosed", func(t *testing.T) {
		m := openNode(t, "")
		mustCreate(t, m, "orders", 1)
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := m.ReadMessage(ctx, "orders", 0, 0); !errors.Is(err, mq.ErrClosed) {
			t.Fatalf("ReadMessage after Close = %v, want ErrClosed", err)
		}
	})
}
