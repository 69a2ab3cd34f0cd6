package mq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// seekFixture is a one-partition topic of ten messages "m0".."m9"; the
// first five were stored before split, the others after.
func seekFixture(t *testing.T) (m *mq.MQ, split time.Time) {
	t.Helper()
	m = openNode(t, "")
	mustCreate(t, m, "t", 1)
	for i := range 10 {
		if i == 5 {
			time.Sleep(2 * time.Millisecond)
			split = time.Now()
			time.Sleep(2 * time.Millisecond)
		}
		publish(t, m, "t", fmt.Sprintf("m%d", i))
	}
	return m, split
}

// TestMQ_ResetOffset moves a running group with every kind of position:
// each message from the new position is delivered exactly once more, in
// order, and nothing else is.
func TestMQ_ResetOffset(t *testing.T) {
	tests := []struct {
		name string
		to   func(split time.Time) mq.Position
		want []string
	}{
		{"First", func(time.Time) mq.Position { return mq.SeekFirst() }, []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"}},
		{"Last", func(time.Time) mq.Position { return mq.SeekLast() }, nil},
		{"Offset", func(time.Time) mq.Position { return mq.SeekOffset(0, 7) }, []string{"m7", "m8", "m9"}},
		{"Time", func(split time.Time) mq.Position { return mq.SeekTime(split) }, []string{"m5", "m6", "m7", "m8", "m9"}},
		{"TimeAfterAll", func(time.Time) mq.Position { return mq.SeekTime(time.Now().Add(time.Hour)) }, nil},
	}
	for _, parallel := range []bool{false, true} {
		for _, tc := range tests {
			name := tc.name
			var opts []mq.ConsumerOption
			if parallel {
				name += "/KeyParallel"
				opts = append(opts, mq.WithKeyParallel(1))
			}
			t.Run(name, func(t *testing.T) {
				m, split := seekFixture(t)
				s := &sink{}
				c := consume(t, m, "t", "g", s, opts...)
				waitFor(t, 5*time.Second, "the first pass", func() bool { return s.len() == 10 })
				if err := c.Seek(context.Background(), tc.to(split)); err != nil {
					t.Fatalf("Seek: %v", err)
				}
				publish(t, m, "t", "new")
				want := append(slices.Clone(tc.want), "new")
				waitFor(t, 5*time.Second, "the second pass", func() bool { return s.len() >= 10+len(want) })
				time.Sleep(20 * time.Millisecond)
				got := s.bodies()[10:]
				if parallel { // keyless messages are keys of their own: any order
					slices.Sort(got)
					slices.Sort(want)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("after the reset got %v, want %v", got, want)
				}
			})
		}
	}
}

// TestMQ_ResetOffsetIdle resets a group with no consumer running (and one
// that never consumed): the next consumer starts there.
func TestMQ_ResetOffsetIdle(t *testing.T) {
	m, _ := seekFixture(t)
	if err := m.ResetOffset(context.Background(), "t", "g", mq.SeekOffset(0, 8)); err != nil {
		t.Fatal(err)
	}
	s := &sink{}
	consume(t, m, "t", "g", s)
	waitFor(t, 5*time.Second, "m8 and m9", func() bool { return s.len() == 2 })
	if got := strings.Join(s.bodies(), ","); got != "m8,m9" {
		t.Fatalf("got %s", got)
	}
}

// TestMQ_ResetOffsetUnblocks: an orderly partition stuck retrying a message
// moves on when reset past it; the message is dropped from its wait.
func TestMQ_ResetOffsetUnblocks(t *testing.T) {
	m, _ := seekFixture(t)
	s := &sink{fail: func(m *mq.Message, _ []*mq.Message) error {
		if string(m.Body) == "m3" {
			return errBoom
		}
		return nil
	}}
	c := consume(t, m, "t", "g", s, mq.WithRetryLadder(time.Hour))
	waitFor(t, 5*time.Second, "m3", func() bool { return s.len() == 4 })
	if err := c.Seek(context.Background(), mq.SeekOffset(0, 4)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the rest", func() bool { return s.len() == 10 })
	if got := strings.Join(s.bodies(), ","); got != "m0,m1,m2,m3,m4,m5,m6,m7,m8,m9" {
		t.Fatalf("got %s", got)
	}
}

// TestMQ_ResetOffsetWhileBusy resets a group many times while it consumes a
// stream; every reset lands (the group ends where the last one put it).
func TestMQ_ResetOffsetWhileBusy(t *testing.T) {
	m, _ := seekFixture(t)
	s := &sink{}
	c := consume(t, m, "t", "g", s, mq.WithFlowControl(2, 1<<20))
	for range 20 {
		if err := c.Seek(context.Background(), mq.SeekFirst()); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Seek(context.Background(), mq.SeekOffset(0, 9)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "m9 after the last reset", func() bool {
		b := s.bodies()
		return len(b) > 0 && b[len(b)-1] == "m9"
	})
	n := s.len()
	publish(t, m, "t", "new")
	waitFor(t, 5*time.Second, "new", func() bool { return s.len() == n+1 })
	time.Sleep(20 * time.Millisecond)
	if b := s.bodies(); b[len(b)-1] != "new" || s.len() != n+1 {
		t.Fatalf("after the resets got %v", b[n-1:])
	}
}

// TestMQ_ResetOffsetErrors checks the refusals.
func TestMQ_ResetOffsetErrors(t *testing.T) {
	m, _ := seekFixture(t)
	ctx := context.Background()
	tests := []struct {
		name  string
		topic string
		group string
		to    mq.Position
		want  error
	}{
		{"NoTopic", "nope", "g", mq.SeekFirst(), mq.ErrNoTopic},
		{"BadGroup", "t", "%g", mq.SeekFirst(), mq.ErrInvalidGroup},
		{"BadInstance", "t", "g@", mq.SeekFirst(), mq.ErrInvalidGroup},
		{"BadPartition", "t", "g", mq.SeekOffset(1, 0), mq.ErrInvalidPartition},
		{"PastTheEnd", "t", "g", mq.SeekOffset(0, 11), mq.ErrInvalidOffset},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := m.ResetOffset(ctx, tc.topic, tc.group, tc.to); !errors.Is(err, tc.want) {
				t.Fatalf("ResetOffset = %v, want %v", err, tc.want)
			}
		})
	}
	if err := m.ResetOffset(ctx, "t", "g", mq.SeekOffset(0, 10)); err != nil {
		t.Fatalf("ResetOffset to the end: %v", err)
	}
}

// TestMQ_ResetOffsetFromHandler: a handler may reset its own group with the
// ctx it was given; its partition goes on from the new offset afterwards.
func TestMQ_ResetOffsetFromHandler(t *testing.T) {
	for _, parallel := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeyParallel=%v", parallel), func(t *testing.T) {
			m, _ := seekFixture(t)
			var opts []mq.ConsumerOption
			if parallel {
				opts = append(opts, mq.WithKeyParallel(1))
			}
			var once sync.Once
			s := &sink{}
			l := mq.ListenerFunc(func(ctx context.Context, name string, msg *mq.Message) error {
				s.OnMessage(ctx, name, msg)
				if string(msg.Body) == "m5" {
					var err error
					once.Do(func() { err = m.ResetOffset(ctx, "t", "g", mq.SeekOffset(0, 8)) })
					return err
				}
				return nil
			})
			consume(t, m, "t", "g", l, append(opts, mq.WithFlowControl(1, 1<<20))...)
			waitFor(t, 5*time.Second, "m9", func() bool { return slices.Contains(s.bodies(), "m9") })
			time.Sleep(20 * time.Millisecond)
			if got := strings.Join(s.bodies(), ","); got != "m0,m1,m2,m3,m4,m5,m8,m9" {
				t.Fatalf("got %s", got)
			}
		})
	}
}

// TestMQ_ResetOffsetTimeExtremes seeks to times outside what int64 Unix
// nanoseconds hold: before them is the first message, after them the end.
func TestMQ_ResetOffsetTimeExtremes(t *testing.T) {
	year := func(y int) time.Time { return time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC) }
	all := []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"}
	tests := []struct {
		name string
		at   time.Time
		want []string
	}{
		{"Zero", time.Time{}, all},
		{"Year1000", year(1000), all},
		{"Year1677", year(1677), all},
		{"Year1969", year(1969), all},
		{"Year2263", year(2263), nil},
		{"Year3000", year(3000), nil},
		{"Year10000", year(10000), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := seekFixture(t)
			if err := m.ResetOffset(context.Background(), "t", "g", mq.SeekTime(tc.at)); err != nil {
				t.Fatal(err)
			}
			publish(t, m, "t", "new")
			s := &sink{}
			consume(t, m, "t", "g", s)
			want := append(slices.Clone(tc.want), "new")
			waitFor(t, 5*time.Second, "new", func() bool { return slices.Contains(s.bodies(), "new") })
			if got := s.bodies(); !slices.Equal(got, want) {
				t.Fatalf("after SeekTime(%v) got %v, want %v", tc.at, got, want)
			}
		})
	}
}

// TestConsumer_StartTime: a new group WithStartTime starts, in each
// partition, at the first message stored at or after the time; a time
// after every message starts at the end, one before all at the first.
func TestConsumer_StartTime(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "t", 1)
	publish(t, m, "t", "a", "b")
	time.Sleep(5 * time.Millisecond)
	at := time.Now()
	time.Sleep(5 * time.Millisecond)
	publish(t, m, "t", "c", "d")
	s := &sink{}
	consume(t, m, "t", "g", s, mq.WithStartTime(at))
	waitFor(t, 5*time.Second, "c and d", func() bool { return s.len() == 2 })
	if got := s.bodies(); !slices.Equal(got, []string{"c", "d"}) {
		t.Fatalf("WithStartTime got %v, want [c d]", got)
	}
	early := &sink{}
	consume(t, m, "t", "early", early, mq.WithStartTime(time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)))
	waitFor(t, 5*time.Second, "every message", func() bool { return early.len() == 4 })
	late := &sink{}
	consume(t, m, "t", "late", late, mq.WithStartTime(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)))
	waitFor(t, 5*time.Second, "late started", func() bool {
		lags, err := m.Lag(context.Background(), "t", "late")
		return err == nil && lags[0].Known && lags[0].Committed == 4
	})
	if late.len() != 0 {
		t.Fatalf("a start time after every message delivered %v", late.bodies())
	}
}

// TestMQ_Lag: a group's backlog per partition, before it consumed (not
// Known, from the oldest message), once it caught up (0) and after more
// sends with its consumer closed.
func TestMQ_Lag(t *testing.T) {
	ctx := context.Background()
	m := openNode(t, "")
	mustCreate(t, m, "t", 2)
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	send := func(part, n int) {
		for range n {
			if _, err := p.SendMessage(ctx, (&mq.Message{Body: []byte("x")}).ToPartition(part)); err != nil {
				t.Fatal(err)
			}
		}
	}
	send(0, 5)
	send(1, 3)
	lags, err := m.Lag(context.Background(), "t", "g")
	if err != nil {
		t.Fatal(err)
	}
	want := []mq.PartitionLag{{Partition: 0, Next: 5, Lag: 5}, {Partition: 1, Next: 3, Lag: 3}}
	if !slices.Equal(lags, want) {
		t.Fatalf("Lag before consuming = %+v, want %+v", lags, want)
	}
	c := consume(t, m, "t", "g", &sink{})
	waitFor(t, 5*time.Second, "the group caught up", func() bool {
		lags, err := m.Lag(context.Background(), "t", "g")
		return err == nil && lags[0].Lag == 0 && lags[1].Lag == 0 && lags[0].Known && lags[1].Known
	})
	c.Close()
	send(1, 2)
	lags, err = m.Lag(context.Background(), "t", "g")
	if err != nil {
		t.Fatal(err)
	}
	want = []mq.PartitionLag{{Partition: 0, Committed: 5, Known: true, Next: 5}, {Partition: 1, Committed: 3, Known: true, Next: 5, Lag: 2}}
	if !slices.Equal(lags, want) {
		t.Fatalf("Lag after 2 more sends = %+v, want %+v", lags, want)
	}
	if _, err := m.Lag(context.Background(), "t", "%bad"); !errors.Is(err, mq.ErrInvalidGroup) {
		t.Fatalf("Lag of a bad group name = %v, want ErrInvalidGroup", err)
	}
	if _, err := m.Lag(context.Background(), "nope", "g"); !errors.Is(err, mq.ErrNoTopic) {
		t.Fatalf("Lag of a missing topic = %v, want ErrNoTopic", err)
	}
}
