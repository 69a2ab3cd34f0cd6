package cluster

import (
	"context"
	"errors"
	"slices"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
)

// drain, on the metadata leader, moves the replicas of draining nodes
// (metastate.Node.Draining) to others, one step per group and tick, each
// step only from a whole group: a DoubleWrite pair a draining node leads
// goes to its follower once that one is in sync and up (Promote, which
// gives it a new follower by load, never a draining node); a pair it
// follows, once both are in sync, gets a new follower (MoveReplica), its
// leader alone in sync until that one caught up; a Raft3 group with a
// replica on it, none of its replicas lost, moves that replica
// (MoveReplica) to a new server, which rejoins as a lost replica does; a
// Single partition on it moves with its data (MoveReplica), and a move to
// a node that went down or is draining is retargeted.
func (m *Meta) drain(ctx context.Context) {
	s := m.State()
	var draining []string
	for _, nd := range s.Nodes() {
		if nd.Draining {
			draining = append(draining, nd.ID)
		}
	}
	if len(draining) == 0 {
		return
	}
	m.movePairs(ctx, "drain", func(s *metastate.State, name string, i int, p metastate.Partition) metastate.Command {
		f := p.Follower()
		follower, _ := s.Node(f)
		leader, _ := s.Node(p.Leader)
		switch {
		case slices.Contains(draining, p.Leader) && follower.Up && !follower.Draining && slices.Contains(p.InSync, f):
			return metastate.Promote{Topic: name, Partition: i, Version: p.Version, Leader: f}
		case slices.Contains(draining, f) && leader.Up && len(p.InSync) == 2 && s.LeastLoaded(p.Replicas...) != "":
			return metastate.MoveReplica{Topic: name, Partition: i, Version: p.Version, From: f}
		}
		return nil
	})
	m.moveGroups(ctx, metastate.TypeRaft3, "drain", func(s *metastate.State, name string, i int, p metastate.Partition) metastate.Command {
		if len(p.Lost) > 0 || !s.AllUp(p.Replicas) || s.LeastLoaded(p.Replicas...) == "" {
			return nil // a move runs on the group's other replicas, one at a time
		}
		for _, from := range p.Replicas {
			if slices.Contains(draining, from) {
				return metastate.MoveReplica{Topic: name, Partition: i, From: from}
			}
		}
		return nil
	})
	m.moveGroups(ctx, metastate.TypeSingle, "drain", func(s *metastate.State, name string, i int, p metastate.Partition) metastate.Command {
		owner, _ := s.Node(p.Replicas[0])
		switch {
		case !owner.Up || s.LeastLoaded(p.Replicas...) == "":
		case len(p.Replicas) == 1 && slices.Contains(draining, owner.ID):
			return metastate.MoveReplica{Topic: name, Partition: i, Version: p.Version, From: owner.ID}
		case len(p.Replicas) == 2:
			// A move to a node that went down, or is draining, goes
			// elsewhere.
			if to, _ := s.Node(p.Replicas[1]); !to.Up || to.Draining {
				return metastate.MoveReplica{Topic: name, Partition: i, Version: p.Version, From: p.Replicas[1]}
			}
		}
		return nil
	})
}

// reconcileMembers, on the metadata leader, brings the metadata group's
// configuration to the state's nodes: a node registered and up that is
// no server is added (its change was lost with a leader), servers whose
// node the state no longer has (metastate.RemoveNode) are removed, and
// nonvoters that are up are made voters while the group has fewer than
// MaxVoters, counting those AddNode added that the configuration does not
// show yet.
func (m *Meta) reconcileMembers(ctx context.Context) {
	cf := m.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	// A node registers before it joins the configuration, so a state
	// that applied every entry of the leader's log before the
	// configuration has every member that joined: a new leader waits for
	// its FSM first (Barrier), once per term.
	if term := m.raft.CurrentTerm(); m.barrierTerm != term {
		if err := m.wait(ctx, func() raft.Future { return m.raft.Barrier(enqueueTimeout(ctx)) }); err != nil {
			return
		}
		m.barrierTerm = term
	}
	s := m.State()
	var promote []raft.Server
	in := map[string]bool{}
	for _, srv := range cf.Configuration().Servers {
		in[string(srv.ID)] = true
	}
	for _, nd := range s.Nodes() {
		if in[nd.ID] || !nd.Up || nd.ID == m.id {
			continue
		}
		// Registered, and its configuration change lost with a leader
		// (AddNode does not wait for it): a nonvoter, made a voter below.
		addr := raft.ServerAddress(nd.Addr)
		if m.raftAddr != nil {
			addr = m.raftAddr(nd.ID, nd.Addr)
		}
		err := m.wait(ctx, func() raft.Future { return m.raft.AddNonvoter(raft.ServerID(nd.ID), addr, 0, enqueueTimeout(ctx)) })
		if err != nil {
			m.log.Warn("registered node not added to the metadata group", "node", nd.ID, "err", err)
		}
		return // again with the new configuration
	}
	for _, srv := range cf.Configuration().Servers {
		id := string(srv.ID)
		nd, ok := s.Node(id)
		switch {
		case !ok && id != m.id:
			err := m.wait(ctx, func() raft.Future { return m.raft.RemoveServer(srv.ID, 0, enqueueTimeout(ctx)) })
			if err != nil {
				m.log.Warn("a removed node is still a member of the metadata group", "node", id, "err", err)
			} else {
				m.log.Info("removed node left the metadata group", "node", id)
			}
		case srv.Suffrage == raft.Voter:
		case ok && nd.Up:
			promote = append(promote, srv)
		}
	}
	// The promotions are chosen under m.members, their places reserved
	// (pending), then waited for without it.
	m.members.Lock()
	voters := m.votersLocked(m.raft.GetConfiguration().Configuration())
	var chosen []raft.Server
	for _, srv := range promote {
		if voters >= MaxVoters {
			break
		}
		m.addPendingLocked(ctx, srv.ID)
		chosen = append(chosen, srv)
		voters++
	}
	m.members.Unlock()
	for _, srv := range chosen {
		err := m.wait(ctx, func() raft.Future { return m.raft.AddVoter(srv.ID, srv.Address, 0, enqueueTimeout(ctx)) })
		if err != nil {
			for _, c := range chosen {
				m.dropPending(c.ID)
			}
			if !errors.Is(err, context.Canceled) {
				m.log.Warn("metadata nonvoter not made a voter", "node", srv.ID, "err", err)
			}
			return
		}
	}
}
