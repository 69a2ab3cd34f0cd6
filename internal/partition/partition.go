// Package partition is the seam between a node's engines, delivery,
// transactions and upkeep, and the partitions they work on. A partition is
// anything that applies store commands in one order and answers reads: the
// local store, Local; an in-memory fake, package fake; a client of a
// partition on another node, internal/remote's; and a Raft3 or DoubleWrite
// partition routed to its leader, internal/replica's. Each engine declares
// the few methods it needs as its own interface; Partition is their union,
// what a topic table holds.
package partition

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/zeze-go/mq/internal/topicdb"
	"github.com/zeze-go/mq/store"
)

// Partition is one partition as the node holds it.
type Partition interface {
	// Apply runs one store command and returns its result once it is
	// durable. The partition stamps a zero cmd.Now with the proposer's
	// clock, and no longer reads cmd when Apply returns.
	Apply(ctx context.Context, cmd *store.Command) (store.Result, error)
	// Fetch reads up to max messages from from on, maxBytes in all past
	// the first, waiting until one is in the log, ctx ends, with
	// ctx.Err(), or the partition closes, with store.ErrClosed.
	Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error)
	Get(offset uint64) (store.Message, bool, error)
	Stats() store.Stats
	Group(name string) (store.GroupState, bool, error)
	GroupStates() (map[string]store.GroupState, error)
	SeekTime(t int64) (uint64, error)
	NextDue() (int64, bool, error)
	HalfTxs(fn func(store.HalfTx) bool) error
	Decision(txid string) (store.Decision, error)
	Close() error
}

// Reads that may wait: a partition that may have to reach another node
// first (internal/remote's, a router to a leader or to where a moved
// partition is) also implements each read with a ctx, XxxContext, which
// the functions below use when it does; a local partition answers at once.

// Get is p.Get, ending with ctx when p's reads may wait.
func Get(ctx context.Context, p interface {
	Get(offset uint64) (store.Message, bool, error)
}, offset uint64) (store.Message, bool, error) {
	if c, ok := p.(interface {
		GetContext(context.Context, uint64) (store.Message, bool, error)
	}); ok {
		return c.GetContext(ctx, offset)
	}
	return p.Get(offset)
}

// Stats is p.Stats, ending with ctx when p's reads may wait.
func Stats(ctx context.Context, p interface{ Stats() store.Stats }) store.Stats {
	if c, ok := p.(interface {
		StatsContext(context.Context) store.Stats
	}); ok {
		return c.StatsContext(ctx)
	}
	return p.Stats()
}

// Group is p.Group, ending with ctx when p's reads may wait.
func Group(ctx context.Context, p interface {
	Group(name string) (store.GroupState, bool, error)
}, name string) (store.GroupState, bool, error) {
	if c, ok := p.(interface {
		GroupContext(context.Context, string) (store.GroupState, bool, error)
	}); ok {
		return c.GroupContext(ctx, name)
	}
	return p.Group(name)
}

// GroupStates is p.GroupStates, ending with ctx when p's reads may wait.
func GroupStates(ctx context.Context, p interface {
	GroupStates() (map[string]store.GroupState, error)
}) (map[string]store.GroupState, error) {
	if c, ok := p.(interface {
		GroupStatesContext(context.Context) (map[string]store.GroupState, error)
	}); ok {
		return c.GroupStatesContext(ctx)
	}
	return p.GroupStates()
}

// SeekTime is p.SeekTime, ending with ctx when p's reads may wait.
func SeekTime(ctx context.Context, p interface{ SeekTime(int64) (uint64, error) }, t int64) (uint64, error) {
	if c, ok := p.(interface {
		SeekTimeContext(context.Context, int64) (uint64, error)
	}); ok {
		return c.SeekTimeContext(ctx, t)
	}
	return p.SeekTime(t)
}

// NextDue is p.NextDue, ending with ctx when p's reads may wait.
func NextDue(ctx context.Context, p interface{ NextDue() (int64, bool, error) }) (int64, bool, error) {
	if c, ok := p.(interface {
		NextDueContext(context.Context) (int64, bool, error)
	}); ok {
		return c.NextDueContext(ctx)
	}
	return p.NextDue()
}

// HalfTxs is p.HalfTxs, ending with ctx when p's reads may wait.
func HalfTxs(ctx context.Context, p interface {
	HalfTxs(fn func(store.HalfTx) bool) error
}, fn func(store.HalfTx) bool) error {
	if c, ok := p.(interface {
		HalfTxsContext(context.Context, func(store.HalfTx) bool) error
	}); ok {
		return c.HalfTxsContext(ctx, fn)
	}
	return p.HalfTxs(fn)
}

// Decision is p.Decision, ending with ctx when p's reads may wait.
func Decision(ctx context.Context, p interface {
	Decision(txid string) (store.Decision, error)
}, txid string) (store.Decision, error) {
	if c, ok := p.(interface {
		DecisionContext(context.Context, string) (store.Decision, error)
	}); ok {
		return c.DecisionContext(ctx, txid)
	}
	return p.Decision(txid)
}

// Local is a partition stored on this node. It is the partition's only
// proposer: Apply stamps a command that carries no time with the node's
// clock, so producers and consumers never choose it. Only the engines that
// run where the proposer is, such as the upkeep, stamp their own commands,
// with the time they decided at.
type Local struct {
	*store.Partition
	now func() time.Time
}

var _ Partition = (*Local)(nil)

// NewLocal serves p, stamping commands with now.
func NewLocal(p *store.Partition, now func() time.Time) *Local {
	return &Local{Partition: p, now: now}
}

// Apply stamps cmd.Now, unless set, and applies cmd.
func (l *Local) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	Stamp(cmd, l.now)
	return l.Partition.Apply(ctx, cmd)
}

// LocalConfig is what a node opens its Single partitions with (OpenLocal).
type LocalConfig struct {
	Dir string // the node's directory: partition files in Dir/topics
	// WAL is the node's write-ahead log; a partition logs to its stream
	// "topic/i".
	WAL              *store.WAL
	MaterializeAfter time.Duration // store.Options.MaterializeAfter
	Now              func() time.Time
}

// OpenLocal opens partition i of topic in the node's directory, creating
// its file if needed.
func OpenLocal(cfg LocalConfig, topic string, i int) (*Local, error) {
	path := topicdb.PartitionPath(cfg.Dir, topic, i)
	if err := store.MkdirAll(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("%s/%d: %w", topic, i, err)
	}
	p, err := store.Open(path, store.Options{WAL: cfg.WAL, Stream: topic + "/" + strconv.Itoa(i), MaterializeAfter: cfg.MaterializeAfter})
	if err != nil {
		return nil, fmt.Errorf("%s/%d: %w", topic, i, err)
	}
	return NewLocal(p, cfg.Now), nil
}

// AwaitLeases refuses, with store.ErrClaimed, a claim (cmd) that would
// take a group's partition from another owner while its proposer has
// served it for less than the claim's lease: since then, by this
// process's monotonic clock; the zero time for a proposer that always
// did. A lease is stamped by its proposer's clock, and the one before may
// run ahead of or behind this one's by up to the session timeout: a claim
// compared with a lease renewed there could find it lapsed while its owner
// still delivers. One lease after since, every lease renewed under the
// proposer before has lapsed in real time too, and every later renewal
// was stamped by this one's clock. The owner's own claims and renewals
// pass. at returns the partition, read only when a claim is in question.
func AwaitLeases(since time.Time, cmd *store.Command, at func() (*store.Partition, error)) error {
	if cmd.Op != store.OpClaim || cmd.MaxAge <= 0 || since.IsZero() || time.Since(since) >= time.Duration(cmd.MaxAge) {
		return nil
	}
	sp, err := at()
	if err != nil {
		return err
	}
	g, found, err := sp.Group(cmd.Group)
	if err != nil || !found {
		return err
	}
	if g.Held() && g.Generation != cmd.Generation {
		return fmt.Errorf("%w: group %s at generation %d: this partition's proposer took it %v ago, less than a lease (%v)",
			store.ErrClaimed, cmd.Group, g.Generation, time.Since(since).Round(time.Millisecond), time.Duration(cmd.MaxAge))
	}
	return nil
}

// Stamp sets a zero cmd.Now to now: the time of the partition's proposer
// (a Single partition's node, a replicated partition's leader), which
// every replica then applies alike.
func Stamp(cmd *store.Command, now func() time.Time) {
	if cmd.Now == 0 {
		cmd.Now = now().UnixNano()
	}
}

// Topic is a topic as the node serves it. It is never modified once in a
// Table: a change makes a new Topic.
type Topic struct {
	Name    string
	Type    uint8     // the replication type, the root's Type
	Created time.Time // zero when unknown
	Parts   []Partition
}

// Table is the node's topic table: an immutable map swapped whole, so
// readers, every send among them, take no lock. Changes are made by one
// writer at a time, as the caller serializes them.
type Table struct {
	p atomic.Pointer[map[string]*Topic]
}

// NewTable returns a table holding topics.
func NewTable(topics map[string]*Topic) *Table {
	t := &Table{}
	t.p.Store(&topics)
	return t
}

// Get returns the named topic.
func (t *Table) Get(name string) (*Topic, bool) {
	tp, ok := (*t.p.Load())[name]
	return tp, ok
}

// All returns the current table; the caller must not modify it.
func (t *Table) All() map[string]*Topic { return *t.p.Load() }

// Put publishes a table where name is topic, the others unchanged.
func (t *Table) Put(topic *Topic) {
	old := *t.p.Load()
	next := make(map[string]*Topic, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[topic.Name] = topic
	t.p.Store(&next)
}

// ForKey is the partition of n that key routes to: 32-bit FNV-1a of the key,
// inlined to allocate nothing per send. Producers, re-driven dead letters and
// retry copies all route with it.
func ForKey(key string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// NewID returns a new message ID: a UUIDv7, ordered by time.
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil { // the system's random source failed; v4 uses the same one
		id = uuid.New()
	}
	return id.String()
}

// The range of int64 Unix nanoseconds: 1677-09-21 to 2262-04-11.
var (
	MinTime = time.Unix(0, math.MinInt64)
	MaxTime = time.Unix(0, math.MaxInt64)
)

// UnixNano is t in Unix nanoseconds, or the nearest end of the int64 range
// for a time outside it.
func UnixNano(t time.Time) int64 {
	switch {
	case t.Before(MinTime):
		return math.MinInt64
	case t.After(MaxTime):
		return math.MaxInt64
	}
	return t.UnixNano()
}
