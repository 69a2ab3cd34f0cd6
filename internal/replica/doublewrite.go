package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

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
// node last saw it (metastate.Partition's fields).
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

// Follower is the record's follower, "" while it has none.
func (r PairRecord) Follower() string {
	if len(r.Replicas) < 2 {
		return ""
	}
	return r.Replicas[1]
}

func (r PairRecord) followerInSync() bool {
	f := r.Follower()
	return f != "" && slices.Contains(r.InSync, f)
}

// DoubleWriteConfig configures a node's DoubleWrite partition.
type DoubleWriteConfig struct {
	Topic string
	Index int
	First int    // the first partition of its chunk: the one naming its Pair
	Self  string // this node's id
	// Peer returns the RPC client of a node.
	Peer func(node string) (*remote.Client, error)
	// Now stamps the commands this node's replica proposes as the leader
	// (time.Now if nil).
	Now func() time.Time
	// CallTimeout bounds the reads that take no ctx (DefaultCallTimeout
	// if zero).
	CallTimeout time.Duration
	// Report tells the metadata group, without waiting, that this node
	// cannot reach node, the leader, which it probes
	// (cluster.Agent.ReportLater). Nil: none.
	Report func(node string)
}

// reportEvery is the least time between two reports of a partition.
const reportEvery = time.Second

// DoubleWrite is a DoubleWrite partition as a node holds it: commands and
// reads go to the leader its pair's record names (Pair), this node's
// replica when it is the one. Safe for concurrent use.
type DoubleWrite struct {
	reads
	cfg    DoubleWriteConfig
	pair   *Pair           // shared with the partitions of its chunk; released by Close
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu       sync.Mutex
	remotes  map[string]*remote.Partition // guarded by mu
	closing  bool                         // guarded by mu: no waiting for a leader
	closed   bool                         // guarded by mu
	reported time.Time                    // guarded by mu: the last report
}

var _ partition.Partition = (*DoubleWrite)(nil)

// NewDoubleWrite returns the partition cfg describes, on pair: a hold
// taken for it with Pairs.Attach, which its Close releases.
func NewDoubleWrite(cfg DoubleWriteConfig, pair *Pair) *DoubleWrite {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	d := &DoubleWrite{cfg: cfg, pair: pair, remotes: map[string]*remote.Partition{}}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.reads = reads{at: d.read, ctx: d.ctx, timeout: cfg.CallTimeout}
	return d
}

// Name is the partition's "topic/index".
func (d *DoubleWrite) Name() string { return d.cfg.Topic + "/" + strconv.Itoa(d.cfg.Index) }

// Pair is the pair the partition shares with its chunk.
func (d *DoubleWrite) Pair() *Pair { return d.pair }

// Replica returns this node's replica, nil if it holds none.
func (d *DoubleWrite) Replica() *raftqueue.Pair { return d.pair.Replica() }

// part is the partition's number in its pair.
func (d *DoubleWrite) part() int { return d.cfg.Index - d.cfg.First }

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
		leader, changed := d.pair.leader()
		d.mu.Lock()
		closing := d.closing
		d.mu.Unlock()
		var err error
		if leader == d.cfg.Self {
			if p, refuse := d.pair.local(); p != nil {
				err = local(p, refuse)
			} else {
				err = raftqueue.ErrNotLeader
			}
		} else if leader != "" {
			var p *remote.Partition
			if p, err = d.remote(leader); err != nil {
				return err
			}
			if err = far(p); errors.Is(err, remote.ErrUnavailable) || errors.Is(err, remote.ErrNotSent) {
				d.report(leader)
			}
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

// report reports that the leader's node was not reached, at most once
// every reportEvery.
func (d *DoubleWrite) report(leader string) {
	d.mu.Lock()
	due := d.cfg.Report != nil && time.Since(d.reported) >= reportEvery
	if due {
		d.reported = time.Now()
	}
	d.mu.Unlock()
	if due {
		d.cfg.Report(leader)
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
	return p.ApplyTo(ctx, d.part(), cmd)
}

// read runs fn on the leader's partition.
func (d *DoubleWrite) read(ctx context.Context, fn func(p partition.Partition) error) error {
	return d.route(ctx, true, func(p *raftqueue.Pair, _ bool) error {
		sp, err := p.LeaderPartition(ctx, d.part())
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
		if sp, perr := p.Partition(d.part()); perr == nil {
			st = sp.Stats()
		}
	}
	return st
}

// Leads reports whether this node's replica leads the partition.
func (d *DoubleWrite) Leads() bool {
	p, _ := d.pair.local()
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
	p, _ := d.pair.local()
	if p == nil {
		return nil, raftqueue.ErrNotLeader
	}
	return p.LeaderPartition(ctx, d.part())
}

func (d *DoubleWrite) leaderApply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	p, refuse := d.pair.local()
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
	return p.Partition(d.part())
}

func (d *DoubleWrite) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(d.ctx, d.cfg.CallTimeout)
}

// AppendFrom is the follower's side of OpPairAppend for the pair the
// partition shares.
func (d *DoubleWrite) AppendFrom(leader string) (*raftqueue.Pair, error) {
	return d.pair.AppendFrom(leader)
}

// Closing tells the partition that its node is closing: a call tries the
// leader once and no longer waits.
func (d *DoubleWrite) Closing() {
	d.mu.Lock()
	d.closing = true
	d.mu.Unlock()
}

// Close ends the calls waiting for a leader, closes the RPC partitions and
// releases the pair (closed with the last partition of its chunk).
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
	for _, p := range remotes {
		p.Close()
	}
	return d.pair.release()
}

// WhileLeading calls fn each time this node's replica starts leading, with
// its Upkeep and a ctx that ends once it no longer leads (or ctx ends), and
// waits for fn; it returns when ctx ends. It looks at each Update and every
// second.
func (d *DoubleWrite) WhileLeading(ctx context.Context, fn func(ctx context.Context, u Upkeep)) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for ctx.Err() == nil {
		_, changed := d.pair.leader()
		if p, _ := d.pair.local(); p != nil && p.Leading() {
			if sp, err := p.Partition(d.part()); err == nil {
				lctx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() {
					defer close(done)
					fn(lctx, Upkeep{G: p, Part: d.part(), P: sp})
				}()
				for ctx.Err() == nil {
					if q, _ := d.pair.local(); q != p || !p.Leading() {
						break
					}
					select {
					case <-ctx.Done():
					case <-changed:
					case <-tick.C:
					}
					_, changed = d.pair.leader()
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
