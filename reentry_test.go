package mq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestConsumer_CloseFromHandler: a handler closes its own consumer. Close
// returns at once, nothing is delivered after it, and the message the
// handler accepts is committed when the handler returns: the group's next
// consumer starts after it.
func TestConsumer_CloseFromHandler(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		m := partitionFixture(t, 1, 6)
		closed := make(chan error, 1)
		var mu sync.Mutex
		var got []string
		l := func(_ context.Context, c *mq.Consumer, msg *mq.Message) error {
			mu.Lock()
			got = append(got, string(msg.Body))
			after := len(got) > 3
			mu.Unlock()
			if after {
				t.Errorf("%s delivered after Close", msg.Body)
			}
			if string(msg.Body) == "p0-2" {
				closed <- c.Close()
			}
			return nil
		}
		c := consumeSelf(t, m, l, append(slices.Clone(opts), mq.WithFlowControl(8, 1<<20))...)
		if err := returns(t, closed, "Consumer.Close from its own handler"); err != nil {
			t.Fatalf("Close = %v", err)
		}
		if err := returns(t, async(c.Close), "a second Close"); err != nil {
			t.Fatalf("second Close = %v", err)
		}
		if a := c.Assigned(); len(a) != 0 {
			t.Errorf("Assigned after Close = %v", a)
		}
		s := &sink{}
		consume(t, m, "t", "g", s)
		waitFor(t, 5*time.Second, "the rest", func() bool { return s.len() >= 3 })
		time.Sleep(20 * time.Millisecond)
		if b := s.bodies(); !slices.Equal(b, []string{"p0-3", "p0-4", "p0-5"}) {
			t.Errorf("the next consumer got %v, want p0-3..p0-5", b)
		}
	})
}

// TestMQ_CloseFromHandler: a handler closes the whole node. Close returns,
// the node refuses work afterwards, and the handler's goroutine ends when
// it returns.
func TestMQ_CloseFromHandler(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		dir := t.TempDir()
		m, err := mq.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, m, "t", 2)
		closed := make(chan error, 1)
		var once sync.Once
		l := mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
			once.Do(func() { closed <- m.Close() })
			return nil
		})
		publish(t, m, "t", "a", "b")
		if _, err := m.NewConsumer("t", "g", l, opts...); err != nil {
			t.Fatal(err)
		}
		if err := returns(t, closed, "MQ.Close from a handler"); err != nil {
			t.Fatalf("Close = %v", err)
		}
		if err := m.Close(); err != nil {
			t.Fatalf("second Close = %v", err)
		}
		if _, err := m.NewProducer("t"); !errors.Is(err, mq.ErrClosed) {
			t.Fatalf("NewProducer after Close = %v, want ErrClosed", err)
		}
		// At least once: reopened, the node delivers what was not
		// committed; "b" at least.
		m2 := openNode(t, dir)
		s := &sink{}
		consume(t, m2, "t", "g", s)
		waitFor(t, 5*time.Second, "b after the reopen", func() bool { return slices.Contains(s.bodies(), "b") })
	})
}

// TestConsumer_SeekFromHandler calls Seek and ResetOffset from a handler
// while its consumer closes, while the group rebalances, while the topic
// grows, from two handlers at once, and with a ctx not from the handler.
func TestConsumer_SeekFromHandler(t *testing.T) {
	for _, mode := range consumeModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Run("OtherCtx", func(t *testing.T) { testSeekOtherCtx(t, mode.opts) })
			t.Run("DuringClose", func(t *testing.T) { testSeekDuringClose(t, mode.opts) })
			t.Run("DuringRebalance", func(t *testing.T) { testSeekDuringRebalance(t, mode.opts) })
			t.Run("DuringAlterMQ", func(t *testing.T) { testSeekDuringAlterMQ(t, mode.opts) })
			t.Run("TwoHandlers", func(t *testing.T) { testSeekTwoHandlers(t, mode.opts) })
		})
	}
}

// testSeekOtherCtx: a handler seeks its own partition with
// context.Background(), not the ctx it was given.
func testSeekOtherCtx(t *testing.T, opts []mq.ConsumerOption) {
	noLeaks(t)
	m := partitionFixture(t, 1, 10)
	seeked := make(chan error, 1)
	var once sync.Once
	s := &sink{}
	l := func(ctx context.Context, c *mq.Consumer, msg *mq.Message) error {
		s.OnMessage(ctx, "t", msg)
		if string(msg.Body) == "p0-5" {
			once.Do(func() { seeked <- c.Seek(context.Background(), mq.SeekOffset(0, 8)) })
		}
		return nil
	}
	consumeSelf(t, m, l, append(slices.Clone(opts), mq.WithFlowControl(1, 1<<20))...)
	if err := returns(t, seeked, "Seek with another ctx from a handler"); err != nil {
		t.Fatalf("Seek = %v", err)
	}
	waitFor(t, 5*time.Second, "p0-9", func() bool { return slices.Contains(s.bodies(), "p0-9") })
	time.Sleep(20 * time.Millisecond)
	want := []string{"p0-0", "p0-1", "p0-2", "p0-3", "p0-4", "p0-5", "p0-8", "p0-9"}
	if b := s.bodies(); !slices.Equal(b, want) {
		t.Errorf("got %v, want %v", b, want)
	}
}

// testSeekDuringClose: while another goroutine closes the consumer, its
// handler (told by ctx) resets the group; Close and the reset return, and
// the group's next consumer starts where the reset put it.
func testSeekDuringClose(t *testing.T, opts []mq.ConsumerOption) {
	noLeaks(t)
	m := partitionFixture(t, 1, 10)
	var c *mq.Consumer
	entered := make(chan struct{})
	seeks := make(chan error, 2)
	var once sync.Once
	l := mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
		if string(msg.Body) != "p0-2" {
			return nil
		}
		once.Do(func() {
			close(entered)
			<-ctx.Done() // Close has begun
			seeks <- c.Seek(ctx, mq.SeekOffset(0, 6))
			seeks <- m.ResetOffset(context.Background(), "t", "g", mq.SeekOffset(0, 7))
		})
		return ctx.Err()
	})
	c = consume(t, m, "t", "g", l, opts...)
	returns(t, entered, "delivery of p0-2")
	closed := async(c.Close)
	if err := returns(t, seeks, "Seek from a handler during Close"); err != nil && !errors.Is(err, mq.ErrClosed) && !errors.Is(err, context.Canceled) {
		t.Errorf("Seek = %v, want nil, ErrClosed or the ctx's error", err)
	}
	if err := returns(t, seeks, "ResetOffset from a handler during Close"); err != nil {
		t.Errorf("ResetOffset = %v", err)
	}
	if err := returns(t, closed, "Close while its handler resets"); err != nil {
		t.Fatalf("Close = %v", err)
	}
	s := &sink{}
	consume(t, m, "t", "g", s)
	waitFor(t, 5*time.Second, "p0-7..p0-9", func() bool { return s.len() >= 3 })
	time.Sleep(20 * time.Millisecond)
	if b := s.bodies(); !slices.Equal(b, []string{"p0-7", "p0-8", "p0-9"}) {
		t.Errorf("after the reset got %v, want p0-7..p0-9", b)
	}
}

// testSeekDuringRebalance: a second consumer joins the group and takes the
// partition whose handler is running; that handler (told by ctx) resets the
// group. The join and the reset return, and the new owner starts where the
// reset put the partition.
func testSeekDuringRebalance(t *testing.T, opts []mq.ConsumerOption) {
	noLeaks(t)
	m := partitionFixture(t, 2, 10)
	entered := make(chan struct{})
	seeks := make(chan error, 2)
	var once sync.Once
	first := func(ctx context.Context, c *mq.Consumer, msg *mq.Message) error {
		if msg.PartitionIndex != 1 || string(msg.Body) != "p1-2" {
			return nil
		}
		once.Do(func() {
			close(entered)
			<-ctx.Done() // the partition is moving
			seeks <- c.Seek(ctx, mq.SeekOffset(1, 5))
			seeks <- m.ResetOffset(context.Background(), "t", "g", mq.SeekOffset(1, 6))
		})
		return ctx.Err()
	}
	consumeSelf(t, m, first, opts...)
	returns(t, entered, "delivery of p1-2")
	s := &sink{}
	joined := make(chan *mq.Consumer, 1)
	go func() {
		c2, err := m.NewConsumer("t", "g", s, opts...)
		if err != nil {
			t.Error(err)
		}
		joined <- c2
	}()
	if err := returns(t, seeks, "Seek with the handler's ctx during a rebalance"); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Seek = %v, want nil or the ctx's error", err)
	}
	if err := returns(t, seeks, "ResetOffset from a handler during a rebalance"); err != nil {
		t.Errorf("ResetOffset = %v", err)
	}
	c2 := returns(t, joined, "NewConsumer while a handler of the group resets it")
	if c2 == nil {
		return
	}
	t.Cleanup(func() { c2.Close() })
	waitFor(t, 5*time.Second, "p1-6..p1-9 at the new owner", func() bool { return s.len() >= 4 })
	time.Sleep(20 * time.Millisecond)
	if b := s.bodies(); !slices.Equal(b, []string{"p1-6", "p1-7", "p1-8", "p1-9"}) {
		t.Errorf("the new owner got %v, want p1-6..p1-9", b)
	}
}

// testSeekDuringAlterMQ: handlers reset the group again and again while the
// topic grows; every call returns, and the new partitions are delivered.
func testSeekDuringAlterMQ(t *testing.T, opts []mq.ConsumerOption) {
	noLeaks(t)
	m := partitionFixture(t, 1, 20)
	var mu sync.Mutex
	seeks, parts := 0, map[int]bool{}
	errs := make(chan error, 100)
	l := func(ctx context.Context, c *mq.Consumer, msg *mq.Message) error {
		mu.Lock()
		parts[msg.PartitionIndex] = true
		again := seeks < 20
		seeks++
		mu.Unlock()
		if again {
			if err := c.Seek(ctx, mq.SeekFirst()); err != nil {
				errs <- err
			}
		}
		return nil
	}
	consumeSelf(t, m, l, opts...)
	altered := async(func() error {
		for n := 2; n <= 4; n++ {
			if err := m.AlterMQ(context.Background(), "t", n); err != nil {
				return err
			}
		}
		return nil
	})
	if err := returns(t, altered, "AlterMQ while handlers reset the group"); err != nil {
		t.Fatal(err)
	}
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		if _, err := p.SendMessage(context.Background(), (&mq.Message{Body: []byte("new")}).ToPartition(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, hangAfter, "every partition delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(parts) == 4
	})
	close(errs)
	for err := range errs {
		t.Errorf("Seek = %v", err)
	}
}

// testSeekTwoHandlers: the handlers of both partitions of a group reset it
// at the same moment; both calls return, and both partitions start over.
func testSeekTwoHandlers(t *testing.T, opts []mq.ConsumerOption) {
	noLeaks(t)
	m := partitionFixture(t, 2, 4)
	var both sync.WaitGroup
	both.Add(2)
	seeks := make(chan error, 2)
	var once [2]sync.Once
	s := &sink{}
	l := func(ctx context.Context, c *mq.Consumer, msg *mq.Message) error {
		s.OnMessage(ctx, "t", msg)
		if b := string(msg.Body); b == "p0-1" || b == "p1-1" {
			once[msg.PartitionIndex].Do(func() {
				both.Done()
				both.Wait() // both handlers are in, neither has returned
				seeks <- c.Seek(ctx, mq.SeekFirst())
			})
		}
		return nil
	}
	consumeSelf(t, m, l, opts...)
	for range 2 {
		if err := returns(t, seeks, "Seek from two handlers at once"); err != nil {
			t.Errorf("Seek = %v", err)
		}
	}
	// Each partition starts over after its handler's reset (and again,
	// maybe, after the other one's) and ends with a whole pass.
	waitFor(t, 5*time.Second, "both partitions again", func() bool {
		var per [2][]string
		for _, msg := range s.all() {
			per[msg.PartitionIndex] = append(per[msg.PartitionIndex], string(msg.Body))
		}
		for i, b := range per {
			pass := []string{fmt.Sprintf("p%d-0", i), fmt.Sprintf("p%d-1", i), fmt.Sprintf("p%d-2", i), fmt.Sprintf("p%d-3", i)}
			if len(b) < 2+4 || !slices.Equal(b[:2], pass[:2]) || !slices.Equal(b[len(b)-4:], pass) {
				return false
			}
		}
		return true
	})
}

// TestMQ_NewConsumerFromHandler: a handler starts a second consumer of its
// own group, which takes the handler's partition. NewConsumer returns, the
// new consumer owns the partition once the handler returns, and nothing of
// the partition is lost.
func TestMQ_NewConsumerFromHandler(t *testing.T) {
	eachMode(t, func(t *testing.T, opts []mq.ConsumerOption) {
		m := partitionFixture(t, 2, 6)
		joined := make(chan *mq.Consumer, 1)
		var once sync.Once
		var mu sync.Mutex
		got := map[string]int{}
		record := func(msg *mq.Message) {
			mu.Lock()
			got[string(msg.Body)]++
			mu.Unlock()
		}
		second := mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
			record(msg)
			return nil
		})
		first := mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
			record(msg)
			if string(msg.Body) == "p1-2" {
				once.Do(func() {
					c2, err := m.NewConsumer("t", "g", second, opts...)
					if err != nil {
						t.Error(err)
					}
					joined <- c2
				})
			}
			return nil
		})
		consume(t, m, "t", "g", first, opts...)
		c2 := returns(t, joined, "NewConsumer of the same group from a handler")
		if c2 == nil {
			return
		}
		t.Cleanup(func() { c2.Close() })
		waitFor(t, 5*time.Second, "partition 1 at the new consumer", func() bool { return slices.Equal(c2.Assigned(), []int{1}) })
		waitFor(t, 5*time.Second, "every message", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == 12
		})
	})
}
