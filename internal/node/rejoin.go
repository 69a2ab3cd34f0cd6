package node

import (
	"context"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/raftqueue"
)

// rejoinEvery is how often the node brings its Raft3 groups' raft
// configurations to their placement (replica.Rejoin).
const rejoinEvery = 500 * time.Millisecond

// lostOf returns the lost replicas of the Raft3 group of topic whose first
// partition is first (metastate.Partition.Lost): their nodes came back as
// new incarnations, and they have not rejoined yet.
func (n *Node) lostOf(topic string, first int) []string {
	p, _ := n.agent.Meta().State().Partition(topic, first)
	return p.Lost
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
		log := n.cfg.Logger.With("topic", topic, "group", first)
		caughtUp, did, err := replica.Rejoin(g, self, p.Replicas, p.Lost)
		for _, d := range did {
			log.Info("Raft3 membership: "+d, "lost", p.Lost)
		}
		if err != nil && n.ctx.Err() == nil {
			log.Warn("Raft3 membership not brought to the placement", "lost", p.Lost, "err", err)
		}
		if !caughtUp {
			return
		}
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		defer cancel()
		if _, err := n.agent.Propose(ctx, metastate.Rejoined{Topic: topic, Partition: first, Node: self, Incarnation: n.inc}); err != nil {
			log.Warn("Raft3 replica caught up, not recorded as rejoined", "err", err)
			return
		}
		log.Info("Raft3 replica rejoined its group as a new server")
	})
}
