// Package node is a node's part in a cluster: its agent, which runs the
// port, the metadata group, the RPC server and the clients, and the topic
// table kept in step with the metadata group's placement. A partition
// placed on this node is opened here and served to the others; one placed
// elsewhere is a remote partition; a Raft3 or DoubleWrite partition is a
// replica.Partition, which routes to its leader. The root package builds
// a Node from its options and translates its errors; nothing here calls
// back into it.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/txn"
	"github.com/zeze-go/mq/internal/upkeep"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// Config is what Open needs.
type Config struct {
	// Agent configures the node's agent; Open sets its Dir and the
	// callbacks of the partition service (Partitions, Authorize, CheckTx,
	// Serve).
	Agent cluster.AgentConfig
	// Local opens the Single partitions placed here; its Dir is the
	// node's directory.
	Local partition.LocalConfig
	// Topics is the node's topic table, which the node keeps in step with
	// the metadata group.
	Topics *partition.Table
	// Upkeep configures the upkeep of the partitions this node leads.
	Upkeep *upkeep.Config
	// ElectionTimeout is the Raft3 groups' election timeout; zero takes
	// raft's default.
	ElectionTimeout time.Duration
	// MaxBatchBytes bounds a DoubleWrite batch: what a frame carries
	// beside its request.
	MaxBatchBytes int
	// PairCompactEvery and PairKeepEntries are the DoubleWrite replicas'
	// raftqueue.PairConfig.CompactEvery and KeepEntries.
	PairCompactEvery, PairKeepEntries int
	// InSyncHook, when set, runs before a DoubleWrite leader proposes the
	// replicas in sync, inSync, and an error it returns fails the
	// proposal: tests hold a pair between its follower caught up and it
	// recorded in sync.
	InSyncHook func(inSync []string) error
	// Rebalance rebalances the consumers of topic on this node: the
	// delivery engine's.
	Rebalance func(topic string)
	Logger    *slog.Logger
}

// Node is a node's part in a cluster. Safe for concurrent use.
//
// Goroutines: Start starts the loop that keeps the topic table in step
// with the metadata group and the consumer groups' coordinator; each sync
// of the table starts the upkeep of each partition placed here and a
// rebalance after each topic grows. Close cancels and waits for them. The
// agent runs its own (cluster.OpenAgent).
type Node struct {
	cfg     Config
	dir     string
	inc     string // the incarnation of dir (Incarnation)
	agent   *cluster.Agent
	coord   *cluster.Coordinator
	tx      atomic.Pointer[txn.Node] // answers check-backs once set (ServeTx)
	refused cluster.Refusals         // refusals logged once per key, bounded
	ctx     context.Context          // cancelled by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// started is agent once Open has set it: the agent serves RPC
	// (Served, authorize, checkTx) before OpenAgent returns, and those
	// callbacks answer only once it is set, which orders their reads of
	// agent after its write.
	started atomic.Pointer[cluster.Agent]

	// mu serializes the table's changes (sync) with Closing: no file is
	// opened once the node is closing.
	mu     sync.Mutex
	closed atomic.Bool // set under mu: Closing was called
	// unopened are the Raft3 partitions in the table whose replica here
	// failed to open: the others serve them meanwhile, and each metadata
	// change tries to open it again (sync). Guarded by mu.
	unopened map[*replica.Partition]replica.Raft3Config
	// logs are the replicas' logs that openLog opened, from the WAL's
	// streams at Open on. A Raft3 group's log leaves once its replica
	// opens; a DoubleWrite pair's stays for the node's life, for a replica
	// placed here again. Guarded by mu.
	logs map[string]*raftqueue.WALLog
	// movers are the Single partitions being copied here (moveIn), by
	// "topic/index". Guarded by mu.
	movers map[string]mover
	groups replica.RaftGroups // this node's replicas of raft groups
	pairs  replica.Pairs      // the DoubleWrite pairs of the table
	// vouched holds, by raft group name, the node that last told this
	// node's lost replica of the group that it leads with the replica as
	// a nonvoter in its committed configuration (OpRaft3Vouch): a string.
	vouched sync.Map
}

// errStarting is what another node's call gets while this node's agent is
// being opened; the caller tries again.
var errStarting = fmt.Errorf("%w: the node is starting", store.ErrClosed)

// errRequestFormat refuses a node request that does not decode.
var errRequestFormat = errors.New("node: malformed request")

// Open moves what the WAL holds for the Single partitions in dir into
// their files, keeps the replicas' logs (recoverLogged) and starts the
// node's agent. The caller calls the WAL's FinishRecovery once Open
// returned. The topic table follows the metadata group from Start on.
func Open(cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	n := &Node{cfg: cfg, dir: cfg.Local.Dir}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if err := n.recoverLogged(); err != nil {
		n.cancel()
		return nil, err
	}
	ac := cfg.Agent
	ac.Dir = filepath.Join(n.dir, "cluster")
	inc, err := Incarnation(n.dir)
	if err != nil {
		n.cancel()
		return nil, err
	}
	ac.Incarnation, n.inc = inc, inc
	ac.Partitions, ac.Authorize, ac.CheckTx, ac.Serve = n.Served, n.authorize, n.checkTx, n.serveReplicas
	agent, err := cluster.OpenAgent(ac)
	if err != nil {
		n.cancel()
		return nil, err
	}
	n.agent = agent
	n.started.Store(agent)
	n.coord = cluster.NewCoordinator(agent, cfg.Rebalance)
	return n, nil
}

// ID is the node's id.
func (n *Node) ID() string { return n.agent.ID() }

// Agent is the node's agent.
func (n *Node) Agent() *cluster.Agent { return n.agent }

// Coordinator is the consumer groups' coordinator, for the delivery
// engine.
func (n *Node) Coordinator() *cluster.Coordinator { return n.coord }

// ServeTx has the node answer other nodes' check-backs of the
// transactions this node prepared with tx.
func (n *Node) ServeTx(tx *txn.Node) { n.tx.Store(tx) }

// Start brings the table to what this node knows before it returns;
// after a restart, that is its state cache. Then, until Close, it keeps
// the table in step with the metadata group and runs the coordinator.
func (n *Node) Start() {
	n.sync(n.agent.Meta().State())
	n.wg.Go(n.syncLoop)
	n.wg.Go(n.rejoinLoop)
	n.wg.Go(func() { n.coord.Run(n.ctx) })
}

// Closing tells the node that it closes: the table no longer changes, and
// the replicated partitions no longer wait for a leader (see
// replica.Partition.Closing).
func (n *Node) Closing() {
	n.mu.Lock()
	n.closed.Store(true)
	n.mu.Unlock()
	n.eachReplicated((*replica.Partition).Closing)
}

// Close stops the node's goroutines and waits for them, hands the
// leadership of this node's Raft3 replicas and DoubleWrite pairs to
// others, and closes the agent. The partitions stay open: they are the
// table's, which its owner closes after.
func (n *Node) Close() error {
	n.Closing()
	n.cancel()
	n.wg.Wait()
	var wg sync.WaitGroup
	wg.Go(n.groups.HandOff)
	wg.Go(func() { n.pairs.HandOff(3 * time.Second) })
	wg.Wait()
	return n.agent.Close()
}

// CreateTopic creates a topic through the metadata leader, which places
// its partitions; AwaitTopic waits until this node's table has it.
func (n *Node) CreateTopic(ctx context.Context, c metastate.CreateTopic) error {
	_, err := n.agent.Propose(ctx, c)
	if errors.Is(err, cluster.ErrUnknownOutcome) || errors.Is(err, metastate.ErrTopicExists) {
		// A create that may have been applied, or repeated after one that
		// was: it is this call's when the topic carries its time.
		if t, ok := n.agent.Meta().State().Topic(c.Name); ok && t.Created == c.Now {
			err = nil
		}
	}
	return err
}

// AlterTopic grows a topic through the metadata leader; AwaitTopic waits
// until this node's table has the new partitions.
func (n *Node) AlterTopic(ctx context.Context, name string, partitions int) error {
	_, err := n.agent.Propose(ctx, metastate.AlterTopic{Name: name, Partitions: partitions})
	return err
}

// AwaitTopic waits until the table has topic with at least partitions
// partitions. It returns ctx's error, or cluster.ErrClosed once the node
// is closing.
func (n *Node) AwaitTopic(ctx context.Context, topic string, partitions int) error {
	for {
		st := n.agent.Meta().State()
		if t, ok := n.cfg.Topics.Get(topic); ok && len(t.Parts) >= partitions {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-st.Changed():
		case <-time.After(10 * time.Millisecond):
		}
		if n.closed.Load() {
			return fmt.Errorf("%w: the node is closing", cluster.ErrClosed)
		}
	}
}

// SetACL replaces the cluster's access rules through the metadata leader
// and returns the index of the entry that did; AwaitIndex waits until this
// node applied it.
func (n *Node) SetACL(ctx context.Context, rules []metastate.Rule) (index uint64, err error) {
	res, err := n.agent.Propose(ctx, metastate.SetACL{Rules: rules})
	return res.Index, err
}

// ACL returns the cluster's access rules.
func (n *Node) ACL() []metastate.Rule { return n.agent.Meta().State().ACL() }

// AwaitIndex waits until this node's copy of the metadata has applied the
// entry at index, or ctx ends (its error).
func (n *Node) AwaitIndex(ctx context.Context, index uint64) error {
	for {
		st := n.agent.Meta().State()
		if st.Index() >= index {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-st.Changed():
		}
	}
}

// Allowed returns cluster.ErrDenied unless identity may do right on topic
// under the current rules, logging a refusal the first time. A system
// topic's calls are its group's (allowedSystem).
func (n *Node) Allowed(identity, topic string, right metastate.Rights) error {
	if _, ok := metastate.SystemGroup(topic); ok {
		return n.allowedSystem(identity, topic, "", right)
	}
	st := n.agent.Meta().State()
	if st.Allowed(identity, topic, right) {
		return nil
	}
	what := strings.Join([]string{identity, topic, right.String()}, "\x00")
	if ok, unlogged := n.refused.First(what); ok {
		n.cfg.Logger.Warn("refused by the cluster's ACL", "identity", identity, "topic", topic, "right", right.String(), "unlogged", unlogged)
	}
	return fmt.Errorf("%w: %s may not %s %s", cluster.ErrDenied, identity, right, topic)
}

// Status is what a node knows of its cluster.
type Status struct {
	NodeID, Addr string
	ClusterID    string // the cluster's id as this node's state has it
	Leader       string // the metadata leader's node id, "" while none is known
	Nodes        []metastate.Node
	// Leading lists the replicated partitions whose replica on this node
	// leads now, as "topic/partition", sorted.
	Leading []string
	// Failed holds the replicated partitions this node is to lead and
	// cannot serve, by "topic/partition", with why (replica.ErrReplicaFailed).
	Failed map[string]error
	// Holds lists, by node id, the partitions with a replica on the node,
	// as "topic/partition" (metastate.State.Holds).
	Holds map[string][]string
}

// Status returns what the node knows of its cluster.
func (n *Node) Status() Status {
	leader, _ := n.agent.Meta().Leader()
	ms := n.agent.Meta().State()
	st := Status{NodeID: n.agent.ID(), Addr: n.agent.Addr(), ClusterID: ms.ClusterID(), Leader: leader, Nodes: ms.Nodes(),
		Holds: ms.Holdings()}
	n.eachReplicated(func(p *replica.Partition) {
		if p.Leads() {
			st.Leading = append(st.Leading, p.Name())
		}
		if err := p.Failed(); err != nil {
			if st.Failed == nil {
				st.Failed = map[string]error{}
			}
			st.Failed[p.Name()] = err
		}
	})
	slices.Sort(st.Leading)
	return st
}

// eachReplicated calls fn with each replicated partition in the table.
func (n *Node) eachReplicated(fn func(p *replica.Partition)) {
	for _, t := range n.cfg.Topics.All() {
		for _, p := range t.Parts {
			if r, ok := p.(*replica.Partition); ok {
				fn(r)
			}
		}
	}
}

// HoldSync keeps the table from following the metadata until release: a
// seam for tests.
func (n *Node) HoldSync() (release func()) {
	n.mu.Lock()
	return n.mu.Unlock
}
