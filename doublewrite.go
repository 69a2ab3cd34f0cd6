package mq

import (
	"github.com/zeze-go/mq/internal/metastate"

	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/raftqueue"
)

// A DoubleWrite partition on a node (replica.DoubleWrite) shares the pair
// of its chunk (replica.Pair: the partitions placed together, which share
// one log and one record): the pair's replica here, if the metadata places
// one here, is in <dir>/dw/<topic>/<first>, its log a stream of the node's
// WAL, dw/<topic>/<first>; it leads or follows as the record says, and the
// record's changes (a promotion, a new follower, the in-sync set) reach it
// at each sync.

const dwPrefix = "dw/"

// dwName is the WAL stream of the log of the pair whose chunk starts at
// partition first.
func dwName(topic string, first int) string { return dwPrefix + topic + "/" + strconv.Itoa(first) }

// pairRecord is the record of partition i's pair of t in st as
// replica.Pair reads it.
func pairRecord(st *metastate.State, t metastate.Topic, i int) replica.PairRecord {
	p := t.Parts[i]
	reps := []string{p.Leader}
	f := p.Follower()
	if f != "" {
		reps = append(reps, f)
	}
	nd, _ := st.Node(f)
	return replica.PairRecord{Replicas: reps, Epoch: p.Epoch, Version: p.Version, InSync: p.InSync, Alone: t.Alone, FollowerUp: nd.Up}
}

// openDoubleWrite opens partition i of DoubleWrite topic t, on the pair of
// its chunk.
func (cn *clusterNode) openDoubleWrite(t metastate.Topic, i int) (partition.Partition, bool, error) {
	m := cn.m
	topic := t.Name
	first, n := t.Chunk(i)
	logger := m.cfg.logger.With("topic", topic, "pair", first)
	pair := cn.pairs.Attach(replica.PairConfig{Topic: topic, First: first, Self: cn.agent.ID(), Peer: cn.agent.Peer,
		Open: func() (*raftqueue.Pair, error) { return cn.openPair(topic, first, n) },
		SetInSync: func(ctx context.Context, rec replica.PairRecord, inSync []string) error {
			_, err := cn.agent.Propose(ctx, metastate.SetInSync{Topic: topic, Partition: first, Version: rec.Version, InSync: inSync})
			return err
		},
		RenewEpoch: func(ctx context.Context, rec replica.PairRecord) error {
			_, err := cn.agent.Propose(ctx, metastate.RenewEpoch{Topic: topic, Partition: first, Version: rec.Version})
			return err
		},
		HandOff: func(ctx context.Context, rec replica.PairRecord) error {
			_, err := cn.agent.Propose(ctx, metastate.Promote{Topic: topic, Partition: first, Version: rec.Version, Leader: rec.Follower()})
			return err
		},
		Logger: logger}, pairRecord(cn.agent.Meta().State(), t, first))
	d := replica.NewDoubleWrite(replica.DoubleWriteConfig{Topic: topic, Index: i, First: first, Self: cn.agent.ID(),
		Peer: cn.agent.Peer, Now: m.cfg.clock.Now, Report: cn.agent.ReportLater}, pair)
	// Its upkeep runs wherever the record moves its leader: every node
	// watches (WhileLeading).
	return d, true, nil
}

// openPair opens this node's replica of the pair of the n partitions of
// DoubleWrite topic topic from first, its log a stream of the node's WAL
// (openWithLog).
func (cn *clusterNode) openPair(topic string, first, n int) (*raftqueue.Pair, error) {
	m := cn.m
	maxFrame := m.cfg.cluster.MaxFrameBytes
	if maxFrame == 0 {
		maxFrame = DefaultMaxFrameBytes
	}
	// The log is kept in raftLogs: a replica the record removes from this
	// node is closed, and one it places here again reopens on its log.
	return openWithLog(m, dwName(topic, first), true, func(log *raftqueue.WALLog) (*raftqueue.Pair, error) {
		return raftqueue.OpenPair(raftqueue.PairConfig{Dir: filepath.Join(m.dir, "dw", topic, strconv.Itoa(first)), Log: log,
			Partitions: n, MaxBatchBytes: maxFrame - frameOverhead, CompactEvery: m.cfg.pairCompactEvery, KeepEntries: m.cfg.pairKeepEntries})
	})
}

// updateDoubleWrite hands each DoubleWrite pair of the table its record
// in st, once.
func (cn *clusterNode) updateDoubleWrite(st *metastate.State) {
	for _, t := range cn.m.topics.All() {
		ct, ok := st.Topic(t.Name)
		if !ok || ct.Type != metastate.TypeDoubleWrite {
			continue
		}
		for i, p := range t.Parts {
			if d, ok := p.(*replica.DoubleWrite); ok && i < len(ct.Parts) && ct.Parts[i].Chunk == i {
				d.Pair().Update(pairRecord(st, ct, i))
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
