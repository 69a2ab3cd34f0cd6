package mq

import (
	"context"

	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/store"
)

// Hooks of the hostile review's tests: what a node that skips its own
// checks does with its own partitions and its agent.

// ApplyCmd applies cmd to partition i of topic as m's table has it: on a
// partition stored on m, with no check at all, as a hostile node may.
func ApplyCmd(ctx context.Context, m *MQ, topic string, i int, cmd *store.Command) (store.Result, error) {
	t, err := m.topic(topic)
	if err != nil {
		return store.Result{}, err
	}
	return t.Parts[i].Apply(ctx, cmd)
}

// PartitionDecision is the decision partition i of topic, as m's table
// reaches it, records for txid.
func PartitionDecision(m *MQ, topic string, i int, txid string) (store.Decision, error) {
	t, err := m.topic(topic)
	if err != nil {
		return store.Undecided, err
	}
	return t.Parts[i].Decision(txid)
}

// CheckTxAs is m's agent asking node to check txid back in parts.
func CheckTxAs(ctx context.Context, m *MQ, node, txid string, parts []cluster.PartRef) (store.Decision, error) {
	return m.cluster.Agent().CheckTx(ctx, node, txid, parts)
}
