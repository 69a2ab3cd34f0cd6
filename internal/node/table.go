package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/topicdb"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/upkeep"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// The WAL streams of the replicas' logs: a Raft3 group's is
// raft3/<topic>/<first>, a DoubleWrite pair's dw/<topic>/<first>, first
// being the first partition of its chunk.
const (
	raft3Prefix = "raft3/"
	dwPrefix    = "dw/"
)

// MaxRaft3Topic is the longest name of a Raft3 topic: its group names fit
// the port's raft group ids.
const MaxRaft3Topic = transport.MaxGroupIDLen - len(raft3Prefix) - len("/65535")

// raft3Name is the raft group, and the WAL stream of its log, whose first
// partition is partition first of a Raft3 topic.
func raft3Name(topic string, first int) string {
	return raft3Prefix + topic + "/" + strconv.Itoa(first)
}

// dwName is the WAL stream of the log of the pair whose chunk starts at
// partition first.
func dwName(topic string, first int) string { return dwPrefix + topic + "/" + strconv.Itoa(first) }

// recoverLogged moves what the write-ahead log holds for each Single
// partition into its file, opening and closing it, before the caller's
// FinishRecovery drops the old segments, and keeps the replicas' logs
// (openLog). A cluster node opens its partitions only later, as the
// metadata state places them, and may never open those of a topic it no
// longer shows, such as one of a directory that was standalone: acked
// records would be lost with the segments.
func (n *Node) recoverLogged() error {
	wal := n.cfg.Local.WAL
	for _, stream := range wal.Streams() {
		if strings.HasPrefix(stream, raft3Prefix) || strings.HasPrefix(stream, dwPrefix) {
			if _, err := n.openLog(stream); err != nil {
				return fmt.Errorf("recover %s: %w", stream, err)
			}
			continue
		}
		i := strings.LastIndexByte(stream, '/')
		part, err := strconv.Atoi(stream[i+1:])
		topic := stream[:max(i, 0)]
		if i < 0 || err != nil || part < 0 || (topicdb.CheckName(topic) != nil && !topicdb.IsSystemTopic(topic)) {
			n.cfg.Logger.Warn("write-ahead log stream of no partition; its records are dropped", "stream", stream)
			continue
		}
		path := topicdb.PartitionPath(n.dir, topic, part)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			n.cfg.Logger.Warn("write-ahead log records of a missing partition file; dropped", "stream", stream, "path", path)
			continue
		}
		p, err := store.Open(path, store.Options{WAL: wal, Stream: stream})
		if err == nil {
			err = p.Close()
		}
		if err != nil {
			return fmt.Errorf("recover %s: %w", path, err)
		}
	}
	return nil
}

// openLog returns the replica log that is the WAL stream name, kept in
// logs: a stream is retained once per WAL.
func (n *Node) openLog(name string) (*raftqueue.WALLog, error) {
	if l, ok := n.logs[name]; ok {
		return l, nil
	}
	l, err := raftqueue.OpenWALLog(n.cfg.Local.WAL, name)
	if err != nil {
		return nil, err
	}
	if n.logs == nil {
		n.logs = map[string]*raftqueue.WALLog{}
	}
	n.logs[name] = l
	return l, nil
}

// syncLoop keeps the topic table in step with the metadata group until
// the node closes.
func (n *Node) syncLoop() {
	for {
		st := n.agent.Meta().State()
		n.sync(st)
		select {
		case <-n.ctx.Done():
			return
		case <-st.Changed():
		}
	}
}

// sync publishes the topics of st in the table: partitions placed here are
// opened and their upkeep started, the others reached by RPC. A
// partition in the table stays, its placement changes reaching it
// (updatePairs, updateRaft3, updateSingles); only added partitions are
// made.
func (n *Node) sync(st *metastate.State) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed.Load() {
		return
	}
	if nd, ok := st.Node(n.agent.ID()); ok && nd.Incarnation != "" && nd.Incarnation != n.inc {
		// A state from before this directory's incarnation registered:
		// it places the replicas the node held with its old data, which
		// this directory lacks. Nothing is opened until the metadata
		// knows (metastate.RegisterNode), which marks them lost.
		return
	}
	for p, cfg := range n.unopened {
		if n.attachGroup(p, cfg) == nil { // a failure was logged when it first failed
			delete(n.unopened, p)
			n.cfg.Logger.Info("replica opened", "partition", p.Name())
		}
	}
	n.updatePairs(st)
	n.updateRaft3(st)
	n.updateSingles(st)
	for _, name := range st.Topics() {
		ct, ok := st.Topic(name)
		if !ok {
			continue
		}
		old, _ := n.cfg.Topics.Get(name)
		have := 0
		if old != nil {
			have = len(old.Parts)
		}
		if have >= len(ct.Parts) {
			continue
		}
		t := &partition.Topic{Name: name, Type: ct.Type, Created: time.Unix(0, ct.Created)}
		if old != nil {
			t.Parts = slices.Clone(old.Parts)
		}
		for i := have; i < len(ct.Parts); i++ {
			p, err := n.partition(ct, i)
			if err != nil {
				n.cfg.Logger.Error("cannot open a partition placed on this node", "topic", name, "partition", i, "err", err)
				break // the table gets the partitions before it; the next change tries again
			}
			t.Parts = append(t.Parts, p)
		}
		if len(t.Parts) == have {
			continue
		}
		n.cfg.Topics.Put(t)
		for i := have; i < len(t.Parts); i++ {
			n.maintain(name, i, t.Parts[i])
		}
		if old != nil { // not under mu: a rebalance reads the table
			n.wg.Go(func() { n.cfg.Rebalance(name) })
		}
		n.cfg.Logger.Info("topic in step with the cluster", "topic", name, "partitions", len(t.Parts))
	}
}

// maintain starts the upkeep of partition i of topic: a Single
// partition's runs while it is here and not frozen; a replicated
// partition's while its replica here leads.
func (n *Node) maintain(topic string, i int, p partition.Partition) {
	logger := n.cfg.Logger.With("topic", topic, "partition", i)
	switch p := p.(type) {
	case *replica.Partition:
		n.wg.Go(func() {
			p.WhileLeading(n.ctx, func(ctx context.Context, u replica.Upkeep) { upkeep.Run(ctx, u, n.cfg.Upkeep, logger) })
		})
	case *single:
		n.wg.Go(func() {
			p.whileHere(n.ctx, func(ctx context.Context, l *partition.Local) { upkeep.Run(ctx, l, n.cfg.Upkeep, logger) })
		})
	}
}

// partition opens partition i of topic t as placed: here, or a client of
// the node holding it; for the replicated types the way to the leader,
// with this node's replica if it holds one. Every partition's upkeep is
// started on every node (maintain): each may move here.
func (n *Node) partition(t metastate.Topic, i int) (partition.Partition, error) {
	topic, pl := t.Name, t.Parts[i]
	if len(pl.Replicas) == 0 {
		return nil, fmt.Errorf("%s/%d has no replica", topic, i)
	}
	first, parts := t.Chunk(i)
	rc := replica.Config{Topic: topic, Index: i, First: first, Self: n.agent.ID(), Peer: n.agent.Peer, Now: n.cfg.Local.Now,
		Logger: n.cfg.Logger.With("topic", topic, "partition", i)}
	switch t.Type {
	case metastate.TypeRaft3:
		return n.openRaft3(replica.Raft3Config{Config: rc, Partitions: parts, Replicas: pl.Replicas})
	case metastate.TypeDoubleWrite:
		return n.openDoubleWrite(t, i, rc)
	}
	s := newSingle(topic, i)
	n.placeSingle(topic, i, s, pl)
	if w, _ := s.at(); w.local == nil && w.far == nil && !n.handedAway(topic, i) {
		s.Close()
		return nil, fmt.Errorf("%s/%d: not opened here, and its node %s not reached", topic, i, pl.Replicas[0])
	}
	return s, nil // or handed away under a state behind: calls wait for it
}

// openRaft3 opens a partition of a Raft3 topic placed as cfg says: this
// node's replica of its group if it is one of them, and the way to the
// group's leader. A replica here that fails to open leaves the partition
// served by the other two, and is tried again at each metadata change
// (unopened).
func (n *Node) openRaft3(cfg replica.Raft3Config) (partition.Partition, error) {
	p := replica.NewRaft3(cfg)
	if !slices.Contains(cfg.Replicas, cfg.Self) {
		return p, nil
	}
	if err := n.attachGroup(p, cfg); err != nil {
		n.cfg.Logger.Error("cannot open this node's replica of a partition: the others serve it", "topic", cfg.Topic, "partition", cfg.Index, "err", err)
		if n.unopened == nil {
			n.unopened = map[*replica.Partition]replica.Raft3Config{}
		}
		n.unopened[p] = cfg
	}
	return p, nil
}

// attachGroup attaches this node's replica of p's raft group to p,
// opening it unless another partition of the group has: the group on the
// port, its log a stream of the node's WAL, its files in
// <dir>/raft3/<topic>/<first>. A new replica bootstraps the group with the
// three of them; each of the three does so alike, which raft allows. One
// with state rejoins.
func (n *Node) attachGroup(p *replica.Partition, cfg replica.Raft3Config) error {
	name := raft3Name(cfg.Topic, cfg.First)
	return n.groups.Attach(p, name, func() (*raftqueue.Group, error) {
		log, err := n.openLog(name)
		if err != nil {
			return nil, err
		}
		g, err := replica.OpenGroup(replica.GroupConfig{Self: cfg.Self, Replicas: cfg.Replicas,
			Dir: filepath.Join(n.dir, "raft3", cfg.Topic, strconv.Itoa(cfg.First)), Partitions: cfg.Partitions,
			Mux: n.agent.RaftMux(), Name: name, Log: log, ElectionTimeout: n.cfg.ElectionTimeout,
			Logger:    cluster.NewHCLogger(n.cfg.Logger.With("topic", cfg.Topic, "group", cfg.First), "raft3"),
			Placement: func() ([]string, []string) { return n.placementOf(cfg.Topic, cfg.First) },
			Vouched:   func(leader string) bool { return n.vouchedBy(name, leader) }})
		if err == nil {
			delete(n.logs, name) // the group has it; a failed open is tried again on it
		}
		return g, err
	})
}

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
	return replica.PairRecord{Replicas: reps, Epoch: p.Epoch, Version: p.Version, InSync: p.InSync, Alone: t.Alone, FollowerUp: nd.Up,
		Accepted: p.Accepted}
}

// openDoubleWrite opens partition i of DoubleWrite topic t, on the pair of
// its chunk: the pair's replica here, if the metadata places one here, is
// in <dir>/dw/<topic>/<first>, its log a stream of the node's WAL; it
// leads or follows as the record says, and the record's changes reach it
// at each sync: a promotion, a new follower, the in-sync set. Its upkeep
// runs wherever the record moves its leader: every node watches.
func (n *Node) openDoubleWrite(t metastate.Topic, i int, rc replica.Config) (partition.Partition, error) {
	topic := t.Name
	first, parts := t.Chunk(i)
	propose := func(ctx context.Context, c metastate.Command) error {
		_, err := n.agent.Propose(ctx, c)
		return err
	}
	pair := n.pairs.Attach(replica.PairConfig{Topic: topic, First: first, Self: n.agent.ID(), Peer: n.agent.Peer,
		Open: func() (*raftqueue.Pair, error) { return n.openPair(topic, first, parts) },
		SetInSync: func(ctx context.Context, rec replica.PairRecord, inSync []string) error {
			if hook := n.cfg.InSyncHook; hook != nil {
				if err := hook(inSync); err != nil {
					return err
				}
			}
			return propose(ctx, metastate.SetInSync{Topic: topic, Partition: first, Version: rec.Version, InSync: inSync})
		},
		RenewEpoch: func(ctx context.Context, rec replica.PairRecord) error {
			return propose(ctx, metastate.RenewEpoch{Topic: topic, Partition: first, Version: rec.Version})
		},
		HandOff: func(ctx context.Context, rec replica.PairRecord) error {
			return propose(ctx, metastate.Promote{Topic: topic, Partition: first, Version: rec.Version, Leader: rec.Follower()})
		},
		HandOver: func(ctx context.Context, rec replica.PairRecord) error {
			return propose(ctx, metastate.HandOver{Topic: topic, Partition: first, Version: rec.Version, Leader: rec.Follower()})
		},
		Logger: n.cfg.Logger.With("topic", topic, "pair", first)}, pairRecord(n.agent.Meta().State(), t, first))
	return replica.NewDoubleWrite(replica.DoubleWriteConfig{Config: rc, Report: n.agent.ReportLater}, pair), nil
}

// openPair opens this node's replica of the pair of the parts partitions
// of DoubleWrite topic topic from first. Its log stays in logs: a replica
// the record removes from this node is closed, and one it places here
// again reopens on its log.
func (n *Node) openPair(topic string, first, parts int) (*raftqueue.Pair, error) {
	log, err := n.openLog(dwName(topic, first))
	if err != nil {
		return nil, err
	}
	return raftqueue.OpenPair(raftqueue.PairConfig{Dir: filepath.Join(n.dir, "dw", topic, strconv.Itoa(first)), Log: log,
		Partitions: parts, MaxBatchBytes: n.cfg.MaxBatchBytes, CompactEvery: n.cfg.PairCompactEvery, KeepEntries: n.cfg.PairKeepEntries})
}

// updateRaft3 gives each Raft3 partition of the table its group's
// placement in st, which a move changes (metastate.MoveReplica), and
// opens this node's replica of a group newly placed here: a lost replica,
// which rejoins the group as a new server (replica.Rejoin). A replica
// moved away stays until it left the group's configuration (detachMoved).
func (n *Node) updateRaft3(st *metastate.State) {
	self := n.agent.ID()
	n.eachPart(st, metastate.TypeRaft3, func(t metastate.Topic, i int, p partition.Partition) {
		r, ok := p.(*replica.Partition)
		if !ok {
			return
		}
		reps := t.Parts[i].Replicas
		r.SetReplicas(reps)
		if !slices.Contains(reps, self) || r.RaftGroup() != nil {
			return
		}
		if _, failed := n.unopened[r]; failed {
			return
		}
		first, parts := t.Chunk(i)
		cfg := replica.Raft3Config{Config: replica.Config{Topic: t.Name, Index: i, First: first, Self: self}, Partitions: parts, Replicas: reps}
		if err := n.attachGroup(r, cfg); err != nil {
			n.cfg.Logger.Error("cannot open this node's replica of a partition moved here: the others serve it", "topic", t.Name, "partition", i, "err", err)
			if n.unopened == nil {
				n.unopened = map[*replica.Partition]replica.Raft3Config{}
			}
			n.unopened[r] = cfg
			return
		}
		n.cfg.Logger.Info("replica of a partition moved here opened", "topic", t.Name, "partition", i)
	})
}

// detachMoved closes this node's replica of the Raft3 group of topic
// whose first partition is first once the group's placement no longer has
// it and it left the group (movedOut): moved away (metastate.MoveReplica).
func (n *Node) detachMoved(st *metastate.State, topic string, first int, g *raftqueue.Group) {
	p, ok := st.Partition(topic, first)
	if !ok || slices.Contains(p.Replicas, n.agent.ID()) || !movedOut(g, n.agent.ID(), p) {
		return
	}
	t, ok := n.cfg.Topics.Get(topic)
	if !ok {
		return
	}
	ct, _ := st.Topic(topic)
	_, parts := ct.Chunk(first)
	for j := first; j < first+parts && j < len(t.Parts); j++ {
		if r, ok := t.Parts[j].(*replica.Partition); ok {
			if err := r.Detach(); err != nil {
				n.cfg.Logger.Warn("replica moved away not closed cleanly", "topic", topic, "partition", j, "err", err)
			}
		}
	}
	n.cfg.Logger.Info("replica moved away left its group and closed", "topic", topic, "group", first)
}

// updatePairs hands each DoubleWrite pair of the table its record in st,
// once.
func (n *Node) updatePairs(st *metastate.State) {
	n.eachPart(st, metastate.TypeDoubleWrite, func(t metastate.Topic, i int, p partition.Partition) {
		if r, ok := p.(*replica.Partition); ok && r.Pair() != nil && t.Parts[i].Chunk == i {
			r.Pair().Update(pairRecord(st, t, i))
		}
	})
}

// eachPart calls fn with each partition of the table whose topic st shows
// of type typ, that topic as st has it and the partition's index, which
// st has too.
func (n *Node) eachPart(st *metastate.State, typ uint8, fn func(t metastate.Topic, i int, p partition.Partition)) {
	for _, t := range n.cfg.Topics.All() {
		ct, ok := st.Topic(t.Name)
		if !ok || ct.Type != typ {
			continue
		}
		for i, p := range t.Parts {
			if i < len(ct.Parts) {
				fn(ct, i, p)
			}
		}
	}
}
