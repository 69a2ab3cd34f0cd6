package mq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"github.com/expr-lang/expr/vm"

	"github.com/zeze-go/mq/store"
)

// Listener receives messages. OnMessage is called for one message of a
// partition at a time, in offset order, except with WithKeyParallel (one
// message per key at a time) and for the retries of Concurrent mode.
// Returning nil commits the message; returning an error (or panicking)
// redelivers it after the retry ladder's next step, and after
// MaxReconsumeTimes retries moves it to the group's dead-letter topic (see
// WithRetryLadder, WithMaxReconsumeTimes and ConsumeMode). A slow handler
// holds up its partition (or key); OnMessage may run on several goroutines
// at once, for different partitions or keys.
//
// ctx is cancelled when the consumer closes or loses the partition; a
// handler that returns ctx's error then is not counted as a failure and the
// message is delivered again to the partition's next owner.
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
	start        StartPosition
	ladder       []time.Duration // retry backoff; step i is the wait before retry i+1
	maxReconsume int             // failed deliveries retried before dead-lettering
	mode         ConsumeMode
	keyParallel  int    // 0: one message of a partition at a time
	instance     string // broadcasting: this consumer's own offset name suffix
	filter       *filter
	batch        int // messages held per partition at a time
	batchBytes   int // bytes held per partition at a time
}

func defaultConsumerConfig() consumerConfig {
	return consumerConfig{
		start:        StartFirst,
		ladder:       DefaultRetryLadder(),
		maxReconsume: DefaultMaxReconsumeTimes,
		mode:         Orderly,
		batch:        DefaultFlowMessages,
		batchBytes:   DefaultFlowBytes,
	}
}

// Flow control defaults: what one partition's worker holds in memory.
const (
	// DefaultFlowMessages is the default bound on messages held per partition.
	DefaultFlowMessages = 256
	// DefaultFlowBytes is the default bound on bytes held per partition.
	DefaultFlowBytes = 1 << 20
)

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

// WithRetryPause replaces the retry ladder with a constant pause d before
// every redelivery. It is WithRetryLadder(d).
func WithRetryPause(d time.Duration) ConsumerOption {
	return func(c *consumerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: retry pause %v", ErrInvalidOption, d)
		}
		c.ladder = []time.Duration{d}
		return nil
	}
}

// WithFlowControl bounds what a consumer holds in memory per partition: at
// most messages messages and, past the first message, bytes bytes (a single
// message larger than bytes is still delivered). Defaults DefaultFlowMessages
// (256) and DefaultFlowBytes (1 MiB). A backlog of any length costs no more
// than this: messages are read from the partition file as they are handled.
// With WithKeyParallel the bound is the sliding window: a key blocked on a
// failing message holds the window's head, and reading stops once the window
// is full.
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
// each partition is delivered by one consumer at a time. A broadcasting
// consumer (WithBroadcast) gets every partition. It is safe for concurrent
// use.
type Consumer struct {
	m         *MQ
	topic     string
	groupName string // the user's group; group.name is the offset name
	group     *group
	listener  Listener
	cfg       consumerConfig
	// parent is set on the consumer of %RETRY%<group> that a Concurrent
	// consumer starts: it takes only its parent's parked messages and
	// presents them as their original.
	parent *Consumer

	mu      sync.Mutex // guards workers, closed and retry; taken after group.mu
	workers map[int]*worker
	closed  bool
	retry   *Consumer // Concurrent mode: the consumer of the retry topic
}

// NewConsumer subscribes listener to topic as a member of group and starts
// delivering at once. Group names follow the topic name rules. topic may be
// a dead-letter or retry topic ("%DLQ%billing", "%RETRY%billing"), which is
// created if it does not exist yet. It returns ErrNoTopic, ErrInvalidGroup,
// ErrInvalidOption (a bad filter expression among them) or ErrClosed.
//
// Each partition the consumer owns runs one goroutine (plus, with
// WithKeyParallel, one per key in flight); a Concurrent consumer also
// consumes the group's retry topic. Close stops them all.
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
	if isSystemTopic(topic) {
		if err := m.ensureSystemTopic(topic); err != nil {
			return nil, err
		}
	}
	offsetName := groupName
	if cfg.instance != "" {
		offsetName = groupName + "@" + cfg.instance
	}
	c, err := m.subscribe(topic, groupName, offsetName, listener, cfg, nil)
	if err != nil || cfg.mode != Concurrent {
		return c, err
	}
	// Concurrent: also consume this consumer's parked messages.
	rt := RetryTopic(groupName)
	if err := m.ensureSystemTopic(rt); err != nil {
		c.Close()
		return nil, err
	}
	rcfg := cfg
	rcfg.filter, rcfg.start, rcfg.instance = nil, StartFirst, ""
	rc, err := m.subscribe(rt, groupName, offsetName+"%"+topic, listener, rcfg, c)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.mu.Lock()
	closed := c.closed
	c.retry = rc
	c.mu.Unlock()
	if closed {
		rc.Close()
	}
	return c, nil
}

// subscribe registers a consumer in the node's group for (topic, offsetName)
// and rebalances the group.
func (m *MQ) subscribe(topic, groupName, offsetName string, listener Listener, cfg consumerConfig, parent *Consumer) (*Consumer, error) {
	if _, _, err := m.router.partitions(topic); err != nil {
		return nil, err
	}
	c := &Consumer{m: m, topic: topic, groupName: groupName, listener: listener, cfg: cfg, parent: parent, workers: map[int]*worker{}}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	g := m.groupLocked(topic, offsetName)
	c.group = g
	g.mu.Lock()
	g.consumers = append(g.consumers, c)
	g.mu.Unlock()
	m.mu.Unlock()
	g.rebalance()
	return c, nil
}

// groupLocked returns the node's group for (topic, offset name), creating
// it if needed. The caller holds m.mu.
func (m *MQ) groupLocked(topic, offsetName string) *group {
	key := topic + "\x00" + offsetName
	g := m.groups[key]
	if g == nil {
		g = &group{m: m, topic: topic, name: offsetName}
		m.groups[key] = g
	}
	return g
}

// Name returns the consumer's group.
func (c *Consumer) Name() string { return c.groupName }

// OffsetName returns the name the consumer's offsets are stored under: the
// group, or for a broadcasting consumer group@instance. ResetOffset takes it.
func (c *Consumer) OffsetName() string { return c.group.name }

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
	rc := c.retry
	c.mu.Unlock()
	c.group.leave(c)
	if rc != nil {
		rc.Close()
	}
	return nil
}

// group is the set of consumers of one (topic, offset name) on this node.
type group struct {
	m     *MQ
	topic string
	name  string // offset name: the group, or group@instance when broadcasting

	rebalanceMu sync.Mutex // serializes rebalances and resets; taken before mu

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
		w := &worker{c: c, part: p, log: parts[p], done: make(chan struct{}), seek: make(chan *seekReq, 1)}
		var ctx context.Context
		ctx, w.cancel = context.WithCancel(context.WithValue(c.m.ctx, workerKey{}, w))
		c.workers[p] = w
		go w.run(ctx)
	}
}

// workerKey marks the contexts a worker hands to its handlers, so a reset
// called from a handler can tell it must not wait for that handler.
type workerKey struct{}

// worker delivers one partition to one consumer. It alone commits the
// partition's offset for its group while it runs; resets reach it through
// seek.
type worker struct {
	c      *Consumer
	part   int
	log    partitionLog
	cancel context.CancelFunc
	done   chan struct{}
	seek   chan *seekReq // ResetOffset hands new positions here

	committed  uint64 // last offset written to the store; owned by run
	lastCommit time.Time
	vm         vm.VM         // filter evaluation; owned by run
	sem        chan struct{} // key-parallel: bounds handlers in flight
}

func (w *worker) stop() {
	w.cancel()
	<-w.done
}

// errorPause is the wait before a worker tries again after a store error
// (a failed read, or a failed move to the retry or dead-letter topic).
const errorPause = time.Second

// commitEvery bounds how long a handled message may wait for its offset to be
// committed while its partition is busy.
const commitEvery = 200 * time.Millisecond

func (w *worker) run(ctx context.Context) {
	defer close(w.done)
	c := w.c
	offset, err := w.startOffset(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.logger().Error("consumer cannot start", "err", err)
		}
		return
	}
	w.committed = offset
	defer func() { w.commit(offset) }()
	if c.cfg.keyParallel > 0 {
		w.runParallel(ctx, &offset)
		return
	}
	buf := make([]store.Message, 0, c.cfg.batch)
	for ctx.Err() == nil {
		changed := w.log.Changed()
		buf, err = w.log.Read(offset, c.cfg.batch, c.cfg.batchBytes, buf[:0])
		if err != nil {
			w.logger().Error("read failed; retrying", "offset", offset, "err", err)
			if ok, req := w.wait(ctx, errorPause, w.seek, nil); !ok {
				if req == nil {
					return
				}
				offset = w.applySeek(req, offset)
			}
			continue
		}
		if len(buf) == 0 {
			w.commit(offset)
			select {
			case <-changed:
			case req := <-w.seek:
				offset = w.applySeek(req, offset)
			case <-ctx.Done():
			}
			continue
		}
		offset = w.skipGap(offset, buf[0].Offset)
	batch:
		for i := range buf {
			select {
			case req := <-w.seek:
				offset = w.applySeek(req, offset)
				break batch
			default:
			}
			ok, req := true, (*seekReq)(nil)
			if w.accept(&buf[i]) {
				ok, req = w.handle(ctx, &buf[i], w.seek, nil)
			}
			if req != nil {
				offset = w.applySeek(req, offset)
				break batch
			}
			if !ok {
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

// skipGap logs messages that retention removed before this group read them
// and returns where reading resumes.
func (w *worker) skipGap(offset, first uint64) uint64 {
	if first > offset {
		w.logger().Warn("messages removed by retention before delivery", "from", offset, "to", first, "lost", first-offset)
		return first
	}
	return offset
}

func (w *worker) logger() *slog.Logger {
	return w.c.m.cfg.logger.With("topic", w.c.topic, "group", w.c.group.name, "partition", w.part)
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
			w.logger().Error("offset commit failed", "err", err)
		}
		return
	}
	w.committed = offset
	w.lastCommit = time.Now()
}

func (w *worker) store(ctx context.Context, offset uint64) error {
	return w.c.m.commitOffset(ctx, w.log, w.c.group.name, offset)
}

// handle runs one accepted message through the listener until it is
// handled, parked in the retry topic or dead-lettered. It returns ok false if
// ctx ended or stop was closed first, and a seek request that arrived on seek
// while it waited to retry (the message is then left unhandled).
func (w *worker) handle(ctx context.Context, sm *store.Message, seek <-chan *seekReq, stop <-chan struct{}) (ok bool, req *seekReq) {
	c := w.c
	m := c.present(w.part, sm)
	for {
		if w.sem != nil { // key-parallel: bound the handlers in flight
			select {
			case w.sem <- struct{}{}:
			case <-stop:
				return false, nil
			case <-ctx.Done():
				return false, nil
			}
		}
		attempt := *m // the listener may keep what it is given
		err := w.call(ctx, &attempt)
		if w.sem != nil {
			<-w.sem
		}
		if err == nil {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, nil
		}
		r := m.ReconsumeTimes
		switch {
		case r >= c.cfg.maxReconsume:
			topic, cp := w.deadCopy(sm, r, err)
			return w.settle(ctx, seek, stop, topic, &cp)
		case c.cfg.mode == Concurrent:
			topic, cp := w.parkCopy(sm, r, err)
			return w.settle(ctx, seek, stop, topic, &cp)
		}
		if c.cfg.keyParallel == 0 {
			// Everything before sm is handled: keep it so while sm waits.
			w.commit(sm.Offset)
		}
		d := c.cfg.retryDelay(r)
		w.c.m.cfg.logger.Warn("message handler failed; redelivering", "topic", m.Topic, "group", c.group.name,
			"partition", m.PartitionIndex, "offset", m.Offset, "attempt", r+1, "after", d, "err", err)
		if ok, req := w.wait(ctx, d, seek, stop); !ok {
			return false, req
		}
		m.ReconsumeTimes++
	}
}

// settle appends cp, a failed message's copy, to the retry or dead-letter
// topic until it succeeds: a failed message is never dropped, so the
// partition waits for the store. Every try sends the same ID, so a try that
// failed late is not stored twice.
func (w *worker) settle(ctx context.Context, seek <-chan *seekReq, stop <-chan struct{}, topic string, cp *store.Message) (bool, *seekReq) {
	for {
		err := w.c.m.appendSystem(ctx, topic, cp, w.c.m.cfg.clock.Now())
		if err == nil {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, nil
		}
		w.logger().Error("cannot move a failed message; retrying", "err", err)
		if ok, req := w.wait(ctx, errorPause, seek, stop); !ok {
			return false, req
		}
	}
}

// wait waits d on the node's clock. It returns ok false if ctx ended, stop
// was closed or a seek request arrived (returned) first.
func (w *worker) wait(ctx context.Context, d time.Duration, seek <-chan *seekReq, stop <-chan struct{}) (ok bool, req *seekReq) {
	select {
	case <-w.c.m.cfg.clock.After(d):
		return true, nil
	case req := <-seek:
		return false, req
	case <-stop:
	case <-ctx.Done():
	}
	return false, nil
}

// call runs the listener, turning a panic into an error.
func (w *worker) call(ctx context.Context, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mq: OnMessage panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return w.c.listener.OnMessage(ctx, m.Topic, m)
}
