package mq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// recorder is a Listener that keeps what it receives.
type recorder struct {
	mu   sync.Mutex
	msgs []*mq.Message
	n    atomic.Int64
}

func (r *recorder) OnMessage(_ context.Context, _ string, m *mq.Message) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
	r.n.Add(1)
	return nil
}

func (r *recorder) bodies() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.msgs))
	for i, m := range r.msgs {
		out[i] = string(m.Body)
	}
	return out
}

// TestMQ_KeyedOrder sends 100,000 keyed messages over 8 partitions and
// consumes them with 4 consumers of one group: every key's messages arrive in
// send order, none missing, none twice.
func TestMQ_KeyedOrder(t *testing.T) {
	const (
		total   = 100_000
		senders = 8
		keys    = 40 // each sender owns keys k%senders == sender; 2,500 messages each
		batch   = 100
	)
	m := openNode(t, "")
	mustCreate(t, m, "orders", 8)
	ctx := context.Background()

	type seen struct {
		mu   sync.Mutex
		last map[string]int
		bad  []string
	}
	s := &seen{last: map[string]int{}}
	var received atomic.Int64
	listener := mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
		var seq int
		fmt.Sscanf(string(msg.Body), "%d", &seq)
		s.mu.Lock()
		if prev, ok := s.last[msg.Key]; ok && seq != prev+1 {
			s.bad = append(s.bad, fmt.Sprintf("key %s: %d after %d", msg.Key, seq, prev))
		} else if !ok && seq != 0 {
			s.bad = append(s.bad, fmt.Sprintf("key %s starts at %d", msg.Key, seq))
		}
		s.last[msg.Key] = seq
		s.mu.Unlock()
		received.Add(1)
		return nil
	})
	var consumers []*mq.Consumer
	for i := 0; i < 4; i++ {
		c, err := m.NewConsumer("orders", "billing", listener)
		if err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, c)
	}
	// Every partition is owned by exactly one consumer.
	waitFor(t, 5*time.Second, "assignment", func() bool {
		owned := map[int]int{}
		for _, c := range consumers {
			for _, p := range c.Assigned() {
				owned[p]++
			}
		}
		if len(owned) != 8 {
			return false
		}
		for _, n := range owned {
			if n != 1 {
				return false
			}
		}
		return true
	})

	p, err := m.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := map[string]int{}
			msgs := make([]*mq.Message, 0, batch)
			for i := 0; i < total/senders; i++ {
				key := fmt.Sprintf("k%d", g+senders*(i%(keys/senders)))
				msgs = append(msgs, &mq.Message{Key: key, Body: []byte(fmt.Sprint(next[key]))})
				next[key]++
				if len(msgs) == batch {
					if _, err := p.SendMessage(ctx, msgs...); err != nil {
						errs <- err
						return
					}
					msgs = msgs[:0]
				}
			}
			if len(msgs) > 0 {
				if _, err := p.SendMessage(ctx, msgs...); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "all messages", func() bool { return received.Load() >= total })
	for _, c := range consumers {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := received.Load(); got != total {
		t.Fatalf("received %d messages, want %d", got, total)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bad) > 0 {
		t.Fatalf("%d order violations, first: %v", len(s.bad), s.bad[0])
	}
	if len(s.last) != keys {
		t.Fatalf("saw %d keys, want %d", len(s.last), keys)
	}
	for k, last := range s.last {
		if last != total/keys-1 {
			t.Fatalf("key %s ends at %d, want %d", k, last, total/keys-1)
		}
	}
}

// TestConsumer_ResumeAfterRestart closes a consumer (and then the whole node)
// midway and shows the group resumes at its committed offset: nothing lost,
// nothing delivered twice.
func TestConsumer_ResumeAfterRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	send := func(m *mq.MQ, from, to int) {
		t.Helper()
		p, err := m.NewProducer("t")
		if err != nil {
			t.Fatal(err)
		}
		for i := from; i < to; i++ {
			if _, err := p.SendMessage(ctx, &mq.Message{Body: []byte(fmt.Sprint(i)), Key: "k"}); err != nil {
				t.Fatal(err)
			}
		}
	}

	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "t", 2)
	send(m, 0, 10)
	r1 := &recorder{}
	c, err := m.NewConsumer("t", "g", r1)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "first 10", func() bool { return r1.n.Load() == 10 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	send(m, 10, 20)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	m2 := openNode(t, dir)
	if got := m2.Topics(); got["t"] != 2 {
		t.Fatalf("after reopen, topics = %v, want t with 2 partitions", got)
	}
	r2 := &recorder{}
	if _, err := m2.NewConsumer("t", "g", r2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "next 10", func() bool { return r2.n.Load() >= 10 })
	time.Sleep(50 * time.Millisecond) // a duplicate would show up here
	want := make([]string, 10)
	for i := range want {
		want[i] = fmt.Sprint(10 + i)
	}
	if got := r2.bodies(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("after restart got %v, want %v", got, want)
	}
}

// TestConsumer_StartPosition: a new group starts at the first or the last
// message.
func TestConsumer_StartPosition(t *testing.T) {
	for _, tc := range []struct {
		name string
		pos  mq.StartPosition
		want string
	}{
		{"First", mq.StartFirst, "old,new"},
		{"Last", mq.StartLast, "new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := openNode(t, "")
			mustCreate(t, m, "t", 1)
			p, _ := m.NewProducer("t")
			ctx := context.Background()
			if _, err := p.SendMessage(ctx, &mq.Message{Body: []byte("old")}); err != nil {
				t.Fatal(err)
			}
			r := &recorder{}
			c, err := m.NewConsumer("t", "g", r, mq.WithStartPosition(tc.pos))
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "assignment", func() bool { return len(c.Assigned()) == 1 })
			time.Sleep(20 * time.Millisecond) // let the worker settle its start offset
			if _, err := p.SendMessage(ctx, &mq.Message{Body: []byte("new")}); err != nil {
				t.Fatal(err)
			}
			n := int64(len(strings.Split(tc.want, ",")))
			waitFor(t, 5*time.Second, "messages", func() bool { return r.n.Load() >= n })
			if got := strings.Join(r.bodies(), ","); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// TestConsumer_Rebalance: more consumers than partitions leave the extra
// idle; closing an owner hands its partitions over.
func TestConsumer_Rebalance(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "t", 2)
	var cs []*mq.Consumer
	for i := 0; i < 3; i++ {
		c, err := m.NewConsumer("t", "g", &recorder{})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	count := func() (total, idle int) {
		for _, c := range cs {
			n := len(c.Assigned())
			total += n
			if n == 0 {
				idle++
			}
		}
		return
	}
	if total, idle := count(); total != 2 || idle != 1 {
		t.Fatalf("3 consumers on 2 partitions: %d assigned, %d idle; want 2 and 1", total, idle)
	}
	if err := cs[0].Close(); err != nil {
		t.Fatal(err)
	}
	cs = cs[1:]
	if total, idle := count(); total != 2 || idle != 0 {
		t.Fatalf("after a close: %d assigned, %d idle; want 2 and 0", total, idle)
	}
}

// TestConsumer_ErrorRedelivers: an error or a panic in OnMessage redelivers
// the same message, and the partition waits for it.
func TestConsumer_ErrorRedelivers(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "t", 1)
	p, _ := m.NewProducer("t")
	ctx := context.Background()
	for _, b := range []string{"a", "b"} {
		if _, err := p.SendMessage(ctx, &mq.Message{Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var got []string
	calls := 0
	_, err := m.NewConsumer("t", "g", mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		got = append(got, fmt.Sprintf("%s#%d", msg.Body, msg.ReconsumeTimes))
		switch calls {
		case 1:
			return errors.New("boom")
		case 2:
			panic("kaboom")
		}
		return nil
	}), mq.WithRetryPause(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "delivery", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 4
	})
	mu.Lock()
	defer mu.Unlock()
	if s := strings.Join(got, ","); s != "a#0,a#1,a#2,b#0" {
		t.Fatalf("deliveries %s, want a#0,a#1,a#2,b#0", s)
	}
}

// TestProducer_Dedup: resending an ID returns the first result and stores
// one copy, whether the resend reuses the struct or builds a new one.
func TestProducer_Dedup(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "t", 4)
	p, _ := m.NewProducer("t")
	ctx := context.Background()

	first := &mq.Message{Body: []byte("x")} // unkeyed: round robin, ID generated
	r1, err := p.SendMessage(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if first.ID == "" {
		t.Fatal("SendMessage did not fill ID")
	}
	r2, err := p.SendMessage(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if !r2[0].Duplicate || r2[0].Partition != r1[0].Partition || r2[0].Offset != r1[0].Offset {
		t.Fatalf("resend of the same struct: %+v, first %+v", r2[0], r1[0])
	}
	own := func() *mq.Message { return &mq.Message{ID: "order-1", Body: []byte("y")} }
	r3, err := p.SendMessage(ctx, own())
	if err != nil {
		t.Fatal(err)
	}
	// Other unkeyed sends move the round robin between the two attempts.
	if _, err := p.SendMessage(ctx, &mq.Message{}, &mq.Message{}); err != nil {
		t.Fatal(err)
	}
	r4, err := p.SendMessage(ctx, own())
	if err != nil {
		t.Fatal(err)
	}
	if r3[0].Duplicate || !r4[0].Duplicate || r4[0].Partition != r3[0].Partition || r4[0].Offset != r3[0].Offset {
		t.Fatalf("resend of a caller's ID: first %+v, again %+v", r3[0], r4[0])
	}
	// Within one call, too.
	r5, err := p.SendMessage(ctx, &mq.Message{ID: "same", Key: "k"}, &mq.Message{ID: "same", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if r5[0].Duplicate || !r5[1].Duplicate || r5[0].Offset != r5[1].Offset {
		t.Fatalf("same ID twice in one call: %+v", r5)
	}

	r := &recorder{}
	if _, err := m.NewConsumer("t", "g", r); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "messages", func() bool { return r.n.Load() >= 5 })
	time.Sleep(50 * time.Millisecond)
	if n := r.n.Load(); n != 5 { // x, y, two empty, same
		t.Fatalf("consumed %d messages, want 5 (one copy per ID)", n)
	}
}

// TestMQ_AlterMQ: growing adds empty partitions that receive messages;
// shrinking is refused.
func TestMQ_AlterMQ(t *testing.T) {
	dir := t.TempDir()
	m := openNode(t, dir)
	mustCreate(t, m, "t", 2)
	ctx := context.Background()
	r := &recorder{}
	c, err := m.NewConsumer("t", "g", r)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.AlterMQ(ctx, "t", 1); !errors.Is(err, mq.ErrPartitionDecrease) {
		t.Fatalf("shrink: %v, want ErrPartitionDecrease", err)
	}
	if err := m.AlterMQ(ctx, "t", 2); err != nil {
		t.Fatalf("same count: %v", err)
	}
	if err := m.AlterMQ(ctx, "t", 5); err != nil {
		t.Fatal(err)
	}
	p, _ := m.NewProducer("t")
	if p.Partition() != 5 {
		t.Fatalf("Partition() = %d, want 5", p.Partition())
	}
	waitFor(t, 5*time.Second, "rebalance", func() bool { return len(c.Assigned()) == 5 })
	res, err := p.SendMessage(ctx, (&mq.Message{Body: []byte("new")}).ToPartition(4))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Partition != 4 || res[0].Offset != 0 {
		t.Fatalf("first message of a new partition: %+v, want partition 4 offset 0", res[0])
	}
	waitFor(t, 5*time.Second, "delivery from the new partition", func() bool { return r.n.Load() == 1 })
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := openNode(t, dir)
	if got := m2.Topics()["t"]; got != 5 {
		t.Fatalf("after reopen: %d partitions, want 5", got)
	}
}

// TestMQ_BadInput: each bad input is answered by its sentinel error.
func TestMQ_BadInput(t *testing.T) {
	m := openNode(t, "", mq.WithMaxMessageBytes(1024))
	mustCreate(t, m, "t", 2)
	ctx := context.Background()
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	closed, err := mq.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, closed, "t", 1)
	closedProducer, _ := closed.NewProducer("t")
	closed.Close()
	closedAgain := closed.Close()

	cases := []struct {
		name string
		err  error
		want error
	}{
		{"EmptyTopic", m.CreateMQ(ctx, "", 1, mq.Options{}), mq.ErrInvalidTopic},
		{"LongTopic", m.CreateMQ(ctx, strings.Repeat("a", 256), 1, mq.Options{}), mq.ErrInvalidTopic},
		{"BadCharTopic", m.CreateMQ(ctx, "a/b", 1, mq.Options{}), mq.ErrInvalidTopic},
		{"DotDotTopic", m.CreateMQ(ctx, "..", 1, mq.Options{}), mq.ErrInvalidTopic},
		{"ReservedTopic", m.CreateMQ(ctx, "%DLQ%x", 1, mq.Options{}), mq.ErrInvalidTopic},
		{"TopicExists", m.CreateMQ(ctx, "t", 1, mq.Options{}), mq.ErrTopicExists},
		{"ZeroPartitions", m.CreateMQ(ctx, "u", 0, mq.Options{}), mq.ErrInvalidPartition},
		{"Raft3Standalone", m.CreateMQ(ctx, "u", 1, mq.Options{Type: mq.Raft3}), mq.ErrUnsupportedType},
		{"DoubleWriteStandalone", m.CreateMQ(ctx, "u", 1, mq.Options{Type: mq.DoubleWrite}), mq.ErrUnsupportedType},
		{"UnknownType", m.CreateMQ(ctx, "u", 1, mq.Options{Type: 3}), mq.ErrUnsupportedType},
		{"AlterUnknownTopic", m.AlterMQ(ctx, "nope", 3), mq.ErrNoTopic},
		{"ProducerUnknownTopic", second(m.NewProducer("nope")), mq.ErrNoTopic},
		{"ConsumerUnknownTopic", second(m.NewConsumer("nope", "g", &recorder{})), mq.ErrNoTopic},
		{"ConsumerBadGroup", second(m.NewConsumer("t", "", &recorder{})), mq.ErrInvalidGroup},
		{"ConsumerNilListener", second(m.NewConsumer("t", "g", nil)), mq.ErrInvalidOption},
		{"TooLarge", second(p.SendMessage(ctx, &mq.Message{Body: make([]byte, 1025)})), mq.ErrMessageTooLarge},
		{"NilMessage", second(p.SendMessage(ctx, nil)), mq.ErrNilMessage},
		{"PartitionTooHigh", second(p.SendMessage(ctx, (&mq.Message{}).ToPartition(2))), mq.ErrInvalidPartition},
		{"PartitionNegative", second(p.SendMessage(ctx, (&mq.Message{}).ToPartition(-1))), mq.ErrInvalidPartition},
		{"BadOption", second(mq.Open(t.TempDir(), mq.WithDedupWindow(-time.Second))), mq.ErrInvalidOption},
		{"SendAfterClose", second(closedProducer.SendMessage(ctx, &mq.Message{})), mq.ErrClosed},
		{"CreateAfterClose", closed.CreateMQ(ctx, "x", 1, mq.Options{}), mq.ErrClosed},
		{"AlterAfterClose", closed.AlterMQ(ctx, "t", 2), mq.ErrClosed},
		{"ProducerAfterClose", second(closed.NewProducer("t")), mq.ErrClosed},
		{"ConsumerAfterClose", second(closed.NewConsumer("t", "g", &recorder{})), mq.ErrClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.want) {
				t.Fatalf("got %v, want %v", tc.err, tc.want)
			}
		})
	}
	t.Run("CloseTwice", func(t *testing.T) {
		if closedAgain != nil {
			t.Fatalf("second Close: %v", closedAgain)
		}
	})
	t.Run("OversizeStoresNothing", func(t *testing.T) {
		_, err := p.SendMessage(ctx, &mq.Message{Key: "a"}, &mq.Message{Key: "a", Body: make([]byte, 2000)})
		if !errors.Is(err, mq.ErrMessageTooLarge) {
			t.Fatalf("got %v", err)
		}
		r := &recorder{}
		if _, err := m.NewConsumer("t", "empty-check", r); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		if n := r.n.Load(); n != 0 {
			t.Fatalf("a refused batch stored %d messages", n)
		}
	})
}

// TestMQ_CreateDoesNotStallSends: a CreateMQ of MaxPartitions partitions
// (one file each, opened and synced) runs while another topic is being sent
// to: the sends go on during it. The topic table is a snapshot swapped once
// the files are open; before, every send took the node lock that CreateMQ
// held for the whole of it, and none completed until it returned. The p99 of
// the sends during it is printed.
func TestMQ_CreateDoesNotStallSends(t *testing.T) {
	m := openNode(t, "")
	mustCreate(t, m, "busy", 1)
	p, err := m.NewProducer("busy")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var (
		creating atomic.Bool
		stop     = make(chan struct{})
		during   []time.Duration // latencies of the sends that completed while CreateMQ ran
		done     = make(chan error, 1)
	)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			start := time.Now()
			before := creating.Load()
			if _, err := p.SendMessage(ctx, &mq.Message{Body: []byte("x")}); err != nil {
				done <- err
				return
			}
			if before && creating.Load() {
				during = append(during, time.Since(start))
			}
		}
	}()
	creating.Store(true)
	start := time.Now()
	if err := m.CreateMQ(ctx, "big", mq.MaxPartitions, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	creating.Store(false)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(during) < 10 {
		t.Fatalf("%d sends completed during a CreateMQ of %d partitions that took %v, want at least 10", len(during), mq.MaxPartitions, took)
	}
	slices.Sort(during)
	t.Logf("CreateMQ of %d partitions took %v; %d sends during it, p50 %v, p99 %v, max %v", mq.MaxPartitions, took,
		len(during), during[len(during)/2], during[len(during)*99/100], during[len(during)-1])
	if got := m.Topics()["big"]; got != mq.MaxPartitions {
		t.Fatalf("big has %d partitions, want %d", got, mq.MaxPartitions)
	}
}
