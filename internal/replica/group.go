package replica

import (
	"io"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue"
)

// GroupConfig is what a node gives OpenGroup of its replica of a Raft3
// partition.
type GroupConfig struct {
	Self     string   // this node's id: its raft server id
	Replicas []string // the three nodes' ids: raft server ids, and addresses over the port
	Dir      string   // the replica's files
	// Layer is the group's stream layer on the node's port (its RaftMux).
	Layer raft.StreamLayer
	// Log is the group's log: a stream of the node's WAL.
	Log             *raftqueue.WALLog
	ElectionTimeout time.Duration // raft's default if zero
	Logger          hclog.Logger
}

// OpenGroup opens a node's replica of a Raft3 partition and bootstraps its
// group with the three replicas (each does, alike: raft allows it); one
// with state rejoins.
func OpenGroup(cfg GroupConfig) (*raftqueue.Group, error) {
	trans := raft.NewNetworkTransport(cfg.Layer, 3, 10*time.Second, io.Discard)
	conf := raft.DefaultConfig()
	if t := cfg.ElectionTimeout; t > 0 {
		conf.HeartbeatTimeout, conf.ElectionTimeout, conf.LeaderLeaseTimeout = t, t, t/2
	}
	conf.MaxAppendEntries = 256
	// An idle leader sends each follower an AppendEntries every
	// CommitTimeout to tell it the commit index (raft's own heartbeats,
	// every HeartbeatTimeout/10, do not carry it). Only the leader serves
	// reads and acks, so a follower may learn it later: half the heartbeat
	// timeout, not raft's 50 ms, halves the idle CPU and traffic of many
	// groups (mqbench raft3-idle). Under load entries carry it at once.
	conf.CommitTimeout = conf.HeartbeatTimeout / 2
	// The log is a WAL stream: the segments it holds stay until a
	// snapshot compacts it, so keep it short.
	conf.TrailingLogs, conf.SnapshotThreshold = 1024, 2048
	g, err := raftqueue.Open(raftqueue.Config{ID: raft.ServerID(cfg.Self), Dir: cfg.Dir, Transport: trans,
		LogStore: cfg.Log, Raft: conf, Logger: cfg.Logger})
	if err != nil {
		trans.Close()
		return nil, err
	}
	servers := make([]raft.Server, len(cfg.Replicas))
	for j, id := range cfg.Replicas {
		servers[j] = raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(id)}
	}
	if err := g.Bootstrap(servers); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// Leads reports whether this node's replica leads the group.
func (r *Raft3) Leads() bool {
	g := r.Replica()
	return g != nil && g.State() == raft.Leader
}
