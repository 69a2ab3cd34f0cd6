package mq_test

// Issue 9, defect 5: group state never shrinks. The API:
//
//	func (m *MQ) DeleteGroup(ctx context.Context, topic, group string) error
//	func WithBroadcastOffsetTTL(d time.Duration) Option
//
// DeleteGroup removes group's offsets (a group or group@instance, as
// ResetOffset takes) on every partition of topic; a consumer of that group
// then starts per its StartPosition. It returns an error wrapping
// ErrGroupInUse while a consumer of the group is open on the node.
// WithBroadcastOffsetTTL makes the partitions' upkeep remove the offsets of
// a broadcast instance (group@instance) not committed for d while no
// consumer of it is open.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestDefect5_DeleteGroup: a deleted group starts over per its
// StartPosition on every partition; a group with an open consumer cannot
// be deleted.
func TestDefect5_DeleteGroup(t *testing.T) {
	ctx := context.Background()
	m := openNode(t, "")
	mustCreate(t, m, "t", 2)
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	send := func(body string) {
		t.Helper()
		for i := range 2 {
			if _, err := p.SendMessage(ctx, (&mq.Message{Body: []byte(fmt.Sprintf("%s-p%d", body, i))}).ToPartition(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	send("old")
	s := &sink{}
	c := consume(t, m, "t", "g", s)
	waitFor(t, defectTimeout, "the first pass", func() bool { return s.len() == 2 })

	if err := m.DeleteGroup(ctx, "t", "g"); !errors.Is(err, mq.ErrGroupInUse) {
		t.Fatalf("DeleteGroup with a consumer of the group open = %v, want ErrGroupInUse", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteGroup(ctx, "t", "g"); err != nil {
		t.Fatalf("DeleteGroup = %v", err)
	}
	if err := m.DeleteGroup(ctx, "nope", "g"); !errors.Is(err, mq.ErrNoTopic) {
		t.Fatalf("DeleteGroup of a missing topic = %v, want ErrNoTopic", err)
	}
	// StartFirst: both partitions from their oldest message again.
	again := &sink{}
	c = consume(t, m, "t", "g", again)
	waitFor(t, defectTimeout, "the second pass", func() bool { return again.len() == 2 })
	c.Close()

	// StartLast after a delete: only what is sent afterwards.
	if err := m.DeleteGroup(ctx, "t", "g"); err != nil {
		t.Fatal(err)
	}
	last := &sink{}
	consume(t, m, "t", "g", last, mq.WithStartPosition(mq.StartLast))
	started(t, m, "t", "g")
	send("new")
	waitFor(t, defectTimeout, "the new messages", func() bool { return last.len() == 2 })
	for _, msg := range last.all() {
		if string(msg.Body[:3]) != "new" {
			t.Fatalf("after DeleteGroup a StartLast consumer got %s", msg.Body)
		}
	}
}

// TestDefect5_BroadcastOffsetTTL: the offsets of a broadcast instance idle
// longer than the TTL are removed by the upkeep: the instance, opened
// again, starts per its StartPosition instead of resuming.
func TestDefect5_BroadcastOffsetTTL(t *testing.T) {
	clk := newRetryClock()
	m := openNode(t, "", mq.WithClock(clk), mq.WithMaintenanceInterval(time.Minute), mq.WithBroadcastOffsetTTL(time.Hour))
	mustCreate(t, m, "t", 1)
	publish(t, m, "t", "m0")
	s := &sink{}
	c := consume(t, m, "t", "g", s, mq.WithBroadcast("i1"))
	waitFor(t, defectTimeout, "m0", func() bool { return s.len() == 1 })
	c.Close()
	publish(t, m, "t", "m1") // the idle instance would resume here

	clk.Advance(2 * time.Hour) // fires the upkeep's timers
	waitFor(t, defectTimeout, "the instance's offsets removed", func() bool {
		lags, err := m.Lag("t", "g@i1")
		return err == nil && !lags[0].Known
	})

	again := &sink{}
	consume(t, m, "t", "g", again, mq.WithBroadcast("i1"), mq.WithStartPosition(mq.StartLast))
	started(t, m, "t", "g@i1")
	publish(t, m, "t", "m2")
	waitFor(t, defectTimeout, "m2", func() bool { return seen(again.all(), "m2") })
	if got := again.bodies(); got[0] != "m2" {
		t.Fatalf("the expired instance resumed: got %v, want [m2]", got)
	}
}

// started waits until group has an offset in every partition of topic: its
// consumers have claimed them, so their start position is fixed.
func started(t *testing.T, m *mq.MQ, topic, group string) {
	t.Helper()
	waitFor(t, defectTimeout, group+" started", func() bool {
		lags, err := m.Lag(topic, group)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lags {
			if !l.Known {
				return false
			}
		}
		return true
	})
}
