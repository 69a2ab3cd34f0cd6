package replica

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/raftqueue"
)

// GroupConfig is what a node gives OpenGroup of its replica of a Raft3
// raft group.
type GroupConfig struct {
	Self     string   // this node's id: its raft server id
	Replicas []string // the three nodes' ids: raft server ids, and addresses over the port
	Dir      string   // the replica's files
	// Partitions is how many partitions the group carries; 0 means 1.
	Partitions int
	// Mux is the node's port's carrier of raft groups; the group takes a
	// layer of it named Name.
	Mux  *transport.RaftMux
	Name string
	// Log is the group's log: a stream of the node's WAL.
	Log             *raftqueue.WALLog
	ElectionTimeout time.Duration // raft's default if zero
	Logger          hclog.Logger
	// Placement returns the group's placement now: its replicas, and
	// those lost (metastate.Partition.Lost): their nodes came back as new
	// incarnations, their data directories replaced, and they have not yet
	// rejoined the group as new servers (Rejoin). A lost replica never
	// bootstraps the group, which the others hold, grants no vote and asks
	// for none: its log lacks what it had acknowledged, so it would grant
	// a candidate lacking what was committed too, an intact but lagging
	// one among them, or win with such a vote itself. A replica that was
	// lost stays so to itself until the placement has it not lost, and
	// placed: one moved away before it rejoined still lacks its log and
	// its term. Nil: the replicas cfg.Replicas, none lost.
	Placement func() (replicas, lost []string)
	// Vouched reports whether node leader told this replica, while it is
	// lost, that it leads the group with a committed configuration that
	// has this replica as a nonvoter (Rejoin's vouch). A lost replica takes
	// entries only from such a leader: it has forgotten its term with its
	// log, so a deposed leader whose configuration still counts it as the
	// voter it was would count its acknowledgements toward a commit the
	// group's newer leader never saw. Nil: none vouched.
	Vouched func(leader string) bool
}

// OpenGroup opens a node's replica of a Raft3 raft group. A new replica
// bootstraps the group with the three replicas; each of the three does so
// alike, which raft allows. One with state rejoins, and so does a lost one
// (cfg.Placement), which waits to be added back by the group's leader (Rejoin)
// and meanwhile grants no vote.
//
// The group's layer accepts raft streams only from its members: the
// replicas the metadata places (cfg.Replicas: a Raft3 group's placement
// never changes), and the servers of the group's raft configuration. The
// placement alone would do today; the configuration is there so that a
// group whose configuration changes keeps accepting its members.
func OpenGroup(cfg GroupConfig) (*raftqueue.Group, error) {
	var opened atomic.Pointer[raftqueue.Group]
	member := func(peer string) bool {
		if slices.Contains(cfg.Replicas, peer) {
			return true
		}
		g := opened.Load()
		return g != nil && transport.InConfiguration(g.Raft(), peer)
	}
	placement := func() ([]string, []string) { return cfg.Replicas, nil }
	if cfg.Placement != nil {
		placement = cfg.Placement
	}
	// lacking: this replica was lost when it opened, and the placement
	// has not shown it rejoined (not lost, placed) since.
	var lacking atomic.Bool
	if _, l := placement(); slices.Contains(l, cfg.Self) {
		lacking.Store(true)
	}
	isLost := func() ([]string, bool) {
		reps, l := placement()
		switch {
		case slices.Contains(l, cfg.Self):
			return l, true
		case slices.Contains(reps, cfg.Self):
			lacking.Store(false)
		}
		return l, lacking.Load()
	}
	// A lost replica neither votes nor campaigns, and a vote never goes
	// to a candidate this node knows lost.
	campaign := func() bool { _, lost := isLost(); return !lost }
	vote := func(candidate string) bool {
		l, lost := isLost()
		return !lost && !slices.Contains(l, candidate)
	}
	// A lost replica takes entries only from a leader that vouched for
	// its place as a nonvoter (cfg.Vouched).
	lead := func(leader string) bool {
		_, lost := isLost()
		return !lost || cfg.Vouched != nil && cfg.Vouched(leader)
	}
	layer, err := cfg.Mux.Layer(cfg.Name, transport.LayerConfig{Member: member, Vote: vote, Campaign: campaign, Lead: lead})
	if err != nil {
		return nil, err
	}
	trans := transport.NewRaftTransport(layer)
	conf := raft.DefaultConfig()
	if t := cfg.ElectionTimeout; t > 0 {
		conf.HeartbeatTimeout, conf.ElectionTimeout, conf.LeaderLeaseTimeout = t, t, t/2
	}
	conf.MaxAppendEntries = 256
	// An idle leader sends each follower an AppendEntries every
	// CommitTimeout to tell it the commit index: raft's own heartbeats,
	// every HeartbeatTimeout/10, do not carry it. Only the leader serves
	// reads and acks, so a follower may learn it later: half the heartbeat
	// timeout, not raft's 50 ms, halves the idle CPU and traffic of many
	// groups, as mqbench's raft3-idle case shows. Under load entries carry
	// it at once.
	conf.CommitTimeout = conf.HeartbeatTimeout / 2
	// The log is a WAL stream: the segments it holds stay until a
	// snapshot compacts it, so keep it short.
	conf.TrailingLogs, conf.SnapshotThreshold = 1024, 2048
	g, err := raftqueue.Open(raftqueue.Config{ID: raft.ServerID(cfg.Self), Dir: cfg.Dir, Transport: trans,
		LogStore: cfg.Log, Raft: conf, Logger: cfg.Logger, Partitions: cfg.Partitions})
	if err != nil {
		trans.Close()
		return nil, err
	}
	servers := make([]raft.Server, len(cfg.Replicas))
	for j, id := range cfg.Replicas {
		servers[j] = raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(id)}
	}
	if !lacking.Load() {
		if err := g.Bootstrap(servers); err != nil {
			g.Close()
			return nil, err
		}
	}
	opened.Store(g)
	return g, nil
}

// sharedGroup is this node's replica of a raft group, as the Raft3
// partitions it carries share it: the first to be attached opens it
// (RaftGroups.Attach), the last to close closes it.
type sharedGroup struct {
	g     *raftqueue.Group
	name  string
	topic string // the topic, and first its group's first partition
	first int
	gs    *RaftGroups
	refs  int // guarded by gs.mu: the partitions attached; 0 once closed
	// damaged: a partition of this replica met damage (store.ErrCorrupt or
	// ErrFailed) in a read or an apply. The replica no longer serves, and
	// hands its leadership over whenever it leads (Partition.WhileLeading),
	// so the group serves from the intact replicas. Sticky until the node
	// restarts.
	damaged atomic.Bool
}

// RaftGroups are the raft groups of which a node holds a replica, by name.
// Safe for concurrent use.
type RaftGroups struct {
	mu sync.Mutex
	m  map[string]*sharedGroup
}

// Attach makes this node's replica of group name p's, p a Raft3
// partition: the one open already, or the one open returns, called under
// gs's lock. A partition that is closed, or has its replica already,
// takes no hold of it, and a replica no partition holds is closed again.
// It returns open's error.
func (gs *RaftGroups) Attach(p *Partition, name string, open func() (*raftqueue.Group, error)) error {
	k, ok := p.kind.(*raft3)
	if !ok {
		return fmt.Errorf("replica: %s is not a Raft3 partition", p.Name())
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	g := gs.m[name]
	if g == nil {
		rg, err := open()
		if err != nil {
			return err
		}
		g = &sharedGroup{g: rg, name: name, topic: k.cfg.Topic, first: k.cfg.First, gs: gs}
		if gs.m == nil {
			gs.m = map[string]*sharedGroup{}
		}
		gs.m[name] = g
	}
	if k.attach(g) {
		g.refs++
	} else if g.refs == 0 {
		g.closeLocked()
	}
	return nil
}

// Get returns the open replica of the group Attach named name, if any; it
// may close once returned.
func (gs *RaftGroups) Get(name string) (*raftqueue.Group, bool) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g := gs.m[name]; g != nil {
		return g.g, true
	}
	return nil, false
}

// Each calls fn with each open replica, named by its topic and its group's
// first partition, not under gs's lock: a replica may close meanwhile.
func (gs *RaftGroups) Each(fn func(topic string, first int, g *raftqueue.Group)) {
	gs.mu.Lock()
	groups := slices.Collect(maps.Values(gs.m))
	gs.mu.Unlock()
	for _, g := range groups {
		fn(g.topic, g.first, g.g)
	}
}

// HandOff hands the leadership of each group whose replica here leads to
// another replica, in parallel, so that the groups do not wait out an
// election when the node closes. Call it while the node's port still runs;
// it is best effort, since the groups elect a leader anyway.
func (gs *RaftGroups) HandOff() {
	gs.mu.Lock()
	groups := slices.Collect(maps.Values(gs.m))
	gs.mu.Unlock()
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(g.handOff)
	}
	wg.Wait()
}

// handOff transfers the group's leadership to another replica if this one
// leads.
func (g *sharedGroup) handOff() {
	if g.g.State() == raft.Leader {
		_ = g.g.Raft().LeadershipTransfer().Error()
	}
}

// release drops a partition's hold of g, and closes the replica with the
// last, under gs.mu so that a new Attach of the name waits for it.
func (g *sharedGroup) release() error {
	g.gs.mu.Lock()
	defer g.gs.mu.Unlock()
	if g.refs--; g.refs > 0 {
		return nil
	}
	return g.closeLocked()
}

func (g *sharedGroup) closeLocked() error {
	delete(g.gs.m, g.name)
	return g.g.Close()
}
