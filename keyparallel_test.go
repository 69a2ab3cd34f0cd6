package mq_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// keyedFixture stores keys×per messages in one partition, interleaved:
// "k0-0", "k1-0", ..., "k0-1", ...
func keyedFixture(t *testing.T, keys, per int) *mq.MQ {
	t.Helper()
	m := openNode(t, "")
	mustCreate(t, m, "t", 1)
	p, _ := m.NewProducer("t")
	var msgs []*mq.Message
	for i := range per {
		for k := range keys {
			key := "k" + strconv.Itoa(k)
			msgs = append(msgs, (&mq.Message{Key: key, Body: []byte(fmt.Sprintf("%s-%d", key, i))}).ToPartition(0))
		}
	}
	mustSend(t, p, msgs...)
	return m
}

// TestConsumer_KeyParallel: different keys run in parallel, up to the limit;
// each key stays in order; a failing message holds up only its own key.
func TestConsumer_KeyParallel(t *testing.T) {
	const keys, per, limit = 6, 15, 3
	m := keyedFixture(t, keys, per)
	b := &blocker{failBody: "k1-3"}
	b.blocked.Store(true)
	consume(t, m, "t", "g", b, mq.WithKeyParallel(limit), mq.WithRetryLadder(time.Millisecond), mq.WithMaxReconsumeTimes(1_000_000))
	// Every other key finishes while k1 is stuck at k1-3.
	waitFor(t, 10*time.Second, "the other keys", func() bool { return b.done() == (keys-1)*per+3 })
	b.mu.Lock()
	if got := b.byKey["k1"]; !slices.Equal(got, []string{"k1-0", "k1-1", "k1-2"}) {
		t.Fatalf("k1 got %v while k1-3 fails", got)
	}
	b.mu.Unlock()
	if b.fails.Load() < 2 {
		t.Fatalf("k1-3 failed %d times", b.fails.Load())
	}
	b.blocked.Store(false)
	waitFor(t, 10*time.Second, "k1", func() bool { return b.done() == keys*per })
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, got := range b.byKey {
		want := make([]string, per)
		for i := range want {
			want[i] = fmt.Sprintf("%s-%d", k, i)
		}
		if !slices.Equal(got, want) {
			t.Errorf("key %s delivered %v", k, got)
		}
	}
	if most := b.most.Load(); most < 2 || most > limit {
		t.Errorf("%d handlers at once, want 2..%d", most, limit)
	}
}

// TestConsumer_KeyParallelWindow: while a key is stuck, the committed offset
// stays at its message (a new owner starts there: nothing before it is
// delivered again), and the window bounds how far the other keys run ahead.
func TestConsumer_KeyParallelWindow(t *testing.T) {
	const keys, per, window = 4, 10, 8
	m := keyedFixture(t, keys, per)
	b := &blocker{failBody: "k1-1"} // offset 5
	b.blocked.Store(true)
	c := consume(t, m, "t", "g", b, mq.WithKeyParallel(keys), mq.WithFlowControl(window, 1<<20),
		mq.WithRetryLadder(time.Millisecond), mq.WithMaxReconsumeTimes(1_000_000))
	// The window holds offsets 5..12 at most: 5 done before it, 7 after.
	waitFor(t, 10*time.Second, "a full window", func() bool { return b.done() == 5+window-1-1 })
	time.Sleep(30 * time.Millisecond)
	if n := b.done(); n != 5+window-2 {
		// Offsets 0-4 done; in the window 5 (stuck), 9 (k1-2, same key,
		// waiting) and 6, 7, 8, 10, 11, 12 done.
		t.Fatalf("%d messages done past a full window, want %d", n, 5+window-2)
	}
	c.Close()

	b2 := &blocker{}
	consume(t, m, "t", "g", b2, mq.WithKeyParallel(keys))
	waitFor(t, 10*time.Second, "the rest", func() bool { return b2.done() == keys*per-5 })
	b2.mu.Lock()
	defer b2.mu.Unlock()
	if got := strings.Join(b2.byKey["k1"], ","); !strings.HasPrefix(got, "k1-1,k1-2") {
		t.Errorf("the new owner's k1 starts %s, want k1-1", got)
	}
	if slices.Contains(b2.order, "k0-1") || slices.Contains(b2.order, "k0-0") {
		t.Errorf("a message before the stuck one was delivered again: %v", b2.order)
	}
}

// TestConsumer_KeyParallelConcurrent: in Concurrent mode a failing message
// is parked and even its own key goes on; the retry comes back presented as
// the original.
func TestConsumer_KeyParallelConcurrent(t *testing.T) {
	const keys, per = 4, 5
	m := keyedFixture(t, keys, per)
	s := &sink{fail: func(m *mq.Message, _ []*mq.Message) error {
		if string(m.Body) == "k1-2" && m.ReconsumeTimes == 0 {
			return errBoom
		}
		return nil
	}}
	consume(t, m, "t", "g", s, mq.WithKeyParallel(keys), mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(0))
	waitFor(t, 10*time.Second, "every message and the retry", func() bool { return s.len() == keys*per+1 })
	var k1 []string
	var retry *mq.Message
	for _, msg := range s.all() {
		if msg.Key == "k1" && msg.ReconsumeTimes == 0 {
			k1 = append(k1, string(msg.Body))
		}
		if msg.ReconsumeTimes == 1 {
			retry = msg
		}
	}
	if want := []string{"k1-0", "k1-1", "k1-2", "k1-3", "k1-4"}; !slices.Equal(k1, want) {
		t.Errorf("k1 first deliveries %v, want %v", k1, want)
	}
	if retry == nil || string(retry.Body) != "k1-2" || retry.Offset != 2*keys+1 || retry.Key != "k1" {
		t.Fatalf("retry %+v", retry)
	}
}

// TestConsumer_KeyParallelRetention: a key-parallel group whose offset fell
// below the head that retention left skips forward and logs the count lost,
// as a one-by-one group does.
func TestConsumer_KeyParallelRetention(t *testing.T) {
	clk := newRetryClock()
	logs := &logRecords{}
	m := openNode(t, "", mq.WithClock(clk), mq.WithRetention(time.Hour),
		mq.WithMaintenanceInterval(time.Minute), mq.WithLogger(slog.New(logs)))
	mustCreate(t, m, "t", 1)
	if err := m.ResetOffset(context.Background(), "t", "g", mq.SeekFirst()); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		publish(t, m, "t", fmt.Sprintf("old-%d", i))
	}
	clk.Advance(61 * time.Minute)
	waitFor(t, 20*time.Second, "trim by age", func() bool {
		clk.Advance(time.Second)
		return !stored(t, m, "t", 0, 9)
	})
	publish(t, m, "t", "new")
	s := &sink{}
	consume(t, m, "t", "g", s, mq.WithKeyParallel(4))
	waitFor(t, 5*time.Second, "new", func() bool { return s.len() == 1 })
	if b := s.bodies(); b[0] != "new" {
		t.Fatalf("got %v", b)
	}
	if lost, ok := logs.find("retention", "lost"); lost != "10" {
		t.Errorf("consumer logged lost=%q (found %v), want 10", lost, ok)
	}
}
