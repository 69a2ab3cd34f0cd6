package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// PairConfig configures a node's view of a DoubleWrite pair: the chunk of
// partitions First..First+Partitions-1 of Topic, which share one log and
// one record.
type PairConfig struct {
	Topic string
	First int    // the chunk's first partition: the name of the pair in the metadata and in OpPairAppend
	Self  string // this node's id
	// Peer returns the RPC client of a node.
	Peer func(node string) (*remote.Client, error)
	// Open opens this node's replica, when the record places one here.
	Open func() (*raftqueue.Pair, error)
	// SetInSync proposes to the metadata group that the replicas inSync
	// hold the pair, compare-and-set on the version of rec.
	SetInSync func(ctx context.Context, rec PairRecord, inSync []string) error
	// RenewEpoch proposes to the metadata group the next epoch for this
	// node's replica to lead, compare-and-set on the version of rec: each
	// run of a leader needs an epoch of its own (pairlog.Log.Lead).
	RenewEpoch func(ctx context.Context, rec PairRecord) error
	// HandOff proposes to the metadata group that the follower of rec, in
	// sync, lead the pair, compare-and-set on the version of rec: a Promote
	// from its leader, whose replica failed or whose node closes. Nil: a
	// leader whose replica failed stays until its node is found down.
	HandOff func(ctx context.Context, rec PairRecord) error
	// HandOver proposes to the metadata group that the follower of rec,
	// in sync, lead the pair and its leader follow, compare-and-set on the
	// version of rec: a HandOver from its leader, to balance leaderships.
	HandOver func(ctx context.Context, rec PairRecord) error
	// CallTimeout bounds each proposal to the metadata group; zero means
	// DefaultCallTimeout.
	CallTimeout time.Duration
	// FollowerTimeout is how long the leader waits for a follower that
	// matches none of its new entries before it refuses sends with
	// ErrNoInSync until the follower answers again, or, in the risk stage,
	// has the metadata record it alone in sync and acks on its own copy.
	// Zero means 2 s.
	FollowerTimeout time.Duration
	// Logger receives the replica's changes; nil is silent.
	Logger *slog.Logger
}

// Pair is a DoubleWrite pair as a node sees it, shared by the partitions
// of its chunk (Pairs.Attach): the record the metadata keeps of it, and
// this node's replica when the record places one here. The replica leads
// or follows as the record says (Update), and, leading, has the metadata
// record its follower in sync once it holds everything and, in the risk
// stage, out of sync once it stopped answering. Safe for concurrent use.
//
// Goroutines: the in-sync watch (watch), stopped by the release of the
// last partition holding the pair.
type Pair struct {
	cfg    PairConfig
	name   string          // "topic/first"
	ctx    context.Context // cancelled when the pair closes
	cancel context.CancelFunc
	wg     sync.WaitGroup // the in-sync watch
	ps     *Pairs
	refs   int // guarded by ps.mu: the partitions holding the pair

	mu      sync.Mutex
	rec     PairRecord      // guarded by mu
	changed chan struct{}   // guarded by mu: closed at each Update
	rep     *raftqueue.Pair // guarded by mu: this node's replica, nil if none
	role    pairRole        // guarded by mu: what rep was told
	syncing bool            // guarded by mu: the risk stage ended, the follower catching up in sync
	unsync  uint64          // guarded by mu: syncing, the record version the leader was proposed alone again from; 0 if not
	renew   bool            // guarded by mu: the replica led the record's epoch before: ask for the next
	stalled bool            // guarded by mu: leading, the follower matched nothing new for FollowerTimeout
	roleErr error           // guarded by mu: why the replica could not open or take its role at the last Update
	closed  bool            // guarded by mu
}

// errNoIntactCopy is the cause of ErrReplicaFailed when the record keeps
// this node's replica as the leader but in sync no more.
var errNoIntactCopy = errors.New("no intact copy known: the leader's data directory was replaced and no follower was in sync")

// pairRole is what this node's replica was last told.
type pairRole struct {
	lead, follow bool
	epoch        uint64
	follower     string // leading: the follower it replicates to
	async        bool   // leading: the risk stage
}

// Pairs are the DoubleWrite pairs a node sees, by name: "topic/first".
// Safe for concurrent use.
type Pairs struct {
	mu sync.Mutex
	m  map[string]*Pair
}

// Attach takes a hold of the pair cfg names for one of its partitions:
// the one open already, on which rec changes nothing since Update gives it
// its records, or a new one with rec. Release the hold with Pair.release.
func (ps *Pairs) Attach(cfg PairConfig, rec PairRecord) *Pair {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	name := cfg.Topic + "/" + strconv.Itoa(cfg.First)
	p := ps.m[name]
	if p == nil {
		p = newPair(cfg, name, rec)
		p.ps = ps
		if ps.m == nil {
			ps.m = map[string]*Pair{}
		}
		ps.m[name] = p
	}
	p.refs++
	return p
}

// newPair returns the pair cfg describes, led and followed as rec says.
func newPair(cfg PairConfig, name string, rec PairRecord) *Pair {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.FollowerTimeout <= 0 {
		cfg.FollowerTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pair{cfg: cfg, name: name, changed: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.Update(rec)
	p.wg.Go(p.watch)
	return p
}

// release drops a partition's hold of p, and closes p with the last,
// under ps.mu so that a new Attach of the name waits for it.
func (p *Pair) release() error {
	p.ps.mu.Lock()
	defer p.ps.mu.Unlock()
	if p.refs--; p.refs > 0 {
		return nil
	}
	delete(p.ps.m, p.name)
	return p.close()
}

// close stops the in-sync watch and closes this node's replica.
func (p *Pair) close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rep != nil {
		err := p.rep.Close()
		p.rep = nil
		return err
	}
	return nil
}

// Replica returns this node's replica, nil if it holds none.
func (p *Pair) Replica() *raftqueue.Pair {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rep
}

// leader returns the node the record makes the leader, and the channel
// the next Update closes.
func (p *Pair) leader() (string, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec.leader(), p.changed
}

// Update makes rec the pair's record: this node's replica leads or
// follows its epoch, opened if the record places one here and closed if
// it no longer does. A replica that cannot open or take its role is
// logged and tried again at the next Update.
func (p *Pair) Update(rec PairRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if rec.Follower() != p.rec.Follower() || rec.followerInSync() || (p.unsync != 0 && rec.Version > p.unsync) {
		// A record past unsync was made after every proposal to record
		// the follower in sync, which were made from unsync or before:
		// it says whether one took.
		p.syncing, p.unsync = false, 0
	}
	p.rec, p.renew = rec, false
	close(p.changed)
	p.changed = make(chan struct{})
	p.roleErr = p.takeRole()
	if p.roleErr != nil {
		p.cfg.Logger.Error("DoubleWrite replica cannot take its role", "pair", p.name, "epoch", rec.Epoch, "replicas", rec.Replicas, "err", p.roleErr)
	}
}

// failed returns why this node's replica cannot serve as the record's
// leader: it could not open or take its role, or the record knows no
// intact copy. Nil otherwise, and when the record names another leader.
func (p *Pair) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rec.leader() != p.cfg.Self {
		return nil
	}
	if p.roleErr != nil {
		return p.roleErr
	}
	if !p.rec.leaderInSync() {
		return errNoIntactCopy
	}
	return nil
}

// takeRole gives this node's replica the role p.rec gives it. mu is held.
func (p *Pair) takeRole() error {
	rec, self := p.rec, p.cfg.Self
	if self != rec.leader() && self != rec.Follower() {
		if p.rep != nil {
			err := p.rep.Close()
			p.rep, p.role = nil, pairRole{}
			return err
		}
		return nil
	}
	if p.rep == nil {
		r, err := p.cfg.Open()
		if err != nil {
			return err
		}
		p.rep = r
	}
	if self == rec.Follower() || !rec.leaderInSync() {
		// Following, or leading a record that knows no intact copy: this
		// replica, which lost its data, must not lead what it lacks. It
		// serves the epoch so that nothing older is taken.
		if p.role.follow && p.role.epoch == rec.Epoch {
			return nil
		}
		p.role = pairRole{}
		if err := p.rep.Follow(rec.Epoch); err != nil {
			return err
		}
		p.role = pairRole{follow: true, epoch: rec.Epoch}
		return nil
	}
	async := rec.Alone && !rec.followerInSync() && !p.syncing
	if p.role.lead && p.role.epoch == rec.Epoch && p.role.follower == rec.Follower() && p.rep.Leading() {
		if async != p.role.async {
			p.rep.SetSync(!async)
			p.role.async = async
		}
		return nil
	}
	var peer pairlog.Peer
	if f := rec.Follower(); f != "" {
		c, err := p.cfg.Peer(f)
		if err != nil {
			return err
		}
		peer = PairPeer{Client: c, Topic: p.cfg.Topic, Index: p.cfg.First}
	}
	p.role = pairRole{}
	if err := p.rep.LeadAfterLoss(rec.Epoch, peer, async, rec.Accepted); err != nil {
		if errors.Is(err, pairlog.ErrEpochLed) {
			p.renew = true // watch asks for the next epoch
			return nil
		}
		return err
	}
	p.role = pairRole{lead: true, epoch: rec.Epoch, follower: rec.Follower(), async: async}
	return nil
}

// watch is the in-sync watch. While this node's replica leads, it has the
// metadata record the follower in sync once it holds everything that may
// have been acked, ending the risk stage first: commits wait for the
// follower again once it is close. In the risk stage, it has the metadata
// record the leader alone once the follower has matched nothing new for
// FollowerTimeout; and so too when the follower it waits for, not yet
// recorded in sync, has matched nothing new for FollowerTimeout, which
// ends the wait.
func (p *Pair) watch() {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var laggingSince time.Time // since when the follower lags and matched nothing new
	var lastMatched uint64
	asyncFrom := uint64(0) // async: what the follower matched when the leader went async
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-tick.C:
		}
		p.mu.Lock()
		rec, r, role, renew, roleErr := p.rec, p.rep, p.role, p.renew, p.roleErr
		p.mu.Unlock()
		if renew {
			p.propose(rec, func(ctx context.Context) error { return p.cfg.RenewEpoch(ctx, rec) }, "renew the epoch")
			continue
		}
		if err := p.failedLeader(rec, r, role, roleErr); err != nil {
			// This replica failed: the follower, which holds every acked
			// entry, is to lead instead of a node that stays up but can
			// no longer ack.
			p.propose(rec, func(ctx context.Context) error { return p.cfg.HandOff(ctx, rec) },
				fmt.Sprintf("hand the pair to %s (this replica failed: %v)", rec.Follower(), err))
			continue
		}
		if r == nil || !role.lead || rec.Follower() == "" || !r.Leading() {
			laggingSince = time.Time{}
			p.setStalled(false)
			continue
		}
		if rec.followerInSync() && r.FollowerLost() {
			// The follower's log no longer holds what it matched: it
			// lost its disk. Out of sync before anything else is acked,
			// so that it is never promoted with what it lacks; commits
			// wait for it meanwhile.
			p.setInSync(rec, []string{p.cfg.Self})
			continue
		}
		matched, lag := r.Matched(), r.Lag()
		switch {
		case lag == 0:
			laggingSince = time.Time{}
		case laggingSince.IsZero() || matched != lastMatched:
			laggingSince = time.Now()
		}
		lastMatched = matched
		stuck := !laggingSince.IsZero() && time.Since(laggingSince) > p.cfg.FollowerTimeout
		p.setStalled(stuck)
		if !role.async {
			asyncFrom = matched
		}
		switch {
		case !rec.followerInSync() && role.async && lag <= 64 && matched > asyncFrom:
			// The follower answers again, having matched something since
			// the leader went async, and is close: commit on both copies
			// again, so that it ends up holding everything.
			p.mu.Lock()
			if p.role == role {
				p.syncing = true
				p.role.async = false
				r.SetSync(true)
			}
			p.mu.Unlock()
		case !rec.followerInSync() && rec.Alone && !role.async && stuck:
			// The follower went away again before it was recorded in
			// sync (the metadata may refuse that while its node is
			// down): commits wait for it in vain. Back to the risk
			// stage, through the metadata: a proposal to record the
			// follower in sync may still take, and the leader may ack
			// alone only under a record that says so and was made after
			// it. This one, from rec's version as those were, is; its
			// Update ends syncing.
			p.mu.Lock()
			current := p.rec.Version == rec.Version && p.role == role
			if current {
				// Only while rec is the record: an Update past it
				// cleared unsync already, and would not again.
				p.unsync = rec.Version
			}
			p.mu.Unlock()
			if current {
				p.setInSync(rec, []string{p.cfg.Self})
			}
			laggingSince = time.Time{}
		case !rec.followerInSync() && !role.async && r.InSync():
			p.setInSync(rec, []string{p.cfg.Self, rec.Follower()})
		case rec.followerInSync() && rec.Alone && stuck:
			p.setInSync(rec, []string{p.cfg.Self})
			laggingSince = time.Time{}
		}
	}
}

// HandOff has the metadata make the follower lead, when this node's
// replica leads and its follower is in sync and up: for a node that
// closes, so that the pair does not wait for its session to expire. It is
// best effort, since the session check promotes the follower anyway; call
// it while the node still reaches the metadata group.
func (p *Pair) HandOff(ctx context.Context) {
	p.mu.Lock()
	rec := p.rec
	p.mu.Unlock()
	if err := p.handTo(ctx, rec.Follower(), p.cfg.HandOff); err != nil && !errors.Is(err, ErrNotHandedOff) {
		p.cfg.Logger.Warn("DoubleWrite: the pair not handed to its follower before the node closes", "follower", rec.Follower(), "err", err)
	}
}

// ErrNotHandedOff is HandOver's refusal: this node's replica does not
// lead, or the follower named is not the pair's, in sync and up.
var ErrNotHandedOff = errors.New("replica: the pair is not led here with that follower in sync and up")

// HandOver swaps this node's replica, which must lead, with its follower,
// node to, in sync and up (PairConfig.HandOver), once to confirmed now
// that it holds the pair: for balancing leaderships. This replica follows
// once it sees the new record; what it had in flight is answered
// ErrUnknownOutcome, and its tail that to lacks, never acked, is cut by
// to's first appends.
func (p *Pair) HandOver(ctx context.Context, to string) error {
	return p.handTo(ctx, to, p.cfg.HandOver)
}

// handTo proposes, with propose, that the follower, node to, lead the pair
// this node's replica leads, once it confirmed that it holds the pair.
func (p *Pair) handTo(ctx context.Context, to string, propose func(context.Context, PairRecord) error) error {
	p.mu.Lock()
	rec, r, role := p.rec, p.rep, p.role
	p.mu.Unlock()
	if !p.mayHandOff(rec, r, role) || rec.Follower() != to || propose == nil {
		return fmt.Errorf("%w: %s to %s", ErrNotHandedOff, p.name, to)
	}
	// The follower may have come back with an empty disk, its node's new
	// incarnation not yet registered: only one that answers now, holding
	// everything, is handed the pair.
	if err := r.ConfirmFollower(ctx); err != nil {
		return fmt.Errorf("the follower did not confirm it holds the pair: %w", err)
	}
	return propose(ctx, rec)
}

// Get returns the pair named topic/first, if this node sees it.
func (ps *Pairs) Get(topic string, first int) (*Pair, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, ok := ps.m[topic+"/"+strconv.Itoa(first)]
	return p, ok
}

// HandOff hands each pair whose replica here leads to its follower in
// sync (Pair.HandOff), in parallel, each within timeout: for a node that
// closes.
func (ps *Pairs) HandOff(timeout time.Duration) {
	ps.mu.Lock()
	pairs := slices.Collect(maps.Values(ps.m))
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pairs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			p.HandOff(ctx)
		})
	}
	wg.Wait()
}

// failedLeader returns why this node's replica, which leads rec, failed,
// when it should hand the pair to its follower: in sync and up. Nil
// otherwise.
func (p *Pair) failedLeader(rec PairRecord, r *raftqueue.Pair, role pairRole, roleErr error) error {
	switch {
	case !p.followerMayTake(rec):
		return nil
	case roleErr != nil:
		return roleErr // the replica could not open or take the lead
	case r == nil || !role.lead:
		return nil
	}
	return r.Failed()
}

// mayHandOff reports whether this node's replica r, in role, leads rec and
// may hand it to its follower: in sync and up.
func (p *Pair) mayHandOff(rec PairRecord, r *raftqueue.Pair, role pairRole) bool {
	return r != nil && role.lead && p.followerMayTake(rec)
}

// followerMayTake reports whether rec makes this node the leader and its
// follower, in sync and up, may be handed the pair.
func (p *Pair) followerMayTake(rec PairRecord) bool {
	return rec.leader() == p.cfg.Self && p.cfg.HandOff != nil && rec.followerInSync() && rec.FollowerUp
}

// setStalled records whether the follower stalled.
func (p *Pair) setStalled(stalled bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != stalled {
		p.stalled = stalled
		if stalled {
			p.cfg.Logger.Warn("DoubleWrite follower stalled: sends refused until it answers")
		} else {
			p.cfg.Logger.Info("DoubleWrite follower answers again")
		}
	}
}

// setInSync has the metadata record inSync for rec's version.
func (p *Pair) setInSync(rec PairRecord, inSync []string) {
	p.propose(rec, func(ctx context.Context) error { return p.cfg.SetInSync(ctx, rec, inSync) },
		fmt.Sprintf("record %q in sync", inSync))
}

// propose runs call, a proposal made from rec, and waits for the record to
// change (Update) before the watch acts on it again: at most a second after
// a refusal, when the record moved on or no metadata leader answered.
func (p *Pair) propose(rec PairRecord, call func(ctx context.Context) error, what string) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.CallTimeout)
	defer cancel()
	p.mu.Lock()
	changed := p.changed
	p.mu.Unlock()
	wait := p.cfg.CallTimeout
	if err := call(ctx); err != nil {
		p.cfg.Logger.Warn("DoubleWrite: the metadata did not "+what, "epoch", rec.Epoch, "version", rec.Version, "err", err)
		wait = time.Second
	} else {
		p.cfg.Logger.Info("DoubleWrite: the metadata did "+what, "epoch", rec.Epoch, "version", rec.Version)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-changed:
	case <-t.C:
	case <-p.ctx.Done():
	}
}

// local returns this node's replica when the record makes it the leader
// and it was told so, and whether sends are refused: without the risk
// stage, while no follower is in sync, its node is down, or it has matched
// nothing new for FollowerTimeout: sends would wait for it, and
// ErrNoInSync at once is clearer.
func (p *Pair) local() (rep *raftqueue.Pair, refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rep == nil || !p.role.lead || p.rec.leader() != p.cfg.Self {
		return nil, false
	}
	if p.rec.Alone {
		// The risk stage: refused only while the follower, recorded in
		// sync, stalled and the leader could not yet be recorded alone
		// for want of a metadata quorum: sends would wait for it.
		return p.rep, p.stalled && p.rec.followerInSync()
	}
	return p.rep, !p.rec.followerInSync() || !p.rec.FollowerUp || p.stalled
}

// AppendFrom is the follower's side of OpPairAppend and OpPairInstall:
// this node's replica, when the record makes it the follower of node
// leader. When the record makes this node the leader, the caller is a
// leader it deposed: it gets a *pairlog.EpochError with the record's
// epoch, which tells it so, and never the replica, which may not lead
// yet and would take the appends.
func (p *Pair) AppendFrom(leader string) (*raftqueue.Pair, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rep != nil && p.rec.leader() == p.cfg.Self {
		return nil, &pairlog.EpochError{Epoch: p.rec.Epoch}
	}
	if p.rep == nil || p.rec.Follower() != p.cfg.Self {
		return nil, fmt.Errorf("%w: %s does not follow here", store.ErrClosed, p.name)
	}
	if leader != p.rec.leader() {
		// The leader's epoch is refused anyway if it was deposed; a node
		// the record does not name gets no say.
		return nil, fmt.Errorf("%w: %s is led by %s, not %s", pairlog.ErrBadAppend, p.name, p.rec.leader(), leader)
	}
	return p.rep, nil
}
