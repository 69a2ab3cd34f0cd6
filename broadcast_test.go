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
