package mq

import (
	"errors"
	"fmt"

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
