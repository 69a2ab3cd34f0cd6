package mq

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/raftqueue"
)

// A DoubleWrite partition on a node (replica.DoubleWrite): its replica
// here, if the metadata places one here, in <dir>/dw/<topic>/<index>, its
// log a stream of the node's WAL, dw/<topic>/<index>; it leads or follows
// as the partition's record says, and the record's changes (a promotion, a
// new follower, the in-sync set) reach it at each sync.

const dwPrefix = "dw/"

// dwName is the WAL stream of a DoubleWrite partition's log.
func dwName(topic string, i int) string { return dwPrefix + topic + "/" + strconv.Itoa(i) }

// pairRecord is partition i of t in st as replica.DoubleWrite reads it.
func pairRecord(st *cluster.State, t cluster.Topic, i int) replica.PairRecord {
	p := t.Parts[i]
	reps := []string{p.Leader}
	f := p.Follower()
	if f != "" {
		reps = append(reps, f)
	}
	nd, _ := st.Node(f)
	return replica.PairRecord{Replicas: reps, Epoch: p.Epoch, Version: p.Version, InSync: p.InSync, Alone: t.Alone, FollowerUp: nd.Up}
}

// openDoubleWrite opens partition i of DoubleWrite topic t.
func (cn *clusterNode) openDoubleWrite(t cluster.Topic, i int) (partition.Partition, bool, error) {
	m := cn.m
	topic, rec := t.Name, pairRecord(cn.agent.Meta().State(), t, i)
	d := replica.NewDoubleWrite(replica.DoubleWriteConfig{Topic: topic, Index: i, Self: cn.agent.ID(), Peer: cn.agent.Peer,
		Open: func() (*raftqueue.Pair, error) { return cn.openPair(topic, i) },
		SetInSync: func(ctx context.Context, rec replica.PairRecord, inSync []string) error {
			_, err := cn.agent.Propose(ctx, cluster.SetInSync{Topic: topic, Partition: i, Version: rec.Version, InSync: inSync})
			return err
		},
		RenewEpoch: func(ctx context.Context, rec replica.PairRecord) error {
			_, err := cn.agent.Propose(ctx, cluster.RenewEpoch{Topic: topic, Partition: i, Version: rec.Version})
			return err
		},
		Now: m.cfg.clock.Now, Logger: m.cfg.logger.With("topic", topic, "partition", i)}, rec)
	// Its upkeep runs wherever the record moves its leader: every node
	// watches (WhileLeading).
	return d, true, nil
}

// openPair opens this node's replica of partition i of DoubleWrite topic
// topic, its log a stream of the node's WAL (openWithLog).
func (cn *clusterNode) openPair(topic string, i int) (*raftqueue.Pair, error) {
	m := cn.m
	maxFrame := m.cfg.cluster.MaxFrameBytes
	if maxFrame == 0 {
		maxFrame = DefaultMaxFrameBytes
	}
	// The log is kept in raftLogs: a replica the record removes from this
	// node is closed, and one it places here again reopens on its log.
	return openWithLog(m, dwName(topic, i), true, func(log *raftqueue.WALLog) (*raftqueue.Pair, error) {
		return raftqueue.OpenPair(raftqueue.PairConfig{Dir: filepath.Join(m.dir, "dw", topic, strconv.Itoa(i)), Log: log,
			MaxBatchBytes: maxFrame - frameOverhead})
	})
}

// updateDoubleWrite hands each DoubleWrite partition of the table its
// record in st.
func (cn *clusterNode) updateDoubleWrite(st *cluster.State) {
	for _, t := range cn.m.topics.All() {
		ct, ok := st.Topic(t.Name)
		if !ok || ct.Type != cluster.TypeDoubleWrite {
			continue
		}
		for i, p := range t.Parts {
			if d, ok := p.(*replica.DoubleWrite); ok && i < len(ct.Parts) {
				d.Update(pairRecord(st, ct, i))
			}
		}
	}
}

// pairAt is the follower's side of a DoubleWrite leader's append from node
// peer (replica.ServePairs).
func (cn *clusterNode) pairAt(peer, topic string, i int) (*raftqueue.Pair, error) {
	if cn.started.Load() == nil {
		return nil, errStarting
	}
	t, ok := cn.m.topics.Get(topic)
	if !ok || i < 0 || i >= len(t.Parts) {
		return nil, fmt.Errorf("%w: %s/%d is not open on node %s", errNotHere, topic, i, cn.agent.ID())
	}
	d, ok := t.Parts[i].(*replica.DoubleWrite)
	if !ok {
		return nil, fmt.Errorf("%w: %s/%d is not a DoubleWrite partition", errNotHere, topic, i)
	}
	return d.AppendFrom(peer)
}

// errNotHere is an append for a replica this node does not hold (yet): the
// leader tries again.
var errNotHere = errors.New("mq: no such replica here")

// serveReplicas registers the replicas' ops on the node's RPC server.
func (cn *clusterNode) serveReplicas(srv *remote.Server) { replica.ServePairs(srv, cn.pairAt) }

// eachDoubleWrite calls fn with each DoubleWrite partition in the table.
func (cn *clusterNode) eachDoubleWrite(fn func(d *replica.DoubleWrite)) {
	for _, t := range cn.m.topics.All() {
		for _, p := range t.Parts {
			if d, ok := p.(*replica.DoubleWrite); ok {
				fn(d)
			}
		}
	}
}
