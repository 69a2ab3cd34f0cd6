package delivery

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/topicdb"
)

// Consumer is one member of a group on this node.
type Consumer struct {
	e         *Engine
	id        uint64 // unique in the engine: the coordinator's name for it
	topic     string
	groupName string // the user's group; group.name is the offset name
	group     *group
	handler   Handler
	cfg       Config
	// parent is set on the consumer of %RETRY%<group> that a Concurrent
	// consumer starts: it takes only its parent's parked messages and
	// presents them as their original.
	parent *Consumer

	mu      sync.Mutex           // guards workers, live, closed and retry
	workers map[int]*worker      // the partitions assigned to this consumer
	live    map[*worker]struct{} // workers not yet ended, assigned or not: Close waits for them
	closed  bool
	retry   *Consumer // Concurrent mode: the consumer of the retry topic

	// commits is the parent of every offset commit of c's workers: it
	// ends lastCommits after Close began, so that a commit under way
	// when Close began and the last one after it are bounded together.
	commits    context.Context
	endCommits context.CancelFunc
}

// commitTimeout bounds one offset commit; lastCommits bounds, from the
// start of a consumer's Close, its commits under way and its last ones.
// An offset not committed is delivered again.
const (
	commitTimeout = 10 * time.Second
	lastCommits   = 5 * time.Second
)

// commitCtx is the ctx of one offset commit of c's.
func (c *Consumer) commitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.commits, commitTimeout)
}

// Subscribe adds a consumer of topic to group and starts delivering at
// once; a Concurrent consumer also consumes the group's retry topic.
func (e *Engine) Subscribe(topic, groupName string, h Handler, cfg Config) (*Consumer, error) {
	if topicdb.IsSystemTopic(topic) {
		if err := e.topics.EnsureSystem(context.Background(), topic); err != nil {
			return nil, err
		}
	}
	offsetName := groupName
	if cfg.Instance != "" {
		offsetName = groupName + "@" + cfg.Instance
	}
	rt := topicdb.RetryPrefix + groupName
	if cfg.Concurrent { // before anything is delivered: a failure leaves nothing behind
		if err := e.topics.EnsureSystem(context.Background(), rt); err != nil {
			return nil, err
		}
	}
	c, err := e.subscribe(topic, groupName, offsetName, h, cfg, nil)
	if err != nil || !cfg.Concurrent {
		return c, err
	}
	rcfg := cfg
	rcfg.Filter, rcfg.Start, rcfg.Instance = nil, StartFirst, ""
	rc, err := e.subscribe(rt, groupName, offsetName+"%"+topic, h, rcfg, c)
	if err != nil {
		if c.Closed() { // a handler closed the node meanwhile: c is what was asked for
			return c, nil
		}
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

// subscribe registers a consumer in the group of topic and offsetName, and
// rebalances the group.
func (e *Engine) subscribe(topic, groupName, offsetName string, h Handler, cfg Config, parent *Consumer) (*Consumer, error) {
	if _, err := e.topics.Partitions(topic); err != nil {
		return nil, err
	}
	c := &Consumer{e: e, id: e.ids.Add(1), topic: topic, groupName: groupName, handler: h, cfg: cfg, parent: parent,
		workers: map[int]*worker{}, live: map[*worker]struct{}{}}
	c.commits, c.endCommits = context.WithCancel(context.Background())
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, ErrClosed
	}
	k := groupKey{topic, offsetName}
	g := e.groups[k]
	if g == nil {
		g = &group{e: e, topic: topic, name: offsetName, owners: map[int]*worker{}}
		e.groups[k] = g
	}
	c.group = g
	g.mu.Lock()
	g.consumers = append(g.consumers, c)
	g.mu.Unlock()
	e.mu.Unlock()
	g.rebalance()
	return c, nil
}

// ID is the consumer's name for the engine's Coordinator: unique among the
// engine's consumers, never reused.
func (c *Consumer) ID() uint64 { return c.id }

// OffsetName is the name the consumer's offsets are stored under.
func (c *Consumer) OffsetName() string { return c.group.name }

// Assigned returns the partitions assigned to this consumer, in order.
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

// Closed reports whether Close was called.
func (c *Consumer) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close stops delivery, waits for the consumer's goroutines and the
// handlers in progress, which commit the offsets they reached, and hands
// the consumer's partitions to the other consumers of its group. Called
// from a handler of any consumer, it does not wait for that handler, nor
// for one that is itself inside a call that waits, as reentry.go explains.
func (c *Consumer) Close() error {
	r := enter(context.Background())
	defer r.leave()
	c.close(r)
	return nil
}

func (c *Consumer) close(r reentry) { await(r, c.stop()) }

// stop ends c's delivery, and its retry consumer's, and returns their
// workers, which end after their last commit.
func (c *Consumer) stop() []*worker {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	rc := c.retry
	c.mu.Unlock()
	if first {
		time.AfterFunc(lastCommits, c.endCommits)
		c.group.leave(c)
	}
	var live []*worker
	if rc != nil {
		live = rc.stop()
	}
	c.mu.Lock()
	for w := range c.live {
		live = append(live, w)
	}
	c.mu.Unlock()
	return live
}

// await waits until each of live ended.
func await(r reentry, live []*worker) {
	for _, w := range live {
		r.await(context.Background(), w, w.done)
	}
}

// Coordinator decides which consumer owns which partition of a group. The
// default, Local, divides the partitions among the group's consumers on
// this node. One for a cluster divides them among the consumers of every
// node, and calls Engine.Rebalance when a node's share changes; the claims
// of store.OpClaim keep two owners on different nodes from both committing
// while the nodes learn of a change.
type Coordinator interface {
	// Share returns, for each of members, the partitions of the topic's
	// partitions it owns. members are the IDs of the group's consumers on
	// this node, in join order. It is called with the group's rebalance lock
	// held: it must not block or call the Engine.
	Share(topic, group string, members []uint64, partitions int) [][]int
}

// Stopper is implemented by a Coordinator that must know when this node
// has stopped delivering a partition of a group: a cluster coordinator
// gives a partition to a consumer on another node only then, or once this
// node is gone, so no partition is delivered on two nodes at once.
type Stopper interface {
	// Stopped reports that part of group is no longer delivered here: its
	// worker ended, after its last commit, and no other consumer of the
	// group on this node took it. It is called without the engine's locks
	// and must not block.
	Stopped(topic, group string, part int)
}

// Local is the coordinator of a standalone node: partition i goes to the
// consumer at index i mod members.
type Local struct{}

// Share implements Coordinator.
func (Local) Share(_, _ string, members []uint64, partitions int) [][]int {
	out := make([][]int, len(members))
	for i := 0; len(members) > 0 && i < partitions; i++ {
		out[i%len(members)] = append(out[i%len(members)], i)
	}
	return out
}

// group is the set of consumers of one topic and offset name on this node.
// Its partitions are assigned by the engine's Coordinator.
type group struct {
	e     *Engine
	topic string
	name  string // offset name: the group, or group@instance when broadcasting

	// rebalanceMu serializes rebalances and guards owners. It is taken
	// before mu and is never held while waiting for a worker or a handler:
	// workers chain instead, through worker.prev.
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

// leave removes c from the group, stops its workers without waiting for
// them, and hands its partitions to the others.
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
	c.revoke(nil)
	g.rebalanceLocked()
	g.rebalanceMu.Unlock()
	g.e.forget(g)
}

// Rebalance reassigns the partitions of every group of topic on this node,
// after AlterMQ grew it.
func (e *Engine) Rebalance(topic string) {
	e.mu.Lock()
	var gs []*group
	for k, g := range e.groups {
		if k.topic == topic {
			gs = append(gs, g)
		}
	}
	e.mu.Unlock()
	for _, g := range gs {
		g.rebalance()
	}
}

func (g *group) rebalance() {
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	g.rebalanceLocked()
}

// rebalanceLocked assigns the partitions. A partition that moves is stopped
// at its old owner and started at the new one once the old one has ended,
// so no partition ever has two owners delivering at once, and nothing here
// waits for a handler. The caller holds rebalanceMu.
func (g *group) rebalanceLocked() {
	parts, err := g.e.topics.Partitions(g.topic)
	if err != nil {
		return // node closing or topic gone: nothing to assign
	}
	cons := g.members()
	want := make(map[*Consumer]map[int]bool, len(cons))
	ids := make([]uint64, len(cons))
	for i, c := range cons {
		ids[i] = c.id
	}
	shares := g.e.coord.Share(g.topic, g.name, ids, len(parts))
	for i, c := range cons {
		want[c] = map[int]bool{}
		if i < len(shares) {
			for _, p := range shares[i] {
				if p >= 0 && p < len(parts) {
					want[c][p] = true
				}
			}
		}
	}
	for _, c := range cons {
		c.revoke(want[c])
	}
	if g.e.ctx.Err() != nil {
		return
	}
	for _, c := range cons {
		c.assign(want[c], parts)
	}
}

// hint tells the worker of partition part, if it runs here, that the
// group's offset there was reset.
func (g *group) hint(part int, gen uint64) {
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	for w := g.owners[part]; w != nil; w = w.prev.Load() {
		w.hint(gen)
	}
}

// forget drops g from the engine once it has no consumers and no workers,
// so that groups used once, such as broadcast instances or names given to
// a reset, do not stay in memory.
func (e *Engine) forget(g *group) {
	e.mu.Lock()
	defer e.mu.Unlock()
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	if len(g.owners) == 0 && len(g.members()) == 0 && e.groups[groupKey{g.topic, g.name}] == g {
		delete(e.groups, groupKey{g.topic, g.name})
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

// lose stops w, whose partition another owner claimed, and drops it from
// the consumer's assignment.
func (c *Consumer) lose(w *worker) {
	g := c.group
	g.rebalanceMu.Lock()
	defer g.rebalanceMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.workers[w.part] == w {
		delete(c.workers, w.part)
	}
	w.cancel()
}

// assign starts workers for the partitions in want that c does not run
// yet, each after the partition's current worker in the group, if any,
// has ended. The caller holds group.rebalanceMu.
func (c *Consumer) assign(want map[int]bool, parts []Partition) {
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
		w := newWorker(c, p, parts[p])
		w.prev.Store(g.owners[p])
		g.owners[p] = w
		var ctx context.Context
		ctx, w.cancel = context.WithCancel(context.WithValue(c.e.ctx, workerKey{}, w))
		c.workers[p] = w
		c.live[w] = struct{}{}
		c.e.spawn(func() { w.run(ctx) })
	}
}

// CheckOffsetName accepts a group name or group@instance.
func CheckOffsetName(name string) error {
	g, inst, found := strings.Cut(name, "@")
	if err := topicdb.CheckName(g); err != nil {
		return err
	}
	if found {
		if err := topicdb.CheckName(inst); err != nil {
			return fmt.Errorf("%w (instance of %q)", err, name)
		}
	}
	return nil
}
