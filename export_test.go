package mq

import (
	"context"
	"time"

	"github.com/zeze-go/mq/internal/faultinject"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/store"
)

// Hooks for the external tests of package mq_test.

// WithMaterializeAfter keeps what partitions log out of their files for d
// (store.Options.MaterializeAfter): a crash within d leaves every
// acknowledged command only in the write-ahead log.
func WithMaterializeAfter(d time.Duration) Option {
	return func(c *config) error {
		c.materializeAfter = d
		return nil
	}
}

// WithPairCompaction compacts the logs of DoubleWrite replicas every
// `every` applied entries, keeping `keep`
// (raftqueue.PairConfig.CompactEvery, KeepEntries).
func WithPairCompaction(every, keep int) Option {
	return func(c *config) error {
		c.pairCompactEvery, c.pairKeepEntries = every, keep
		return nil
	}
}

// TxDecided returns the decision recorded for txid in any partition of m,
// without changing anything.
func TxDecided(m *MQ, txid string) TxDecision {
	return txDecision(m.cfg.tx.node.Decided(context.Background(), txid))
}

// PendingTxs counts the transactions with undecided half messages in m.
func PendingTxs(m *MQ) (int, error) {
	n, err := m.cfg.tx.node.Pending()
	return n, translate(err)
}

// WithInSyncHook runs f before each proposal of m's DoubleWrite leaders
// to record replicas in sync, inSync: an error f returns fails it
// (node.Config.InSyncHook).
func WithInSyncHook(f func(inSync []string) error) Option {
	return func(c *config) error {
		c.inSyncHook = f
		return nil
	}
}

// WithTxTestHook makes f run at the named points of the life of the node's
// transactions (see txn.Config.TestHook). The crash-test children set it.
func WithTxTestHook(f func(point, txid string)) Option {
	return func(c *config) error {
		c.tx.testHook = f
		return nil
	}
}

// PartitionNode returns the node that partition i of topic is placed on,
// as m's table of the cluster has it ("" when m does not know it).
func PartitionNode(m *MQ, topic string, i int) string {
	if m.cluster == nil {
		return ""
	}
	pl, ok := m.cluster.Agent().Meta().State().Partition(topic, i)
	if !ok || len(pl.Replicas) == 0 {
		return ""
	}
	return pl.Replicas[0]
}

// ApplyAt appends msg to partition i of topic as m's table has it, without
// the checks a Producer makes where the call starts (the node's own ACL
// check): what a node that skips them could ask of another's partition.
func ApplyAt(ctx context.Context, m *MQ, topic string, i int, msg *Message) error {
	t, err := m.topic(topic)
	if err != nil {
		return err
	}
	cmd := &store.Command{Op: store.OpAppend, Msgs: []store.Message{toStore(msg)}}
	_, err = t.Parts[i].Apply(ctx, cmd)
	return translate(err)
}

// Hooks of the cluster's fault tests (cluster_faults_test.go and others): a
// node's links, and its agent's Propose as a (possibly hostile) node would
// call it.

// SetLinkDown cuts (or restores) m's side of its link to node peer.
func SetLinkDown(m *MQ, peer string, down bool) {
	m.cluster.Agent().Transport().SetLinkDown(peer, down)
}

// SetLinkMuted stalls what m writes to peer while muted, cutting their
// link one way (transport.SetLinkMuted).
func SetLinkMuted(m *MQ, peer string, muted bool) {
	m.cluster.Agent().Transport().SetLinkMuted(peer, muted)
}

// SessionValid reports whether m's own process holds a session the
// metadata leader acknowledged within the session timeout.
func SessionValid(m *MQ) bool {
	return m.cluster.Agent().SessionValid()
}

// Propose proposes c through m's agent, as node m: what any node
// knowing the secret can send to the metadata leader.
func Propose(ctx context.Context, m *MQ, c metastate.Command) (metastate.Result, error) {
	return m.cluster.Agent().Propose(ctx, c)
}

// GroupRecord is the metadata group's record of a consumer group, as m sees it.
func GroupRecord(m *MQ, topic, group string) (metastate.ConsumerGroup, bool) {
	return m.cluster.Agent().Meta().State().Group(topic, group)
}

// RemotePartition is partition i of topic on node, reached from m
// straight through the RPC partition service (as any node knowing the
// secret may), not through m's producer or consumer API.
func RemotePartition(m *MQ, node, topic string, i int) (partition.Partition, error) {
	c, err := m.cluster.Agent().Peer(node)
	if err != nil {
		return nil, err
	}
	return remote.NewPartition(c, topic, i, remote.PartitionConfig{}), nil
}

// PairReplica returns how many times node m's replica of the pair of
// partition part of DoubleWrite topic has compacted its log and installed
// a snapshot of its leader's (-1, -1 without a replica there).
func PairReplica(m *MQ, topic string, part int) (compactions, installs int64) {
	t, ok := m.topics.Get(topic)
	if !ok || part < 0 || part >= len(t.Parts) {
		return -1, -1
	}
	d, ok := t.Parts[part].(*replica.Partition)
	if !ok || d.Pair() == nil || d.Pair().Replica() == nil {
		return -1, -1
	}
	r := d.Pair().Replica()
	return r.Compactions(), r.Installs()
}

// PairRecord returns the metadata record of partition part of topic as node
// m sees it: its leader, replicas, in-sync replicas and epoch.
func PairRecord(m *MQ, topic string, part int) (leader string, replicas, inSync []string, epoch uint64) {
	p, ok := m.cluster.Agent().Meta().State().Partition(topic, part)
	if !ok {
		return "", nil, nil, 0
	}
	return p.Leader, p.Replicas, p.InSync, p.Epoch
}

// BreakAcks makes every replicated partition opened from now on in this
// process acknowledge sends before they commit (faultinject): the
// negative control of the process fault test.
func BreakAcks() { faultinject.AckBeforeCommit.Store(true) }

// BreakOwnership makes every consumer of a group in this process deliver
// every partition, whatever lease another holds (faultinject): the
// negative control of the process fault test's check of owners.
func BreakOwnership() { faultinject.ShareOwnership.Store(true) }
