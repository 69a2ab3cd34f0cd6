package mq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// quantile returns the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// TestDelay_Precision sends delayed messages due at spread-out times on an
// otherwise idle node: none arrives before its DeliverAt, and they arrive
// within a few milliseconds after it (the issue asks for 100 ms).
func TestDelay_Precision(t *testing.T) {
	const n = 300
	m, p := openWithTopic(t, "later", 4)
	got := &arrivals{}
	mustConsume(t, m, "later", "g", got)

	start := time.Now().Add(200 * time.Millisecond)
	var msgs []*mq.Message
	for i := range n {
		// Due times 5 ms apart, sent in shuffled order.
		j := (i * 7) % n
		msgs = append(msgs, &mq.Message{
			Key:       "k" + strconv.Itoa(j%13),
			Body:      []byte(strconv.Itoa(j)),
			DeliverAt: start.Add(time.Duration(j) * 5 * time.Millisecond),
		})
	}
	for i := 0; i < n; i += 50 {
		for _, r := range mustSend(t, p, msgs[i:i+50]...) {
			if !r.Delayed || r.Offset != -1 {
				t.Fatalf("send result %+v, want Delayed with offset -1", r)
			}
		}
	}
	waitFor(t, 30*time.Second, "delayed messages", func() bool { return got.len() == n })

	late := got.lateness()
	if late[0] < 0 {
		t.Errorf("a message arrived %v before its DeliverAt", -late[0])
	}
	p50, p99, worst := quantile(late, 0.50), quantile(late, 0.99), late[len(late)-1]
	t.Logf("lateness of %d delayed messages: p50 %v, p99 %v, max %v", n, p50, p99, worst)
	// 100 ms is the target on an idle node; CI runs other test packages at
	// the same time under -race, so only the median is held to it and the
	// tail gets a wide margin.
	if p50 > 100*time.Millisecond || worst > 2*time.Second {
		t.Errorf("lateness p50 %v (limit 100ms), max %v (limit 2s)", p50, worst)
	}
}

// TestDelay_FakeClock checks "not before DeliverAt" against the node's clock:
// a message due in an hour stays held until the clock gets there.
func TestDelay_FakeClock(t *testing.T) {
	clk := newRetryClock()
	m, p := openWithTopic(t, "later", 1, mq.WithClock(clk))
	got := &arrivals{}
	mustConsume(t, m, "later", "g", got)

	mustSend(t, p, &mq.Message{Body: []byte("in an hour"), DeliverAt: clk.Now().Add(time.Hour)})
	mustSend(t, p, &mq.Message{Body: []byte("now")})
	waitFor(t, 10*time.Second, "the undelayed message", func() bool { return got.len() == 1 })

	clk.Advance(59 * time.Minute)
	time.Sleep(50 * time.Millisecond) // give a wrong release the time to show
	if n := got.len(); n != 1 {
		t.Fatalf("%d messages delivered at 59 minutes, want 1", n)
	}
	clk.Advance(time.Minute)
	waitFor(t, 10*time.Second, "the delayed message", func() bool { return got.len() == 2 })
	if b := got.bodiesOfKey(""); b[1] != "in an hour" {
		t.Fatalf("delivered %q", b)
	}
	if off := got.msgs[1].Offset; off != 1 {
		t.Errorf("released message has offset %d, want 1 (the next free one)", off)
	}
}

// TestDelay_Restart closes the node with delayed messages waiting: those
// that fell due while it was down arrive right after Open, the others at
// their time.
func TestDelay_Restart(t *testing.T) {
	dir := t.TempDir()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "later", 2)
	p, _ := m.NewProducer("later")
	now := time.Now()
	early := now.Add(100 * time.Millisecond) // due while the node is down
	late := now.Add(1500 * time.Millisecond) // due after it is back
	var msgs []*mq.Message
	for i := range 20 {
		at := early
		if i%2 == 1 {
			at = late
		}
		msgs = append(msgs, &mq.Message{Key: "k" + strconv.Itoa(i%4), Body: []byte(strconv.Itoa(i)), DeliverAt: at})
	}
	mustSend(t, p, msgs...)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(early) + 50*time.Millisecond)

	m = openNode(t, dir)
	got := &arrivals{}
	mustConsume(t, m, "later", "g", got)
	waitFor(t, 10*time.Second, "delayed messages after restart", func() bool { return got.len() == 20 })
	got.mu.Lock()
	defer got.mu.Unlock()
	for i, msg := range got.msgs {
		if got.at[i].Before(msg.DeliverAt) {
			t.Errorf("message %s arrived %v before its DeliverAt", msg.Body, msg.DeliverAt.Sub(got.at[i]))
		}
		if n, _ := strconv.Atoi(string(msg.Body)); (n%2 == 0) != msg.DeliverAt.Equal(early) {
			t.Errorf("message %s has DeliverAt %v", msg.Body, msg.DeliverAt)
		}
	}
}

// TestDelay_SameKeyOrder checks that messages of one key due at the same
// time arrive in send order, across several sends, and after the messages
// of that key due earlier, even ones sent later.
func TestDelay_SameKeyOrder(t *testing.T) {
	m, p := openWithTopic(t, "later", 2)
	got := &arrivals{}
	mustConsume(t, m, "later", "g", got)

	due := time.Now().Add(300 * time.Millisecond)
	var want []string
	for batch := range 5 {
		var msgs []*mq.Message
		for i := range 100 {
			body := fmt.Sprintf("same-%d-%03d", batch, i)
			want = append(want, body)
			msgs = append(msgs, &mq.Message{Key: "k", Body: []byte(body), DeliverAt: due})
			// Another key interleaved, due at the same time.
			msgs = append(msgs, &mq.Message{Key: "other", Body: []byte(body), DeliverAt: due})
		}
		mustSend(t, p, msgs...)
	}
	// Sent last, due first.
	earlier := []*mq.Message{
		{Key: "k", Body: []byte("earlier-0"), DeliverAt: due.Add(-100 * time.Millisecond)},
		{Key: "k", Body: []byte("earlier-1"), DeliverAt: due.Add(-100 * time.Millisecond)},
	}
	mustSend(t, p, earlier...)
	want = append([]string{"earlier-0", "earlier-1"}, want...)

	waitFor(t, 10*time.Second, "delayed messages", func() bool { return got.len() == 1002 })
	if b := got.bodiesOfKey("k"); !slices.Equal(b, want) {
		t.Fatalf("key k arrived in the wrong order:\n got %q\nwant %q", b, want)
	}
	if b := got.bodiesOfKey("other"); !slices.Equal(b, want[2:]) {
		t.Fatalf("key other arrived in the wrong order: %q", b)
	}
}

// TestDelay_AlterMQ checks that partitions added by AlterMQ release their
// delayed messages too.
func TestDelay_AlterMQ(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "later", 1)
	got := &arrivals{}
	mustConsume(t, m, "later", "g", got)
	if err := m.AlterMQ(context.Background(), "later", 3); err != nil {
		t.Fatal(err)
	}
	p, _ := m.NewProducer("later")
	msg := (&mq.Message{Body: []byte("x")}).ToPartition(2).DeliverAfter(100 * time.Millisecond)
	mustSend(t, p, msg)
	waitFor(t, 10*time.Second, "the delayed message on the new partition", func() bool { return got.len() == 1 })
	if got.msgs[0].PartitionIndex != 2 {
		t.Errorf("delivered from partition %d, want 2", got.msgs[0].PartitionIndex)
	}
}

func TestMessage_DeliverAfter(t *testing.T) {
	before := time.Now()
	msg := (&mq.Message{}).DeliverAfter(time.Minute)
	if d := msg.DeliverAt.Sub(before); d < time.Minute || d > time.Minute+time.Second {
		t.Fatalf("DeliverAt is %v after the call, want 1m", d)
	}
	m, p := openWithTopic(t, "later", 1)
	res := mustSend(t, p, msg)
	if !res[0].Delayed || res[0].Offset != -1 || msg.Offset != -1 {
		t.Fatalf("send result %+v, message offset %d: want delayed, offset -1", res[0], msg.Offset)
	}
	if _, err := m.ReadMessage(context.Background(), "later", 0, 0); !errors.Is(err, mq.ErrNoMessage) {
		t.Fatalf("ReadMessage of a held message: %v, want ErrNoMessage", err)
	}
}
