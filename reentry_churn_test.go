package mq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// Re-entrancy: every consumer method called
// concurrently with Close and with rebalances, from inside handlers, and
// with contexts that end.

// TestConsumer_ChurnKeepsOrder: while messages flow, consumers of one group
// join and leave from several goroutines (and accessors are called on all
// of them). Each partition has one owner at a time and a new owner starts
// where the old one stopped: in Orderly mode every offset is delivered
// exactly once, in order, and never by two handlers at once.
func TestConsumer_ChurnKeepsOrder(t *testing.T) {
	noLeaks(t)
	const parts, per = 3, 150
	m := openNode(t, "")
	mustCreate(t, m, "t", parts)
	var (
		mu       sync.Mutex
		got      [parts][]int64
		inFlight [parts]atomic.Int32
	)
	l := mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
		p := msg.PartitionIndex
		if n := inFlight[p].Add(1); n != 1 {
			t.Errorf("partition %d: %d handlers at once", p, n)
		}
		time.Sleep(100 * time.Microsecond)
		mu.Lock()
		got[p] = append(got[p], msg.Offset)
		mu.Unlock()
		inFlight[p].Add(-1)
		return nil
	})
	base, err := m.NewConsumer("t", "g", l)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := m.NewConsumer("t", "g", l)
				if err != nil {
					t.Error(err)
					return
				}
				_ = c.Name() + c.OffsetName() + c.Topic()
				_, _, _, _ = c.Options(), c.Partition(), c.Assigned(), c.Listener()
				time.Sleep(time.Millisecond)
				done := async(c.Close)
				go c.Assigned() // racing the Close
				if err := returns(t, done, "Close during churn"); err != nil {
					t.Error(err)
				}
				if err := c.Seek(context.Background(), mq.SeekFirst()); !errors.Is(err, mq.ErrClosed) {
					t.Errorf("Seek after Close = %v, want ErrClosed", err)
				}
			}
		}()
	}
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	for j := range per {
		for i := range parts {
			if _, err := p.SendMessage(context.Background(), (&mq.Message{Body: []byte(fmt.Sprint(j))}).ToPartition(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, 30*time.Second, "every message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range parts {
			if len(got[i]) < per {
				return false
			}
		}
		return true
	})
	close(stop)
	wg.Wait()
	if err := returns(t, async(base.Close), "the last Close"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range parts {
		want := make([]int64, per)
		for j := range want {
			want[j] = int64(j)
		}
		if !slices.Equal(got[i], want) {
			t.Errorf("partition %d delivered offsets %v, want 0..%d once each", i, got[i], per-1)
		}
	}
}

// TestConsumer_SeekChurn: outside goroutines seek, handlers seek, and
// consumers join and leave, all at once, in every mode. Every call returns
// and nothing is left running.
func TestConsumer_SeekChurn(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		m := partitionFixture(t, 3, 30)
		var seeks atomic.Int32
		var quiet atomic.Bool
		l := mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
			if seeks.Add(1)%7 == 0 && !quiet.Load() {
				if err := m.ResetOffset(ctx, "t", "g", mq.SeekOffset(msg.PartitionIndex, 0)); err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("ResetOffset from a handler = %v", err)
				}
			}
			return nil
		})
		base := consume(t, m, "t", "g", l, opts...)
		var wg sync.WaitGroup
		deadline := time.Now().Add(sized(500*time.Millisecond, 2*time.Second))
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					switch g {
					case 0, 1:
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(g+1)*time.Millisecond)
						err := base.Seek(ctx, mq.SeekFirst())
						cancel()
						if err != nil && !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("Seek = %v", err)
						}
					default:
						c, err := m.NewConsumer("t", "g", l, opts...)
						if err != nil {
							t.Error(err)
							return
						}
						time.Sleep(time.Millisecond)
						if err := returns(t, async(c.Close), "Close during seeks"); err != nil {
							t.Error(err)
						}
					}
				}
			}()
		}
		wg.Wait()
		// The group still works: with the handlers quiet and every
		// consumer closed, a reset takes each partition to its end, and
		// the next consumer gets only what comes after.
		if err := returns(t, async(func() error { return base.Seek(context.Background(), mq.SeekLast()) }), "Seek after the churn"); err != nil {
			t.Fatal(err)
		}
		quiet.Store(true)
		if err := returns(t, async(base.Close), "Close after the churn"); err != nil {
			t.Fatal(err)
		}
		if err := m.ResetOffset(context.Background(), "t", "g", mq.SeekLast()); err != nil {
			t.Fatal(err)
		}
		s := &sink{}
		consume(t, m, "t", "g", s)
		publish(t, m, "t", "last")
		waitFor(t, 5*time.Second, "the last message", func() bool { return s.len() == 1 })
	})
}

// TestConsumer_EveryCallFromHandler: one handler calls every method of the
// package that a handler might, in every mode; each returns.
func TestConsumer_EveryCallFromHandler(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		m := partitionFixture(t, 2, 3)
		finished := make(chan error, 1)
		var first atomic.Bool // not a sync.Once: the other handlers must not wait for this one
		consumeSelf(t, m, func(ctx context.Context, c *mq.Consumer, msg *mq.Message) error {
			if first.CompareAndSwap(false, true) {
				finished <- everyCall(ctx, m, c, msg)
			}
			return nil
		}, opts...)
		if err := returns(t, finished, "the calls from a handler"); err != nil {
			t.Fatal(err)
		}
	})
}

// everyCall makes, from a handler of c, one call of every kind and returns
// the first unexpected error.
func everyCall(ctx context.Context, m *mq.MQ, c *mq.Consumer, msg *mq.Message) error {
	_ = c.Name() + c.OffsetName() + c.Topic()
	_, _, _, _ = c.Options(), c.Partition(), c.Assigned(), c.Listener()
	_ = m.Topics()
	steps := []struct {
		name string
		fn   func() error
	}{
		{"Seek", func() error { return c.Seek(ctx, mq.SeekOffset(msg.PartitionIndex, uint64(msg.Offset)+1)) }},
		{"SeekOtherCtx", func() error { return c.Seek(context.Background(), mq.SeekFirst()) }},
		{"ResetOffset", func() error { return m.ResetOffset(context.Background(), "t", "g", mq.SeekLast()) }},
		{"ResetOtherGroup", func() error { return m.ResetOffset(ctx, "t", "other", mq.SeekFirst()) }},
		{"CreateMQ", func() error { return m.CreateMQ(ctx, "u", 1, mq.Options{}) }},
		{"AlterMQ", func() error { return m.AlterMQ(ctx, "t", 3) }},
		{"SendMessage", func() error {
			p, err := m.NewProducer("t")
			if err != nil {
				return err
			}
			_, err = p.SendMessage(ctx, &mq.Message{Body: []byte("from a handler")})
			return err
		}},
		{"ReadMessage", func() error { _, err := m.ReadMessage(ctx, "t", msg.PartitionIndex, msg.Offset); return err }},
		{"RedriveDeadLetters", func() error { _, err := m.RedriveDeadLetters(ctx, "g"); return err }},
		{"NewConsumerThenClose", func() error {
			c2, err := m.NewConsumer("t", "g", c.Listener())
			if err != nil {
				return err
			}
			return c2.Close()
		}},
		{"Close", c.Close},
		{"SeekAfterClose", func() error {
			if err := c.Seek(ctx, mq.SeekFirst()); !errors.Is(err, mq.ErrClosed) {
				return fmt.Errorf("got %v, want ErrClosed", err)
			}
			return nil
		}},
		{"CloseAgain", c.Close},
		{"MQClose", m.Close},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			return fmt.Errorf("%s from a handler: %w", s.name, err)
		}
	}
	return nil
}

// TestConsumer_HandlersCloseEachOther: two handlers close at the same time
// their own consumer, each other's consumer, or the node; every Close
// returns.
func TestConsumer_HandlersCloseEachOther(t *testing.T) {
	cases := []struct {
		name   string
		target func(m *mq.MQ, own, other *mq.Consumer) func() error
	}{
		{"Own", func(_ *mq.MQ, own, _ *mq.Consumer) func() error { return own.Close }},
		{"Each other", func(_ *mq.MQ, _, other *mq.Consumer) func() error { return other.Close }},
		{"Node", func(m *mq.MQ, _, _ *mq.Consumer) func() error { return m.Close }},
	}
	for _, mode := range consumeModes {
		for _, tc := range cases {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				noLeaks(t)
				dir := t.TempDir()
				m, err := mq.Open(dir)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { m.Close() })
				mustCreate(t, m, "t", 2)
				mustCreate(t, m, "u", 2)
				publish(t, m, "t", "x")
				publish(t, m, "u", "x")
				var cs [2]*mq.Consumer
				var both sync.WaitGroup
				both.Add(2)
				ready := make(chan struct{})
				closed := make(chan error, 2)
				for i, topic := range []string{"t", "u"} {
					var once sync.Once
					l := mq.ListenerFunc(func(ctx context.Context, _ string, _ *mq.Message) error {
						<-ready
						once.Do(func() {
							both.Done()
							both.Wait()
							closed <- tc.target(m, cs[i], cs[1-i])()
						})
						return nil
					})
					c, err := m.NewConsumer(topic, "g", l, mode.opts...)
					if err != nil {
						t.Fatal(err)
					}
					cs[i] = c
				}
				close(ready)
				for range 2 {
					if err := returns(t, closed, "Close from two handlers at once"); err != nil {
						t.Error(err)
					}
				}
				for _, c := range cs {
					if err := returns(t, async(c.Close), "Close afterwards"); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
}

// TestConsumer_CloseFromRetryHandler: in Concurrent mode the handler that
// receives a parked message back, on the retry topic's goroutine, closes
// the consumer.
func TestConsumer_CloseFromRetryHandler(t *testing.T) {
	noLeaks(t)
	m := openNode(t, "")
	mustCreate(t, m, "t", 1)
	publish(t, m, "t", "a")
	closed := make(chan error, 1)
	consumeSelf(t, m, func(_ context.Context, c *mq.Consumer, msg *mq.Message) error {
		if msg.ReconsumeTimes == 0 {
			return errBoom
		}
		closed <- c.Close()
		return nil
	}, mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(0))
	if err := returns(t, closed, "Close from the retry topic's handler"); err != nil {
		t.Fatal(err)
	}
}

// TestConsumer_SeekCtxEnds: a Seek with a ctx that has already ended
// changes nothing; one made while a handler of the partition is slow does
// not wait for it (the reset is stored at once) and the partition moves
// when the handler returns.
func TestConsumer_SeekCtxEnds(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		m := partitionFixture(t, 1, 5)
		release := make(chan struct{})
		entered := make(chan struct{})
		var once sync.Once
		s := &sink{}
		l := mq.ListenerFunc(func(ctx context.Context, name string, msg *mq.Message) error {
			s.OnMessage(ctx, name, msg)
			if string(msg.Body) == "p0-1" {
				once.Do(func() {
					close(entered)
					<-release
				})
			}
			return nil
		})
		c := consume(t, m, "t", "g", l, opts...)
		returns(t, entered, "delivery of p0-1")

		done, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.Seek(done, mq.SeekOffset(0, 4)); !errors.Is(err, context.Canceled) {
			t.Fatalf("Seek with an ended ctx = %v, want context.Canceled", err)
		}
		seeked := async(func() error { return c.Seek(context.Background(), mq.SeekOffset(0, 3)) })
		err := returns(t, seeked, "Seek while the partition's handler is slow")
		close(release)
		if err != nil {
			t.Fatalf("Seek = %v", err)
		}
		waitFor(t, 5*time.Second, "p0-3 and p0-4", func() bool { return slices.Contains(s.bodies(), "p0-4") })
		time.Sleep(20 * time.Millisecond)
		if b := s.bodies(); !slices.Equal(b, []string{"p0-0", "p0-1", "p0-3", "p0-4"}) {
			t.Fatalf("got %v, want p0-0, p0-1, then p0-3 and p0-4 (the reset lands once the handler returns)", b)
		}
	})
}

// TestConsumer_CloseCancelsHandler: a handler blocked on its ctx is
// released by Close, from outside and from another handler.
func TestConsumer_CloseCancelsHandler(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		m := partitionFixture(t, 2, 1)
		closed := make(chan error, 1)
		l := func(ctx context.Context, c *mq.Consumer, msg *mq.Message) error {
			if msg.PartitionIndex == 0 {
				<-ctx.Done() // released by the other handler's Close
				return ctx.Err()
			}
			time.Sleep(10 * time.Millisecond)
			closed <- c.Close()
			return nil
		}
		consumeSelf(t, m, l, opts...)
		if err := returns(t, closed, "Close from a handler while another waits on its ctx"); err != nil {
			t.Fatal(err)
		}
		// The blocked handler returned ctx's error: its message is
		// delivered again to the group's next consumer.
		s := &sink{}
		consume(t, m, "t", "g", s)
		waitFor(t, 5*time.Second, "p0-0 again", func() bool { return slices.Contains(s.bodies(), "p0-0") })
	})
}

// TestMQ_CloseWhileSeekWaits: a reset waits for a slow handler while the
// node closes; once the handler returns, both calls return.
func TestMQ_CloseWhileSeekWaits(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		m, err := mq.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, m, "t", 2)
		publish(t, m, "t", "a")
		entered, release := make(chan struct{}), make(chan struct{})
		c, err := m.NewConsumer("t", "g", mq.ListenerFunc(func(ctx context.Context, _ string, _ *mq.Message) error {
			close(entered)
			<-release
			return nil
		}), opts...)
		if err != nil {
			t.Fatal(err)
		}
		returns(t, entered, "delivery of a")
		seeked := async(func() error { return c.Seek(context.Background(), mq.SeekFirst()) })
		closed := async(m.Close)
		time.Sleep(10 * time.Millisecond) // let both wait for the handler
		close(release)
		if err := returns(t, seeked, "Seek while the node closes"); err != nil && !errors.Is(err, mq.ErrClosed) {
			t.Errorf("Seek = %v, want nil or ErrClosed", err)
		}
		if err := returns(t, closed, "MQ.Close while a Seek waits"); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
}

// TestConsumer_CloseStopsBatch: once Close has cancelled a worker, the rest
// of the batch it read is not handed to the listener (with an ended ctx);
// Close returns after the handler in progress.
func TestConsumer_CloseStopsBatch(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		m := partitionFixture(t, 1, 50)
		entered := make(chan struct{})
		var late atomic.Int32
		c := consume(t, m, "t", "g", mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
			if ctx.Err() != nil {
				late.Add(1)
			}
			if string(msg.Body) == "p0-5" {
				close(entered)
				<-ctx.Done() // Close has cancelled the worker
			}
			return nil
		}), opts...)
		returns(t, entered, "delivery of p0-5")
		if err := returns(t, async(c.Close), "Close"); err != nil {
			t.Fatal(err)
		}
		if n := late.Load(); n != 0 {
			t.Fatalf("%d messages handed to the listener after Close cancelled the worker", n)
		}
	})
}
