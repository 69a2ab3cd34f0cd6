package replica

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// Raft3Config configures a node's Raft3 partition.
type Raft3Config struct {
	Config
	// Partitions is how many partitions the raft group carries.
	Partitions int
	// Replicas are the ids of the three nodes holding the group's replicas:
	// their raft server ids and, over the node's port, their raft
	// addresses.
	Replicas []string
}

// raft3 is the kind of a Raft3 partition: the leader is the one raft
// elects among Replicas, this node's replica a raftqueue.Group shared with
// the partitions of its group (RaftGroups.Attach).
type raft3 struct {
	cfg   Raft3Config                 // Replicas guarded by mu: the placement changes (SetReplicas)
	group atomic.Pointer[sharedGroup] // this node's replica, held until Close or Detach

	mu     sync.Mutex
	turn   int    // guarded by mu: the replica to try when no leader is known
	hint   string // guarded by mu: the node that last answered as the leader
	closed bool   // guarded by mu: released; attach no longer takes a replica
}

// NewRaft3 returns the partition cfg describes. This node's replica, if it
// holds one, is attached later (RaftGroups.Attach).
func NewRaft3(cfg Raft3Config) *Partition {
	return newPartition(cfg.Config, &raft3{cfg: cfg})
}

// RaftGroup returns this node's replica of a Raft3 partition's raft group,
// nil if it holds none or p is not Raft3.
func (p *Partition) RaftGroup() *raftqueue.Group {
	if k, ok := p.kind.(*raft3); ok {
		if g := k.group.Load(); g != nil {
			return g.g
		}
	}
	return nil
}

// attach makes g this node's replica, and reports whether it did: not if
// the partition is closed, or has a replica. It runs when Self is in
// Replicas, as the partition opens or later, once a failed open succeeded.
func (k *raft3) attach(g *sharedGroup) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return !k.closed && k.group.CompareAndSwap(nil, g)
}

// local returns this node's replica while it serves: nil without one, or
// once it is damaged.
func (k *raft3) local() *raftqueue.Group {
	g := k.group.Load()
	if g == nil || g.damaged.Load() {
		return nil
	}
	return g.g
}

func (k *raft3) next() route {
	if g := k.local(); g != nil && g.State() == raft.Leader {
		return route{local: g}
	}
	return route{node: k.candidate()}
}

// candidate returns the node to ask: the leader this node's replica knows
// of, the last node that answered as the leader, or the replicas in turn.
func (k *raft3) candidate() string {
	if g := k.group.Load(); g != nil {
		if _, id := g.g.Leader(); id != "" && string(id) != k.cfg.Self {
			return string(id)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.hint != "" {
		return k.hint
	}
	for range k.cfg.Replicas {
		node := k.cfg.Replicas[k.turn%len(k.cfg.Replicas)]
		k.turn++
		if node != k.cfg.Self {
			return node
		}
	}
	return ""
}

// sent remembers the node that answered as the leader, and forgets it
// once it no longer does.
func (k *raft3) sent(node string, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case err == nil:
		k.hint = node
	case k.hint == node:
		k.hint = ""
	}
}

// candidates: a call tries each replica once before it waits.
func (k *raft3) candidates() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return max(len(k.cfg.Replicas), 1)
}

// checkDamage returns err, a local call's: one that met damage of this
// node's replica, a corrupt file or a failed write, marks the replica
// damaged and becomes raftqueue.ErrNotLeader, which sends the call on to
// the intact replicas. A command whose outcome is unknown stays so.
func (k *raft3) checkDamage(err error) error {
	if err == nil || !errors.Is(err, store.ErrCorrupt) && !errors.Is(err, store.ErrFailed) {
		return err
	}
	if k.group.Load().damaged.CompareAndSwap(false, true) {
		k.cfg.Logger.Error("this node's replica is damaged: it no longer serves, and hands its leadership over; "+
			"the others serve the partitions of its group (restart the node once its files are repaired)", "err", err)
	}
	if errors.Is(err, raftqueue.ErrUnknownOutcome) {
		return err
	}
	return fmt.Errorf("%w: this node's replica is damaged: %w", raftqueue.ErrNotLeader, err)
}

func (k *raft3) replica() leaderReplica {
	if g := k.local(); g != nil {
		return g
	}
	return nil
}

func (k *raft3) leading() (leaderReplica, <-chan struct{}) {
	g := k.group.Load() // nil without a replica here, or until one that failed to open is attached
	if g == nil {
		return nil, nil
	}
	changed := g.g.LeaderChanged()
	if g.g.State() != raft.Leader || g.damaged.Load() {
		return nil, changed
	}
	return g.g, changed
}

// notLeading hands a damaged replica's leadership over.
func (k *raft3) notLeading() {
	if g := k.group.Load(); g != nil && g.damaged.Load() {
		g.handOff()
	}
}

// SetReplicas gives a Raft3 partition its group's new placement
// (metastate.MoveReplica): the replicas a call tries when no leader is
// known. This node's replica is attached (RaftGroups.Attach) and detached
// (Detach) apart.
func (p *Partition) SetReplicas(replicas []string) {
	if k, ok := p.kind.(*raft3); ok {
		k.mu.Lock()
		k.cfg.Replicas, k.hint = slices.Clone(replicas), ""
		k.mu.Unlock()
	}
}

// Detach drops a Raft3 partition's hold of this node's replica of its
// group, which closes with the last partition's: the replica moved away
// and left the group's configuration. Calls go to the group's leader
// elsewhere from then on; one in flight on the replica may fail.
func (p *Partition) Detach() error {
	if k, ok := p.kind.(*raft3); ok {
		if g := k.group.Swap(nil); g != nil {
			return g.release()
		}
	}
	return nil
}

func (k *raft3) release() error {
	k.mu.Lock()
	k.closed = true
	k.mu.Unlock()
	if g := k.group.Load(); g != nil {
		return g.release()
	}
	return nil
}
