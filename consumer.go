package mq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/expr-lang/expr/vm"

	"github.com/zeze-go/mq/internal/partition"
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
//
// OnMessage may call any method of the package, among them Close of its own
// consumer, MQ.Close, Seek, ResetOffset and NewConsumer of its own group: a
// call never waits for the handler that makes it (see Consumer.Close and
// MQ.ResetOffset).
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

	mu      sync.Mutex           // guards workers, live, closed and retry; taken after group.mu and group.rebalanceMu
	workers map[int]*worker      // the partitions assigned to this consumer
	live    map[*worker]struct{} // workers not yet ended, assigned or not: Close waits for them
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
	c := &Consumer{m: m, topic: topic, groupName: groupName, listener: listener, cfg: cfg, parent: parent,
		workers: map[int]*worker{}, live: map[*worker]struct{}{}}
	m.mu.Lock()
	if m.closed.Load() {
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
		g = &group{m: m, topic: topic, name: offsetName, owners: map[int]*worker{}}
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

// Assigned returns the partitions assigned to this consumer, in order. A
// partition that just moved here is delivered once its previous owner's
// handler has returned.
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

// Close stops delivery, waits for the consumer's goroutines and the handlers
// in progress to return, commits the offsets reached and hands the
// consumer's partitions to the other consumers of its group. It is
// idempotent and safe for concurrent use; every call waits. Afterwards Seek
// returns ErrClosed.
//
// Close may be called from a handler, of this consumer or another. It then
// does not wait for that handler, nor for a handler that is itself inside a
// call to this package that waits (Close, MQ.Close, Seek, ResetOffset): such
// a handler's goroutine ends, and its offset is committed, when it returns.
// It does wait for the other handlers, so a handler that waits for another
// one (on a lock of its own, say) must not call Close, or be waited for by a
// goroutine that calls it.
func (c *Consumer) Close() error {
	r := enter(context.Background())
	defer r.leave()
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	rc := c.retry
	c.mu.Unlock()
	if first {
		c.group.leave(c)
	}
	if rc != nil {
		rc.Close()
	}
	c.mu.Lock()
	live := make([]*worker, 0, len(c.live))
	for w := range c.live {
		live = append(live, w)
	}
	c.mu.Unlock()
	for _, w := range live {
		r.await(context.Background(), w, w.done)
	}
	return nil
}

// group is the set of consumers of one (topic, offset name) on this node.
type group struct {
	m     *MQ
	topic string
	name  string // offset name: the group, or group@instance when broadcasting

	// rebalanceMu serializes rebalances and resets and guards owners and
	// every worker's seeks. It is taken before mu and is never held while
	// waiting for a worker or a handler: workers chain instead (see
	// worker.prev).
	rebalanceMu sync.Mutex
	owners      map[int]*worker // per partition, its newest worker until that one ends

	mu        sync.Mutex // guards consumers
	consumers []*Consumer
}

func (g *group) members() []*Consumer {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Consumer(nil), g.consumers...)
}

// leave removes c from the group, stops its workers (without waiting) and
// hands its partitions to the others.
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
	defer g.rebalanceMu.Unlock()
	c.revoke(nil)
	g.rebalanceLocked()
}

func (g *group) rebalance() {
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	g.rebalanceLocked()
}

// rebalanceLocked assigns partition i to the (i mod n)-th consumer in join
// order. A partition that moves is stopped at its old owner and started at
// the new one once the old one has ended, so no partition ever has two
// owners delivering at once, and nothing here waits for a handler. The
// caller holds rebalanceMu.
func (g *group) rebalanceLocked() {
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

// revoke stops the workers of partitions not in keep; they end on their
// own, after their handlers return. The caller holds group.rebalanceMu.
func (c *Consumer) revoke(keep map[int]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, w := range c.workers {
		if !keep[p] {
			w.cancel()
			delete(c.workers, p)
		}
	}
}

// assign starts workers for the partitions in want that c does not run
// yet, each after the partition's current worker in the group, if any,
// has ended. The caller holds group.rebalanceMu.
func (c *Consumer) assign(want map[int]bool, parts []partition.Partition) {
	g := c.group
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for p := range want {
		if _, ok := c.workers[p]; ok {
			continue
		}
		w := &worker{c: c, part: p, log: parts[p], done: make(chan struct{}), wake: make(chan struct{}, 1)}
		w.prev.Store(g.owners[p])
		g.owners[p] = w
		var ctx context.Context
		ctx, w.cancel = context.WithCancel(context.WithValue(c.m.ctx, workerKey{}, w))
		c.workers[p] = w
		c.live[w] = struct{}{}
		go w.run(ctx)
	}
}

// workerKey marks the contexts a worker hands to its handlers, so a call
// made with one (even from another goroutine) counts as made by the handler.
type workerKey struct{}

// worker delivers one partition to one consumer. It alone commits the
// partition's offset for its group while it runs; resets reach it through
// seeks.
type worker struct {
	c    *Consumer
	part int
	log  partition.Partition
	// prev is the partition's previous worker in the group, which run waits
	// for before it starts (then clears prev): one owner at a time.
	prev   atomic.Pointer[worker]
	cancel context.CancelFunc
	done   chan struct{} // closed when the worker has ended, prev before it
	held   atomic.Int32  // calls in progress, made by this worker's handlers, that wait

	seeks     []*seekReq    // resets to apply; guarded by group.rebalanceMu
	wake      chan struct{} // holds a token while seeks is not empty
	resetting atomic.Bool   // seeks is not empty: key-parallel lanes start no new message

	committed  uint64 // last offset written to the store; owned by run
	lastCommit time.Time
	vm         vm.VM         // filter evaluation; owned by run
	sem        chan struct{} // key-parallel: bounds handlers in flight
}

// errorPause is the wait before a worker tries again after a store error
// (a failed read, or a failed move to the retry or dead-letter topic).
const errorPause = time.Second

// commitEvery bounds how long a handled message may wait for its offset to be
// committed while its partition is busy.
const commitEvery = 200 * time.Millisecond

func (w *worker) run(ctx context.Context) {
	defer w.end()
	defer w.runsHandlers()()
	if prev := w.prev.Load(); prev != nil {
		<-prev.done // even when cancelled: w.end must follow prev's last commit
		w.prev.Store(nil)
	}
	if ctx.Err() != nil {
		return
	}
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
		if reqs := w.pollSeeks(); reqs != nil {
			offset = w.applySeek(reqs, offset)
			continue
		}
		changed := w.log.Changed()
		buf, err = w.log.Read(offset, c.cfg.batch, c.cfg.batchBytes, buf[:0])
		if err != nil {
			w.logger().Error("read failed; retrying", "offset", offset, "err", err)
			if ok, reqs := w.wait(ctx, errorPause, w.wake, nil); !ok {
				offset = w.applySeek(reqs, offset)
			}
			continue
		}
		if len(buf) == 0 {
			w.commit(offset)
			select {
			case <-changed:
			case <-w.wake:
				offset = w.applySeek(w.claimSeeks(), offset)
			case <-ctx.Done():
			}
			continue
		}
		offset = w.skipGap(offset, buf[0].Offset)
	batch:
		for i := range buf {
			if reqs := w.pollSeeks(); reqs != nil {
				offset = w.applySeek(reqs, offset)
				break batch
			}
			ok, reqs := true, []*seekReq(nil)
			if w.accept(&buf[i]) {
				ok, reqs = w.handle(ctx, &buf[i], w.wake, nil)
			}
			if reqs != nil {
				offset = w.applySeek(reqs, offset)
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
// ctx ended or stop was closed first, and the resets that arrived (a token
// on wake) while it waited to retry (the message is then left unhandled).
func (w *worker) handle(ctx context.Context, sm *store.Message, wake, stop <-chan struct{}) (ok bool, reqs []*seekReq) {
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
		if ctx.Err() != nil { // stopped: deliver nothing more
			if w.sem != nil {
				<-w.sem
			}
			return false, nil
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
			return w.settle(ctx, wake, stop, topic, &cp)
		case c.cfg.mode == Concurrent:
			topic, cp := w.parkCopy(sm, r, err)
			return w.settle(ctx, wake, stop, topic, &cp)
		}
		if c.cfg.keyParallel == 0 {
			// Everything before sm is handled: keep it so while sm waits.
			w.commit(sm.Offset)
		}
		d := c.cfg.retryDelay(r)
		w.c.m.cfg.logger.Warn("message handler failed; redelivering", "topic", m.Topic, "group", c.group.name,
			"partition", m.PartitionIndex, "offset", m.Offset, "attempt", r+1, "after", d, "err", err)
		if ok, reqs := w.wait(ctx, d, wake, stop); !ok {
			return false, reqs
		}
		m.ReconsumeTimes++
	}
}

// settle appends cp, a failed message's copy, to the retry or dead-letter
// topic until it succeeds: a failed message is never dropped, so the
// partition waits for the store. Every try sends the same ID, so a try that
// failed late is not stored twice.
func (w *worker) settle(ctx context.Context, wake, stop <-chan struct{}, topic string, cp *store.Message) (bool, []*seekReq) {
	for {
		err := w.c.m.appendSystem(ctx, topic, cp, w.c.m.cfg.clock.Now())
		if err == nil {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, nil
		}
		w.logger().Error("cannot move a failed message; retrying", "err", err)
		if ok, reqs := w.wait(ctx, errorPause, wake, stop); !ok {
			return false, reqs
		}
	}
}

// wait waits d on the node's clock. It returns ok false if ctx ended, stop
// was closed or resets arrived (a token on wake; returned) first.
func (w *worker) wait(ctx context.Context, d time.Duration, wake, stop <-chan struct{}) (ok bool, reqs []*seekReq) {
	after := w.c.m.cfg.clock.After(d)
	for {
		select {
		case <-after:
			return true, nil
		case <-wake:
			if reqs := w.claimSeeks(); reqs != nil {
				return false, reqs
			}
		case <-stop:
			return false, nil
		case <-ctx.Done():
			return false, nil
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
	return w.c.listener.OnMessage(ctx, m.Topic, m)
}

// end finishes the worker once run is done with the partition: it applies
// the resets still queued for it (after its last commit, so they win),
// gives the partition up and closes done, which starts its successor.
func (w *worker) end() {
	g := w.c.group
	for {
		g.rebalanceMu.Lock()
		reqs := w.claimSeeksLocked()
		if reqs == nil {
			if g.owners[w.part] == w {
				delete(g.owners, w.part)
			}
		}
		g.rebalanceMu.Unlock()
		if reqs == nil {
			break
		}
		w.applySeek(reqs, 0)
	}
	w.c.mu.Lock()
	delete(w.c.live, w)
	w.c.mu.Unlock()
	close(w.done)
}

// Calls from handlers. A handler may call any public method, and a call that
// waits must not wait for a handler that cannot return before the call
// does: its own, or one that is itself inside such a call. The goroutines
// that run handlers are registered with their worker; a call made from one
// (or with a handler's ctx) holds that worker for its duration, and its
// waits give up on a worker that is held, directly or through the worker it
// waits to take over from.
var (
	handlerGoroutines sync.Map // goroutine id → the *worker whose handlers it runs

	heldMu      sync.Mutex            // guards heldChanged
	heldChanged = make(chan struct{}) // closed and replaced whenever a worker's held count changes
)

// runsHandlers registers the calling goroutine as one that runs w's
// handlers; the returned func deregisters it.
func (w *worker) runsHandlers() func() {
	id := goid()
	handlerGoroutines.Store(id, w)
	return func() { handlerGoroutines.Delete(id) }
}

// goid is the calling goroutine's id, read from the first line of its stack
// trace ("goroutine 18 [running]:"). Only registrations and public calls
// that wait pay for it.
func goid() uint64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}

// reentry is a public call in progress; in holds the workers whose handlers
// made it.
type reentry struct{ in []*worker }

// enter starts a call that may wait: made from a handler's goroutine, or
// with a handler's ctx, it holds that handler's worker until leave.
func enter(ctx context.Context) reentry {
	var r reentry
	if v, ok := handlerGoroutines.Load(goid()); ok {
		r.in = append(r.in, v.(*worker))
	}
	if w, _ := ctx.Value(workerKey{}).(*worker); w != nil && !slices.Contains(r.in, w) {
		r.in = append(r.in, w)
	}
	for _, w := range r.in {
		w.hold(1)
	}
	return r
}

func (r reentry) leave() {
	for _, w := range r.in {
		w.hold(-1)
	}
}

func (w *worker) hold(d int32) {
	w.held.Add(d)
	heldMu.Lock()
	close(heldChanged)
	heldChanged = make(chan struct{})
	heldMu.Unlock()
}

// blocked reports whether w cannot end, nor answer a reset, before a call
// made by a handler returns: w, or a worker w waits for, is held.
func (w *worker) blocked() bool {
	for x := w; x != nil; x = x.prev.Load() {
		select {
		case <-x.done:
			return false // and so are the ones before it
		default:
		}
		if x.held.Load() > 0 {
			return true
		}
	}
	return false
}

// await waits until ready (w's done, or its answer to a reset) is closed
// and reports true, or until ctx ends (its error). A call made from a
// handler stops waiting, reporting false, once w is blocked.
func (r reentry) await(ctx context.Context, w *worker, ready <-chan struct{}) (bool, error) {
	for {
		heldMu.Lock()
		changed := heldChanged
		heldMu.Unlock()
		if len(r.in) > 0 && w.blocked() {
			return false, nil
		}
		select {
		case <-ready:
			return true, nil
		case <-changed:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}
