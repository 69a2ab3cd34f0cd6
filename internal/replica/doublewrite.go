package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/zeze-go/mq/dwqueue"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// ErrNoInSync is a send refused by a DoubleWrite leader whose follower is
// not in sync while its topic does not allow the risk stage: an ack would
// mean one copy. It lasts until a follower has caught up.
var ErrNoInSync = errors.New("replica: the DoubleWrite partition has no follower in sync")

// PairRecord is a DoubleWrite partition's record in the metadata, as the
// node last saw it (cluster.Partition's fields).
type PairRecord struct {
	Replicas []string // the leader, then the follower (none while no node was free)
	Epoch    uint64
	Version  uint64
	InSync   []string
	Alone    bool // the topic allows the risk stage
	// FollowerUp is whether the follower's node is up (its session alive).
	FollowerUp bool
}

func (r PairRecord) leader() string {
	if len(r.Replicas) == 0 {
		return ""
	}
	return r.Replicas[0]
}

func (r PairRecord) follower() string {
	if len(r.Replicas) < 2 {
		return ""
	}
	return r.Replicas[1]
}

func (r PairRecord) followerInSync() bool {
	f := r.follower()
	return f != "" && slices.Contains(r.InSync, f)
}

// DoubleWriteConfig configures a node's DoubleWrite partition.
type DoubleWriteConfig struct {
	Topic string
	Index int
	Self  string // this node's id
	// Peer returns the RPC client of a node.
	Peer func(node string) (*remote.Client, error)
	// Open opens this node's replica, when the record places one here.
	Open func() (*raftqueue.Pair, error)
	// SetInSync proposes to the metadata group that the replicas inSync
	// hold the partition, compare-and-set on the version of rec.
	SetInSync func(ctx context.Context, rec PairRecord, inSync []string) error
	// RenewEpoch proposes to the metadata group the next epoch for this
	// node's replica to lead (a run of a leader needs an epoch of its own:
	// dwqueue.Log.Lead), compare-and-set on the version of rec.
	RenewEpoch func(ctx context.Context, rec PairRecord) error
	// Now stamps the commands this node's replica proposes as the leader.
	Now func() time.Time
	// CallTimeout bounds the reads that take no ctx (DefaultCallTimeout
	// if zero).
	CallTimeout time.Duration
	// FollowerTimeout is how long the leader waits for a follower that
	// matches none of its new entries before it refuses sends
	// (ErrNoInSync) until the follower answers again, or, in the risk
	// stage, has the metadata record it alone in sync and acks on its own
	// copy (2 s if zero).
	FollowerTimeout time.Duration
	// Logger receives the replica's changes (nil: silent).
	Logger *slog.Logger
}

// DoubleWrite is a DoubleWrite partition as a node holds it: commands and
// reads go to the leader the metadata records, this node's replica when it
// is the one. The replica leads or follows as the record says (Update),
// and, leading, has the metadata record its follower in sync once it
// holds everything (and, in the risk stage, out of sync once it stopped
// answering). Safe for concurrent use.
//
// Goroutines: the in-sync watch (watch), stopped by Close.
type DoubleWrite struct {
	reads
	cfg    DoubleWriteConfig
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	done   chan struct{} // closed when watch returns

	mu      sync.Mutex
	rec     PairRecord                   // guarded by mu
	changed chan struct{}                // guarded by mu: closed at each Update
	pair    *raftqueue.Pair              // guarded by mu: this node's replica, nil if none
	role    pairRole                     // guarded by mu: what pair was told
	syncing bool                         // guarded by mu: the risk stage ended, the follower catching up in sync
	renew   bool                         // guarded by mu: the replica led the record's epoch before: ask for the next
	stalled bool                         // guarded by mu: leading, the follower matched nothing new for FollowerTimeout
	remotes map[string]*remote.Partition // guarded by mu
	closing bool                         // guarded by mu: no waiting for a leader
	closed  bool                         // guarded by mu
}

// pairRole is what this node's replica was last told.
type pairRole struct {
	lead, follow bool
	epoch        uint64
	follower     string // leading: the follower it replicates to
	async        bool   // leading: the risk stage
}

var _ partition.Partition = (*DoubleWrite)(nil)

// NewDoubleWrite returns the partition cfg describes, led and followed as
// rec says.
func NewDoubleWrite(cfg DoubleWriteConfig, rec PairRecord) *DoubleWrite {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.FollowerTimeout <= 0 {
		cfg.FollowerTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &DoubleWrite{cfg: cfg, changed: make(chan struct{}), remotes: map[string]*remote.Partition{}, done: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.reads = reads{at: d.read, ctx: d.ctx, timeout: cfg.CallTimeout}
	d.Update(rec)
	go d.watch()
	return d
}

// Name is the partition's "topic/index".
func (d *DoubleWrite) Name() string { return d.cfg.Topic + "/" + strconv.Itoa(d.cfg.Index) }

// Replica returns this node's replica, nil if it holds none.
func (d *DoubleWrite) Replica() *raftqueue.Pair {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pair
}

// Update makes rec the partition's record: this node's replica (opened if
// the record places one here, closed if it no longer does) leads or follows
// its epoch. A replica that cannot open or take its role is logged and
// tried again at the next Update.
func (d *DoubleWrite) Update(rec PairRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if rec.follower() != d.rec.follower() || rec.followerInSync() {
		d.syncing = false
	}
	d.rec, d.renew = rec, false
	close(d.changed)
	d.changed = make(chan struct{})
	if err := d.takeRole(); err != nil {
		d.cfg.Logger.Error("DoubleWrite replica cannot take its role", "epoch", rec.Epoch, "replicas", rec.Replicas, "err", err)
	}
}

// takeRole gives this node's replica the role d.rec gives it. mu is held.
func (d *DoubleWrite) takeRole() error {
	rec, self := d.rec, d.cfg.Self
	if self != rec.leader() && self != rec.follower() {
		if d.pair != nil {
			err := d.pair.Close()
			d.pair, d.role = nil, pairRole{}
			return err
		}
		return nil
	}
	if d.pair == nil {
		p, err := d.cfg.Open()
		if err != nil {
			return err
		}
		d.pair = p
	}
	if self == rec.follower() {
		if d.role.follow && d.role.epoch == rec.Epoch {
			return nil
		}
		d.role = pairRole{}
		if err := d.pair.Follow(rec.Epoch); err != nil {
			return err
		}
		d.role = pairRole{follow: true, epoch: rec.Epoch}
		return nil
	}
	async := rec.Alone && !rec.followerInSync() && !d.syncing
	if d.role.lead && d.role.epoch == rec.Epoch && d.role.follower == rec.follower() && d.pair.Leading() {
		if async != d.role.async {
			d.pair.SetSync(!async)
			d.role.async = async
		}
		return nil
	}
	var peer dwqueue.Peer
	if f := rec.follower(); f != "" {
		c, err := d.cfg.Peer(f)
		if err != nil {
			return err
		}
		peer = PairPeer{Client: c, Topic: d.cfg.Topic, Index: d.cfg.Index}
	}
	d.role = pairRole{}
	if err := d.pair.Lead(rec.Epoch, peer, async); err != nil {
		if errors.Is(err, dwqueue.ErrEpochLed) {
			d.renew = true // watch asks for the next epoch
			return nil
		}
		return err
	}
	d.role = pairRole{lead: true, epoch: rec.Epoch, follower: rec.follower(), async: async}
	return nil
}

// watch is the in-sync watch: while this node's replica leads, it has the
// metadata record the follower in sync once it holds everything that may
// have been acked (ending the risk stage first: commits wait for the
// follower again once it is close), and, in the risk stage, the leader
// alone once the follower has matched nothing new for FollowerTimeout.
func (d *DoubleWrite) watch() {
	defer close(d.done)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var laggingSince time.Time // since when the follower lags and matched nothing new
	var lastMatched uint64
	asyncFrom := uint64(0) // async: what the follower matched when the leader went async
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-tick.C:
		}
		d.mu.Lock()
		rec, p, role, renew := d.rec, d.pair, d.role, d.renew
		d.mu.Unlock()
		if renew {
			d.propose(rec, func(ctx context.Context) error { return d.cfg.RenewEpoch(ctx, rec) }, "renew the epoch")
			continue
		}
		if p == nil || !role.lead || rec.follower() == "" || !p.Leading() {
			laggingSince = time.Time{}
			d.setStalled(false)
			continue
		}
		matched, lag := p.Matched(), p.Lag()
		switch {
		case lag == 0:
			laggingSince = time.Time{}
		case laggingSince.IsZero() || matched != lastMatched:
			laggingSince = time.Now()
		}
		lastMatched = matched
		stuck := !laggingSince.IsZero() && time.Since(laggingSince) > d.cfg.FollowerTimeout
		d.setStalled(stuck)
		if !role.async {
			asyncFrom = matched
		}
		switch {
		case !rec.followerInSync() && role.async && lag <= 64 && matched > asyncFrom:
			// The follower answers again (it matched something since the
			// leader went async) and is close: commit on both copies
			// again, so that it ends up holding everything.
			d.mu.Lock()
			if d.role == role {
				d.syncing = true
				d.role.async = false
				p.SetSync(true)
			}
			d.mu.Unlock()
		case !rec.followerInSync() && !role.async && p.InSync():
			d.setInSync(rec, []string{d.cfg.Self, rec.follower()})
		case rec.followerInSync() && rec.Alone && stuck:
			d.setInSync(rec, []string{d.cfg.Self})
			laggingSince = time.Time{}
		}
	}
}

// setStalled records whether the follower stalled.
func (d *DoubleWrite) setStalled(stalled bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stalled != stalled {
		d.stalled = stalled
		d.cfg.Logger.Warn("DoubleWrite follower stalled: sends refused until it answers", "stalled", stalled)
	}
}

// setInSync has the metadata record inSync for rec's version.
func (d *DoubleWrite) setInSync(rec PairRecord, inSync []string) {
	d.propose(rec, func(ctx context.Context) error { return d.cfg.SetInSync(ctx, rec, inSync) },
		fmt.Sprintf("record %q in sync", inSync))
}

// propose runs call, a proposal made from rec, and waits for the record to
// change (Update) before the watch acts on it again: at most a second after
// a refusal (the record moved on, or no metadata leader answered).
func (d *DoubleWrite) propose(rec PairRecord, call func(ctx context.Context) error, what string) {
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.CallTimeout)
	defer cancel()
	d.mu.Lock()
	changed := d.changed
	d.mu.Unlock()
	wait := d.cfg.CallTimeout
	if err := call(ctx); err != nil {
		d.cfg.Logger.Warn("DoubleWrite: the metadata did not "+what, "epoch", rec.Epoch, "version", rec.Version, "err", err)
		wait = time.Second
	} else {
		d.cfg.Logger.Info("DoubleWrite: the metadata did "+what, "epoch", rec.Epoch, "version", rec.Version)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-changed:
	case <-t.C:
	case <-d.ctx.Done():
	}
}

// local returns this node's replica when the record makes it the leader
// and it was told so, and whether sends are refused: without the risk
// stage, while no follower is in sync, its node is down, or it has matched
// nothing new for FollowerTimeout (they would wait for it; ErrNoInSync at
// once is clearer).
func (d *DoubleWrite) local() (p *raftqueue.Pair, refuse bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pair == nil || !d.role.lead || d.rec.leader() != d.cfg.Self {
		return nil, false
	}
	if d.rec.Alone {
		// The risk stage: refused only while the follower, recorded in
		// sync, stalled and the leader could not yet be recorded alone
		// (no metadata quorum): they would wait for it.
		return d.pair, d.stalled && d.rec.followerInSync()
	}
	return d.pair, !d.rec.followerInSync() || !d.rec.FollowerUp || d.stalled
}

// route runs a call at the leader the record names: local with this node's
// replica, far with the leader's node. A leader that does not lead yet (its
// node has not seen the record) or no longer does, or a node not reached,
// is tried again after a wait, and at each Update, until ctx ends
// (ErrNoLeader wrapping ctx's error), or the partition closes
// (store.ErrClosed). A call that is not idempotent and reached a node whose
// connection then broke may have run: raftqueue.ErrUnknownOutcome.
func (d *DoubleWrite) route(ctx context.Context, idempotent bool, local func(p *raftqueue.Pair, refuse bool) error, far func(p *remote.Partition) error) error {
	backoff := 5 * time.Millisecond
	for {
		d.mu.Lock()
		leader, changed, closing := d.rec.leader(), d.changed, d.closing
		d.mu.Unlock()
		var err error
		if leader == d.cfg.Self {
			if p, refuse := d.local(); p != nil {
				err = local(p, refuse)
			} else {
				err = raftqueue.ErrNotLeader
			}
		} else if leader != "" {
			var p *remote.Partition
			if p, err = d.remote(leader); err != nil {
				return err
			}
			err = far(p)
		} else {
			err = raftqueue.ErrNotLeader
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, raftqueue.ErrNotLeader), errors.Is(err, remote.ErrNotSent),
			errors.Is(err, store.ErrClosed) && !d.isClosed():
		case errors.Is(err, remote.ErrUnavailable) && !idempotent:
			return fmt.Errorf("%w: %w", raftqueue.ErrUnknownOutcome, err)
		case errors.Is(err, remote.ErrUnavailable):
		default:
			return err
		}
		if closing {
			return fmt.Errorf("%w: %s: no leader, and the node is closing", store.ErrClosed, d.Name())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: %w", ErrNoLeader, d.Name(), ctx.Err())
		case <-d.ctx.Done():
			return fmt.Errorf("%w: %s", store.ErrClosed, d.Name())
		case <-changed:
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

func (d *DoubleWrite) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// remote returns the RPC partition of node.
func (d *DoubleWrite) remote(node string) (*remote.Partition, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("%w: %s", store.ErrClosed, d.Name())
	}
	if p, ok := d.remotes[node]; ok {
		return p, nil
	}
	c, err := d.cfg.Peer(node)
	if err != nil {
		return nil, err
	}
	p := remote.NewPartition(c, d.cfg.Topic, d.cfg.Index, remote.PartitionConfig{CallTimeout: d.cfg.CallTimeout})
	d.remotes[node] = p
	return p, nil
}

// Apply runs cmd at the leader.
func (d *DoubleWrite) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	var res store.Result
	err := d.route(ctx, false, func(p *raftqueue.Pair, refuse bool) (err error) {
		res, err = d.applyAt(ctx, p, refuse, cmd)
		return err
	}, func(p *remote.Partition) (err error) {
		res, err = p.Apply(ctx, cmd)
		return err
	})
	return res, err
}

// applyAt applies cmd through p, this node's replica leading: a send is
// refused while no follower is in sync without the risk stage.
func (d *DoubleWrite) applyAt(ctx context.Context, p *raftqueue.Pair, refuse bool, cmd *store.Command) (store.Result, error) {
	if refuse && (cmd.Op == store.OpAppend || cmd.Op == store.OpPrepare) {
		return store.Result{}, fmt.Errorf("%w: %s", ErrNoInSync, d.Name())
	}
	stamp(cmd, d.cfg.Now)
	return p.Apply(ctx, cmd)
}

// read runs fn on the leader's partition.
func (d *DoubleWrite) read(ctx context.Context, fn func(p partition.Partition) error) error {
	return d.route(ctx, true, func(p *raftqueue.Pair, _ bool) error {
		sp, err := p.LeaderPartition(ctx, 0)
		if err != nil {
			return err
		}
		return fn(sp)
	}, func(p *remote.Partition) error { return fn(p) })
}

// Stats returns the leader's, or this node's replica's while no leader
// answers.
func (d *DoubleWrite) Stats() store.Stats {
	var st store.Stats
	err := d.call(func(p partition.Partition) error {
		st = p.Stats()
		return nil
	})
	if p := d.Replica(); err != nil && p != nil {
		if sp, perr := p.Partition(0); perr == nil {
			st = sp.Stats()
		}
	}
	return st
}

// Leads reports whether this node's replica leads the partition.
func (d *DoubleWrite) Leads() bool {
	p, _ := d.local()
	return p != nil && p.Leading()
}

// Leading is this node's replica as the partition service serves it to
// other nodes: it answers only while it leads. Nil when this node holds
// none.
func (d *DoubleWrite) Leading() *Leading {
	if d.Replica() == nil {
		return nil
	}
	return &Leading{r: d}
}

func (d *DoubleWrite) leaderPartition(ctx context.Context) (*store.Partition, error) {
	p, _ := d.local()
	if p == nil {
		return nil, raftqueue.ErrNotLeader
	}
	return p.LeaderPartition(ctx, 0)
}

func (d *DoubleWrite) leaderApply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	p, refuse := d.local()
	if p == nil {
		return store.Result{}, raftqueue.ErrNotLeader
	}
	return d.applyAt(ctx, p, refuse, cmd)
}

func (d *DoubleWrite) checkDamage(err error) error { return err }

func (d *DoubleWrite) replicaPartition() (*store.Partition, error) {
	p := d.Replica()
	if p == nil {
		return nil, store.ErrClosed
	}
	return p.Partition(0)
}

func (d *DoubleWrite) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(d.ctx, d.cfg.CallTimeout)
}

// AppendFrom is the follower's side of OpPairAppend: this node's replica,
// when the record makes it the follower of node leader.
func (d *DoubleWrite) AppendFrom(leader string) (*raftqueue.Pair, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pair != nil && d.rec.leader() == d.cfg.Self {
		// A leader deposed by this one: the replica refuses its epoch
		// (dwqueue.EpochError), which tells it so.
		return d.pair, nil
	}
	if d.pair == nil || d.rec.follower() != d.cfg.Self {
		return nil, fmt.Errorf("%w: %s does not follow here", store.ErrClosed, d.Name())
	}
	if leader != d.rec.leader() {
		// The leader's epoch is refused anyway if it was deposed; a node
		// the record does not name gets no say.
		return nil, fmt.Errorf("%w: %s is led by %s, not %s", dwqueue.ErrBadAppend, d.Name(), d.rec.leader(), leader)
	}
	return d.pair, nil
}

// Closing tells the partition that its node is closing: a call tries the
// leader once and no longer waits.
func (d *DoubleWrite) Closing() {
	d.mu.Lock()
	d.closing = true
	d.mu.Unlock()
}

// Close stops the in-sync watch, ends the calls waiting for a leader,
// closes the RPC partitions and this node's replica.
func (d *DoubleWrite) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	remotes := d.remotes
	d.remotes = nil
	d.mu.Unlock()
	d.cancel()
	<-d.done
	for _, p := range remotes {
		p.Close()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pair != nil {
		err := d.pair.Close()
		d.pair = nil
		return err
	}
	return nil
}

// WhileLeading calls fn each time this node's replica starts leading, with
// its Upkeep and a ctx that ends once it no longer leads (or ctx ends), and
// waits for fn; it returns when ctx ends. It looks at each Update and every
// second.
func (d *DoubleWrite) WhileLeading(ctx context.Context, fn func(ctx context.Context, u Upkeep)) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for ctx.Err() == nil {
		d.mu.Lock()
		changed := d.changed
		d.mu.Unlock()
		if p, _ := d.local(); p != nil && p.Leading() {
			if sp, err := p.Partition(0); err == nil {
				lctx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() {
					defer close(done)
					fn(lctx, Upkeep{G: p, P: sp})
				}()
				for ctx.Err() == nil {
					if q, _ := d.local(); q != p || !p.Leading() {
						break
					}
					select {
					case <-ctx.Done():
					case <-changed:
					case <-tick.C:
					}
					d.mu.Lock()
					changed = d.changed
					d.mu.Unlock()
				}
				cancel()
				<-done
				continue
			}
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-tick.C:
		}
	}
}
