package node

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/raftqueue"
)

// rejoinEvery is how often the node brings its Raft3 groups' raft
// configurations to their placement (replica.Rejoin).
const rejoinEvery = 500 * time.Millisecond

// placementOf returns the replicas of the Raft3 group of topic whose first
// partition is first, and those lost (metastate.Partition.Lost): their
// nodes came back as new incarnations, and they have not rejoined yet.
func (n *Node) placementOf(topic string, first int) (replicas, lost []string) {
	p, _ := n.agent.Meta().State().Partition(topic, first)
	return p.Replicas, p.Lost
}

// rejoinLoop runs rejoin every rejoinEvery until the node closes.
func (n *Node) rejoinLoop() {
	t := time.NewTicker(rejoinEvery)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		n.rejoin()
	}
}

// movedOut reports whether this node's replica g of a Raft3 group whose
// placement p no longer has it left the group: its configuration left it
// out, or, the move done (no replica lost), it follows and has heard from
// no leader for movedOutAfter, as a removed server does, to which its
// leader sends nothing more, not even the configuration that removed it.
func movedOut(g *raftqueue.Group, self string, p metastate.Partition) bool {
	r := g.Raft()
	if !transport.InConfiguration(r, self) {
		return true
	}
	return len(p.Lost) == 0 && r.State() != raft.Leader && time.Since(r.LastContact()) > movedOutAfter
}

// movedOutAfter is how long a replica moved away waits for its leader
// before it takes itself for removed.
const movedOutAfter = 5 * time.Second

// rejoin has each Raft3 group this node leads add back its lost replicas
// as new servers, and records each lost replica here that caught up
// (metastate.Rejoined).
func (n *Node) rejoin() {
	st := n.agent.Meta().State()
	self := n.agent.ID()
	n.groups.Each(func(topic string, first int, g *raftqueue.Group) {
		p, ok := st.Partition(topic, first)
		if !ok {
			return
		}
		if !slices.Contains(p.Replicas, self) && movedOut(g, self, p) {
			n.mu.Lock()
			n.detachMoved(st, topic, first, g)
			n.mu.Unlock()
			return
		}
		if !slices.Contains(p.Lost, self) {
			// A vouch holds for one time lost only.
			n.vouched.Delete(raft3Name(topic, first))
		}
		log := n.cfg.Logger.With("topic", topic, "group", first)
		step, err := replica.Rejoin(g, self, p.Replicas, p.Lost)
		for _, d := range step.Did {
			log.Info("Raft3 membership: "+d, "lost", p.Lost)
		}
		if err != nil && n.ctx.Err() == nil {
			log.Warn("Raft3 membership not brought to the placement", "lost", p.Lost, "err", err)
		}
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		defer cancel()
		for _, id := range step.Vouch {
			if err := n.vouch(ctx, id, topic, first); err != nil && n.ctx.Err() == nil {
				log.Debug("lost Raft3 replica not told that this leader's entries may be taken", "node", id, "err", err)
			}
		}
		if !step.CaughtUp {
			return
		}
		if _, err := n.agent.Propose(ctx, metastate.Rejoined{Topic: topic, Partition: first, Node: self, Incarnation: n.inc}); err != nil {
			log.Warn("Raft3 replica caught up, not recorded as rejoined", "err", err)
			return
		}
		log.Info("Raft3 replica rejoined its group as a new server")
	})
}

// OpRaft3Vouch tells a node that its lost replica of a Raft3 group may take
// the caller's entries: the caller leads the group, and its committed
// configuration has the replica as a nonvoter (replica.RejoinStep.Vouch).
// The request: a version byte (1), the topic (uvarint length and bytes),
// then the group's first partition as a uvarint. The reply is empty.
const OpRaft3Vouch = remote.FirstOp + 91

const raft3VouchVersion = 1

// AppendRaft3Vouch appends an OpRaft3Vouch request to dst.
func AppendRaft3Vouch(dst []byte, topic string, first int) []byte {
	return appendTopicRequest(dst, raft3VouchVersion, topic, uint64(first))
}

func decodeRaft3Vouch(b []byte) (topic string, first int, err error) {
	var vs [1]uint64
	if topic, err = decodeTopicRequest(b, raft3VouchVersion, vs[:]); err != nil || vs[0] >= metastate.MaxPartitions {
		return "", 0, errRequestFormat
	}
	return topic, int(vs[0]), nil
}

// vouch tells node id that its lost replica of topic's group first may
// take this node's entries.
func (n *Node) vouch(ctx context.Context, id, topic string, first int) error {
	c, err := n.agent.Peer(id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = c.Call(ctx, OpRaft3Vouch, AppendRaft3Vouch(nil, topic, first))
	return err
}

// raft3Vouch serves OpRaft3Vouch to node peer, which must be a replica the
// group's placement names, as this node's state shows: its replica here
// then takes peer's entries while it is lost (vouchedBy).
func (n *Node) raft3Vouch(_ context.Context, peer string, req []byte) ([]byte, error) {
	if n.started.Load() == nil {
		return nil, errStarting
	}
	topic, first, err := decodeRaft3Vouch(req)
	if err != nil {
		return nil, err
	}
	st := n.agent.Meta().State()
	t, _ := st.Topic(topic)
	p, ok := st.Partition(topic, first)
	if !ok || t.Type != metastate.TypeRaft3 || p.Chunk != first || !slices.Contains(p.Replicas, peer) || peer == n.agent.ID() {
		return nil, n.refuse(peer, fmt.Sprintf("vouch\x00%s/%d", topic, first),
			fmt.Errorf("%w: %s is no other replica of the Raft3 group %s/%d", cluster.ErrDenied, peer, topic, first))
	}
	n.vouched.Store(raft3Name(topic, first), peer)
	return nil, nil
}

// vouchedBy reports whether leader last vouched for this node's lost
// replica of the raft group name (OpRaft3Vouch).
func (n *Node) vouchedBy(name, leader string) bool {
	v, ok := n.vouched.Load(name)
	return ok && v.(string) == leader
}
