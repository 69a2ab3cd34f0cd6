// Package replica holds the partitions a node reaches through replication,
// as the node's topic table holds them: Raft3, a raft group of three
// replicas (raftqueue.Group), and DoubleWrite, a leader and a follower that
// the metadata places (raftqueue.Pair). Both are a Partition: every command
// and every read goes to the leader, through this node's replica when it
// leads, or by RPC to the node that does (internal/remote), whose replica
// answers only while it leads. What differs is a kind: where the leader
// comes from, raft's election or the metadata's record, and what the
// replica is.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

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

// DefaultCallTimeout bounds the reads that take no ctx, such as Get and
// Stats.
const DefaultCallTimeout = 10 * time.Second

// ErrNoLeader is returned when a call found no leader before its ctx
// ended: no quorum of a Raft3 group's replicas reachable, or a DoubleWrite
// leader that does not answer.
var ErrNoLeader = errors.New("replica: no leader")

// Config is what every replicated partition of a node is given.
type Config struct {
	Topic string
	Index int
	// First is the first partition of the chunk this one shares a replica
	// with (metastate.Partition.Chunk): the partition is number
	// Index-First of its raft group's or pair's.
	First int
	Self  string // this node's id
	// Peer returns the RPC client of a node.
	Peer func(node string) (*remote.Client, error)
	// Now stamps the commands this node's replica proposes as the leader;
	// nil means time.Now.
	Now func() time.Time
	// CallTimeout bounds the reads that take no ctx; zero means
	// DefaultCallTimeout.
	CallTimeout time.Duration
	// Logger receives the replica's damage; nil is silent.
	Logger *slog.Logger
}

// Partition is a replicated partition as a node holds it: commands and
// reads go to its leader, and wait while there is none, until their ctx
// ends. Safe for concurrent use.
type Partition struct {
	partition.Reads
	cfg    Config
	kind   kind
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	closing atomic.Bool // the node is closing: no waiting for a leader

	mu      sync.Mutex
	remotes map[string]*remote.Partition // guarded by mu: by node, made when first used
	closed  bool                         // guarded by mu
}

var _ partition.Partition = (*Partition)(nil)

// kind is what differs between the replicated types: where the leader
// comes from and what this node's replica is.
type kind interface {
	// next returns where a call goes now.
	next() route
	// sent learns from the outcome of a call to node: err is nil when the
	// node answered as the leader.
	sent(node string, err error)
	// candidates is how many routes a call tries before it waits.
	candidates() int
	// checkDamage maps the error of a call run on this node's replica.
	checkDamage(err error) error
	// replica returns this node's replica, leading or not; nil without one.
	replica() leaderReplica
	// leading returns this node's replica while it leads and may serve,
	// nil otherwise, and a channel closed when that may change, nil when
	// nothing signals it.
	leading() (leaderReplica, <-chan struct{})
	// notLeading runs where WhileLeading finds the replica not leading.
	notLeading()
	// release drops the partition's hold of its replica, at Close.
	release() error
}

// route is where a call goes: this node's replica while it leads, or the
// node to ask.
type route struct {
	local leaderReplica // this node's replica, leading; nil otherwise
	// refuse is, with local, the error appends and prepares get instead
	// of running; nil when they run.
	refuse error
	node   string // without local: the node to ask, "" while none is known
	// fail is, without local and node, the error every call gets at once:
	// the leader is this node, whose replica cannot serve.
	fail error
	// changed is closed when the route may change; nil when nothing
	// signals it.
	changed <-chan struct{}
}

// leaderReplica is this node's replica as the partition's calls use it: a
// raftqueue.Group or a raftqueue.Pair.
type leaderReplica interface {
	Proposer
	// Partition is the replica's partition part, leading or not.
	Partition(part int) (*store.Partition, error)
	// LeaderPartition is the replica's partition part while it leads, once
	// it has applied what its predecessors committed.
	LeaderPartition(ctx context.Context, part int) (*store.Partition, error)
	// LeaderSince is when the replica last took the lead, by this
	// process's monotonic clock; the zero time while it does not lead.
	LeaderSince() time.Time
}

func newPartition(cfg Config, k kind) *Partition {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Partition{cfg: cfg, kind: k, remotes: map[string]*remote.Partition{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.Reads = partition.Reads{At: p.read, Ctx: p.ctx, Timeout: cfg.CallTimeout}
	return p
}

// Name is the partition's "topic/index".
func (p *Partition) Name() string { return p.cfg.Topic + "/" + strconv.Itoa(p.cfg.Index) }

// part is the partition's number in its replica.
func (p *Partition) part() int { return p.cfg.Index - p.cfg.First }

// route runs a call at the leader: local with this node's replica when it
// leads, else far with the leader's node. A replica that does not lead,
// here or there, returns raftqueue.ErrNotLeader, which sends the call on to
// the next route, as a node not reached does. Once each candidate was
// tried, route waits a little, or until the route changes, and tries
// again. It returns ErrNoLeader wrapping ctx's error when ctx ends, and
// store.ErrClosed at the partition's Close, or once the node is closing
// and each candidate was tried once. A call that is not idempotent and
// reached a node whose connection then broke may have run:
// raftqueue.ErrUnknownOutcome. A call whose outcome this node's replica
// cannot tell (raftqueue.ErrUnknownOutcome) ends the loop as it is.
func (p *Partition) route(ctx context.Context, idempotent bool, local func(r leaderReplica, refuse error) error, far func(rp *remote.Partition) error) error {
	backoff := 5 * time.Millisecond
	for tries := 1; ; tries++ {
		rt := p.kind.next()
		var err error
		switch {
		case rt.local != nil:
			err = p.kind.checkDamage(local(rt.local, rt.refuse))
		case rt.fail != nil:
			return rt.fail
		case rt.node != "":
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrNoLeader, p.Name(), err) // nothing forwarded
			}
			rp, rerr := p.remote(rt.node)
			if rerr != nil {
				return rerr
			}
			err = far(rp)
			p.kind.sent(rt.node, err)
		default:
			err = raftqueue.ErrNotLeader
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, raftqueue.ErrUnknownOutcome):
			// Proposed, and it may have been applied: never proposed again,
			// even beside ErrClosed (raft shut down under the entry).
			return err
		case errors.Is(err, raftqueue.ErrNotLeader), errors.Is(err, remote.ErrNotSent),
			errors.Is(err, store.ErrClosed) && !p.isClosed():
			// Not the leader, not reached, or its replica closing: nothing
			// ran there.
		case errors.Is(err, remote.ErrUnavailable) && !idempotent:
			return fmt.Errorf("%w: %w", raftqueue.ErrUnknownOutcome, err) // sent, and the connection broke
		case rt.node != "" && !idempotent && ctx.Err() != nil && errors.Is(err, ctx.Err()):
			// The caller gave up while the leader's node may have run it.
			return fmt.Errorf("%w: %w", raftqueue.ErrUnknownOutcome, err)
		case errors.Is(err, remote.ErrUnavailable):
			// A read: asked again.
		default:
			return err
		}
		if tries%p.kind.candidates() != 0 {
			continue
		}
		if p.closing.Load() {
			// store.ErrClosed, not ErrNoLeader: the caller's node closes
			// under the call (mq.ErrClosed), and a consumer's last commit
			// is given up quietly, as it is once the partition closed.
			return fmt.Errorf("%w: %s: no leader, and the node is closing", store.ErrClosed, p.Name())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: %w", ErrNoLeader, p.Name(), ctx.Err())
		case <-p.ctx.Done():
			return fmt.Errorf("%w: %s", store.ErrClosed, p.Name())
		case <-rt.changed:
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

func (p *Partition) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// remote returns the RPC partition of node.
func (p *Partition) remote(node string) (*remote.Partition, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("%w: %s", store.ErrClosed, p.Name())
	}
	if rp, ok := p.remotes[node]; ok {
		return rp, nil
	}
	c, err := p.cfg.Peer(node)
	if err != nil {
		return nil, err
	}
	rp := remote.NewPartition(c, p.cfg.Topic, p.cfg.Index, remote.PartitionConfig{CallTimeout: p.cfg.CallTimeout})
	p.remotes[node] = rp
	return rp, nil
}

// Apply runs cmd at the leader. This node's replica stamps a zero Now when
// it leads; a leader elsewhere stamps it there.
func (p *Partition) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	var res store.Result
	err := p.route(ctx, false, func(r leaderReplica, refuse error) (err error) {
		res, err = p.applyAt(ctx, r, refuse, cmd)
		return err
	}, func(rp *remote.Partition) (err error) {
		res, err = rp.Apply(ctx, cmd)
		return err
	})
	return res, err
}

// applyAt applies cmd through r, this node's replica leading, unless it
// is a send and the route refuses sends.
func (p *Partition) applyAt(ctx context.Context, r leaderReplica, refuse error, cmd *store.Command) (store.Result, error) {
	if refuse != nil && (cmd.Op == store.OpAppend || cmd.Op == store.OpPrepare) {
		return store.Result{}, refuse
	}
	if err := p.awaitLeases(ctx, r, cmd); err != nil {
		return store.Result{}, err
	}
	partition.Stamp(cmd, p.cfg.Now)
	return r.ApplyTo(ctx, p.part(), cmd)
}

// awaitLeases is partition.AwaitLeases for a claim through r, leading
// since r.LeaderSince.
func (p *Partition) awaitLeases(ctx context.Context, r leaderReplica, cmd *store.Command) error {
	return partition.AwaitLeases(r.LeaderSince(), cmd, func() (*store.Partition, error) { return r.LeaderPartition(ctx, p.part()) })
}

// read runs fn on the leader's partition: this node's replica's when it
// leads, once it applied what its predecessors committed; the leader's by
// RPC otherwise.
func (p *Partition) read(ctx context.Context, fn func(p partition.Partition) error) error {
	return p.route(ctx, true, func(r leaderReplica, _ error) error {
		sp, err := r.LeaderPartition(ctx, p.part())
		if err != nil {
			return err
		}
		return fn(sp)
	}, func(rp *remote.Partition) error { return fn(rp) })
}

// Stats returns the leader's, or this node's replica's while no leader
// answers; zero without a replica here. It waits at most Timeout.
func (p *Partition) Stats() store.Stats {
	var st store.Stats
	_ = p.Bounded(func(ctx context.Context) error {
		st = p.StatsContext(ctx)
		return nil
	})
	return st
}

// StatsContext is Stats ending with ctx.
func (p *Partition) StatsContext(ctx context.Context) store.Stats {
	var st store.Stats
	err := p.At(ctx, func(lp partition.Partition) error {
		st = partition.Stats(ctx, lp)
		return nil
	})
	if r := p.kind.replica(); err != nil && r != nil {
		if sp, perr := r.Partition(p.part()); perr == nil {
			st = sp.Stats()
		}
	}
	return st
}

// Leads reports whether this node's replica leads the partition.
func (p *Partition) Leads() bool {
	r, _ := p.kind.leading()
	return r != nil
}

// Leading is this node's replica as the partition service serves it to
// other nodes: it answers only while it leads, and otherwise returns
// raftqueue.ErrNotLeader, which sends the caller on, so a call is never
// forwarded twice. Nil when this node holds no replica that may serve.
func (p *Partition) Leading() *Leading {
	if p.kind.replica() == nil {
		return nil
	}
	return &Leading{p: p}
}

// Closing tells the partition that its node is closing: a call tries each
// candidate once and no longer waits for a leader, so the node's last
// commits, such as a consumer's final offset, do not hold its Close when
// the other nodes are gone too.
func (p *Partition) Closing() { p.closing.Store(true) }

// Close ends the calls waiting for a leader, closes the RPC partitions and
// releases this node's replica, which the last partition holding it
// closes.
func (p *Partition) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	remotes := p.remotes
	p.remotes = nil
	p.mu.Unlock()
	p.cancel()
	for _, rp := range remotes {
		rp.Close()
	}
	return p.kind.release()
}

// Upkeep is this node's replica as the upkeep sees it while it leads: its
// commands go through the replica, its reads and wake-ups are the
// replica's partition's. Run the upkeep with a ctx that ends when the
// replica stops leading.
type Upkeep struct {
	G    Proposer // the replica: a raftqueue.Group, or a raftqueue.Pair
	Part int      // the partition's number in G
	P    *store.Partition
}

// Proposer is a replica through which the leader proposes commands to its
// partition part.
type Proposer interface {
	ApplyTo(ctx context.Context, part int, cmd *store.Command) (store.Result, error)
}

// Apply proposes cmd to the partition through the replica.
func (u Upkeep) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	return u.G.ApplyTo(ctx, u.Part, cmd)
}
func (u Upkeep) Stats() store.Stats                                { return u.P.Stats() }
func (u Upkeep) Changed() <-chan struct{}                          { return u.P.Changed() }
func (u Upkeep) NextDue() (int64, bool, error)                     { return u.P.NextDue() }
func (u Upkeep) Get(offset uint64) (store.Message, bool, error)    { return u.P.Get(offset) }
func (u Upkeep) GroupStates() (map[string]store.GroupState, error) { return u.P.GroupStates() }

// WhileLeading calls fn each time this node's replica starts leading, with
// the replica's Upkeep and a ctx that ends once it no longer leads or ctx
// ends, and waits for fn. It returns when ctx ends. It wakes at the
// replica's leadership changes, and every second for what they do not
// signal: a replica attached late, or moved here (metastate.MoveReplica),
// damage.
func (p *Partition) WhileLeading(ctx context.Context, fn func(ctx context.Context, u Upkeep)) {
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
		r, changed := p.kind.leading()
		if r == nil {
			p.kind.notLeading()
			wait(changed)
			continue
		}
		sp, err := r.Partition(p.part())
		if err != nil {
			wait(changed)
			continue
		}
		lctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { fn(lctx, Upkeep{G: r, Part: p.part(), P: sp}) })
		for ctx.Err() == nil {
			wait(changed)
			var now leaderReplica
			if now, changed = p.kind.leading(); now != r {
				break
			}
		}
		cancel()
		wg.Wait()
	}
}
