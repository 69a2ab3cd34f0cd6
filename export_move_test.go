package mq

import (
	"context"

	"github.com/zeze-go/mq/internal/node"
)

// PartitionVersion returns the version of topic/part's record as m's state shows it.
func PartitionVersion(m *MQ, topic string, part int) uint64 {
	p, ok := m.cluster.Agent().Meta().State().Partition(topic, part)
	if !ok {
		return 0
	}
	return p.Version
}

// MoveFetchRequest encodes an OpMoveFetch request.
func MoveFetchRequest(topic string, part int, version, offset uint64) []byte {
	return node.AppendMoveFetch(nil, topic, part, version, offset)
}

// CallMoveFetch sends req as OpMoveFetch from m's node to node peer.
func CallMoveFetch(ctx context.Context, m *MQ, peer string, req []byte) ([]byte, error) {
	c, err := m.cluster.Agent().Peer(peer)
	if err != nil {
		return nil, err
	}
	return c.Call(ctx, node.OpMoveFetch, req)
}
