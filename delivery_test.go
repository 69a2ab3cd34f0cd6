package mq_test

// The delivery engine: resets racing a closing consumer, seeks from
// handlers, retry counts and properties, a worker that cannot start,
// deleted groups and idle broadcast offsets (DeleteGroup removes a group's
// offsets on every partition of a topic, ErrGroupInUse while a consumer of
// it is open on the node; WithBroadcastOffsetTTL makes the partitions'
// upkeep remove the offsets of a broadcast instance, group@instance, not
// committed for that long while no consumer of it is open). The races are
// worth running many times:
//
//	go test -race -count=20 -run 'TestMQ_ResetOffset|TestConsumer_Seek|TestMQ_CloseWaits' .

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/store"
)

// handoverTimeout bounds every wait of these tests.
const handoverTimeout = 5 * time.Second

// sendKeyed sends "m<from>".."m<from+n-1>" with key "k" to partition 0 of t.
func sendKeyed(t *testing.T, m *mq.MQ, n, from int) {
	t.Helper()
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < from+n; i++ {
		msg := (&mq.Message{Key: "k", Body: []byte(fmt.Sprintf("m%d", i))}).ToPartition(0)
		if _, err := p.SendMessage(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
}

// firstDelivery opens a fresh consumer of group g on m and returns the body
// of the first message it is given.
func firstDelivery(t *testing.T, m *mq.MQ) string {
	t.Helper()
	s := &sink{}
	c := consume(t, m, "t", "g", s)
	defer c.Close()
	waitFor(t, handoverTimeout, "a delivery to a fresh consumer of g", func() bool { return s.len() > 0 })
	return s.bodies()[0]
}

// TestMQ_ResetOffsetWhileConsumerCloses: a reset made while a consumer of the
// group closes (its handler blocked in the message at offset 1) must not be
// undone by the closing worker's last commit. The reset moves partition 0
// to offset 5; once the handler is released, the partition's next owner (a
// second consumer of the group, if any) and, after a restart, a fresh
// consumer must go on from m5, never from m2.
func TestMQ_ResetOffsetWhileConsumerCloses(t *testing.T) {
	for _, kp := range []bool{false, true} {
		for _, two := range []bool{false, true} {
			for _, how := range []string{"ConsumerClose", "MQClose"} {
				for _, order := range []string{"ResetFirst", "CloseFirst"} {
					name := fmt.Sprintf("Orderly/%s/%s", how, order)
					if kp {
						name = fmt.Sprintf("KeyParallel/%s/%s", how, order)
					}
					if two {
						name += "/TwoConsumers"
					}
					if how == "MQClose" && order == "CloseFirst" {
						continue // refused with ErrClosed; see TestMQ_CloseWaitsForClosingConsumer
					}
					t.Run(name, func(t *testing.T) {
						t.Parallel() // TestMain's goleak checks what they leave
						testResetVsClose(t, kp, two, how, order)
					})
				}
			}
		}
	}
}

func testResetVsClose(t *testing.T, kp, two bool, how, order string) {
	dir := t.TempDir()
	m := keyedFixtureDir(t, dir, 10)
	var opts []mq.ConsumerOption
	if kp {
		opts = append(opts, mq.WithKeyParallel(2))
	}
	g := newGate("m1")
	t.Cleanup(g.open)
	a := consume(t, m, "t", "g", g, opts...)
	var b *mq.Consumer
	other := &sink{}
	if two {
		b = consume(t, m, "t", "g", other, opts...) // idle: one partition
	}
	returns(t, g.entered, "delivery of m1")

	closeFn := a.Close
	if how == "MQClose" {
		closeFn = m.Close
	}
	left := func() bool { // the closing consumer has left the group
		if two && how == "ConsumerClose" { // MQ.Close hands nothing over
			return slices.Equal(b.Assigned(), []int{0})
		}
		return len(a.Assigned()) == 0
	}
	reset := func() error { return m.ResetOffset(context.Background(), "t", "g", mq.SeekOffset(0, 5)) }
	var resetDone, closeDone <-chan error
	if order == "ResetFirst" {
		resetDone = async(reset)
		select { // a reset that does not wait for the handler has done its harm
		case err := <-resetDone:
			ch := make(chan error, 1)
			ch <- err
			resetDone = ch
		case <-time.After(50 * time.Millisecond):
		}
		closeDone = async(closeFn)
		waitFor(t, handoverTimeout, "the closing consumer to leave its group", left)
	} else {
		closeDone = async(closeFn)
		waitFor(t, handoverTimeout, "the closing consumer to leave its group", left)
		resetDone = async(reset)
		select {
		case err := <-resetDone:
			ch := make(chan error, 1)
			ch <- err
			resetDone = ch
		case <-time.After(50 * time.Millisecond):
		}
	}
	g.open()
	resetErr := returns(t, resetDone, "ResetOffset racing Close")
	if err := returns(t, closeDone, "Close racing ResetOffset"); err != nil {
		t.Fatalf("%s = %v", how, err)
	}
	if resetErr != nil {
		if how == "MQClose" && errors.Is(resetErr, mq.ErrClosed) {
			t.Logf("ResetOffset = %v: refused, nothing to check", resetErr)
			return
		}
		t.Fatalf("ResetOffset = %v", resetErr)
	}
	if two && how == "ConsumerClose" {
		waitFor(t, handoverTimeout, "m9 at the partition's next owner", func() bool { return seen(other.all(), "m9") })
		if got := other.bodies(); got[0] != "m5" {
			t.Fatalf("after the reset to 5 the next owner got %v, want m5..m9 (the closing worker's commit undid the reset)", got)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = openNode(t, dir)
	sendKeyed(t, m, 1, 10)
	want := "m5"
	if two && how == "ConsumerClose" {
		want = "m10"
	}
	if got := firstDelivery(t, m); got != want {
		t.Fatalf("after the reset to 5 and a restart, the first delivery is %s, want %s (the closing worker's commit undid the reset; first pass %v)", got, want, g.got())
	}
}

// TestConsumer_ConcurrentSeeksFromHandlers: the handlers of two partitions
// of one group, run by one consumer or by two, call Seek at the same moment;
// both calls return (no deadlock).
func TestConsumer_ConcurrentSeeksFromHandlers(t *testing.T) {
	for _, mode := range consumeModes {
		for _, consumers := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/%dConsumers", mode.name, consumers), func(t *testing.T) {
				noLeaks(t)
				m := partitionFixture(t, 2, 4)
				var both sync.WaitGroup
				both.Add(2)
				seeks := make(chan error, 2)
				var once [2]sync.Once
				l := mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
					if msg.Offset == 1 {
						once[msg.PartitionIndex].Do(func() {
							both.Done()
							both.Wait() // both handlers are in, neither has returned
							// Not the handler's ctx: a rebalance cancels it, and
							// ResetOffset then returns at once. The handler's
							// goroutine is what makes it a call from a handler.
							sctx, cancel := context.WithTimeout(context.Background(), handoverTimeout)
							defer cancel()
							seeks <- m.ResetOffset(sctx, "t", "g", mq.SeekLast())
						})
					}
					return nil
				})
				for range consumers {
					consume(t, m, "t", "g", l, mode.opts...)
				}
				for range 2 {
					if err := returns(t, seeks, "Seek from two handlers at once"); err != nil {
						t.Errorf("Seek from a handler = %v (deadlocked until its ctx ended?)", err)
					}
				}
			})
		}
	}
}

// TestConsumer_SeekFromHandlerDuringRebalance: a handler calls Seek while a
// consumer joins, or leaves, the group and takes, or hands over, the
// partition whose handler is running; every call returns.
func TestConsumer_SeekFromHandlerDuringRebalance(t *testing.T) {
	for _, mode := range consumeModes {
		for _, event := range []string{"Join", "Leave"} {
			t.Run(mode.name+"/"+event, func(t *testing.T) {
				noLeaks(t)
				m := partitionFixture(t, 2, 4)
				in := make(chan struct{}, 2)
				release := make(chan struct{})
				var rel sync.Once
				t.Cleanup(func() { rel.Do(func() { close(release) }) })
				seeks := make(chan error, 2)
				var once [2]sync.Once
				l := mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
					if msg.Offset == 1 {
						once[msg.PartitionIndex].Do(func() {
							in <- struct{}{}
							select {
							case <-release:
							case <-time.After(handoverTimeout):
							}
							// Not the handler's ctx: a rebalance cancels it, and
							// ResetOffset then returns at once. The handler's
							// goroutine is what makes it a call from a handler.
							sctx, cancel := context.WithTimeout(context.Background(), handoverTimeout)
							defer cancel()
							seeks <- m.ResetOffset(sctx, "t", "g", mq.SeekLast())
						})
					}
					return nil
				})
				var leaver *mq.Consumer
				consume(t, m, "t", "g", l, mode.opts...)
				if event == "Leave" {
					leaver = consume(t, m, "t", "g", l, mode.opts...)
				}
				returns(t, in, "the first handler")
				returns(t, in, "the second handler")
				var moved <-chan error
				if event == "Join" {
					moved = async(func() error {
						c, err := m.NewConsumer("t", "g", l, mode.opts...)
						if err == nil {
							t.Cleanup(func() { c.Close() })
						}
						return err
					})
				} else {
					moved = async(leaver.Close)
				}
				rel.Do(func() { close(release) })
				for range 2 {
					if err := returns(t, seeks, "Seek from a handler during a rebalance"); err != nil {
						t.Errorf("Seek from a handler during a rebalance = %v (deadlocked until its ctx ended?)", err)
					}
				}
				if err := returns(t, moved, event); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestConsumer_SeekDoesNotWaitForOtherPartitions: Seek from the handler of
// partition 0 must not wait for the handler of partition 1, which here
// waits for something the test holds back (as a handler may wait for
// another one). The reset of partition 1 then lands when its handler
// returns.
func TestConsumer_SeekDoesNotWaitForOtherPartitions(t *testing.T) {
	for _, mode := range consumeModes {
		t.Run(mode.name, func(t *testing.T) {
			noLeaks(t)
			m := partitionFixture(t, 2, 4)
			p1in := make(chan struct{})
			release := make(chan struct{})
			var rel sync.Once
			open := func() { rel.Do(func() { close(release) }) }
			// Released before the consumer's Close (a Cleanup), which
			// waits for partition 1's handler.
			defer open()
			took := make(chan time.Duration, 1)
			var once [2]sync.Once
			l := mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
				if msg.Offset != 1 {
					return nil
				}
				once[msg.PartitionIndex].Do(func() {
					if msg.PartitionIndex == 1 {
						close(p1in)
						select {
						case <-release:
						case <-time.After(handoverTimeout):
						}
						return
					}
					<-p1in
					start := time.Now()
					sctx, cancel := context.WithTimeout(ctx, handoverTimeout)
					defer cancel()
					m.ResetOffset(sctx, "t", "g", mq.SeekLast())
					took <- time.Since(start)
				})
				return nil
			})
			consume(t, m, "t", "g", l, mode.opts...)
			var d time.Duration
			select {
			case d = <-took:
			case <-time.After(time.Second):
				open()
				d = returns(t, took, "Seek from partition 0's handler")
				t.Fatalf("Seek from partition 0's handler waited for partition 1's handler: returned only when it was released, after %v", d.Round(time.Millisecond))
			}
			if d > time.Second {
				t.Fatalf("Seek from partition 0's handler took %v: it waited for partition 1's handler", d)
			}
		})
	}
}

// TestConsumer_OwnRetryCount: a group starts counting failures at 0 for a
// message it has not failed itself. A dead letter of group g (stored with
// ReconsumeTimes MaxReconsumeTimes+1 = 3) consumed by group h, and a message
// sent with ReconsumeTimes 7, must each be delivered to h 1 + h's own
// MaxReconsumeTimes (2) times before h dead-letters them.
func TestConsumer_OwnRetryCount(t *testing.T) {
	const hMax = 2
	for _, mode := range []mq.ConsumeMode{mq.Orderly, mq.Concurrent} {
		for _, src := range []string{"DeadLetter", "SentReconsumeTimes"} {
			t.Run(mode.String()+"/"+src, func(t *testing.T) {
				noLeaks(t)
				m := openNode(t, "")
				mustCreate(t, m, "t", 1)
				topic := "t"
				if src == "DeadLetter" {
					publish(t, m, "t", "a")
					dead := &sink{fail: func(*mq.Message, []*mq.Message) error { return errBoom }}
					consume(t, m, "t", "g", dead, mq.WithRetryLadder(0), mq.WithMaxReconsumeTimes(2))
					topic = mq.DeadLetterTopic("g")
				} else {
					p, err := m.NewProducer("t")
					if err != nil {
						t.Fatal(err)
					}
					if _, err := p.SendMessage(context.Background(), &mq.Message{Body: []byte("a"), ReconsumeTimes: 7}); err != nil {
						t.Fatal(err)
					}
				}
				h := &sink{fail: func(*mq.Message, []*mq.Message) error { return errBoom }}
				consume(t, m, topic, "h", h, mq.WithConsumeMode(mode), mq.WithRetryLadder(0), mq.WithMaxReconsumeTimes(hMax))
				hDead := &sink{}
				consume(t, m, mq.DeadLetterTopic("h"), "ops", hDead)
				waitFor(t, handoverTimeout, "h's dead letter", func() bool { return hDead.len() == 1 })
				if n := h.len(); n != 1+hMax {
					t.Fatalf("group h was given the message %d times (%s) before dead-lettering it, want 1+%d: it took a count it did not make as its own",
						n, h.trace(), hMax)
				}
			})
		}
	}
}

// TestConsumer_WorkerStartFailure: the worker of a partition whose group
// offset cannot be read (a damaged group record) must not give up for
// good while the partition stays assigned: once the cause is gone (the
// group's offset rewritten by ResetOffset) the partition is delivered.
func TestConsumer_WorkerStartFailure(t *testing.T) {
	noLeaks(t)
	dir := t.TempDir()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "t", 1)
	sendKeyed(t, m, 3, 0)
	if err := m.ResetOffset(context.Background(), "t", "g", mq.SeekOffset(0, 1)); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, "topics", "t", "0.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("groups"))
		if b == nil || b.Get([]byte("g")) == nil {
			return errors.New("no record of group g in the partition file")
		}
		return b.Put([]byte("g"), []byte{1, 2, 3}) // fails its check
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	logs := &errorLog{}
	m = openNode(t, dir, mq.WithLogger(slog.New(logs)))
	s := &sink{}
	c := consume(t, m, "t", "g", s)
	waitFor(t, handoverTimeout, "the worker to report the damaged offset", func() bool {
		return logs.has(func(err error) bool { return errors.Is(err, mq.ErrCorrupt) || errors.Is(err, store.ErrCorrupt) })
	})
	// The cause goes: the group's offset is written anew.
	if err := m.ResetOffset(context.Background(), "t", "g", mq.SeekOffset(0, 1)); err != nil {
		t.Fatalf("ResetOffset over the damaged record: %v", err)
	}
	deadline := time.Now().Add(handoverTimeout)
	for s.len() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := s.bodies(); !slices.Equal(got, []string{"m1", "m2"}) {
		assigned := c.Assigned()
		// Show that the cause is gone: a new consumer of g delivers.
		c.Close()
		fresh := &sink{}
		consume(t, m, "t", "g", fresh)
		waitFor(t, handoverTimeout, "a new consumer of g to deliver", func() bool { return fresh.len() >= 2 })
		t.Fatalf("%v delivered after the damaged offset was rewritten, want [m1 m2] (a new consumer then got %v); Assigned() = %v; log:\n%s",
			got, fresh.bodies(), assigned, logs)
	}
}

// TestConsumer_HandlerChangesProperties: what a handler does to
// msg.Properties stays with that delivery: a redelivery, a parked copy and
// a dead letter carry the Properties the message was sent with.
func TestConsumer_HandlerChangesProperties(t *testing.T) {
	for _, mode := range []mq.ConsumeMode{mq.Orderly, mq.Concurrent} {
		t.Run(mode.String(), func(t *testing.T) {
			noLeaks(t)
			m := openNode(t, "")
			mustCreate(t, m, "t", 1)
			p, err := m.NewProducer("t")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.SendMessage(context.Background(), &mq.Message{Body: []byte("a"), Properties: map[string]string{"user": "v"}}); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var seenProps []map[string]string
			l := mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
				mu.Lock()
				seenProps = append(seenProps, maps.Clone(msg.Properties))
				mu.Unlock()
				msg.Properties["touched"] = "by the handler"
				delete(msg.Properties, "user")
				return errBoom
			})
			consume(t, m, "t", "g", l, mq.WithConsumeMode(mode), mq.WithRetryLadder(0), mq.WithMaxReconsumeTimes(1))
			dead := &sink{}
			consume(t, m, mq.DeadLetterTopic("g"), "ops", dead)
			waitFor(t, handoverTimeout, "the dead letter", func() bool { return dead.len() == 1 })
			mu.Lock()
			defer mu.Unlock()
			if len(seenProps) != 2 {
				t.Fatalf("%d deliveries, want 2", len(seenProps))
			}
			if again := seenProps[1]; again["user"] != "v" || again["touched"] != "" {
				t.Errorf("the redelivery has Properties %v: the first handler's changes reached it", again)
			}
			if dl := dead.all()[0].Properties; dl["user"] != "v" || dl["touched"] != "" {
				t.Errorf("the dead letter has Properties %v: the handler's changes reached it", dl)
			}
		})
	}
}

// TestConsumer_RetryPresentedAsOriginal: in Concurrent mode a message taken
// back from the retry topic is "presented as the original": the Properties
// it was sent with and nothing else (none of the queue's ORIGIN_*,
// LAST_ERROR, RETRY_GROUP), and the original's DeliverAt (here none; the
// parked copy's release time is the queue's business, and ReconsumeTimes
// already says it is a retry).
func TestConsumer_RetryPresentedAsOriginal(t *testing.T) {
	noLeaks(t)
	clk := newRetryClock()
	m := openNode(t, "", mq.WithClock(clk))
	mustCreate(t, m, "t", 1)
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]string{"user": "v"}
	if _, err := p.SendMessage(context.Background(), &mq.Message{Body: []byte("a"), Properties: maps.Clone(sent)}); err != nil {
		t.Fatal(err)
	}
	s := &sink{fail: func(msg *mq.Message, _ []*mq.Message) error {
		if msg.ReconsumeTimes == 0 {
			return errBoom
		}
		return nil
	}}
	consume(t, m, "t", "g", s, mq.WithConsumeMode(mq.Concurrent), mq.WithRetryLadder(10*time.Second))
	waitFor(t, handoverTimeout, "the first delivery", func() bool { return s.len() == 1 })
	deadline := time.Now().Add(handoverTimeout)
	for s.len() < 2 && time.Now().Before(deadline) {
		clk.Advance(10 * time.Second) // due, whenever the copy was parked
		time.Sleep(5 * time.Millisecond)
	}
	if s.len() < 2 {
		t.Fatalf("no retry: %s", s.trace())
	}
	first, retry := s.all()[0], s.all()[1]
	var problems []string
	if !maps.Equal(retry.Properties, sent) {
		problems = append(problems, fmt.Sprintf("Properties %v, sent %v", retry.Properties, sent))
	}
	if !retry.DeliverAt.Equal(first.DeliverAt) {
		problems = append(problems, fmt.Sprintf("DeliverAt %v, the original's %v", retry.DeliverAt, first.DeliverAt))
	}
	if len(problems) > 0 {
		t.Fatalf("the retry is not presented as the original: %s", strings.Join(problems, "; "))
	}
}

// TestMQ_ResetOffsetCloseSimultaneous starts Consumer.Close and ResetOffset
// at the same instant, many times, while the handler is blocked in m1 (and
// a second consumer waits to take the partition over, or none does): when
// the reset returns nil, the group's next consumer starts at m5.
func TestMQ_ResetOffsetCloseSimultaneous(t *testing.T) {
	for _, kp := range []bool{false, true} {
		for _, two := range []bool{false, true} {
			name := fmt.Sprintf("KeyParallel=%v/Two=%v", kp, two)
			t.Run(name, func(t *testing.T) {
				noLeaks(t)
				m := keyedFixtureDir(t, "", 10)
				var opts []mq.ConsumerOption
				if kp {
					opts = append(opts, mq.WithKeyParallel(2))
				}
				for i := range 10 {
					group := fmt.Sprintf("g%d", i)
					g := newGate("m1")
					a := consume(t, m, "t", group, g, opts...)
					other := &sink{}
					var b *mq.Consumer
					if two {
						b = consume(t, m, "t", group, other, opts...)
					}
					returns(t, g.entered, "delivery of m1")
					start := make(chan struct{})
					closed := async(func() error { <-start; return a.Close() })
					reset := async(func() error {
						<-start
						return m.ResetOffset(context.Background(), "t", group, mq.SeekOffset(0, 5))
					})
					close(start)
					// Released only once Close has stopped the worker, so the
					// closing consumer delivers nothing after m1.
					if two {
						waitFor(t, handoverTimeout, "the partition to move", func() bool { return slices.Equal(b.Assigned(), []int{0}) })
					} else {
						waitFor(t, handoverTimeout, "the consumer to leave", func() bool { return len(a.Assigned()) == 0 })
					}
					// The reset lands before the closing handler finishes m1: a
					// reset after its commit of 2 rightly leaves the group at 2.
					if err := returns(t, reset, "ResetOffset racing Close"); err != nil {
						t.Fatalf("ResetOffset = %v", err)
					}
					g.open()
					if err := returns(t, closed, "Close racing ResetOffset"); err != nil {
						t.Fatal(err)
					}
					if two {
						waitFor(t, handoverTimeout, "m9 at the next owner", func() bool { return seen(other.all(), "m9") })
						if got := other.bodies(); got[0] != "m5" {
							t.Fatalf("round %d: after the reset to 5 the next owner got %v, want m5..m9", i, got)
						}
						b.Close()
						continue
					}
					s := &sink{}
					c := consume(t, m, "t", group, s)
					waitFor(t, handoverTimeout, fmt.Sprintf("a delivery (the closing consumer got %v)", g.got()), func() bool { return s.len() > 0 })
					c.Close()
					if got := s.bodies()[0]; got != "m5" {
						t.Fatalf("round %d: after the reset to 5 the next consumer starts at %s, want m5", i, got)
					}
				}
			})
		}
	}
}

// TestMQ_CloseWaitsForClosingConsumer: MQ.Close "stops every
// consumer ... waits for them": it must not return while the handler of a
// consumer that another goroutine is closing still runs (its worker would
// then commit, and apply a reset, on a closed partition).
func TestMQ_CloseWaitsForClosingConsumer(t *testing.T) {
	noLeaks(t)
	m := keyedFixtureDir(t, "", 10)
	g := newGate("m1")
	t.Cleanup(g.open)
	a := consume(t, m, "t", "g", g)
	returns(t, g.entered, "delivery of m1")
	closed := async(a.Close)
	waitFor(t, handoverTimeout, "the consumer to leave its group", func() bool { return len(a.Assigned()) == 0 })
	reset := async(func() error { return m.ResetOffset(context.Background(), "t", "g", mq.SeekOffset(0, 5)) })
	mqClosed := async(m.Close)
	select {
	case err := <-mqClosed:
		g.open()
		returns(t, closed, "Consumer.Close")
		rerr := returns(t, reset, "ResetOffset")
		t.Fatalf("MQ.Close returned (%v) while a handler of a closing consumer still ran; the reset then returned %v", err, rerr)
	case <-time.After(300 * time.Millisecond):
	}
	g.open()
	if err := returns(t, mqClosed, "MQ.Close"); err != nil {
		t.Fatal(err)
	}
	returns(t, closed, "Consumer.Close")
	if err := returns(t, reset, "ResetOffset"); err != nil && !errors.Is(err, mq.ErrClosed) {
		t.Fatalf("ResetOffset = %v", err)
	}
}

// TestMQ_DeleteGroup: a deleted group starts over per its
// StartPosition on every partition; a group with an open consumer cannot
// be deleted.
func TestMQ_DeleteGroup(t *testing.T) {
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
	waitFor(t, handoverTimeout, "the first pass", func() bool { return s.len() == 2 })

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
	waitFor(t, handoverTimeout, "the second pass", func() bool { return again.len() == 2 })
	c.Close()

	// StartLast after a delete: only what is sent afterwards.
	if err := m.DeleteGroup(ctx, "t", "g"); err != nil {
		t.Fatal(err)
	}
	last := &sink{}
	consume(t, m, "t", "g", last, mq.WithStartPosition(mq.StartLast))
	started(t, m, "t", "g")
	send("new")
	waitFor(t, handoverTimeout, "the new messages", func() bool { return last.len() == 2 })
	for _, msg := range last.all() {
		if string(msg.Body[:3]) != "new" {
			t.Fatalf("after DeleteGroup a StartLast consumer got %s", msg.Body)
		}
	}
}

// TestConsumer_BroadcastOffsetTTL: the offsets of a broadcast instance idle
// longer than the TTL are removed by the upkeep: the instance, opened
// again, starts per its StartPosition instead of resuming.
func TestConsumer_BroadcastOffsetTTL(t *testing.T) {
	clk := newRetryClock()
	m := openNode(t, "", mq.WithClock(clk), mq.WithMaintenanceInterval(time.Minute), mq.WithBroadcastOffsetTTL(time.Hour))
	mustCreate(t, m, "t", 1)
	publish(t, m, "t", "m0")
	s := &sink{}
	c := consume(t, m, "t", "g", s, mq.WithBroadcast("i1"))
	waitFor(t, handoverTimeout, "m0", func() bool { return s.len() == 1 })
	c.Close()
	publish(t, m, "t", "m1") // the idle instance would resume here

	clk.Advance(2 * time.Hour) // fires the upkeep's timers
	waitFor(t, handoverTimeout, "the instance's offsets removed", func() bool {
		lags, err := m.Lag(context.Background(), "t", "g@i1")
		return err == nil && !lags[0].Known
	})

	again := &sink{}
	consume(t, m, "t", "g", again, mq.WithBroadcast("i1"), mq.WithStartPosition(mq.StartLast))
	started(t, m, "t", "g@i1")
	publish(t, m, "t", "m2")
	waitFor(t, handoverTimeout, "m2", func() bool { return seen(again.all(), "m2") })
	if got := again.bodies(); got[0] != "m2" {
		t.Fatalf("the expired instance resumed: got %v, want [m2]", got)
	}
}
