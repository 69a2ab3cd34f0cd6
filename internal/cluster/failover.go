package cluster

import (
	"context"
	"errors"
	"slices"
)

// failover, on the metadata leader, acts for the DoubleWrite pairs that
// have a node marked down (its session expired): a pair whose leader is
// down is led by its follower if that one is up and in sync (Promote);
// one whose follower is down gets a new one if a node is free
// (ReplaceFollower). A pair whose leader is down and whose follower is out
// of sync is left as it is: that follower may lack acked batches, and is
// never promoted automatically. Each proposal carries the version it read,
// so one that lost a race (ErrStale) changes nothing, and the next tick
// looks at the new record.
func (m *Meta) failover(ctx context.Context) {
	s := m.State()
	for _, name := range s.Topics() {
		t, _ := s.Topic(name)
		if t.Type != TypeDoubleWrite {
			continue
		}
		for i, p := range t.Parts {
			if p.Chunk != i {
				continue // the record of its chunk's first partition, changed with it
			}
			f := p.Follower()
			leader, _ := s.Node(p.Leader)
			follower, _ := s.Node(f)
			var c Command
			switch {
			case !leader.Up && follower.Up && slices.Contains(p.InSync, f):
				c = Promote{Topic: name, Partition: i, Version: p.Version, Leader: f}
			case leader.Up && !follower.Up && s.leastLoaded(p.Leader, f) != "":
				c = ReplaceFollower{Topic: name, Partition: i, Version: p.Version}
			default:
				continue
			}
			if _, err := m.Propose(ctx, c); err != nil && !errors.Is(err, ErrStale) {
				m.log.Warn("DoubleWrite failover not recorded", "topic", name, "partition", i, "command", c, "err", err)
				continue
			}
			m.log.Info("DoubleWrite failover", "topic", name, "partition", i, "command", c)
		}
	}
}
