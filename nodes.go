package mq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
)

// The life of a cluster's nodes: draining one, moving a replica, removing
// a node. Each needs the Admin right on "*" under the cluster's ACL, and
// returns once this node's copy of the metadata shows the change; the
// moves it starts go on in the background (ClusterStatus shows them).

// DrainNode marks node id draining: placement puts no new replica on it,
// and the metadata leader moves its replicas to other nodes, one group at
// a time, each move only from a whole group: a DoubleWrite pair it leads
// is handed to its follower once that one is in sync, a pair it follows
// gets a new follower (its leader acks alone meanwhile only with
// AckAlone: otherwise its sends are refused until the new follower caught
// up), a Raft3 group's replica moves to a new server, caught up before
// it votes, and a Single partition moves with its data (MoveReplica).
// NodeStatus.Holds lists what the node still holds. Drained, the node may
// be shut down and removed (RemoveNode).
func (m *MQ) DrainNode(ctx context.Context, id string) error {
	return m.setDraining(ctx, id, true)
}

// ResumeNode takes DrainNode's mark off node id: placement may put
// replicas on it again. Moves already made stay.
func (m *MQ) ResumeNode(ctx context.Context, id string) error {
	return m.setDraining(ctx, id, false)
}

func (m *MQ) setDraining(ctx context.Context, id string, draining bool) error {
	return m.admin(ctx, metastate.DrainNode{ID: id, Draining: draining})
}

// MoveReplica moves the replica of partition of topic on node from to node
// to, or with to empty to the node placement chooses: the whole raft
// group or pair the partition shares (Options.GroupSize) moves. Raft3:
// the new replica is caught up as a nonvoter, then made a voter, and the
// old one leaves the group. DoubleWrite: from must be the follower (a
// leader is moved by handing the pair over first); the new follower is
// caught up while the leader alone is in sync. Single: from must be the
// partition's node; it freezes the partition, to copies it and takes it
// over, and sends and consumers wait through the switch (seconds for a
// partition of a few hundred MB) where they would otherwise fail. While
// that move runs, MoveReplica with from its target retargets it, or with
// to the partition's node cancels it; one whose partition moved meanwhile
// (the move ended, or another started) is refused (ErrInvalidOption).
// MoveReplica returns once the move started: ClusterStatus's Holds shows
// where the partition is.
func (m *MQ) MoveReplica(ctx context.Context, topic string, partition int, from, to string) error {
	if m.closed.Load() {
		return ErrClosed
	}
	if m.cluster == nil {
		return fmt.Errorf("%w: replicas move only in a cluster", ErrUnsupportedType)
	}
	for {
		st := m.cluster.Agent().Meta().State()
		t, _ := st.Topic(topic)
		p, ok := st.Partition(topic, partition)
		if !ok {
			return fmt.Errorf("%w: %s/%d", ErrNoTopic, topic, partition)
		}
		err := m.admin(ctx, metastate.MoveReplica{Topic: topic, Partition: partition, Version: p.Version, From: from, To: to})
		switch {
		case !errors.Is(err, metastate.ErrStale):
			return err
		case t.Type == metastate.TypeSingle:
			// Only a move changes a Single partition's record: the
			// caller's view of it is out of date.
			return fmt.Errorf("%w: %s/%d moved meanwhile: %v", ErrInvalidOption, topic, partition, err)
		}
		select { // the pair's record changed: read it again once it is here
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// BalanceReplicas starts moves (MoveReplica) that even out the replicas
// the nodes up and not draining hold, at most most of them (most <= 0: no
// bound): a node added to the cluster holds nothing until then. While
// moving a raft group or a Single partition from one node to another that
// holds none of its replicas evens their loads (the partitions they
// hold), the one that evens them most moves, each once per call. Raft3
// groups move with every replica up and none lost, their new replica
// caught up as a nonvoter first; Single partitions move with their data,
// their sends waiting through the copy; DoubleWrite pairs stay (a moved
// follower leaves its leader alone in sync, which without AckAlone
// refuses sends until the new one caught up). It needs the Admin right on
// "*", and returns how many moves started, and the errors of those that
// did not start (a record that changed meanwhile). The moves go on in the
// background: ClusterStatus's Holds shows them done; call it again until
// it starts none, then BalanceLeaders.
func (m *MQ) BalanceReplicas(ctx context.Context, most int) (int, error) {
	if m.closed.Load() {
		return 0, ErrClosed
	}
	if m.cluster == nil {
		return 0, fmt.Errorf("%w: replicas are balanced only in a cluster", ErrUnsupportedType)
	}
	if err := m.cluster.Allowed(m.cluster.ID(), "*", metastate.RightAdmin); err != nil {
		return 0, translate(err) // also when there is nothing to move
	}
	started := 0
	var errs []error
	for _, mv := range m.cluster.Agent().Meta().State().BalanceMoves(most) {
		// Each move after the one before applied: a group that lost a
		// replica or a node meanwhile stays.
		if !m.cluster.Agent().Meta().State().Balanceable(mv.Topic, mv.Partition) {
			errs = append(errs, fmt.Errorf("%s/%d from %s to %s: %w: a replica lost, down or moving since the plan", mv.Topic, mv.Partition, mv.From, mv.To, ErrInvalidOption))
			continue
		}
		if err := m.admin(ctx, mv); err != nil {
			if errors.Is(err, ErrDenied) || ctx.Err() != nil {
				return started, err
			}
			errs = append(errs, fmt.Errorf("%s/%d from %s to %s: %w", mv.Topic, mv.Partition, mv.From, mv.To, err))
			continue
		}
		started++
	}
	return started, errors.Join(errs...)
}

// BalanceLeaders hands the leaderships of Raft3 raft groups and
// DoubleWrite pairs over so that the nodes lead about as many each: raft
// elects whichever replica times out first, a pair's follower takes over
// when its leader fails, and a node that restarted leads none of its
// groups until something moves them back. It asks every up node which
// Raft3 groups it leads (a pair's leader is in the metadata), then has
// each group that moves hand its leadership to a replica on a node that
// leads fewer: raft's leadership transfer (the new leader is caught up
// first), or a pair's swap of leader and follower, both in sync, at a new
// epoch (no copy is made). Sends to the group meanwhile wait or are
// retried, or, when in flight at the old leader, return
// ErrUnknownOutcome; none acked is lost. Only up nodes that are not
// draining, Raft3 replicas not lost, and a pair's follower in sync take
// leaderships. A pair whose follower does not confirm within 10 s that it
// holds the pair (cut off from its leader) stays. It needs the Admin right
// on "*" of every node involved. It returns how many groups moved, and an
// error naming those that did not (they stay where they were, but for one
// whose ctx ended while its last step was under way, which may still
// complete), or nodes that could not be asked. Call it after a rolling
// restart, or once replicas moved to new nodes.
func (m *MQ) BalanceLeaders(ctx context.Context) (int, error) {
	if m.closed.Load() {
		return 0, ErrClosed
	}
	if m.cluster == nil {
		return 0, fmt.Errorf("%w: leaders are balanced only in a cluster", ErrUnsupportedType)
	}
	moved, err := m.cluster.BalanceLeaders(ctx)
	return moved, translate(err)
}

// AcceptDataLoss is an operator's decision on a DoubleWrite pair that
// serves nothing because no copy is known to hold what it acked: its
// leader's data directory was replaced while it acked alone (AckAlone),
// and ClusterStatus's Failed names the partition with "no intact copy
// known". Nothing else ends that state: the pair waits, also while its
// follower is down, since the follower may hold the only copy. Node
// leader, the pair's follower, then leads with what it holds, and the
// old leader follows it from there. What only the lost copy held is given
// up: messages acked while the leader was alone in sync may be gone, and
// their offsets taken by new sends. A consumer group that had read past
// the follower's end claims the partition again from the offset stored
// there when its next read finds its position past the end; one whose
// next read comes only after new sends filled those offsets skips them
// (ResetOffset to an earlier offset delivers them again). It needs the Admin right
// on "*". It returns ErrInvalidOption when a replica is in sync (there is
// no loss to accept), when leader is not the follower (the leader's copy
// is the one lost), or when the pair's record changed meanwhile.
func (m *MQ) AcceptDataLoss(ctx context.Context, topic string, partition int, leader string) error {
	if m.closed.Load() {
		return ErrClosed
	}
	if m.cluster == nil {
		return fmt.Errorf("%w: data loss is accepted only for a cluster's DoubleWrite pairs", ErrUnsupportedType)
	}
	if err := m.cluster.Allowed(m.cluster.ID(), "*", metastate.RightAdmin); err != nil {
		return translate(err) // before what the state holds is told
	}
	st := m.cluster.Agent().Meta().State()
	t, _ := st.Topic(topic)
	p, ok := st.Partition(topic, partition)
	switch {
	case !ok:
		return fmt.Errorf("%w: %s/%d", ErrNoTopic, topic, partition)
	case t.Type != metastate.TypeDoubleWrite:
		return fmt.Errorf("%w: %s is not a DoubleWrite topic", ErrInvalidOption, topic)
	}
	err := m.admin(ctx, metastate.AcceptLoss{Topic: topic, Partition: partition, Version: p.Version, Leader: leader})
	if errors.Is(err, metastate.ErrStale) {
		return fmt.Errorf("%w: %s/%d changed meanwhile: %v", ErrInvalidOption, topic, partition, err)
	}
	return err
}

// RemoveNode removes node id from the cluster: it must be down and hold
// no replica (ErrNodeInUse otherwise: drain it, wait until ClusterStatus
// shows it holds nothing, shut it down). It leaves the metadata group's
// members too. A node that comes back under that id after it joins as a
// new node, holding nothing.
func (m *MQ) RemoveNode(ctx context.Context, id string) error {
	return m.admin(ctx, metastate.RemoveNode{ID: id})
}

// admin proposes c, an operator's command, and waits until this node's
// metadata applied it.
func (m *MQ) admin(ctx context.Context, c metastate.Command) error {
	if m.closed.Load() {
		return ErrClosed
	}
	if m.cluster == nil {
		return fmt.Errorf("%w: node commands need a cluster", ErrUnsupportedType)
	}
	res, err := m.cluster.Agent().Propose(ctx, c)
	if errors.Is(err, metastate.ErrInvalid) {
		return fmt.Errorf("%w: %v", ErrInvalidOption, err)
	}
	if err != nil {
		return clusterErr(err)
	}
	return m.cluster.AwaitIndex(ctx, res.Index)
}
