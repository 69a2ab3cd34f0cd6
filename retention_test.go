package mq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
)

func sendBodies(t testing.TB, p *mq.Producer, prefix string, n int) {
	t.Helper()
	msgs := make([]*mq.Message, n)
	for i := range msgs {
		msgs[i] = &mq.Message{Body: []byte(fmt.Sprintf("%s-%d", prefix, i))}
	}
	mustSend(t, p, msgs...)
}

// TestRetention_Age deletes messages older than the retention from the head
// on a fake clock, keeps the younger ones, and makes a group whose offset
// fell below the new head skip forward, logging how many it lost.
func TestRetention_Age(t *testing.T) {
	clk := newRetryClock()
	logs := &logRecords{}
	m, p := openWithTopic(t, "aged", 1, mq.WithClock(clk), mq.WithRetention(time.Hour),
		mq.WithMaintenanceInterval(time.Minute), mq.WithLogger(slog.New(logs)))

	// Group "slow" handles the first 10 messages, then stops.
	sendBodies(t, p, "old", 10)
	slow := &arrivals{}
	c := mustConsume(t, m, "aged", "slow", slow)
	waitFor(t, 10*time.Second, "the first 10 messages", func() bool { return slow.len() == 10 })
	c.Close()

	sendBodies(t, p, "old", 90) // offsets 10..99, stored at T0
	clk.Advance(30 * time.Minute)
	sendBodies(t, p, "new", 100) // offsets 100..199, stored at T0+30m
	clk.Advance(31 * time.Minute)

	// The upkeep runs on its own schedule: nudge the clock forward until it
	// has trimmed. The young messages stay younger than the hour throughout.
	waitFor(t, 20*time.Second, "trim by age", func() bool {
		clk.Advance(time.Second)
		return !stored(t, m, "aged", 0, 99)
	})
	for _, off := range []int64{0, 50, 99} {
		if stored(t, m, "aged", 0, off) {
			t.Errorf("offset %d, stored 61 minutes ago, is still there", off)
		}
	}
	for _, off := range []int64{100, 150, 199} {
		if !stored(t, m, "aged", 0, off) {
			t.Errorf("offset %d, stored 31 minutes ago, was deleted", off)
		}
	}
	waitFor(t, 10*time.Second, "the upkeep's log line", func() bool {
		_, ok := logs.find("retention deleted", "count")
		return ok
	})
	if n, _ := logs.find("retention deleted", "count"); n != "100" {
		t.Errorf("upkeep logged count %q, want 100", n)
	}

	slow = &arrivals{}
	mustConsume(t, m, "aged", "slow", slow)
	waitFor(t, 10*time.Second, "the surviving messages", func() bool { return slow.len() == 100 })
	if first := slow.msgs[0]; first.Offset != 100 || string(first.Body) != "new-0" {
		t.Errorf("group resumed at offset %d (%s), want 100 (new-0)", first.Offset, first.Body)
	}
	if lost, ok := logs.find("retention", "lost"); lost != "90" {
		t.Errorf("consumer logged lost=%q (found %v), want 90", lost, ok)
	}
}

// TestRetention_Consumed deletes what every group has committed past, and
// nothing before the slowest group has moved.
func TestRetention_Consumed(t *testing.T) {
	m, p := openWithTopic(t, "read", 1, mq.WithRetentionConsumed(), mq.WithDedupWindow(100*time.Millisecond),
		mq.WithMaintenanceInterval(20*time.Millisecond))
	sendBodies(t, p, "a", 50)
	fast := &arrivals{}
	cf := mustConsume(t, m, "read", "fast", fast)
	waitFor(t, 10*time.Second, "fast's 50 messages", func() bool { return fast.len() == 50 })
	cf.Close() // commits its offset: 50

	// "slow" exists (it claimed the partition) but holds its first message.
	var slowN atomic.Int64
	gate := make(chan struct{})
	cs := mustConsume(t, m, "read", "slow", mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
		if msg.Offset == 0 {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		slowN.Add(1)
		return nil
	}))
	time.Sleep(300 * time.Millisecond) // fifteen upkeep rounds
	if !stored(t, m, "read", 0, 0) {
		t.Fatal("offset 0 deleted while group slow has not committed past it")
	}
	close(gate)
	waitFor(t, 10*time.Second, "slow's 50 messages", func() bool { return slowN.Load() == 50 })
	cs.Close()
	waitFor(t, 20*time.Second, "the consumed head trimmed", func() bool { return !stored(t, m, "read", 0, 49) })
	sendBodies(t, p, "b", 1)
	if !stored(t, m, "read", 0, 50) {
		t.Fatal("offset 50, consumed by no group, was deleted")
	}
}

// TestRetention_Bytes keeps each partition's records under the byte limit
// by deleting the oldest, and no more than needed.
func TestRetention_Bytes(t *testing.T) {
	const (
		limit = 64 << 10
		total = 1000
		body  = 1024
	)
	m, p := openWithTopic(t, "sized", 1, mq.WithRetentionBytes(limit), mq.WithMaintenanceInterval(20*time.Millisecond))
	for i := 0; i < total; i += 50 {
		msgs := make([]*mq.Message, 50)
		for j := range msgs {
			msgs[j] = &mq.Message{Body: make([]byte, body)}
		}
		mustSend(t, p, msgs...)
	}
	// head finds the first stored offset; only the newest can remain.
	head := func() int64 {
		for off := int64(total - limit/body - 1); off < total; off++ {
			if stored(t, m, "sized", 0, off) {
				return off
			}
		}
		return total
	}
	waitFor(t, 20*time.Second, "trim by size", func() bool {
		return !stored(t, m, "sized", 0, int64(total-limit/body-1))
	})
	kept := int(total - head())
	t.Logf("%d of %d messages of %d bytes kept under a %d-byte limit", kept, total, body, limit)
	if kept*body > limit {
		t.Errorf("%d messages of %d bytes kept, over the %d-byte limit", kept, body, limit)
	}
	if overhead := 256; (kept+1)*(body+overhead) <= limit {
		t.Errorf("only %d messages kept: trimmed more than the limit asks", kept)
	}
}

// TestRetention_DiskReused writes, lets retention delete, and writes again:
// bbolt reuses the freed pages, so the partition file stays a small multiple
// of the byte limit however much passes through it.
func TestRetention_DiskReused(t *testing.T) {
	const (
		limit   = 1 << 20
		rounds  = 8
		round   = 4 << 20 // bytes of bodies sent per round
		body    = 1024
		maxFile = 8 << 20 // bbolt grows the file by doubling: 2, 4, 8 MiB
	)
	dir := t.TempDir()
	m := openNode(t, dir, mq.WithRetentionBytes(limit), mq.WithMaintenanceInterval(10*time.Millisecond),
		mq.WithDedupWindow(time.Second))
	mustCreate(t, m, "reuse", 1)
	p, _ := m.NewProducer("reuse")
	file := filepath.Join(dir, "topics", "reuse", "0.db")
	var sizes []int64
	for r := range rounds {
		for i := 0; i < round/body; i += 256 {
			msgs := make([]*mq.Message, 256)
			for j := range msgs {
				msgs[j] = &mq.Message{Body: make([]byte, body)}
			}
			mustSend(t, p, msgs...)
		}
		last := int64((r+1)*round/body - 1)
		waitFor(t, 20*time.Second, "trim by size", func() bool {
			return !stored(t, m, "reuse", 0, last-2*limit/body)
		})
		fi, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, fi.Size())
	}
	t.Logf("file size after each round of %d MiB with a %d MiB limit: %v", round>>20, limit>>20, sizes)
	if s := slices.Max(sizes); s > maxFile {
		t.Errorf("file reached %d bytes while %d MiB passed through a %d MiB limit: freed pages are not reused",
			s, rounds*round>>20, limit>>20)
	}
}

// TestProducer_DedupExpires checks that a message ID is forgotten once the
// dedup window has passed: the upkeep prunes its entry.
func TestProducer_DedupExpires(t *testing.T) {
	clk := newRetryClock()
	_, p := openWithTopic(t, "once", 1, mq.WithClock(clk), mq.WithDedupWindow(time.Minute),
		mq.WithMaintenanceInterval(10*time.Second))
	send := func() mq.SendResult {
		return mustSend(t, p, &mq.Message{ID: "order-1", Body: []byte("x")})[0]
	}
	if r := send(); r.Duplicate || r.Offset != 0 {
		t.Fatalf("first send: %+v", r)
	}
	clk.Advance(30 * time.Second)
	if r := send(); !r.Duplicate || r.Offset != 0 {
		t.Fatalf("send within the window: %+v, want the first result", r)
	}
	clk.Advance(2 * time.Minute)
	var r mq.SendResult
	waitFor(t, 20*time.Second, "the dedup entry to expire", func() bool {
		clk.Advance(time.Second)
		r = send()
		return !r.Duplicate
	})
	if r.Offset != 1 {
		t.Fatalf("send after the window: %+v, want a new copy at offset 1", r)
	}
}

// TestRetention_DecisionTTL checks that a transaction's recorded decision
// is forgotten once its time to live has passed: ResolveTx first reports the
// commit that stands, then that it knows nothing of the transaction.
func TestRetention_DecisionTTL(t *testing.T) {
	ctx := context.Background()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "host.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the node's Close
	host, err := localtx.NewBolt(db, localtx.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clk := newRetryClock()
	m, p := openWithTopic(t, "orders", 1, mq.WithLocalTx(host), mq.WithClock(clk),
		mq.WithDecisionTTL(time.Hour), mq.WithMaintenanceInterval(time.Minute))
	var txid string
	err = host.Run(ctx, func(ctx context.Context) error {
		txid = txID(t, ctx)
		return p.CommitMessage(ctx, &mq.Message{Body: []byte("order-1 placed")})
	})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := m.ResolveTx(ctx, txid, mq.TxRollback); err != nil || d != mq.TxCommit {
		t.Fatalf("ResolveTx within the TTL: %v, %v; want the standing commit", d, err)
	}
	// The node forgets the host's marker shortly after the commit (in real
	// time); until then no decision may be pruned (the sweep would publish
	// the transaction again).
	waitFor(t, 10*time.Second, "the host's marker to be forgotten", func() bool {
		recs, err := host.Committed(ctx, "", 1)
		if err != nil {
			t.Fatalf("Committed: %v", err)
		}
		return len(recs) == 0
	})
	clk.Advance(59 * time.Minute)
	if d, _ := m.ResolveTx(ctx, txid, mq.TxRollback); d != mq.TxCommit {
		t.Fatalf("decision forgotten before its TTL: %v", d)
	}
	clk.Advance(2 * time.Hour) // past the TTL and the hourly full trim
	// The node lets go of the transaction just after its Forget returns,
	// which the wait above cannot see: a trim in between keeps the decision
	// (seen under load) and the next hourly full trim prunes it. A minute a
	// poll reaches that trim in seconds.
	waitFor(t, 20*time.Second, "the decision to be pruned", func() bool {
		clk.Advance(time.Minute)
		d, err := m.ResolveTx(ctx, txid, mq.TxRollback)
		if err != nil {
			t.Fatalf("ResolveTx: %v", err)
		}
		return d == mq.TxUndecided
	})
}

func TestOpen_RetentionOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  mq.Option
	}{
		{"NegativeRetention", mq.WithRetention(-time.Second)},
		{"NegativeBytes", mq.WithRetentionBytes(-1)},
		{"ZeroDecisionTTL", mq.WithDecisionTTL(0)},
		{"ZeroInterval", mq.WithMaintenanceInterval(0)},
		{"IntervalBelow1ms", mq.WithMaintenanceInterval(time.Millisecond - 1)},
		{"IntervalPast24h", mq.WithMaintenanceInterval(24*time.Hour + 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := mq.Open(t.TempDir(), tc.opt)
			if !errors.Is(err, mq.ErrInvalidOption) {
				if m != nil {
					m.Close()
				}
				t.Fatalf("Open: %v, want ErrInvalidOption", err)
			}
		})
	}
	t.Run("ZeroDisables", func(t *testing.T) {
		m := openNode(t, "", mq.WithRetention(0), mq.WithRetentionBytes(0), mq.WithDecisionTTL(time.Hour))
		mustCreate(t, m, "kept", 1)
	})
}

// TestRetention_DamagedGroupRecord: one damaged group record (of
// an ordinary group, nothing to do with broadcasting) must not stop the
// partition's retention: messages older than the retention are still
// deleted. The upkeep lists every group record for the broadcast TTL
// (default on) and gives up the whole check, trim included, on the damage.
func TestRetention_DamagedGroupRecord(t *testing.T) {
	dir := t.TempDir()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "t", 1)
	publish(t, m, "t", "a", "b", "c")
	var s sink
	c, err := m.NewConsumer("t", "g", &s)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "delivery", func() bool { return s.len() == 3 })
	c.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "topics", "t", "0.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("groups"))
		v := bytes.Clone(b.Get([]byte("g")))
		if len(v) < 10 {
			return fmt.Errorf("group record %x", v)
		}
		v[5] ^= 0x01 // in the offset: its seal no longer matches
		return b.Put([]byte("g"), v)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	m = openNode(t, dir, mq.WithRetention(time.Millisecond), mq.WithMaintenanceInterval(20*time.Millisecond))
	if _, err := m.Lag(context.Background(), "t", "g"); !errors.Is(err, mq.ErrCorrupt) {
		t.Logf("Lag of the damaged group: %v", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	var lags []mq.PartitionLag
	for time.Now().Before(deadline) {
		if lags, err = m.Lag(context.Background(), "t", "other"); err != nil {
			t.Fatal(err)
		}
		if lags[0].Committed == lags[0].Next {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("retention never ran: %+v (3 messages stored long before a retention of 1ms)", lags)
}
