package mq

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"github.com/zeze-go/mq/store"
)

// Listener receives messages. OnMessage is called for one message of a
// partition at a time, in offset order. Returning nil commits the message;
// returning an error (or panicking) redelivers it later. ctx is cancelled
// when the consumer closes or loses the partition; a handler that returns
// ctx's error then is not counted as a failure and the message is delivered
// again to the partition's next owner.
type Listener interface {
	OnMessage(ctx context.Context, mqName string, m *Message) error
}

// ListenerFunc adapts a function to Listener.
type ListenerFunc func(ctx context.Context, mqName string, m *Message) error

// OnMessage calls f.
func (f ListenerFunc) OnMessage(ctx context.Context, mqName string, m *Message) error {
	return f(ctx, mqName, m)
}

// StartPosition is where a new group starts reading.
type StartPosition int

const (
	// StartFirst starts a new group at the oldest stored message (the default).
	StartFirst StartPosition = iota
	// StartLast starts a new group after the newest message: it sees only
	// messages sent after it first subscribed.
	StartLast
)

// ConsumerOption configures NewConsumer.
type ConsumerOption func(*consumerConfig) error

type consumerConfig struct {
	start      StartPosition
	retryPause time.Duration
	batch      int // messages read per partition at a time
	batchBytes int // bytes read per partition at a time
}

func defaultConsumerConfig() consumerConfig {
	return consumerConfig{
		start:      StartFirst,
		retryPause: time.Second,
		batch:      256,
		batchBytes: 1 << 20,
	}
}

// WithStartPosition sets where a group with no committed offset starts.
func WithStartPosition(s StartPosition) ConsumerOption {
	return func(c *consumerConfig) error {
		if s != StartFirst && s != StartLast {
			return fmt.Errorf("%w: start position %d", ErrInvalidOption, s)
		}
		c.start = s
		return nil
	}
}

// WithRetryPause sets the pause before a failed message is delivered again.
// Default 1s.
func WithRetryPause(d time.Duration) ConsumerOption {
	return func(c *consumerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: retry pause %v", ErrInvalidOption, d)
		}
		c.retryPause = d
		return nil
	}
}

// WithFlowControl bounds what a consumer holds in memory per partition: at
// most messages messages and, past the first message, bytes bytes. Defaults
// 256 messages and 1 MiB.
func WithFlowControl(messages, bytes int) ConsumerOption {
	return func(c *consumerConfig) error {
		if messages <= 0 || bytes <= 0 {
			return fmt.Errorf("%w: flow control %d messages, %d bytes", ErrInvalidOption, messages, bytes)
		}
		c.batch, c.batchBytes = messages, bytes
		return nil
	}
}

// Consumer receives the messages of one topic for one group. The topic's
// partitions are divided among the open consumers of the group on this node;
// each partition is delivered by one consumer at a time. It is safe for
// concurrent use.
type Consumer struct {
	m        *MQ
	topic    string
	group    *group
	listener Listener
	cfg      consumerConfig

	mu      sync.Mutex // guards workers and closed; taken after group.mu
	workers map[int]*worker
	closed  bool
}

// NewConsumer subscribes listener to topic as a member of group and starts
// delivering at once. Group names follow the topic name rules. It returns
// ErrNoTopic, ErrInvalidGroup, ErrInvalidOption or ErrClosed. Each partition
// the consumer owns runs one goroutine; Close stops them.
func (m *MQ) NewConsumer(topic, groupName string, listener Listener, opts ...ConsumerOption) (*Consumer, error) {
	if err := checkName(groupName, ErrInvalidGroup); err != nil {
		return nil, err
	}
	if listener == nil {
		return nil, fmt.Errorf("%w: nil listener", ErrInvalidOption)
	}
	cfg := defaultConsumerConfig()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil consumer option", ErrInvalidOption)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if _, _, err := m.router.partitions(topic); err != nil {
		return nil, err
	}
	c := &Consumer{m: m, topic: topic, listener: listener, cfg: cfg, workers: map[int]*worker{}}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	key := topic + "\x00" + groupName
	g := m.groups[key]
	if g == nil {
		g = &group{m: m, topic: topic, name: groupName}
		m.groups[key] = g
	}
	c.group = g
	g.mu.Lock()
	g.consumers = append(g.consumers, c)
	g.mu.Unlock()
	m.mu.Unlock()
	g.rebalance()
	return c, nil
}

// Name returns the consumer's group.
func (c *Consumer) Name() string { return c.group.name }

// Topic returns the consumer's topic.
func (c *Consumer) Topic() string { return c.topic }

// Options returns the topic's options.
func (c *Consumer) Options() Options {
	o, _, _ := c.m.router.partitions(c.topic)
	return o
}

// Partition returns the topic's partition count (0 after the node closes).
func (c *Consumer) Partition() int {
	_, parts, _ := c.m.router.partitions(c.topic)
	return len(parts)
}

// Assigned returns the partitions this consumer delivers now, in order.
func (c *Consumer) Assigned() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int, 0, len(c.workers))
	for p := range c.workers {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// Listener returns the consumer's listener.
func (c *Consumer) Listener() Listener { return c.listener }

// Close stops delivery, waits for the handlers in progress to return,
// commits the offsets reached and hands the consumer's partitions to the
// other consumers of its group. It is idempotent.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.group.leave(c)
	return nil
}

// group is the set of consumers of one (topic, group) on this node.
type group struct {
	m     *MQ
	topic string
	name  string

	rebalanceMu sync.Mutex // serializes rebalances; taken before mu

	mu        sync.Mutex // guards consumers
	consumers []*Consumer
}

func (g *group) members() []*Consumer {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Consumer(nil), g.consumers...)
}

func (g *group) leave(c *Consumer) {
	g.mu.Lock()
	for i, x := range g.consumers {
		if x == c {
			g.consumers = append(g.consumers[:i], g.consumers[i+1:]...)
			break
		}
	}
	g.mu.Unlock()
	g.rebalanceMu.Lock()
	c.revokeAll()
	g.rebalanceMu.Unlock()
	g.rebalance()
}

// rebalance assigns partition i to the (i mod n)-th consumer in join order.
// Partitions that move are stopped first, so no partition ever has two
// owners delivering at once.
func (g *group) rebalance() {
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	_, parts, err := g.m.router.partitions(g.topic)
	if err != nil {
		return // node closing or topic gone: nothing to assign
	}
	cons := g.members()
	want := make(map[*Consumer]map[int]bool, len(cons))
	for _, c := range cons {
		want[c] = map[int]bool{}
	}
	for i := range parts {
		if len(cons) > 0 {
			want[cons[i%len(cons)]][i] = true
		}
	}
	for _, c := range cons {
		c.revoke(want[c])
	}
	if g.m.ctx.Err() != nil {
		return
	}
	for _, c := range cons {
		c.assign(want[c], parts)
	}
}

// revoke stops the workers of partitions not in keep and waits for them.
func (c *Consumer) revoke(keep map[int]bool) {
	c.mu.Lock()
	var stop []*worker
	for p, w := range c.workers {
		if !keep[p] {
			stop = append(stop, w)
			delete(c.workers, p)
		}
	}
	c.mu.Unlock()
	for _, w := range stop {
		w.stop()
	}
}

func (c *Consumer) revokeAll() { c.revoke(nil) }

func (c *Consumer) assign(want map[int]bool, parts []partitionLog) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for p := range want {
		if _, ok := c.workers[p]; ok {
			continue
		}
		w := &worker{c: c, part: p, log: parts[p], done: make(chan struct{})}
		var ctx context.Context
		ctx, w.cancel = context.WithCancel(c.m.ctx)
		c.workers[p] = w
		go w.run(ctx)
	}
}

// worker delivers one partition to one consumer.
type worker struct {
	c      *Consumer
	part   int
	log    partitionLog
	cancel context.CancelFunc
	done   chan struct{}

	committed  uint64 // last offset written to the store; owned by run
	lastCommit time.Time
}

func (w *worker) stop() {
	w.cancel()
	<-w.done
}

// commitEvery bounds how long a handled message may wait for its offset to be
// committed while its partition is busy.
const commitEvery = 200 * time.Millisecond

func (w *worker) run(ctx context.Context) {
	defer close(w.done)
	c := w.c
	log := c.m.cfg.logger.With("topic", c.topic, "group", c.group.name, "partition", w.part)
	offset, err := w.startOffset(ctx)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("consumer cannot start", "err", err)
		}
		return
	}
	w.committed = offset
	defer func() { w.commit(offset) }()
	buf := make([]store.Message, 0, c.cfg.batch)
	for ctx.Err() == nil {
		changed := w.log.Changed()
		buf, err = w.log.Read(offset, c.cfg.batch, c.cfg.batchBytes, buf[:0])
		if err != nil {
			log.Error("read failed; retrying", "offset", offset, "err", err)
			if !w.sleep(ctx, c.cfg.retryPause) {
				return
			}
			continue
		}
		if len(buf) == 0 {
			w.commit(offset)
			select {
			case <-changed:
			case <-ctx.Done():
			}
			continue
		}
		if first := buf[0].Offset; first > offset {
			log.Warn("messages removed by retention before delivery", "from", offset, "to", first, "lost", first-offset)
			offset = first
		}
		for i := range buf {
			if !w.deliver(ctx, &buf[i]) {
				return
			}
			offset = buf[i].Offset + 1
			if time.Since(w.lastCommit) > commitEvery {
				w.commit(offset)
			}
		}
		clear(buf)
		w.commit(offset)
	}
}

// startOffset is the group's committed offset, or the start position for a
// new group (which it commits, so a restart does not move it).
func (w *worker) startOffset(ctx context.Context) (uint64, error) {
	off, ok, err := w.log.GroupOffset(w.c.group.name)
	if err != nil || ok {
		return off, err
	}
	st := w.log.Stats()
	off = st.Low
	if w.c.cfg.start == StartLast {
		off = st.Next
	}
	return off, w.store(ctx, off)
}

func (w *worker) commit(offset uint64) {
	if offset == w.committed {
		return
	}
	// Commit even while stopping: the offset must reach the store.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.store(ctx, offset); err != nil {
		if !errors.Is(err, ErrClosed) {
			w.c.m.cfg.logger.Error("offset commit failed", "topic", w.c.topic, "group", w.c.group.name, "partition", w.part, "err", err)
		}
		return
	}
	w.committed = offset
	w.lastCommit = time.Now()
}

func (w *worker) store(ctx context.Context, offset uint64) error {
	cmd := store.Command{Op: store.OpCommitOffset, Group: w.c.group.name, Offset: offset}
	return translate(w.log.Apply(ctx, &cmd))
}

// deliver calls the listener until it accepts m. It returns false if ctx
// ended first.
func (w *worker) deliver(ctx context.Context, sm *store.Message) bool {
	c := w.c
	m := fromStore(c.topic, w.part, sm)
	for {
		err := w.call(ctx, m)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		c.m.cfg.logger.Warn("message handler failed; redelivering", "topic", c.topic, "group", c.group.name,
			"partition", w.part, "offset", m.Offset, "attempt", m.ReconsumeTimes+1, "err", err)
		m.ReconsumeTimes++
		if !w.sleep(ctx, c.cfg.retryPause) {
			return false
		}
	}
}

// call runs the listener, turning a panic into an error.
func (w *worker) call(ctx context.Context, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mq: OnMessage panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return w.c.listener.OnMessage(ctx, w.c.topic, m)
}

func (w *worker) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-w.c.m.cfg.clock.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}
