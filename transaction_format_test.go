package mq_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestTransaction_RowFormat pins the layout of the marker and outbox rows
// the node writes into the host store: magic, version, then the fields.
func TestTransaction_RowFormat(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "orders", 2)
	p, err := m.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]byte{}
	tx := &fakeTx{id: "tx-format", put: func(bucket, _, value []byte) error {
		rows[string(bucket)] = bytes.Clone(value)
		return nil
	}}
	ctx := localtx.WithTx(context.Background(), tx)
	if err := p.PrepareMessage(ctx, (&mq.Message{ID: "half-0", Body: []byte("h")}).ToPartition(1)); err != nil {
		t.Fatal(err)
	}
	out := (&mq.Message{ID: "out-0", Key: "k0", Tags: []string{"t"}, Properties: map[string]string{"b": "2", "a": "1"},
		Body: []byte("out"), Timestamp: time.Unix(0, 0x0102030405060708)}).ToPartition(0)
	if err := p.CommitMessage(ctx, out); err != nil {
		t.Fatal(err)
	}

	str := func(s string) []byte { return append([]byte{byte(len(s))}, s...) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	be := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	wantMarker := cat([]byte("ZMQM\x03"), str(""), []byte{1}, str("orders"), []byte{1}) // a standalone node: no owner
	wantRow := cat([]byte("ZMQO\x02"), str("orders"), []byte{0}, str("out-0"), str("k0"),
		[]byte{1}, str("t"), []byte{2}, str("a"), str("1"), str("b"), str("2"),
		str("out"), be(0x0102030405060708), be(0))
	if got := rows[string(localtx.MarkerBucket)]; !bytes.Equal(got, wantMarker) {
		t.Errorf("marker\n got %q\nwant %q", got, wantMarker)
	}
	if got := rows[string(localtx.OutboxBucket)]; !bytes.Equal(got, wantRow) {
		t.Errorf("outbox row\n got %q\nwant %q", got, wantRow)
	}
}

// v1Marker and v1Row encode rows as the first format did: msgpack arrays
// whose first element is the version, 1.
func v1Marker(t testing.TB, halves ...[]any) []byte {
	t.Helper()
	if halves == nil {
		halves = [][]any{}
	}
	b, err := msgpack.Marshal([]any{1, halves})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func v1Row(t testing.TB, topic string, part int, m *mq.Message) []byte {
	t.Helper()
	b, err := msgpack.Marshal([]any{1, topic, part, m.ID, m.Key, m.Tags, m.Properties, m.Body, m.Timestamp.UnixNano(), int64(0)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTransaction_RowFormatV1: rows written by the first format, still in
// users' host stores, are read: the check-back publishes a transaction
// with half messages, the sweep one with only outbox rows.
func TestTransaction_RowFormatV1(t *testing.T) {
	for _, adapter := range txtest.Names {
		t.Run(adapter, func(t *testing.T) {
			e := newTxEnv(t, adapter)
			ctx := context.Background()
			discard := &fakeTx{}
			err := e.h.Run(ctx, func(ctx context.Context) error {
				real, _ := localtx.FromContext(ctx)
				discard.id = real.ID()
				// The half messages, through a transaction whose own rows go nowhere.
				if err := e.p.PrepareMessage(localtx.WithTx(ctx, discard), (&mq.Message{ID: "v1-half", Body: []byte("h")}).ToPartition(1)); err != nil {
					return err
				}
				out := &mq.Message{ID: "v1-out", Key: "k", Tags: []string{"a"}, Properties: map[string]string{"p": "q"}, Body: []byte("o"), Timestamp: time.Unix(7, 0)}
				if err := real.Put(localtx.MarkerBucket, []byte(real.ID()), v1Marker(t, []any{"orders", 1})); err != nil {
					return err
				}
				return real.Put(localtx.OutboxBucket, localtx.OutboxKey(real.ID(), 0), v1Row(t, "orders", 2, out))
			})
			if err != nil {
				t.Fatal(err)
			}
			err = e.h.Run(ctx, func(ctx context.Context) error {
				real, _ := localtx.FromContext(ctx)
				if err := real.Put(localtx.MarkerBucket, []byte(real.ID()), v1Marker(t)); err != nil {
					return err
				}
				return real.Put(localtx.OutboxBucket, localtx.OutboxKey(real.ID(), 0), v1Row(t, "orders", 3, &mq.Message{ID: "v1-only", Body: []byte("x")}))
			})
			if err != nil {
				t.Fatal(err)
			}
			waitSeen(t, e.col, "v1-half", "v1-out", "v1-only")
			got := e.col.byID("v1-out")
			if got.PartitionIndex != 2 || got.Key != "k" || len(got.Tags) != 1 || got.Tags[0] != "a" ||
				got.Properties["p"] != "q" || string(got.Body) != "o" || !got.Timestamp.Equal(time.Unix(7, 0)) {
				t.Errorf("v1 outbox row delivered as %+v", got)
			}
			if got := e.col.byID("v1-only"); got.PartitionIndex != 3 {
				t.Errorf("v1 outbox-only row delivered to partition %d, want 3", got.PartitionIndex)
			}
			waitFor(t, 5*time.Second, "markers forgotten", func() bool {
				n, err := e.h.Markers()
				return err == nil && n == 0
			})
		})
	}
}

// TestTransaction_RowFormatUnknown: a marker or outbox row of an unknown
// version is refused with ErrCorrupt naming it; the transaction is left in
// place, undelivered, for an operator (or a newer build).
func TestTransaction_RowFormatUnknown(t *testing.T) {
	for _, c := range []struct {
		name   string
		bucket []byte
		row    []byte
		want   string // in the error
	}{
		{"MarkerVersion", localtx.MarkerBucket, []byte("ZMQM\x09\x00"), "marker of %s: format version 9"},
		{"MarkerV1Version", localtx.MarkerBucket, []byte{0x92, 0x07, 0x90}, "marker of %s: format version 7"},
		{"MarkerGarbage", localtx.MarkerBucket, []byte("garbage"), "marker of %s"},
		{"MarkerTruncated", localtx.MarkerBucket, []byte("ZMQM\x02\x01\x06ord"), "marker of %s"},
		{"OutboxVersion", localtx.OutboxBucket, []byte("ZMQO\x09"), "outbox of %s: format version 9"},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := &logRecords{}
			e := newTxEnv(t, "bolt", mq.WithLogger(slog.New(logs)))
			h := e.h
			ctx := context.Background()
			var id string
			err := h.Run(ctx, func(ctx context.Context) error {
				real, _ := localtx.FromContext(ctx)
				id = real.ID()
				// The node's own rows, through a transaction whose hooks never
				// run, as if the process died after the host's commit.
				fctx := localtx.WithTx(ctx, &fakeTx{id: id, put: real.Put})
				if err := e.p.PrepareMessage(fctx, msgs("half", 2)...); err != nil {
					return err
				}
				if err := e.p.CommitMessage(fctx, msgs("out", 1)...); err != nil {
					return err
				}
				key := []byte(id)
				if bytes.Equal(c.bucket, localtx.OutboxBucket) {
					key = localtx.OutboxKey(id, 0)
				}
				return real.Put(c.bucket, key, c.row)
			})
			if err != nil {
				t.Fatal(err)
			}
			want := strings.ReplaceAll(c.want, "%s", id)
			_, err = e.m.ResolveTx(ctx, id, mq.TxCommit)
			if !errors.Is(err, mq.ErrCorrupt) || !strings.Contains(err.Error(), want) {
				t.Errorf("ResolveTx(commit) = %v, want ErrCorrupt with %q", err, want)
			}
			waitFor(t, 10*time.Second, "the check-back to find the row unreadable", func() bool {
				got, ok := logs.find("cannot read", "tx")
				return ok && got == id
			})
			checkNone(t, e, []string{"half-0", "half-1", "out-0"})
			if d := mq.TxDecided(e.m, id); d != mq.TxUndecided {
				t.Errorf("a transaction with an unreadable row was decided: %v", d)
			}
			if n, err := h.Markers(); err != nil || n != 1 {
				t.Errorf("markers %d, %v; want the unreadable one kept", n, err)
			}
		})
	}
}

// errStore is a host store that cannot answer.
type errStore struct{ unknownStore }

var errStoreDown = errors.New("store down")

func (s *errStore) Check(context.Context, string) (localtx.State, localtx.Record, error) {
	return localtx.Unknown, localtx.Record{}, errStoreDown
}

// TestMQ_ResolveTx_StoreError: committing a transaction while a host store
// cannot say what rows it holds decides nothing: the rows it may hold would
// be lost by a commit of the half messages alone.
func TestMQ_ResolveTx_StoreError(t *testing.T) {
	m := openNode(t, "", mq.WithLocalTx(&errStore{}), mq.WithTxCheckAfter(time.Hour))
	mustCreate(t, m, "orders", 1)
	p, _ := m.NewProducer("orders")
	ctx := context.Background()
	if err := p.PrepareMessage(localtx.WithTx(ctx, &fakeTx{id: "tx-1"}), msgs("half", 1)...); err != nil {
		t.Fatal(err)
	}
	if d, err := m.ResolveTx(ctx, "tx-1", mq.TxCommit); !errors.Is(err, errStoreDown) {
		t.Errorf("ResolveTx(commit) = %v, %v; want the store's error", d, err)
	}
	if d := mq.TxDecided(m, "tx-1"); d != mq.TxUndecided {
		t.Errorf("decided %v while the store could not answer", d)
	}
}
