package mq

import (
	"context"

	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
)

// Hooks of the review's tests (cluster_review_test.go): a node's port, and
// its agent's Propose as a (possibly hostile) node would call it.

// ReviewSetLinkDown cuts (or restores) m's side of its link to node peer.
func ReviewSetLinkDown(m *MQ, peer string, down bool) {
	m.cluster.agent.Transport().SetLinkDown(peer, down)
}

// ReviewPropose proposes c through m's agent, as node m: what any node
// knowing the secret can send to the metadata leader.
func ReviewPropose(ctx context.Context, m *MQ, c cluster.Command) (cluster.Result, error) {
	return m.cluster.agent.Propose(ctx, c)
}

// ReviewGroup is the metadata group's record of a consumer group, as m sees it.
func ReviewGroup(m *MQ, topic, group string) (cluster.Group, bool) {
	return m.cluster.agent.Meta().State().Group(topic, group)
}

// ReviewRemotePartition is partition i of topic on node, reached from m
// straight through the RPC partition service (as any node knowing the
// secret may), not through m's producer or consumer API.
func ReviewRemotePartition(m *MQ, node, topic string, i int) (partition.Partition, error) {
	c, err := m.cluster.agent.Peer(node)
	if err != nil {
		return nil, err
	}
	return remote.NewPartition(c, topic, i, remote.PartitionConfig{}), nil
}
