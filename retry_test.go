package mq_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestConsumer_RetryLadder: a message that always fails waits each step of
// the default ladder, on the node's clock, before each retry; after the 16th
// retry it goes to %DLQ%<group> with its origin and last error.
func TestConsumer_RetryLadder(t *testing.T) {
	clk := newRetryClock()
	m := openNode(t, "", mq.WithClock(clk))
	mustCreate(t, m, "t", 1)
	orig := publish(t, m, "t", "bad", "next")[0]
	s := &sink{clk: clk, fail: func(m *mq.Message, _ []*mq.Message) error {
		if string(m.Body) == "bad" {
			return errBoom
		}
		return nil
	}}
	consume(t, m, "t", "g", s)
	dead := &sink{}
	consume(t, m, mq.DeadLetterTopic("g"), "ops", dead)

	ladder := mq.DefaultRetryLadder()
	if len(ladder) != mq.DefaultMaxReconsumeTimes {
		t.Fatalf("ladder has %d steps, max reconsume is %d", len(ladder), mq.DefaultMaxReconsumeTimes)
	}
	for i, d := range ladder {
		waitFor(t, 5*time.Second, fmt.Sprintf("delivery %d", i+1), func() bool { return s.len() == i+1 })
		s.mu.Lock()
		mark := s.mark[i]
		s.mu.Unlock()
		waitFor(t, 5*time.Second, fmt.Sprintf("a wait of %v", d), func() bool { return clk.waitingSince(mark, d) })
		if i > 0 {
			clk.Advance(d - time.Millisecond)
			time.Sleep(5 * time.Millisecond)
			if n := s.len(); n != i+1 {
				t.Fatalf("retry %d came before its %v step", i+1, d)
			}
			clk.Advance(time.Millisecond)
		} else {
			clk.Advance(d)
		}
	}
	waitFor(t, 5*time.Second, "the next message", func() bool { return s.len() == 18 })
	msgs := s.all()
	for i, msg := range msgs[:17] {
		if string(msg.Body) != "bad" || msg.ReconsumeTimes != i || msg.ID != orig.ID || msg.Offset != 0 {
			t.Fatalf("delivery %d: %s#%d id %s offset %d", i, msg.Body, msg.ReconsumeTimes, msg.ID, msg.Offset)
		}
	}
	if string(msgs[17].Body) != "next" {
		t.Fatalf("after the dead letter got %q", msgs[17].Body)
	}

	waitFor(t, 5*time.Second, "the dead letter", func() bool { return dead.len() == 1 })
	dl := dead.all()[0]
	want := map[string]string{
		mq.PropOriginTopic:     "t",
		mq.PropOriginPartition: "0",
		mq.PropOriginOffset:    "0",
		mq.PropOriginID:        orig.ID,
		mq.PropLastError:       "boom",
	}
	for k, v := range want {
		if dl.Properties[k] != v {
			t.Errorf("dead letter %s = %q, want %q", k, dl.Properties[k], v)
		}
	}
	// The dead-letter group counts its own failures; the giving-up group's
	// count travels as a property.
	if string(dl.Body) != "bad" || dl.ReconsumeTimes != 0 || dl.Properties[mq.PropReconsumeTimes] != "17" || dl.ID != orig.ID || dl.Topic != "%DLQ%g" {
		t.Errorf("dead letter %s#%d (%s failures) id %s topic %s", dl.Body, dl.ReconsumeTimes, dl.Properties[mq.PropReconsumeTimes], dl.ID, dl.Topic)
	}
}

// TestConsumer_DeadLetterRedrive: with a short ladder, failures in both
// modes end in the dead-letter topic; RedriveDeadLetters sends them back
// once, fresh, to their topic.
func TestConsumer_DeadLetterRedrive(t *testing.T) {
	for _, mode := range []mq.ConsumeMode{mq.Orderly, mq.Concurrent} {
		t.Run(mode.String(), func(t *testing.T) {
			m := openNode(t, "")
			mustCreate(t, m, "t", 1)
			orig := publish(t, m, "t", "a", "b")
			var mu sync.Mutex
			healed := false
			s := &sink{fail: func(m *mq.Message, _ []*mq.Message) error {
				mu.Lock()
				defer mu.Unlock()
				if string(m.Body) == "a" && !healed {
					panic("kaboom")
				}
				return nil
			}}
			consume(t, m, "t", "g", s, mq.WithConsumeMode(mode), mq.WithRetryLadder(0), mq.WithMaxReconsumeTimes(2))
			dead := &sink{}
			consume(t, m, "%DLQ%g", "ops", dead)
			waitFor(t, 5*time.Second, "the dead letter", func() bool { return dead.len() == 1 })
			dl := dead.all()[0]
			if dl.ReconsumeTimes != 0 || dl.Properties[mq.PropReconsumeTimes] != "3" || dl.ID != orig[0].ID || dl.Properties[mq.PropOriginTopic] != "t" ||
				dl.Properties[mq.PropOriginOffset] != "0" || !strings.Contains(dl.Properties[mq.PropLastError], "kaboom") {
				t.Fatalf("dead letter #%d (%s failures) id %s props %v", dl.ReconsumeTimes, dl.Properties[mq.PropReconsumeTimes], dl.ID, dl.Properties)
			}
			waitFor(t, 5*time.Second, "b", func() bool { return seen(s.all(), "b") })
			if got := s.trace(); got != "a#0,a#1,a#2,b#0" && mode == mq.Orderly {
				t.Fatalf("deliveries %s", got)
			}

			mu.Lock()
			healed = true
			mu.Unlock()
			n, err := m.RedriveDeadLetters(context.Background(), "g")
			if err != nil || n != 1 {
				t.Fatalf("RedriveDeadLetters = %d, %v; want 1", n, err)
			}
			waitFor(t, 5*time.Second, "the re-driven message", func() bool { return s.len() == 5 })
			last := s.all()[4]
			if string(last.Body) != "a" || last.ReconsumeTimes != 0 || last.ID != orig[0].ID || last.Offset != 2 || last.Topic != "t" {
				t.Fatalf("re-driven %s#%d id %s offset %d topic %s", last.Body, last.ReconsumeTimes, last.ID, last.Offset, last.Topic)
			}
			if _, ok := last.Properties[mq.PropLastError]; ok {
				t.Errorf("re-driven message keeps %s", mq.PropLastError)
			}
			if n, err := m.RedriveDeadLetters(context.Background(), "g"); err != nil || n != 0 {
				t.Fatalf("second RedriveDeadLetters = %d, %v; want 0", n, err)
			}
			if n, err := m.RedriveDeadLetters(context.Background(), "nobody"); err != nil || n != 0 {
				t.Fatalf("RedriveDeadLetters of a group without dead letters = %d, %v", n, err)
			}
			if _, err := m.RedriveDeadLetters(context.Background(), "%bad"); !errors.Is(err, mq.ErrInvalidGroup) {
				t.Fatalf("RedriveDeadLetters(%%bad) = %v, want ErrInvalidGroup", err)
			}
			time.Sleep(20 * time.Millisecond)
			if n := s.len(); n != 5 {
				t.Fatalf("%d deliveries, want 5: %s", n, s.trace())
			}
		})
	}
}

// TestConsumer_OrderlyBlocks and concurrent continues: "a" fails until "b"
// has been seen. Orderly never delivers "b" while "a" fails; Concurrent
// parks "a", delivers "b" and "c", and "a" again from the retry topic
// (before or after "c"), presented as the original.
func TestConsumer_Modes(t *testing.T) {
	failUntilB := func(m *mq.Message, before []*mq.Message) error {
		if string(m.Body) == "a" && !seen(before, "b") {
			return errBoom
		}
		return nil
	}
	t.Run("OrderlyBlocks", func(t *testing.T) {
		m := openNode(t, "")
		mustCreate(t, m, "t", 1)
		publish(t, m, "t", "a", "b", "c")
		s := &sink{fail: failUntilB}
		consume(t, m, "t", "g", s, mq.WithRetryLadder(time.Millisecond), mq.WithMaxReconsumeTimes(1000))
		waitFor(t, 5*time.Second, "retries", func() bool { return s.len() >= 20 })
		for _, msg := range s.all() {
			if string(msg.Body) != "a" {
				t.Fatalf("%q delivered while a fails", msg.Body)
			}
		}
	})
	t.Run("ConcurrentContinues", func(t *testing.T) {
		m := openNode(t, "")
		mustCreate(t, m, "t", 1)
		orig := publish(t, m, "t", "a", "b", "c")
		s := &sink{fail: failUntilB}
		c := consume(t, m, "t", "g", s, mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(0))
		// The retry copy that succeeds: an "a" redelivered after "b". It may
		// come before or after "c" (the retry topic is consumed beside t).
		retried := func(all []*mq.Message) int {
			for i, msg := range all {
				if string(msg.Body) == "a" && msg.ReconsumeTimes > 0 && seen(all[:i], "b") {
					return i
				}
			}
			return -1
		}
		waitFor(t, 30*time.Second, "all", func() bool {
			all := s.all()
			return seen(all, "c") && retried(all) >= 0
		})
		msgs := s.all()
		if string(msgs[0].Body) != "a" || msgs[0].ReconsumeTimes != 0 {
			t.Fatalf("first delivery %s", s.trace())
		}
		i := retried(msgs)
		last := msgs[i]
		s.mu.Lock()
		name := s.names[i]
		s.mu.Unlock()
		if string(last.Body) != "a" || last.Topic != "t" || name != "t" || last.PartitionIndex != 0 || last.Offset != 0 || last.ID != orig[0].ID {
			t.Fatalf("retry presented as %s#%d topic %s (%s) partition %d offset %d id %s",
				last.Body, last.ReconsumeTimes, last.Topic, name, last.PartitionIndex, last.Offset, last.ID)
		}
		if _, ok := m.Topics()["%RETRY%g"]; !ok {
			t.Fatalf("no retry topic in %v", m.Topics())
		}
		if c.Name() != "g" || c.OffsetName() != "g" {
			t.Fatalf("Name %q OffsetName %q", c.Name(), c.OffsetName())
		}
	})
	t.Run("ConcurrentWaitsForTheLadder", func(t *testing.T) {
		// The parked copy is a delayed message: released by the node when
		// its clock reaches the ladder step.
		clk := newRetryClock()
		m := openNode(t, "", mq.WithClock(clk))
		mustCreate(t, m, "t", 1)
		publish(t, m, "t", "a", "b")
		s := &sink{fail: func(m *mq.Message, _ []*mq.Message) error {
			if string(m.Body) == "a" && m.ReconsumeTimes == 0 {
				return errBoom
			}
			return nil
		}}
		consume(t, m, "t", "g", s, mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(10*time.Second))
		waitFor(t, 5*time.Second, "b", func() bool { return s.len() == 2 })
		clk.Advance(9 * time.Second)
		time.Sleep(30 * time.Millisecond)
		if n := s.len(); n != 2 {
			t.Fatalf("retried before its step: %s", s.trace())
		}
		clk.Advance(time.Second)
		waitFor(t, 5*time.Second, "the retry", func() bool { return s.len() == 3 })
		if got := s.trace(); got != "a#0,b#0,a#1" {
			t.Fatalf("deliveries %s", got)
		}
	})
}

// TestConsumer_SystemTopics: retry and dead-letter topics can be consumed
// (and are created for it), but not created by users; one of a group name
// too long for a group is no topic.
func TestConsumer_SystemTopics(t *testing.T) {
	m := openNode(t, "")
	ctx := context.Background()
	for _, name := range []string{"%DLQ%g", "%RETRY%g"} {
		if err := m.CreateMQ(ctx, name, 1, mq.Options{}); !errors.Is(err, mq.ErrInvalidTopic) {
			t.Errorf("CreateMQ(%s) = %v, want ErrInvalidTopic", name, err)
		}
		consume(t, m, name, "ops", &sink{})
	}
	if _, err := m.NewConsumer("%DLQ%", "ops", &sink{}); !errors.Is(err, mq.ErrNoTopic) {
		t.Errorf("NewConsumer(%%DLQ%%) = %v, want ErrNoTopic", err)
	}
	if _, err := m.NewConsumer("%OTHER%g", "ops", &sink{}); !errors.Is(err, mq.ErrNoTopic) {
		t.Errorf("NewConsumer(%%OTHER%%g) = %v, want ErrNoTopic", err)
	}
	// The longest group's (248 bytes: its retry topic is 255) can be
	// consumed; one byte longer is no group's, and so no topic, not a
	// name the file system refuses.
	longest := strings.Repeat("g", 248)
	for _, name := range []string{"%DLQ%" + longest, "%RETRY%" + longest} {
		consume(t, m, name, "ops", &sink{})
	}
	for _, name := range []string{"%DLQ%" + longest + "g", "%RETRY%" + longest + "g", "%RETRY%" + strings.Repeat("g", 300)} {
		if _, err := m.NewConsumer(name, "ops", &sink{}); !errors.Is(err, mq.ErrNoTopic) {
			t.Errorf("NewConsumer of a %d-byte system topic = %v, want ErrNoTopic", len(name), err)
		}
	}
	mustCreate(t, m, "t", 1)
	for name, opt := range map[string]mq.ConsumerOption{
		"EmptyLadder":   mq.WithRetryLadder(),
		"NegativeStep":  mq.WithRetryLadder(-time.Second),
		"NegativeMax":   mq.WithMaxReconsumeTimes(-1),
		"BadMode":       mq.WithConsumeMode(7),
		"ZeroParallel":  mq.WithKeyParallel(0),
		"BadBroadcast":  mq.WithBroadcast("a@b"),
		"EmptyInstance": mq.WithBroadcast(""),
		"FlowZero":      mq.WithFlowControl(0, 1<<20),
		"FlowMessages":  mq.WithFlowControl(mq.MaxFlowMessages+1, 1<<20),
		"FlowBytes":     mq.WithFlowControl(1, mq.MaxFlowBytes+1),
		"FlowHuge":      mq.WithFlowControl(math.MaxInt, math.MaxInt),
	} {
		if _, err := m.NewConsumer("t", "g", &sink{}, opt); !errors.Is(err, mq.ErrInvalidOption) {
			t.Errorf("%s: NewConsumer = %v, want ErrInvalidOption", name, err)
		}
	}
	// At the limits, a consumer delivers.
	publish(t, m, "t", "at-the-limits")
	s := &sink{}
	consume(t, m, "t", "limits", s, mq.WithFlowControl(mq.MaxFlowMessages, mq.MaxFlowBytes))
	waitFor(t, 5*time.Second, "the delivery", func() bool { return s.len() == 1 })
}

// TestConsumer_RetryLadderLongStep: a Concurrent consumer parks a failed
// message for the longest ladder step a Duration holds. Its due time is past
// 2262, which int64 nanoseconds cannot hold: it must stay parked (held at
// the end of the range), not wrap into the past and come back at once.
func TestConsumer_RetryLadderLongStep(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "t", 1)
	publish(t, m, "t", "a", "b")
	s := &sink{fail: func(m *mq.Message, _ []*mq.Message) error {
		if string(m.Body) == "a" {
			return errBoom
		}
		return nil
	}}
	consume(t, m, "t", "g", s, mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(time.Duration(math.MaxInt64)))
	// "b" is delivered once "a" is parked (one message of a partition at a
	// time). A fence in the retry topic, taken by this consumer like a parked
	// copy, comes after anything parked there that was due at once.
	waitFor(t, 5*time.Second, "b", func() bool { return seen(s.all(), "b") })
	p, err := m.NewProducer(mq.RetryTopic("g"))
	if err != nil {
		t.Fatal(err)
	}
	fence := &mq.Message{Body: []byte("fence"), Properties: map[string]string{mq.PropRetryGroup: "g", mq.PropOriginTopic: "t"}}
	if _, err := p.SendMessage(context.Background(), fence); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the fence", func() bool { return seen(s.all(), "fence") })
	if got := s.trace(); got != "a#0,b#0,fence#0" {
		t.Fatalf("deliveries %s, want a#0,b#0,fence#0", got)
	}
}
