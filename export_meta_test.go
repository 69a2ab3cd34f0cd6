package mq

import (
	"context"
	"slices"
	"strconv"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/node"
)

// Hooks of the tests of the metadata group (cluster_wipe_test.go).

// MetaVoters returns the voters of the raft configuration of m's metadata
// replica, sorted.
func MetaVoters(m *MQ) []string {
	f := m.cluster.Agent().Meta().Raft().GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var voters []string
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, string(s.ID))
		}
	}
	slices.Sort(voters)
	return voters
}

// MetaIndexes returns the last log index and the commit index of m's
// metadata replica.
func MetaIndexes(m *MQ) (last, commit uint64) {
	st := m.cluster.Agent().Meta().Raft().Stats()
	last, _ = strconv.ParseUint(st["last_log_index"], 10, 64)
	commit, _ = strconv.ParseUint(st["commit_index"], 10, 64)
	return last, commit
}

// MetaMayVote reports whether m's metadata replica votes and campaigns.
func MetaMayVote(m *MQ) bool { return m.cluster.Agent().Meta().MayVote() }

// MetaHasTopic reports whether m's metadata state holds topic.
func MetaHasTopic(m *MQ, topic string) bool {
	_, ok := m.cluster.Agent().Meta().State().Topic(topic)
	return ok
}

// HoldMoves has each node a Single partition moves to call hold once it
// holds the copy, before it ends the move; nil removes it.
func HoldMoves(hold func(ctx context.Context, node string)) { node.SetMoveHold(hold) }
