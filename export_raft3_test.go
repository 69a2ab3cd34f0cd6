package mq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/node"
	"github.com/zeze-go/mq/internal/replica"
)

// Hooks of the Raft3 tests (raft3_failover_test.go and others).

// Raft3Leader returns the leader of partition i of Raft3 topic as m's
// replica knows it ("" while none is known), and whether m holds a
// replica of that partition at all.
func Raft3Leader(m *MQ, topic string, i int) (leader string, holds bool) {
	t, ok := m.topics.Get(topic)
	if !ok || i < 0 || i >= len(t.Parts) {
		return "", false
	}
	r, ok := t.Parts[i].(*replica.Partition)
	if !ok || r.RaftGroup() == nil {
		return "", false
	}
	_, id := r.RaftGroup().Leader()
	return string(id), true
}

// HoldAdmin keeps m's topic table from following the metadata (its node's
// sync) until release.
func HoldAdmin(m *MQ) (release func()) { return m.cluster.HoldSync() }

// Served is what m's partition service finds for a call to partition i of
// topic from another node.
func Served(m *MQ, topic string, i int) error {
	_, err := m.cluster.Served(topic, i)
	if errors.Is(err, node.ErrNoTopic) {
		return fmt.Errorf("%w: %w", ErrNoTopic, err)
	}
	return err
}

// Raft3Membership returns what m's metadata state records of the replicas
// of partition i of Raft3 topic that are lost (metastate.Partition.Lost),
// and the voters of m's replica's raft configuration (nil when m holds
// none).
func Raft3Membership(m *MQ, topic string, i int) (lost, voters []string) {
	if p, ok := m.cluster.Agent().Meta().State().Partition(topic, i); ok {
		lost = p.Lost
	}
	t, ok := m.topics.Get(topic)
	if !ok || i < 0 || i >= len(t.Parts) {
		return lost, nil
	}
	r, ok := t.Parts[i].(*replica.Partition)
	if !ok || r.RaftGroup() == nil {
		return lost, nil
	}
	f := r.RaftGroup().Raft().GetConfiguration()
	if f.Error() != nil {
		return lost, nil
	}
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, string(s.ID))
		}
	}
	slices.Sort(voters)
	return lost, voters
}

// Raft3Indexes returns the last log index and the commit index of m's
// replica of partition i of Raft3 topic, 0, 0 when m holds none.
func Raft3Indexes(m *MQ, topic string, i int) (last, commit uint64) {
	t, ok := m.topics.Get(topic)
	if !ok || i < 0 || i >= len(t.Parts) {
		return 0, 0
	}
	r, ok := t.Parts[i].(*replica.Partition)
	if !ok || r.RaftGroup() == nil {
		return 0, 0
	}
	st := r.RaftGroup().Raft().Stats()
	last, _ = strconv.ParseUint(st["last_log_index"], 10, 64)
	commit, _ = strconv.ParseUint(st["commit_index"], 10, 64)
	return last, commit
}

// Raft3TransferTo has m's replica of partition i of Raft3 topic, which
// must lead, hand its leadership to node to.
func Raft3TransferTo(m *MQ, topic string, i int, to string) error {
	t, ok := m.topics.Get(topic)
	if !ok || i < 0 || i >= len(t.Parts) {
		return ErrNoTopic
	}
	r, ok := t.Parts[i].(*replica.Partition)
	if !ok || r.RaftGroup() == nil {
		return fmt.Errorf("no replica of %s/%d here", topic, i)
	}
	return r.RaftGroup().Raft().LeadershipTransferToServer(raft.ServerID(to), raft.ServerAddress(to)).Error()
}

// Raft3Term returns the current raft term of m's replica of partition i
// of Raft3 topic, 0 when m holds none.
func Raft3Term(m *MQ, topic string, i int) uint64 {
	t, ok := m.topics.Get(topic)
	if !ok || i < 0 || i >= len(t.Parts) {
		return 0
	}
	r, ok := t.Parts[i].(*replica.Partition)
	if !ok || r.RaftGroup() == nil {
		return 0
	}
	return r.RaftGroup().Raft().CurrentTerm()
}

// PairHandOver has m, the leader of DoubleWrite topic's pair of partition
// i, swap with its follower to (replica.Pair.HandOver), as BalanceLeaders
// does.
func PairHandOver(ctx context.Context, m *MQ, topic string, i int, to string) error {
	t, ok := m.topics.Get(topic)
	if !ok || i < 0 || i >= len(t.Parts) {
		return ErrNoTopic
	}
	r, ok := t.Parts[i].(*replica.Partition)
	if !ok || r.Pair() == nil {
		return fmt.Errorf("no pair of %s/%d here", topic, i)
	}
	return r.Pair().HandOver(ctx, to)
}
