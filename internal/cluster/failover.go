package cluster

import (
	"context"
	"errors"
	"slices"

	"github.com/zeze-go/mq/internal/metastate"
)

// failover, on the metadata leader, acts for the DoubleWrite pairs that
// have a node marked down, its session expired: a pair whose leader is
// down is led by its follower if that one is up and in sync (Promote);
// one whose follower is down gets a new one if a node is free
// (ReplaceFollower). A pair whose leader is down and whose follower is out
// of sync is left as it is: that follower may lack acked batches, and is
// never promoted automatically, nor is a follower replaced while the
// leader's own copy is lost (no replica in sync: AcceptLoss is an
// operator's). Each proposal carries the version it read,
// so one that lost a race (ErrStale) changes nothing, and the next tick
// looks at the new record.
func (m *Meta) failover(ctx context.Context) {
	m.movePairs(ctx, "failover", func(s *metastate.State, name string, i int, p metastate.Partition) metastate.Command {
		f := p.Follower()
		leader, _ := s.Node(p.Leader)
		follower, _ := s.Node(f)
		switch {
		case !leader.Up && follower.Up && slices.Contains(p.InSync, f):
			return metastate.Promote{Topic: name, Partition: i, Version: p.Version, Leader: f}
		case leader.Up && !follower.Up && len(p.InSync) > 0 && s.LeastLoaded(p.Leader, f) != "":
			// With no replica in sync (the leader's copy lost) the
			// follower, down, may hold the only copy: an operator decides.
			return metastate.ReplaceFollower{Topic: name, Partition: i, Version: p.Version}
		}
		return nil
	})
}

// promoteFrom promotes the in-sync follower, when up, of every DoubleWrite
// pair node leads, once the leader's probe confirmed a report of node.
func (m *Meta) promoteFrom(ctx context.Context, node string) {
	m.movePairs(ctx, "hand-off of a reported leader", func(s *metastate.State, name string, i int, p metastate.Partition) metastate.Command {
		f := p.Follower()
		follower, _ := s.Node(f)
		if p.Leader != node || f == "" || f == node || !follower.Up || !slices.Contains(p.InSync, f) {
			return nil
		}
		return metastate.Promote{Topic: name, Partition: i, Version: p.Version, Leader: f}
	})
}

// movePairs is moveGroups of the DoubleWrite pairs.
func (m *Meta) movePairs(ctx context.Context, what string, decide func(s *metastate.State, topic string, i int, p metastate.Partition) metastate.Command) {
	m.moveGroups(ctx, metastate.TypeDoubleWrite, what, decide)
}

// moveGroups proposes, for each raft group, pair or partition of the
// topics of type typ, the command decide returns for it, if any. decide
// sees the record of the chunk's first partition, which a command changes
// for the whole chunk. A proposal that lost a race (ErrStale) changes
// nothing; others failing are logged.
func (m *Meta) moveGroups(ctx context.Context, typ uint8, what string, decide func(s *metastate.State, topic string, i int, p metastate.Partition) metastate.Command) {
	s := m.State()
	for _, name := range s.Topics() {
		t, _ := s.Topic(name)
		if t.Type != typ {
			continue
		}
		for i, p := range t.Parts {
			if p.Chunk != i {
				continue
			}
			c := decide(s, name, i, p)
			if c == nil {
				continue
			}
			if _, err := m.Propose(ctx, c); err != nil && !errors.Is(err, metastate.ErrStale) {
				m.log.Warn(what+" not recorded", "type", typ, "topic", name, "partition", i, "command", c, "err", err)
				continue
			}
			m.log.Info(what, "type", typ, "topic", name, "partition", i, "command", c)
		}
	}
}
