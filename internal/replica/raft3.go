// Package replica holds the partitions a node reaches through replication:
// Raft3, a raft group of three replicas (raftqueue), as the node's topic
// table holds it. Every command and every read goes to the group's leader:
// through this node's replica when it leads, or by RPC to the node that
// does (internal/remote), whose replica answers only while it leads.
package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// Codes of raftqueue's errors on the wire (remote.RegisterError).
const (
	codeNotLeader      = remote.FirstUserCode + 100
	codeUnknownOutcome = remote.FirstUserCode + 101
)

func init() {
	remote.RegisterError(codeNotLeader, raftqueue.ErrNotLeader)
	remote.RegisterError(codeUnknownOutcome, raftqueue.ErrUnknownOutcome)
}

// DefaultCallTimeout bounds the reads that take no ctx (Get, Stats, ...).
const DefaultCallTimeout = 10 * time.Second

// Raft3Config configures a node's Raft3 partition.
type Raft3Config struct {
	Topic string
	Index int
	// First is the first partition of the raft group this one shares
	// (metastate.Partition.Chunk), and Partitions how many the group
	// carries: the partition is number Index-First of the group's.
	First, Partitions int
	// Self is this node's id; Replicas the ids of the three nodes holding
	// the group's replicas (raft server ids and, over the node's port,
	// their raft addresses).
	Self     string
	Replicas []string
	// Peer returns the RPC client of a node.
	Peer func(node string) (*remote.Client, error)
	// Now stamps the commands this node's replica proposes as the leader.
	Now func() time.Time
	// CallTimeout bounds the reads that take no ctx (DefaultCallTimeout if
	// zero).
	CallTimeout time.Duration
	// Logger receives the replica's damage (nil: silent).
	Logger *slog.Logger
}

// Raft3 is a Raft3 partition as a node holds it: commands and reads go to
// the group's leader, waiting (until their ctx ends) while the group has
// none. Safe for concurrent use.
type Raft3 struct {
	reads
	cfg    Raft3Config
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	closing atomic.Bool           // the node is closing: no waiting for a leader
	group   atomic.Pointer[Group] // this node's replica (Groups.Attach), held until Close

	mu      sync.Mutex
	remotes map[string]*remote.Partition // guarded by mu: by node, made when first used
	next    int                          // guarded by mu: the replica to try when no leader is known
	hint    string                       // guarded by mu: the node that last answered as the leader
	closed  bool                         // guarded by mu
}

var _ partition.Partition = (*Raft3)(nil)

// NewRaft3 returns the partition cfg describes.
func NewRaft3(cfg Raft3Config) *Raft3 {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Raft3{cfg: cfg, remotes: map[string]*remote.Partition{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.reads = reads{at: r.read, ctx: r.ctx, timeout: cfg.CallTimeout}
	return r
}

// Name is the partition's "topic/index".
func (r *Raft3) Name() string { return r.cfg.Topic + "/" + strconv.Itoa(r.cfg.Index) }

// Config returns the partition's configuration: its placement.
func (r *Raft3) Config() Raft3Config { return r.cfg }

// Replica returns this node's replica, nil if it holds none.
func (r *Raft3) Replica() *raftqueue.Group {
	if g := r.group.Load(); g != nil {
		return g.g
	}
	return nil
}

// part is the partition's number in its group.
func (r *Raft3) part() int { return r.cfg.Index - r.cfg.First }

// attach makes g this node's replica (when Self is in Replicas: opened
// with the partition, or later, once a failed open succeeded), and reports
// whether it did: not if the partition is closed, or has a replica.
func (r *Raft3) attach(g *Group) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.closed && r.group.CompareAndSwap(nil, g)
}

// route runs a call at the group's leader: local with this node's replica
// when it leads, else far with the leader's node. A replica that does not
// lead (raftqueue.ErrNotLeader, here or there), or a node not reached,
// sends it on to the next candidate; with no leader anywhere it waits a
// little and tries again, until ctx ends (ErrNoLeader wrapping ctx's
// error), or the node's closing or the partition's Close does
// (store.ErrClosed: a closing node tries each replica once, without
// waiting). A call that is not idempotent and reached a node whose
// connection then broke may have run: raftqueue.ErrUnknownOutcome.
func (r *Raft3) route(ctx context.Context, idempotent bool, local func(g *raftqueue.Group) error, far func(p *remote.Partition) error) error {
	backoff := 5 * time.Millisecond
	for tries := 0; ; tries++ {
		if g := r.local(); g != nil && g.State() == raft.Leader {
			err := r.checkDamage(local(g))
			if !errors.Is(err, raftqueue.ErrNotLeader) {
				return err
			}
		} else if node := r.candidate(); node != "" {
			p, err := r.remote(node)
			if err != nil {
				return err
			}
			err = far(p)
			switch {
			case err == nil:
				r.answered(node)
				return nil
			case errors.Is(err, raftqueue.ErrNotLeader), errors.Is(err, remote.ErrNotSent),
				errors.Is(err, store.ErrClosed) && !r.isClosed():
				// Not the leader, not reached, or its replica closing:
				// nothing ran there; the next.
				r.missed(node)
			case errors.Is(err, remote.ErrUnavailable) && !idempotent:
				// Sent, and the connection broke: it may have run.
				r.missed(node)
				return fmt.Errorf("%w: %w", raftqueue.ErrUnknownOutcome, err)
			case errors.Is(err, remote.ErrUnavailable):
				r.missed(node) // a read: asked again
			default:
				r.missed(node)
				return err
			}
		}
		if tries%len(r.cfg.Replicas) != len(r.cfg.Replicas)-1 {
			continue // try each replica once before waiting
		}
		if r.closing.Load() {
			// store.ErrClosed, not ErrNoLeader: the caller's node closes
			// under the call (mq.ErrClosed), and a consumer's last commit
			// is given up quietly, as it is once the partition closed.
			return fmt.Errorf("%w: %s/%d: no leader, and the node is closing", store.ErrClosed, r.cfg.Topic, r.cfg.Index)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s/%d: %w", ErrNoLeader, r.cfg.Topic, r.cfg.Index, ctx.Err())
		case <-r.ctx.Done():
			return fmt.Errorf("%w: %s/%d", store.ErrClosed, r.cfg.Topic, r.cfg.Index)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// local returns this node's replica while it serves: nil without one, or
// once it is damaged.
func (r *Raft3) local() *raftqueue.Group {
	g := r.group.Load()
	if g == nil || g.damaged.Load() {
		return nil
	}
	return g.g
}

// checkDamage returns err, a local call's: one that met damage of this
// node's replica (its file corrupt, or failed) marks the replica damaged
// and becomes raftqueue.ErrNotLeader, which sends the call on to the
// intact replicas. A command whose outcome is unknown stays so.
func (r *Raft3) checkDamage(err error) error {
	if err == nil || !errors.Is(err, store.ErrCorrupt) && !errors.Is(err, store.ErrFailed) {
		return err
	}
	if r.group.Load().damaged.CompareAndSwap(false, true) {
		r.cfg.Logger.Error("this node's replica is damaged: it no longer serves, and hands its leadership over; "+
			"the others serve the partitions of its group (restart the node once its files are repaired)", "err", err)
	}
	if errors.Is(err, raftqueue.ErrUnknownOutcome) {
		return err
	}
	return fmt.Errorf("%w: this node's replica is damaged: %w", raftqueue.ErrNotLeader, err)
}

// ErrNoLeader is returned when a call found no leader of the group before
// its ctx ended (no quorum of its replicas reachable).
var ErrNoLeader = errors.New("replica: no leader")

// candidate returns the node to ask: the leader this node's replica knows
// of, the last node that answered as the leader, or the replicas in turn.
func (r *Raft3) candidate() string {
	if g := r.Replica(); g != nil {
		if _, id := g.Leader(); id != "" && string(id) != r.cfg.Self {
			return string(id)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hint != "" {
		return r.hint
	}
	for range r.cfg.Replicas {
		node := r.cfg.Replicas[r.next%len(r.cfg.Replicas)]
		r.next++
		if node != r.cfg.Self {
			return node
		}
	}
	return ""
}

func (r *Raft3) answered(node string) {
	r.mu.Lock()
	r.hint = node
	r.mu.Unlock()
}

func (r *Raft3) missed(node string) {
	r.mu.Lock()
	if r.hint == node {
		r.hint = ""
	}
	r.mu.Unlock()
}

func (r *Raft3) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// remote returns the RPC partition of node.
func (r *Raft3) remote(node string) (*remote.Partition, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("%w: %s/%d", store.ErrClosed, r.cfg.Topic, r.cfg.Index)
	}
	if p, ok := r.remotes[node]; ok {
		return p, nil
	}
	c, err := r.cfg.Peer(node)
	if err != nil {
		return nil, err
	}
	p := remote.NewPartition(c, r.cfg.Topic, r.cfg.Index, remote.PartitionConfig{CallTimeout: r.cfg.CallTimeout})
	r.remotes[node] = p
	return p, nil
}

// Apply runs cmd at the leader. This node's replica stamps a zero Now when
// it leads; a leader elsewhere stamps it there.
func (r *Raft3) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	var res store.Result
	err := r.route(ctx, false, func(g *raftqueue.Group) (err error) {
		res, err = applyLeading(ctx, g, r.part(), cmd, r.cfg.Now)
		return err
	}, func(p *remote.Partition) (err error) {
		res, err = p.Apply(ctx, cmd)
		return err
	})
	return res, err
}

// applyLeading applies cmd to partition part of g, this node's replica,
// stamping a zero Now.
func applyLeading(ctx context.Context, g *raftqueue.Group, part int, cmd *store.Command, now func() time.Time) (store.Result, error) {
	stamp(cmd, now)
	return g.ApplyTo(ctx, part, cmd)
}

// stamp sets a zero Now of cmd, which the leader proposes.
func stamp(cmd *store.Command, now func() time.Time) {
	if cmd.Now == 0 {
		cmd.Now = now().UnixNano()
	}
}

func (r *Raft3) leaderPartition(ctx context.Context) (*store.Partition, error) {
	return r.Replica().LeaderPartition(ctx, r.part())
}

func (r *Raft3) leaderApply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	return applyLeading(ctx, r.Replica(), r.part(), cmd, r.cfg.Now)
}

func (r *Raft3) replicaPartition() (*store.Partition, error) { return r.Replica().Partition(r.part()) }

func (r *Raft3) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, r.cfg.CallTimeout)
}

// read runs fn on the leader's partition: this node's replica's when it
// leads (after it applied what its predecessors committed), the leader's
// by RPC otherwise.
func (r *Raft3) read(ctx context.Context, fn func(p partition.Partition) error) error {
	return r.route(ctx, true, func(g *raftqueue.Group) error {
		p, err := g.LeaderPartition(ctx, r.part())
		if err != nil {
			return err
		}
		return fn(p)
	}, func(p *remote.Partition) error { return fn(p) })
}

// Stats returns the leader's, or this node's replica's while no leader
// answers (zero without a replica here).
func (r *Raft3) Stats() store.Stats {
	var st store.Stats
	err := r.call(func(p partition.Partition) error {
		st = p.Stats()
		return nil
	})
	if g := r.Replica(); err != nil && g != nil {
		if p, perr := g.Partition(r.part()); perr == nil {
			st = p.Stats()
		}
	}
	return st
}

// Closing tells the partition that its node is closing: a call tries each
// replica once and no longer waits for a leader to be elected, so the
// node's last commits (a consumer's final offset) do not hold its Close
// when the other nodes are gone too.
func (r *Raft3) Closing() { r.closing.Store(true) }

// HandOff hands this node's replica's leadership, if it leads, to another
// replica, so that the group does not wait out an election when the node
// closes. Call it while the node's port still runs; it is best effort (the
// group elects a leader anyway).
func (r *Raft3) HandOff() {
	if g := r.Replica(); g != nil && g.State() == raft.Leader {
		_ = g.Raft().LeadershipTransfer().Error()
	}
}

// Close ends the calls waiting for a leader, closes the RPC partitions and
// this node's replica.
func (r *Raft3) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	remotes := r.remotes
	r.remotes = nil
	r.mu.Unlock()
	r.cancel()
	for _, p := range remotes {
		p.Close()
	}
	if g := r.group.Load(); g != nil {
		return g.release()
	}
	return nil
}

// Leading is this node's replica as the partition service serves it to
// other nodes: it answers only while it leads (raftqueue.ErrNotLeader
// otherwise, which sends the caller on), so a call is never forwarded
// twice. Nil when this node holds no replica.
func (r *Raft3) Leading() *Leading {
	if r.local() == nil {
		return nil
	}
	return &Leading{r: r}
}

var _ io.Closer = (*Raft3)(nil)

// Upkeep is this node's replica as the upkeep sees it while it leads: its
// commands go through the group, its reads and wake-ups are the replica's.
// Run the upkeep with a ctx that ends when the replica stops leading.
type Upkeep struct {
	G    Proposer // the replica: a raftqueue.Group, or a raftqueue.Pair
	Part int      // the partition's number in G
	P    *store.Partition
}

// Proposer is a replica through which the leader proposes commands to
// its group's partition part.
type Proposer interface {
	ApplyTo(ctx context.Context, part int, cmd *store.Command) (store.Result, error)
}

func (u Upkeep) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	return u.G.ApplyTo(ctx, u.Part, cmd)
}
func (u Upkeep) Stats() store.Stats                                { return u.P.Stats() }
func (u Upkeep) Changed() <-chan struct{}                          { return u.P.Changed() }
func (u Upkeep) NextDue() (int64, bool, error)                     { return u.P.NextDue() }
func (u Upkeep) Get(offset uint64) (store.Message, bool, error)    { return u.P.Get(offset) }
func (u Upkeep) GroupStates() (map[string]store.GroupState, error) { return u.P.GroupStates() }

// WhileLeading calls fn each time this node's replica starts leading, with
// the replica's Upkeep and a ctx that ends once it no longer leads (or ctx
// ends), and waits for fn. It returns when ctx ends; at once without a
// replica here. It wakes at the replica's leadership changes
// (raftqueue.Group.LeaderChanged), and every second for what they do not
// signal (a replica attached late, damage).
func (r *Raft3) WhileLeading(ctx context.Context, fn func(ctx context.Context, u Upkeep)) {
	if !slices.Contains(r.cfg.Replicas, r.cfg.Self) {
		return
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	wait := func(changed <-chan struct{}) {
		select {
		case <-ctx.Done():
		case <-changed:
		case <-tick.C:
		}
	}
	for ctx.Err() == nil {
		g := r.group.Load() // nil until a replica that failed to open is attached
		if g == nil {
			wait(nil)
			continue
		}
		changed := g.g.LeaderChanged()
		switch {
		case g.g.State() != raft.Leader:
		case g.damaged.Load():
			r.HandOff()
		default:
			p, err := g.g.Partition(r.part())
			if err != nil {
				break
			}
			lctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				fn(lctx, Upkeep{G: g.g, Part: r.part(), P: p})
			}()
			for g.g.State() == raft.Leader && !g.damaged.Load() && ctx.Err() == nil {
				wait(changed)
				changed = g.g.LeaderChanged()
			}
			cancel()
			<-done
			continue
		}
		wait(changed)
	}
}
