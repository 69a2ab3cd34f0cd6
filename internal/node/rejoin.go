package node

import (
	"context"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/replica"
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
