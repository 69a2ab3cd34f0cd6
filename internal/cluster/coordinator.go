package cluster

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/faultinject"
	"github.com/zeze-go/mq/internal/metastate"
)

// Coordinator divides the partitions of consumer groups among their
// consumers on every node, as the metadata group assigns them. It is the
// delivery engine's coordinator on a node of a cluster, both
// internal/delivery's Coordinator and its Stopper:
//
//   - Share, called by the engine with the group's consumers on this node,
//     gives each the partitions the metadata group assigns its member,
//     minus those being revoked from it. While the node's session may have
//     expired, because the node is cut from the metadata leader or the
//     metadata group has no quorum, it gives only those its workers run
//     already: the data paths that exist go on, nothing new starts;
//   - its loop makes the metadata group's members follow this node's
//     consumers (JoinGroup, LeaveGroup), proposes Released for a partition
//     being revoked once the engine reported it Stopped, after the old
//     owner's last commit, and asks the engine to rebalance the groups'
//     topics when the state changes.
//
// So a partition is delivered on at most one node at a time: the new
// owner's node gets it only after the old owner released it or its node was
// marked down, and even then its worker claims it only once the old
// owner's lease at the partition lapsed or was let go (Lease, the delivery
// engine's Leaser). A node marked down while it still reaches the
// partition keeps delivering it, renewing its lease, until it learns that
// it was marked down. Offsets stay fenced by the store's claims.
type Coordinator struct {
	agent     *Agent
	rebalance func(topic string)

	mu     sync.Mutex // guards groups
	groups map[metastate.GroupKey]*localGroup
	kick   chan struct{} // a token: the loop has work
}

// localGroup is what this node's consumers of one group are.
type localGroup struct {
	members []uint64     // the engine's consumer IDs, in join order
	running map[int]bool // partitions Share gave and the engine did not report Stopped
}

// NewCoordinator returns the coordinator of agent's node; rebalance asks
// the delivery engine to reassign a topic's groups, which calls Share.
func NewCoordinator(agent *Agent, rebalance func(topic string)) *Coordinator {
	return &Coordinator{agent: agent, rebalance: rebalance, groups: map[metastate.GroupKey]*localGroup{},
		kick: make(chan struct{}, 1)}
}

func (c *Coordinator) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// member is the metadata group's name of consumer id of this node.
func (c *Coordinator) member(id uint64) string { return MemberName(c.agent.ID(), id) }

// Share implements the delivery engine's Coordinator.
func (c *Coordinator) Share(topic, group string, members []uint64, partitions int) [][]int {
	st := c.agent.Meta().State()
	valid := c.agent.SessionValid()
	c.mu.Lock()
	defer c.mu.Unlock()
	k := metastate.GroupKey{Topic: topic, Group: group}
	lg := c.groups[k]
	if lg == nil {
		lg = &localGroup{running: map[int]bool{}}
		c.groups[k] = lg
	}
	if !slices.Equal(lg.members, members) {
		lg.members = slices.Clone(members)
		c.wake()
	}
	out := make([][]int, len(members))
	g, _ := st.Group(topic, group)
	for i, id := range members {
		name := c.member(id)
		if m, ok := g.Members[name]; !ok || m.Node != c.agent.ID() {
			continue // not this node's member, or not yet
		}
		_, parts := st.Assignment(topic, group, name)
		if faultinject.ShareOwnership.Load() {
			parts = make([]int, partitions)
			for p := range parts {
				parts[p] = p
			}
		}
		_, revoking := st.Revoking(topic, group, name)
		for _, p := range parts {
			if p < partitions && !slices.Contains(revoking, p) && (valid || lg.running[p]) {
				out[i] = append(out[i], p)
				lg.running[p] = true
			}
		}
	}
	return out
}

// Lease implements the delivery engine's Leaser: half the session
// timeout, so that a node that died has let go of its partitions before the
// leader marks it down and gives them to others.
func (c *Coordinator) Lease() time.Duration { return c.agent.timeout / 2 }

// Stopped implements the delivery engine's Stopper.
func (c *Coordinator) Stopped(topic, group string, part int) {
	c.mu.Lock()
	if lg := c.groups[metastate.GroupKey{Topic: topic, Group: group}]; lg != nil {
		delete(lg.running, part)
	}
	c.mu.Unlock()
	c.wake()
}

// Run makes the metadata group follow this node's consumers until ctx
// ends; see Coordinator.
func (c *Coordinator) Run(ctx context.Context) {
	tick := time.NewTicker(max(c.agent.timeout/10, 10*time.Millisecond))
	defer tick.Stop()
	valid, last := false, uint64(0)
	for {
		st := c.agent.Meta().State()
		topics := c.reconcile(ctx, st)
		if v := c.agent.SessionValid(); v != valid || st.Index() != last {
			valid, last = v, st.Index()
			for _, t := range topics {
				c.rebalance(t)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-st.Changed():
		case <-c.kick:
		case <-tick.C:
		}
	}
}

// step is one proposal reconcile makes.
type step struct {
	key metastate.GroupKey
	cmd metastate.Command
}

// reconcile proposes what makes the metadata group's members and
// revocations match this node's consumers, and returns the topics whose
// groups should be rebalanced here, since the state may give them other
// partitions. A member whose consumer closed leaves its group only once
// none of its partitions runs here any more, so that the group moves them
// after their last commit; members of this node that no consumer here
// stands for, left by a process that ended without leaving, leave at once.
// Each proposal waits at most until this node's session may expire, so a
// node cut from the leader stops delivering in time (see Run).
func (c *Coordinator) reconcile(ctx context.Context, st *metastate.State) []string {
	self := c.agent.ID()
	var steps []step
	var topics []string
	c.mu.Lock()
	for k, lg := range c.groups {
		if !slices.Contains(topics, k.Topic) {
			topics = append(topics, k.Topic)
		}
		g, _ := st.Group(k.Topic, k.Group)
		want := map[string]bool{}
		for _, id := range lg.members {
			name := c.member(id)
			want[name] = true
			if _, ok := g.Members[name]; !ok {
				steps = append(steps, step{k, metastate.JoinGroup{Topic: k.Topic, Group: k.Group, Member: name, Node: self}})
			}
			gen, revoking := st.Revoking(k.Topic, k.Group, name)
			for _, p := range revoking {
				if !lg.running[p] {
					steps = append(steps, step{k, metastate.Released{Topic: k.Topic, Group: k.Group, Partition: p, Member: name, Generation: gen}})
				}
			}
		}
		for name, m := range g.Members {
			if m.Node != self || want[name] {
				continue
			}
			_, owned := st.Assignment(k.Topic, k.Group, name)
			if slices.ContainsFunc(owned, func(p int) bool { return lg.running[p] }) {
				continue // its worker is still on a partition: leave after its last commit
			}
			steps = append(steps, step{k, metastate.LeaveGroup{Topic: k.Topic, Group: k.Group, Member: name}})
		}
		if len(lg.members) == 0 && len(lg.running) == 0 && !hasMemberOn(g, self) {
			delete(c.groups, k)
		}
	}
	for _, k := range st.GroupsOn(self) {
		if _, local := c.groups[k]; local {
			continue
		}
		g, _ := st.Group(k.Topic, k.Group)
		for name, m := range g.Members {
			if m.Node == self {
				steps = append(steps, step{k, metastate.LeaveGroup{Topic: k.Topic, Group: k.Group, Member: name}})
			}
		}
	}
	c.mu.Unlock()
	for _, s := range steps {
		deadline := c.agent.SessionDeadline()
		if !time.Now().Before(deadline) {
			break // the session may have expired: nothing is proposed, and the workers that run go on under their leases
		}
		pctx, cancel := context.WithDeadline(ctx, deadline)
		_, err := c.agent.Propose(pctx, s.cmd)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, metastate.ErrNoTopic) {
			c.agent.log.Debug("group coordination", "topic", s.key.Topic, "group", s.key.Group, "err", err)
		}
	}
	return topics
}

func hasMemberOn(g metastate.ConsumerGroup, node string) bool {
	for _, m := range g.Members {
		if m.Node == node {
			return true
		}
	}
	return false
}
