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

// sink is a Listener that records what it is given and answers with fail
// (nil: accept everything).
type sink struct {
	mu    sync.Mutex
	msgs  []*mq.Message
	names []string // mqName of each call
	mark  []int    // clock mark at each call, when clk is set
	clk   *retryClock
	fail  func(m *mq.Message, seen []*mq.Message) error
}

func (s *sink) OnMessage(_ context.Context, name string, m *mq.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, m)
	s.names = append(s.names, name)
	if s.clk != nil {
		s.mark = append(s.mark, s.clk.mark())
	}
	if s.fail != nil {
		return s.fail(m, s.msgs[:len(s.msgs)-1])
	}
	return nil
}

func (s *sink) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

func (s *sink) all() []*mq.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// trace renders the deliveries as body#ReconsumeTimes.
func (s *sink) trace() string {
	var b []string
	for _, m := range s.all() {
		b = append(b, fmt.Sprintf("%s#%d", m.Body, m.ReconsumeTimes))
	}
	return strings.Join(b, ",")
}

func seen(msgs []*mq.Message, body string) bool {
	return slices.ContainsFunc(msgs, func(m *mq.Message) bool { return string(m.Body) == body })
}

func publish(t testing.TB, m *mq.MQ, topic string, bodies ...string) []*mq.Message {
	t.Helper()
	p, err := m.NewProducer(topic)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*mq.Message
	for _, b := range bodies {
		msg := &mq.Message{Body: []byte(b)}
		if _, err := p.SendMessage(context.Background(), msg.ToPartition(0)); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, msg)
	}
	return msgs
}

func consume(t testing.TB, m *mq.MQ, topic, group string, l mq.Listener, opts ...mq.ConsumerOption) *mq.Consumer {
	t.Helper()
	c, err := m.NewConsumer(topic, group, l, opts...)
	if err != nil {
		t.Fatalf("NewConsumer(%s, %s): %v", topic, group, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var errBoom = errors.New("boom")

// arrivals is a Listener that keeps each message with the time it arrived.
type arrivals struct {
	mu   sync.Mutex
	msgs []*mq.Message
	at   []time.Time
}

func (a *arrivals) OnMessage(_ context.Context, _ string, m *mq.Message) error {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.msgs = append(a.msgs, m)
	a.at = append(a.at, now)
	return nil
}

func (a *arrivals) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.msgs)
}

// lateness returns, sorted, how long after its DeliverAt each message arrived.
func (a *arrivals) lateness() []time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]time.Duration, len(a.msgs))
	for i, m := range a.msgs {
		out[i] = a.at[i].Sub(m.DeliverAt)
	}
	slices.Sort(out)
	return out
}

// bodiesOfKey returns the bodies of key's messages in arrival order.
func (a *arrivals) bodiesOfKey(key string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, m := range a.msgs {
		if m.Key == key {
			out = append(out, string(m.Body))
		}
	}
	return out
}

func mustSend(t testing.TB, p *mq.Producer, msgs ...*mq.Message) []mq.SendResult {
	t.Helper()
	res, err := p.SendMessage(context.Background(), msgs...)
	if err != nil {
		t.Fatalf("SendMessage: %v", err)
	}
	return res
}

// openWithTopic opens a node with opts and creates topic with parts
// partitions; it returns the node and a producer for the topic.
func openWithTopic(t testing.TB, topic string, parts int, opts ...mq.Option) (*mq.MQ, *mq.Producer) {
	t.Helper()
	m := openNode(t, "", opts...)
	mustCreate(t, m, topic, parts)
	p, err := m.NewProducer(topic)
	if err != nil {
		t.Fatalf("NewProducer(%s): %v", topic, err)
	}
	return m, p
}

func mustConsume(t testing.TB, m *mq.MQ, topic, group string, l mq.Listener) *mq.Consumer {
	t.Helper()
	c, err := m.NewConsumer(topic, group, l)
	if err != nil {
		t.Fatalf("NewConsumer(%s, %s): %v", topic, group, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// collector is a Listener that records every delivery.
type collector struct {
	mu   sync.Mutex
	seen map[string]int // message ID -> deliveries
	msgs []*mq.Message  // in delivery order
}

func (c *collector) OnMessage(_ context.Context, _ string, m *mq.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]int{}
	}
	c.seen[m.ID]++
	c.msgs = append(c.msgs, m)
	return nil
}

func (c *collector) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[id]
}

func (c *collector) ids() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.seen))
	for k, v := range c.seen {
		out[k] = v
	}
	return out
}

func (c *collector) byID(id string) *mq.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.msgs {
		if m.ID == id {
			return m
		}
	}
	return nil
}

// collect subscribes a collector to topic as group; the consumer closes at
// cleanup.
func collect(t testing.TB, m *mq.MQ, topic, group string) *collector {
	t.Helper()
	col := &collector{}
	c, err := m.NewConsumer(topic, group, col)
	if err != nil {
		t.Fatalf("NewConsumer(%s, %s): %v", topic, group, err)
	}
	t.Cleanup(func() { c.Close() })
	return col
}

// waitSeen waits until every id was delivered at least once.
func waitSeen(t testing.TB, col *collector, ids ...string) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("delivery of %v", ids), func() bool {
		for _, id := range ids {
			if col.count(id) == 0 {
				return false
			}
		}
		return true
	})
}

// fence sends one plain message to every partition of topic and waits for
// them: whatever the consumer saw afterwards is all that was visible before
// the fence (delivery is in offset order per partition).
func fence(t testing.TB, m *mq.MQ, col *collector, topic string) {
	t.Helper()
	p, err := m.NewProducer(topic)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < p.Partition(); i++ {
		msg := (&mq.Message{Body: []byte("fence")}).ToPartition(i)
		if _, err := p.SendMessage(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, msg.ID)
	}
	waitSeen(t, col, ids...)
}

// msgs makes n messages with IDs prefix-0, prefix-1, ...
func msgs(prefix string, n int) []*mq.Message {
	out := make([]*mq.Message, n)
	for i := range out {
		out[i] = &mq.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Key: fmt.Sprintf("k%d", i), Body: []byte(prefix)}
	}
	return out
}

func idsOf(ms []*mq.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// eachMode runs fn as a subtest for each consume mode and checks, after
// each, that no goroutine is left.
func eachMode(t *testing.T, fn func(t *testing.T, opts []mq.ConsumerOption)) {
	for _, mode := range consumeModes {
		t.Run(mode.name, func(t *testing.T) {
			noLeaks(t)
			fn(t, mode.opts)
		})
	}
}

// consumeSelf subscribes fn to topic t as group g. fn may use its own
// consumer: no message reaches it before NewConsumer has returned it.
func consumeSelf(t testing.TB, m *mq.MQ, fn func(ctx context.Context, c *mq.Consumer, msg *mq.Message) error, opts ...mq.ConsumerOption) *mq.Consumer {
	t.Helper()
	var c *mq.Consumer
	ready := make(chan struct{})
	defer close(ready)
	c = consume(t, m, "t", "g", mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
		<-ready
		return fn(ctx, c, msg)
	}), opts...)
	return c
}

// partitionFixture is a topic t of parts partitions; partition i holds per
// messages "p<i>-0", "p<i>-1", ..., all with key "k<i>" (so a key-parallel
// consumer, too, hands them over one by one).
func partitionFixture(t *testing.T, parts, per int) *mq.MQ {
	t.Helper()
	m := openNode(t, "")
	mustCreate(t, m, "t", parts)
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	for i := range parts {
		for j := range per {
			msg := (&mq.Message{Key: fmt.Sprintf("k%d", i), Body: []byte(fmt.Sprintf("p%d-%d", i, j))}).ToPartition(i)
			if _, err := p.SendMessage(context.Background(), msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	return m
}

// consumeModes are the ways a consumer runs its handlers.
var consumeModes = []struct {
	name string
	opts []mq.ConsumerOption
}{
	{"Orderly", nil},
	{"Concurrent", []mq.ConsumerOption{mq.WithConsumeMode(mq.Concurrent)}},
	{"KeyParallel", []mq.ConsumerOption{mq.WithKeyParallel(1)}},
	{"KeyParallelConcurrent", []mq.ConsumerOption{mq.WithKeyParallel(4), mq.WithConsumeMode(mq.Concurrent)}},
}

// blocker is a Listener for key-parallel tests: it fails one message while
// blocked is set, records every successful delivery per key, and measures
// how many handlers run at once.
type blocker struct {
	failBody string
	blocked  atomic.Bool
	inFlight atomic.Int32
	most     atomic.Int32
	fails    atomic.Int32

	mu    sync.Mutex
	byKey map[string][]string
	order []string
}

func (b *blocker) OnMessage(_ context.Context, _ string, m *mq.Message) error {
	n := b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	for {
		old := b.most.Load()
		if n <= old || b.most.CompareAndSwap(old, n) {
			break
		}
	}
	time.Sleep(time.Millisecond)
	if string(m.Body) == b.failBody && b.blocked.Load() {
		b.fails.Add(1)
		return errBoom
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byKey == nil {
		b.byKey = map[string][]string{}
	}
	b.byKey[m.Key] = append(b.byKey[m.Key], string(m.Body))
	b.order = append(b.order, string(m.Body))
	return nil
}

func (b *blocker) done() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.order)
}

// keyedFixtureDir is a node in dir with a one-partition topic t holding
// messages "m0".."m<n-1>", all with key "k" (so a key-parallel consumer,
// too, hands them over one by one, in order).
func keyedFixtureDir(t *testing.T, dir string, n int) *mq.MQ {
	t.Helper()
	m := openNode(t, dir)
	mustCreate(t, m, "t", 1)
	sendKeyed(t, m, n, 0)
	return m
}

// gate is a Listener that records what it is given and blocks the first
// delivery of body at until release is closed (or handoverTimeout passes, so
// a failed test leaves no goroutine behind).
type gate struct {
	at      string
	entered chan struct{} // closed when the handler blocks
	release chan struct{}
	once    sync.Once
	rel     sync.Once

	mu     sync.Mutex
	bodies []string
}

func newGate(at string) *gate {
	return &gate{at: at, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) OnMessage(_ context.Context, _ string, msg *mq.Message) error {
	g.mu.Lock()
	g.bodies = append(g.bodies, string(msg.Body))
	g.mu.Unlock()
	if string(msg.Body) == g.at {
		g.once.Do(func() {
			close(g.entered)
			select {
			case <-g.release:
			case <-time.After(handoverTimeout):
			}
		})
	}
	return nil
}

func (g *gate) open() { g.rel.Do(func() { close(g.release) }) }

func (g *gate) got() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.bodies)
}

// started waits until group has an offset in every partition of topic: its
// consumers have claimed them, so their start position is fixed.
func started(t *testing.T, m *mq.MQ, topic, group string) {
	t.Helper()
	waitFor(t, handoverTimeout, group+" started", func() bool {
		lags, err := m.Lag(context.Background(), topic, group)
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
