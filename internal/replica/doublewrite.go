package replica

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/remote"
)

// ErrNoInSync is a send refused by a DoubleWrite leader whose follower is
// not in sync while its topic does not allow the risk stage: an ack would
// mean one copy. It lasts until a follower has caught up.
var ErrNoInSync = errors.New("replica: the DoubleWrite partition has no follower in sync")

// ErrReplicaFailed is a call to a DoubleWrite partition whose record makes
// this node the leader while its replica cannot serve: it could not be
// opened or take its role, or the record holds no intact copy, the
// leader's own having been lost with its data directory. It wraps the
// cause and lasts until the record or the replica changes.
var ErrReplicaFailed = errors.New("replica: this node's DoubleWrite replica cannot serve")

// PairRecord is a DoubleWrite partition's record in the metadata, as the
// node last saw it: metastate.Partition's fields.
type PairRecord struct {
	Replicas []string // the leader, then the follower; no follower while no node was free
	Epoch    uint64
	Version  uint64
	InSync   []string
	Alone    bool // the topic allows the risk stage
	// FollowerUp is whether the follower's node is up: its session is
	// alive.
	FollowerUp bool
	// Accepted is the epoch at which an operator gave up the tail the
	// pair's lost copy alone held (metastate.Partition.Accepted): its
	// leader fences the consumer groups before anything else; 0 when none.
	Accepted uint64
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

// leaderInSync reports whether the leader holds every acked entry: false
// once the metadata found its data directory replaced (a new incarnation)
// with no follower in sync to take over, when no intact copy is known.
func (r PairRecord) leaderInSync() bool {
	l := r.leader()
	return l != "" && slices.Contains(r.InSync, l)
}

// DoubleWriteConfig configures a node's DoubleWrite partition.
type DoubleWriteConfig struct {
	Config
	// Report tells the metadata group, without waiting, that this node
	// cannot reach node, the leader, which it probes
	// (cluster.Agent.ReportLater). Nil: none.
	Report func(node string)
}

// reportEvery is the least time between two reports of a partition.
const reportEvery = time.Second

// doubleWrite is the kind of a DoubleWrite partition: the leader is the
// one its pair's record names, this node's replica the pair's
// (raftqueue.Pair), shared with the partitions of its chunk.
type doubleWrite struct {
	cfg  DoubleWriteConfig
	pair *Pair // shared with the partitions of its chunk; released at Close

	mu       sync.Mutex
	reported time.Time // guarded by mu: the last report
}

// NewDoubleWrite returns the partition cfg describes, on pair: a hold
// taken for it with Pairs.Attach, which its Close releases.
func NewDoubleWrite(cfg DoubleWriteConfig, pair *Pair) *Partition {
	return newPartition(cfg.Config, &doubleWrite{cfg: cfg, pair: pair})
}

// Pair returns the pair a DoubleWrite partition shares with its chunk, nil
// if p is not DoubleWrite.
func (p *Partition) Pair() *Pair {
	if k, ok := p.kind.(*doubleWrite); ok {
		return k.pair
	}
	return nil
}

// next: the leader the record names; sends refused (ErrNoInSync) while
// this node's replica leads without a follower in sync, unless the topic
// allows the risk stage.
func (k *doubleWrite) next() route {
	leader, changed := k.pair.leader()
	switch {
	case leader == k.cfg.Self:
		if err := k.pair.failed(); err != nil {
			return route{fail: fmt.Errorf("%w: %s/%d: %w", ErrReplicaFailed, k.cfg.Topic, k.cfg.Index, err), changed: changed}
		}
		if r, refuse := k.pair.local(); r != nil {
			rt := route{local: r, changed: changed}
			if refuse {
				rt.refuse = fmt.Errorf("%w: %s/%d", ErrNoInSync, k.cfg.Topic, k.cfg.Index)
			}
			return rt
		}
		return route{changed: changed} // the record's change has not reached the replica yet
	default:
		return route{node: leader, changed: changed}
	}
}

// sent reports that the leader's node was not reached, at most once every
// reportEvery.
func (k *doubleWrite) sent(leader string, err error) {
	if k.cfg.Report == nil || !errors.Is(err, remote.ErrUnavailable) && !errors.Is(err, remote.ErrNotSent) {
		return
	}
	k.mu.Lock()
	due := time.Since(k.reported) >= reportEvery
	if due {
		k.reported = time.Now()
	}
	k.mu.Unlock()
	if due {
		k.cfg.Report(leader)
	}
}

// Failed returns why this node cannot serve a DoubleWrite partition whose
// record makes it the leader (ErrReplicaFailed's cause), nil when it can,
// when another node leads, and for the other types.
func (p *Partition) Failed() error {
	if k, ok := p.kind.(*doubleWrite); ok {
		return k.pair.failed()
	}
	return nil
}

// candidates: the record names one leader; a call waits after each try,
// and at each Update.
func (k *doubleWrite) candidates() int { return 1 }

func (k *doubleWrite) checkDamage(err error) error { return err }

func (k *doubleWrite) replica() leaderReplica {
	if r := k.pair.Replica(); r != nil {
		return r
	}
	return nil
}

func (k *doubleWrite) leading() (leaderReplica, <-chan struct{}) {
	_, changed := k.pair.leader()
	if r, _ := k.pair.local(); r != nil && r.Leading() {
		return r, changed
	}
	return nil, changed
}

func (k *doubleWrite) notLeading() {}

func (k *doubleWrite) release() error { return k.pair.release() }
