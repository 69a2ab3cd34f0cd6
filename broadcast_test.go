package mq_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestConsumer_Broadcast: every broadcasting consumer of a group gets every
// message of every partition, next to a clustering consumer of the same
// group; an instance that comes back resumes at its own offset.
func TestConsumer_Broadcast(t *testing.T) {
	dir := t.TempDir()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "t", 3)
	p, _ := m.NewProducer("t")
	send := func(from, to int) {
		for i := from; i < to; i++ {
			mustSend(t, p, &mq.Message{Body: []byte{byte('a' + i)}})
		}
	}
	send(0, 9)
	a, b, cl := &sink{}, &sink{}, &sink{}
	ca, err := m.NewConsumer("t", "g", a, mq.WithBroadcast("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	if ca.OffsetName() != "g@node-a" || ca.Name() != "g" {
		t.Fatalf("OffsetName %q Name %q", ca.OffsetName(), ca.Name())
	}
	cb, err := m.NewConsumer("t", "g", b, mq.WithBroadcast("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	ccl, err := m.NewConsumer("t", "g", cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*sink{a, b, cl} {
		waitFor(t, 5*time.Second, "every message", func() bool { return s.len() == 9 })
	}
	if got := ca.Assigned(); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("broadcasting consumer owns %v, want all", got)
	}
	ca.Close()
	send(9, 12)
	waitFor(t, 5*time.Second, "b's new messages", func() bool { return b.len() == 12 })
	cb.Close()
	ccl.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// After a restart, instance a resumes where it stopped: it gets only the
	// three messages sent while it was away.
	m = openNode(t, dir)
	again := &sink{}
	consume(t, m, "t", "g", again, mq.WithBroadcast("node-a"))
	waitFor(t, 5*time.Second, "the missed messages", func() bool { return again.len() == 3 })
	time.Sleep(20 * time.Millisecond)
	got := again.bodies()
	slices.Sort(got)
	if !slices.Equal(got, []string{"j", "k", "l"}) {
		t.Fatalf("instance a got %v after a restart, want [j k l]", got)
	}
	// A reset by offset name moves only that instance.
	if err := m.ResetOffset(context.Background(), "t", "g@node-a", mq.SeekFirst()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the replay", func() bool { return again.len() == 15 })
}

// TestConsumer_BroadcastRetry: broadcasting consumers in Concurrent mode
// share the group's retry topic but each takes back only its own parked
// copies.
func TestConsumer_BroadcastRetry(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "t", 1)
	publish(t, m, "t", "x", "y")
	failFirst := func(m *mq.Message, _ []*mq.Message) error {
		if string(m.Body) == "x" && m.ReconsumeTimes == 0 {
			return errBoom
		}
		return nil
	}
	a, b := &sink{fail: failFirst}, &sink{fail: failFirst}
	opts := []mq.ConsumerOption{mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(0)}
	consume(t, m, "t", "g", a, append(opts, mq.WithBroadcast("a"))...)
	consume(t, m, "t", "g", b, append(opts, mq.WithBroadcast("b"))...)
	for _, s := range []*sink{a, b} {
		waitFor(t, 5*time.Second, "x, y and the retry of x", func() bool { return s.len() == 3 })
	}
	time.Sleep(20 * time.Millisecond)
	for name, s := range map[string]*sink{"a": a, "b": b} {
		got := s.trace()
		if got != "x#0,y#0,x#1" && got != "x#0,x#1,y#0" {
			t.Errorf("instance %s got %s", name, got)
		}
	}
}
