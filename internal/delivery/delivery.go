// Package delivery is the node's consumer engine: it divides a group's
// partitions among the group's consumers on the node, runs one worker per
// owned partition that fetches messages and hands them to the handler in
// offset order, or in order per key with key-parallel lanes, retries failing
// messages on a ladder, parks them in the group's retry topic or moves them
// to its dead-letter topic, and commits the group's offset.
//
// # Ownership and offsets
//
// A worker owns its partition for its group by claiming it with
// store.OpClaim: the claim gives the worker a generation, and every offset
// commit carries it. The partition refuses a commit of any other generation
// with store.ErrStaleGeneration, so an owner that was replaced — by a newer
// claim, or by a reset, store.OpResetOffset, which takes a new generation
// too — can never move the offset again. A worker whose commit is refused
// while it still owns the partition claims it again and goes on from the
// offset the partition holds: that is how a reset reaches a running
// consumer. Reset tells this node's workers at once, as a hint; the store
// alone decides.
//
// On this node, a partition moving between consumers of a group starts at
// its new worker only once the old one has ended, as group.owners chains
// them, so a partition is never delivered by two workers at once.
//
// # Goroutines
//
// Every worker and lane goroutine is started by Engine.spawn,
// counted in its WaitGroup and stopped by its consumer's Close or the
// Engine's Close, which waits for them all. Handlers run on worker and lane
// goroutines, never under a lock of this package.
//
// # Locks
//
// Engine.mu → group.rebalanceMu → group.mu → Consumer.mu → heldMu. No lock
// is held while waiting for a worker or a handler, nor while calling one.
package delivery

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/store"
)

// Errors the root maps to its own.
var (
	ErrClosed           = errors.New("delivery: closed")
	ErrInvalidPartition = errors.New("delivery: invalid partition")
	ErrInvalidOffset    = errors.New("delivery: invalid offset")
	ErrGroupInUse       = errors.New("delivery: group in use")
)

// Partition is what delivery needs of a partition.
type Partition interface {
	Apply(ctx context.Context, cmd *store.Command) (store.Result, error)
	// Fetch waits until a message at or after from is in the log, or ctx
	// ends, and returns up to max of them, maxBytes in all past the first.
	Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error)
	Stats() store.Stats
	SeekTime(t int64) (uint64, error)
	Group(name string) (store.GroupState, bool, error)
}

// Topics is the node's topic table as delivery sees it.
type Topics interface {
	// Partitions returns topic's partitions, or an error for a topic that
	// does not exist or a node that closed.
	Partitions(topic string) ([]Partition, error)
	// EnsureSystem creates the retry or dead-letter topic name unless it
	// exists, waiting at most until ctx ends.
	EnsureSystem(ctx context.Context, name string) error
}

// Clock is the node's source of time.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// Delivery is one message handed to a handler. Msg is the handler's own
// copy: changing it, its Properties included, changes nothing stored.
type Delivery struct {
	Topic          string // for a retried message, the topic it was first delivered from
	Partition      int
	Offset         uint64
	Msg            *store.Message
	ReconsumeTimes int // the failed deliveries of this message to this group so far
}

// Handler handles one delivery. Returning nil commits it; an error is a
// failure, and so is a panic, which the worker recovers.
type Handler func(ctx context.Context, d *Delivery) error

// Start is where a group without an offset starts.
type Start int

const (
	StartFirst Start = iota // the oldest stored message
	StartLast               // after the newest message
	StartTime               // the first message stored at or after Config.StartTime
)

// Config is one consumer's options.
type Config struct {
	Start        Start
	StartTime    int64           // unix ns, for StartTime
	Ladder       []time.Duration // retry backoff; step i is the wait before retry i+1
	MaxReconsume int             // failed deliveries retried before dead-lettering
	Concurrent   bool            // park failing messages in the retry topic and go on
	KeyParallel  int             // 0: one message of a partition at a time
	Instance     string          // broadcasting: this consumer's offset name suffix
	Filter       *Filter         // nil: every message
	Batch        int             // messages held per partition at a time
	BatchBytes   int             // bytes held per partition at a time
	Refresh      time.Duration   // store the offset again after this long idle; 0: never
}

// retryDelay is the wait before retry r+1.
func (c *Config) retryDelay(r int) time.Duration {
	return c.Ladder[min(r, len(c.Ladder)-1)]
}

// Engine is the node's delivery: its groups and their workers.
type Engine struct {
	topics Topics
	clock  Clock
	log    *slog.Logger
	coord  Coordinator
	lease  time.Duration // the coordinator's, if it is a Leaser, or 0
	ids    atomic.Uint64 // the last Consumer.ID given

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // every worker and lane goroutine

	mu     sync.Mutex // guards closed, groups
	closed bool
	groups map[groupKey]*group
}

type groupKey struct{ topic, name string }

// New returns the delivery engine of a node; coord nil is Local.
func New(topics Topics, clock Clock, log *slog.Logger, coord Coordinator) *Engine {
	if coord == nil {
		coord = Local{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Engine{topics: topics, clock: clock, log: log, coord: coord, lease: leaseOf(coord), ctx: ctx, cancel: cancel, groups: map[groupKey]*group{}}
}

// spawn runs fn on a goroutine owned by the engine: Close waits for it.
func (e *Engine) spawn(fn func()) { e.wg.Go(fn) }

// Close closes every consumer, waits for its goroutines and their
// handlers, and refuses new consumers. Called from a handler, it does not
// wait for that handler, as Consumer.Close explains. It is idempotent.
func (e *Engine) Close() {
	r := enter(context.Background())
	defer r.leave()
	e.mu.Lock()
	e.closed = true
	var consumers []*Consumer
	for _, g := range e.groups {
		consumers = append(consumers, g.members()...)
	}
	e.mu.Unlock()
	// Every consumer stopped before any is waited for: their last
	// commits, each bounded, run at once.
	var live []*worker
	for _, c := range consumers {
		live = append(live, c.stop()...)
	}
	await(r, live)
	e.cancel()
	if len(r.in) == 0 {
		e.wg.Wait()
	}
}
