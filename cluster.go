package mq

import (
	"github.com/zeze-go/mq/internal/metastate"

	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/meta"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/txn"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// clusterNode is the node's part in a cluster: its agent (port, metadata
// group, RPC) and the topic table kept in step with the metadata group's
// placement. A partition placed on this node is opened here and served to
// the others; one placed elsewhere is a remote partition.
type clusterNode struct {
	m       *MQ
	agent   *cluster.Agent
	coord   *cluster.Coordinator // the delivery engine's
	refused refusals             // acl.go
	// started is agent once openCluster has set it: the agent serves RPC
	// (served, authorize, checkTx) before OpenAgent returns, and those
	// callbacks answer only once it is set (which orders their reads of
	// agent after its write).
	started atomic.Pointer[cluster.Agent]
	// unopened are the Raft3 partitions in the table whose replica here
	// failed to open: the others serve them meanwhile, and each metadata
	// change tries to open it again (sync). Guarded by the MQ's adminMu.
	unopened map[*replica.Raft3]struct{}
	groups   replica.Groups // this node's replicas of raft groups
	pairs    replica.Pairs  // the DoubleWrite pairs of the table
}

// errStarting is what another node's call gets while this node's agent is
// being opened; the caller tries again.
var errStarting = fmt.Errorf("%w: the node is starting", store.ErrClosed)

// openCluster starts the node's agent. The topic table follows the
// metadata group from then on (syncLoop, started with the background).
func (m *MQ) openCluster() error {
	c := m.cfg.cluster
	maxFrame := c.MaxFrameBytes
	if maxFrame == 0 {
		maxFrame = DefaultMaxFrameBytes
	}
	if maxFrame < m.cfg.maxMessageBytes+frameOverhead {
		return fmt.Errorf("%w: cluster MaxFrameBytes %d cannot carry a message of MaxMessageBytes %d", ErrInvalidOption, maxFrame, m.cfg.maxMessageBytes)
	}
	cn := &clusterNode{m: m}
	agent, err := cluster.OpenAgent(cluster.AgentConfig{
		ID: c.NodeID, Dir: filepath.Join(m.dir, "cluster"), Bind: c.Bind, Advertise: c.Advertise,
		Seeds: c.Seeds, Secret: c.Secret, ServerTLS: c.ServerTLS, ClientTLS: c.ClientTLS,
		SessionTimeout: c.SessionTimeout, HandshakeTimeout: c.HandshakeTimeout, MaxFrameBytes: maxFrame,
		HeartbeatTimeout: c.ElectionTimeout, ElectionTimeout: c.ElectionTimeout,
		LeaderLeaseTimeout: c.ElectionTimeout / 2,
		Partitions:         cn.served, Authorize: cn.authorize, CheckTx: cn.checkTx, Serve: cn.serveReplicas, Logger: m.cfg.logger,
	})
	if err != nil {
		return fmt.Errorf("mq: cluster: %w", translate(err))
	}
	cn.agent = agent
	cn.started.Store(agent)
	cn.coord = cluster.NewCoordinator(agent, func(topic string) { m.delivery.Rebalance(topic) })
	m.cluster = cn
	return nil
}

// The node file, <dir>/cluster/node: nodeFileHeader, then the id of the
// cluster node whose directory this is, and a newline. A directory is one
// node's for its life: its raft log, its state and its partition files are
// that node's, placed by the cluster. Open writes the file the first time
// a directory opens WithCluster (a directory of an older release, which
// has a raft log but no file, takes the id it is opened with), and refuses
// what does not fit it.
const nodeFileHeader = "zeze-mq node 1\n"

// checkDirOwner returns ErrInvalidOption when dir is not the directory of
// the node cfg describes: a cluster node's opened standalone or under
// another NodeID, or a standalone node's (it has topics) opened
// WithCluster. claim is true when a cluster node's directory has no node
// file yet: Open writes it (claimDir) once the node opened.
func checkDirOwner(dir string, cfg *config) (claim bool, err error) {
	cdir := filepath.Join(dir, "cluster")
	path := filepath.Join(cdir, "node")
	owner := ""
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id, hasHeader := strings.CutPrefix(string(b), nodeFileHeader)
		id, hasEnd := strings.CutSuffix(id, "\n")
		if owner = id; !hasHeader || !hasEnd || metastate.CheckNodeID(owner) != nil {
			return false, fmt.Errorf("%w: %s is not a node file", ErrCorrupt, path)
		}
	case !errors.Is(err, os.ErrNotExist):
		return false, fmt.Errorf("mq: open %s: %w", path, err)
	}
	_, err = os.Stat(filepath.Join(cdir, "raft.db"))
	hasRaft := err == nil
	if cfg.cluster == nil {
		if owner != "" || hasRaft {
			return false, fmt.Errorf("%w: %s is the directory of cluster node %q: open it WithCluster", ErrInvalidOption, dir, cmp.Or(owner, "?"))
		}
		return false, nil
	}
	if id := cfg.cluster.NodeID; owner != "" && owner != id {
		return false, fmt.Errorf("%w: %s is the directory of cluster node %q, not %q", ErrInvalidOption, dir, owner, id)
	}
	if owner == "" && !hasRaft {
		if ents, err := os.ReadDir(filepath.Join(dir, "topics")); err != nil || len(ents) > 0 {
			return false, fmt.Errorf("%w: %s holds the topics of a standalone node, which cannot join a cluster (%v)", ErrInvalidOption, dir, err)
		}
	}
	return owner == "", nil
}

// claimDir writes the node file of dir, naming node id.
func claimDir(dir, id string) error {
	path := filepath.Join(dir, "cluster", "node")
	if err := boltsafe.ReplaceFile(path, []byte(nodeFileHeader+id+"\n")); err != nil {
		return fmt.Errorf("mq: open %s: %w", path, err)
	}
	return nil
}

// recoverLogged moves what the write-ahead log holds for each partition
// into its file (opening and closing it) before Open's FinishRecovery drops
// the old segments. A cluster node opens its partitions only later, as the
// metadata state places them, and may never open those of a topic it no
// longer shows (a directory that was standalone): acked records would be
// lost with the segments.
func (m *MQ) recoverLogged() error {
	for _, stream := range m.wal.Streams() {
		if strings.HasPrefix(stream, raft3Prefix) || strings.HasPrefix(stream, dwPrefix) {
			if err := m.retainRaftLog(stream); err != nil {
				return err
			}
			continue
		}
		i := strings.LastIndexByte(stream, '/')
		part, err := strconv.Atoi(stream[i+1:])
		topic := stream[:max(i, 0)]
		if i < 0 || err != nil || part < 0 || (meta.CheckName(topic) != nil && !meta.IsSystemTopic(topic)) {
			m.cfg.logger.Warn("write-ahead log stream of no partition; its records are dropped", "stream", stream)
			continue
		}
		path := meta.PartitionPath(m.dir, topic, part)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			m.cfg.logger.Warn("write-ahead log records of a missing partition file; dropped", "stream", stream, "path", path)
			continue
		}
		p, err := store.Open(path, store.Options{WAL: m.wal, Stream: stream})
		if err == nil {
			err = p.Close()
		}
		if err != nil {
			return fmt.Errorf("mq: recover %s: %w", path, translate(err))
		}
	}
	return nil
}

// DefaultMaxFrameBytes is ClusterConfig.MaxFrameBytes's default: room for
// the largest message WithMaxMessageBytes allows, so that nodes with
// different message limits still carry each other's messages.
const DefaultMaxFrameBytes = maxMessageLimit + frameOverhead

// frameOverhead is what a frame needs beside one message: the request or
// reply around it.
const frameOverhead = 1 << 20

// syncLoop keeps the topic table in step with the metadata group until the
// node closes.
func (cn *clusterNode) syncLoop(ctx context.Context) {
	for {
		st := cn.agent.Meta().State()
		cn.sync(st)
		select {
		case <-ctx.Done():
			return
		case <-st.Changed():
		}
	}
}

// sync publishes the topics of st in the table: partitions placed here are
// opened (and their upkeep started), the others reached by RPC. A
// partition's placement never changes for a Single topic, so what is in the
// table is kept and only added partitions are made.
func (cn *clusterNode) sync(st *metastate.State) {
	m := cn.m
	m.adminMu.Lock()
	defer m.adminMu.Unlock()
	if m.closed.Load() {
		return
	}
	for r := range cn.unopened {
		if cn.attachReplica(r) == nil { // a failure was logged when it first failed
			delete(cn.unopened, r)
			m.cfg.logger.Info("replica opened", "partition", r.Name())
		}
	}
	cn.updateDoubleWrite(st)
	for _, name := range st.Topics() {
		ct, ok := st.Topic(name)
		if !ok {
			continue
		}
		old, _ := m.topics.Get(name)
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
		var local []int
		for i := have; i < len(ct.Parts); i++ {
			p, isLocal, err := cn.partition(ct, i)
			if err != nil {
				m.cfg.logger.Error("cannot open a partition placed on this node", "topic", name, "partition", i, "err", err)
				break // the table gets the partitions before it; the next change tries again
			}
			if isLocal {
				local = append(local, i)
			}
			t.Parts = append(t.Parts, p)
		}
		if len(t.Parts) == have {
			continue
		}
		m.topics.Put(t)
		for _, i := range local {
			m.maintainPartitions(name, i, t.Parts[i:i+1])
		}
		if old != nil { // not under adminMu: a rebalance reads the table
			m.goFunc(func(context.Context) { m.delivery.Rebalance(name) })
		}
		m.cfg.logger.Info("topic in step with the cluster", "topic", name, "partitions", len(t.Parts))
	}
}

// partition opens partition i of topic t as placed: here, or a client of
// the node holding it; for Raft3 the way to its group's leader, with this
// node's replica if it holds one.
func (cn *clusterNode) partition(t metastate.Topic, i int) (partition.Partition, bool, error) {
	topic, pl := t.Name, t.Parts[i]
	if len(pl.Replicas) == 0 {
		return nil, false, fmt.Errorf("%s/%d has no replica", topic, i)
	}
	switch t.Type {
	case metastate.TypeRaft3:
		first, n := t.Chunk(i)
		return cn.openRaft3(replica.Raft3Config{Topic: topic, Index: i, First: first, Partitions: n, Replicas: pl.Replicas})
	case metastate.TypeDoubleWrite:
		return cn.openDoubleWrite(t, i)
	}
	owner := pl.Replicas[0]
	if owner == cn.agent.ID() {
		p, err := cn.m.openPartition(topic, i)
		return p, true, err
	}
	c, err := cn.agent.Peer(owner)
	if err != nil {
		return nil, false, err
	}
	return remote.NewPartition(c, topic, i, remote.PartitionConfig{}), false, nil
}

// served is the partition of the table that this node serves to another's
// RPC: one placed here. A topic just created may not be in the table yet
// (the metadata group's change reaches the nodes one after the other): it
// waits a little for it; but a Raft3 partition the metadata shows and the
// table does not yet is refused at once (store.ErrClosed), so the caller
// asks another of its replicas.
func (cn *clusterNode) served(topic string, i int) (partition.Partition, error) {
	if cn.started.Load() == nil {
		return nil, errStarting
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if t, ok := cn.m.topics.Get(topic); ok && i >= 0 && i < len(t.Parts) {
			switch p := t.Parts[i].(type) {
			case *partition.Local:
				return p, nil
			case *replica.Raft3:
				if l := p.Leading(); l != nil {
					return l, nil // it answers while it leads
				}
			case *replica.DoubleWrite:
				if l := p.Leading(); l != nil {
					return l, nil // it answers while it leads
				}
			}
			return nil, fmt.Errorf("%w: %s/%d is not on node %s", store.ErrClosed, topic, i, cn.agent.ID())
		}
		if mt, ok := cn.agent.Meta().State().Topic(topic); ok && mt.Type != metastate.TypeSingle && i >= 0 && i < len(mt.Parts) {
			return nil, fmt.Errorf("%w: %s/%d is not open on node %s yet", store.ErrClosed, topic, i, cn.agent.ID())
		}
		if cn.m.closed.Load() || time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %s/%d", ErrNoTopic, topic, i)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// authorize is the ACL of the partition service: what a node asks of a
// partition stored here needs the right its own calls would. Commands only
// a partition's own node proposes (upkeep, counting check-backs) are
// refused from others. Deciding a transaction needs Produce when the
// caller prepared it (it is named as the half messages' producer, which a
// prepare must name truly), Admin otherwise; a reset needs Admin, as
// ResetOffset and Seek do where they start.
func (cn *clusterNode) authorize(peer, topic string, index int, op uint16, cmd *store.Command) error {
	if cn.started.Load() == nil {
		return errStarting
	}
	if meta.IsSystemTopic(topic) {
		return nil
	}
	right := Consume // reads, fetches, offsets
	switch {
	case op == remote.OpHalfTxs || op == remote.OpDecision: // transaction state: a producer's or an admin's check
		st := cn.agent.Meta().State()
		for _, r := range []Rights{Produce, Consume, Admin} {
			if st.Allowed(peer, topic, metastate.Rights(r)) {
				return nil
			}
		}
		return fmt.Errorf("%w: %v", cluster.ErrDenied, cn.allowed(peer, topic, Produce))
	case op != remote.OpApply:
	case cmd.Op == store.OpPrepare && cmd.Producer != peer:
		return fmt.Errorf("%w: %s prepares half messages as %q", cluster.ErrDenied, peer, cmd.Producer)
	case cmd.Op == store.OpCommitTx || cmd.Op == store.OpRollbackTx:
		right = Produce
		if cn.agent.Meta().State().Allowed(peer, topic, metastate.Rights(Admin)) {
			return nil
		}
		producer, ok, err := cn.halfProducer(topic, index, cmd.TxID)
		if err != nil {
			return err
		}
		if ok && producer != peer {
			return fmt.Errorf("%w: %s decides transaction %s of %s: %v", cluster.ErrDenied, peer, cmd.TxID, producer,
				cn.allowed(peer, topic, Admin))
		}
	case cmd.Op == store.OpAppend || cmd.Op == store.OpPrepare:
		right = Produce
	case cmd.Op == store.OpDeleteGroup || cmd.Op == store.OpResetOffset:
		right = Admin
	case cmd.Op == store.OpClaim || cmd.Op == store.OpCommitOffset || cmd.Op == store.OpUnclaim || cmd.Op == store.OpRenew:
	default:
		return fmt.Errorf("%w: op %d is proposed by the partition's own node only", cluster.ErrDenied, cmd.Op)
	}
	if err := cn.allowed(peer, topic, right); err != nil {
		return fmt.Errorf("%w: %v", cluster.ErrDenied, err) // a code the caller's node maps back to ErrDenied
	}
	return nil
}

// halfProducer returns the producer of txid's half messages in partition
// index of topic, stored here, and whether there are any.
func (cn *clusterNode) halfProducer(topic string, index int, txid string) (string, bool, error) {
	t, ok := cn.m.topics.Get(topic)
	if !ok || index < 0 || index >= len(t.Parts) {
		return "", false, nil // the lookup that follows answers
	}
	switch p := t.Parts[index].(type) {
	case *partition.Local:
		return p.HalfProducer(txid)
	case *replica.Raft3:
		if l := p.Leading(); l != nil {
			return l.HalfProducer(txid)
		}
	case *replica.DoubleWrite:
		if l := p.Leading(); l != nil {
			return l.HalfProducer(txid)
		}
	}
	return "", false, nil
}

// checkTx answers another node's check-back of a transaction this node
// prepared (internal/txn's CheckBack).
func (cn *clusterNode) checkTx(ctx context.Context, txid string, parts []cluster.PartRef) (store.Decision, error) {
	if cn.started.Load() == nil {
		return store.Undecided, errStarting
	}
	node := cn.m.cfg.tx.node
	if node == nil { // not started yet: as if running
		return store.Undecided, nil
	}
	refs := make([]txn.Ref, len(parts))
	for i, p := range parts {
		refs[i] = txn.Ref{Topic: p.Topic, Part: p.Part}
	}
	return node.CheckBack(ctx, txid, refs)
}

// askNode asks node, which prepared txid, to decide it for the half
// messages in parts.
func (cn *clusterNode) askNode(ctx context.Context, node, txid string, parts []txn.Ref) (store.Decision, error) {
	refs := make([]cluster.PartRef, len(parts))
	for i, p := range parts {
		refs[i] = cluster.PartRef{Topic: p.Topic, Part: p.Part}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return cn.agent.CheckTx(ctx, node, txid, refs)
}

// owned reports whether partition part of topic is stored on this node.
func (cn *clusterNode) owned(topic string, part int) bool {
	t, ok := cn.m.topics.Get(topic)
	if !ok || part < 0 || part >= len(t.Parts) {
		return false
	}
	switch p := t.Parts[part].(type) {
	case *partition.Local:
		return true
	case *replica.Raft3: // its leader's node checks its transactions back
		return p.Leads()
	case *replica.DoubleWrite:
		return p.Leads()
	}
	return false
}

// handOff hands the leadership of this node's Raft3 replicas to others,
// and its DoubleWrite pairs to their followers in sync, before the node
// closes, in parallel, once per group and pair.
func (cn *clusterNode) handOff() {
	var wg sync.WaitGroup
	seen := map[*raftqueue.Group]bool{}
	cn.eachRaft3(func(r *replica.Raft3) {
		if g := r.Replica(); g != nil && !seen[g] {
			seen[g] = true
			wg.Go(r.HandOff)
		}
	})
	pairs := map[*replica.Pair]bool{}
	cn.eachDoubleWrite(func(d *replica.DoubleWrite) {
		if p := d.Pair(); !pairs[p] {
			pairs[p] = true
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				p.HandOff(ctx)
			})
		}
	})
	wg.Wait()
}

// closing tells the Raft3 partitions that the node is closing (see
// replica.Raft3.Closing).
func (cn *clusterNode) closing() {
	cn.eachRaft3((*replica.Raft3).Closing)
	cn.eachDoubleWrite((*replica.DoubleWrite).Closing)
}

// eachRaft3 calls fn with each Raft3 partition in the table.
func (cn *clusterNode) eachRaft3(fn func(r *replica.Raft3)) {
	for _, t := range cn.m.topics.All() {
		for _, p := range t.Parts {
			if r, ok := p.(*replica.Raft3); ok {
				fn(r)
			}
		}
	}
}

// raft3Name is the raft group, and the WAL stream of its log, whose first
// partition is partition first of a Raft3 topic (at most 255 bytes:
// transport.MaxGroupIDLen).
func raft3Name(topic string, first int) string {
	return raft3Prefix + topic + "/" + strconv.Itoa(first)
}

const raft3Prefix = "raft3/"

// maxRaft3Topic is the longest name of a Raft3 topic: its group names fit
// the port's raft group ids.
const maxRaft3Topic = transport.MaxGroupIDLen - len(raft3Prefix) - len("/65535")

// openRaft3 opens a partition of a Raft3 topic placed as cfg says: this
// node's replica of its group if it is one of them, and the way to the
// group's leader. A replica here that fails to open leaves the partition
// served by the other two, and is tried again at each metadata change
// (unopened).
func (cn *clusterNode) openRaft3(cfg replica.Raft3Config) (partition.Partition, bool, error) {
	m := cn.m
	cfg.Self, cfg.Peer, cfg.Now = cn.agent.ID(), cn.agent.Peer, m.cfg.clock.Now
	cfg.Logger = m.cfg.logger.With("topic", cfg.Topic, "partition", cfg.Index)
	r := replica.NewRaft3(cfg)
	if !slices.Contains(cfg.Replicas, cfg.Self) {
		return r, false, nil
	}
	if err := cn.attachReplica(r); err != nil {
		m.cfg.logger.Error("cannot open this node's replica of a partition: the others serve it", "topic", cfg.Topic, "partition", cfg.Index, "err", err)
		if cn.unopened == nil {
			cn.unopened = map[*replica.Raft3]struct{}{}
		}
		cn.unopened[r] = struct{}{}
	}
	return r, true, nil
}

// attachReplica attaches this node's replica of r's group to r, opening it
// unless another partition of the group has.
func (cn *clusterNode) attachReplica(r *replica.Raft3) error {
	cfg := r.Config()
	return cn.groups.Attach(r, raft3Name(cfg.Topic, cfg.First), func() (*raftqueue.Group, error) {
		return cn.openReplica(cfg)
	})
}

// openReplica opens this node's replica of the raft group of a Raft3
// partition placed as cfg says: the group on the port, its log a stream of
// the node's WAL, its files in <dir>/raft3/<topic>/<first>. A new replica
// bootstraps the group with the three of them (each does, alike: raft
// allows it); one with state rejoins.
func (cn *clusterNode) openReplica(cfg replica.Raft3Config) (*raftqueue.Group, error) {
	name := raft3Name(cfg.Topic, cfg.First)
	return openWithLog(cn.m, name, false, func(log *raftqueue.WALLog) (*raftqueue.Group, error) { return cn.openGroup(cfg, name, log) })
}

// openWithLog opens a replica with open, given its log, the WAL stream
// name. The log stays in raftLogs until the replica opened (for good with
// keep): a stream is retained once per WAL, and a failed open is tried
// again at the metadata state's next change.
func openWithLog[R any](m *MQ, name string, keep bool, open func(log *raftqueue.WALLog) (R, error)) (R, error) {
	log, ok := m.raftLogs[name]
	if !ok {
		var err error
		if log, err = raftqueue.OpenWALLog(m.wal, name); err != nil {
			var none R
			return none, err
		}
		if m.raftLogs == nil {
			m.raftLogs = map[string]*raftqueue.WALLog{}
		}
		m.raftLogs[name] = log
	}
	r, err := open(log)
	if err == nil && !keep {
		delete(m.raftLogs, name)
	}
	return r, err
}

// openGroup opens this node's replica of the raft group name of the
// partition cfg places, its log log, and bootstraps it (see openReplica).
func (cn *clusterNode) openGroup(cfg replica.Raft3Config, name string, log *raftqueue.WALLog) (*raftqueue.Group, error) {
	m := cn.m
	layer, err := cn.agent.RaftMux().Layer(name)
	if err != nil {
		return nil, err
	}
	return replica.OpenGroup(replica.GroupConfig{Self: cn.agent.ID(), Replicas: cfg.Replicas,
		Dir: filepath.Join(m.dir, "raft3", cfg.Topic, strconv.Itoa(cfg.First)), Partitions: cfg.Partitions,
		Layer: layer, Log: log, ElectionTimeout: m.cfg.cluster.ElectionTimeout,
		Logger: cluster.NewHCLogger(m.cfg.logger.With("topic", cfg.Topic, "group", cfg.First), "raft3")})
}

// retainRaftLogs keeps the logs of the Raft3 replicas left in the WAL
// before FinishRecovery drops them: the replicas open later, as the
// metadata state places them.
func (m *MQ) retainRaftLog(stream string) error {
	l, err := raftqueue.OpenWALLog(m.wal, stream)
	if err != nil {
		return fmt.Errorf("mq: recover %s: %w", stream, translate(err))
	}
	if m.raftLogs == nil {
		m.raftLogs = map[string]*raftqueue.WALLog{}
	}
	m.raftLogs[stream] = l
	return nil
}

// createTopic creates a topic through the metadata leader, which places its
// partitions, and waits until this node's table has it.
func (cn *clusterNode) createTopic(ctx context.Context, name string, partitions int, opts Options) error {
	now := time.Now().UnixNano()
	_, err := cn.agent.Propose(ctx, metastate.CreateTopic{Name: name, Partitions: partitions, Type: uint8(opts.Type), Now: now,
		GroupSize: opts.PartitionsPerRaftGroup + opts.PartitionsPerPair, AllowAlone: opts.AckAlone}) // one of them is zero (Options.check)
	if errors.Is(err, cluster.ErrUnknownOutcome) || errors.Is(err, metastate.ErrTopicExists) {
		// A create that may have been applied, or repeated after one that
		// was: it is this call's when the topic carries its time.
		if t, ok := cn.agent.Meta().State().Topic(name); ok && t.Created == now {
			err = nil
		}
	}
	if err != nil {
		return clusterErr(err)
	}
	return cn.await(ctx, name, partitions)
}

// alterTopic grows a topic through the metadata leader and waits until
// this node's table has the new partitions.
func (cn *clusterNode) alterTopic(ctx context.Context, name string, partitions int) error {
	if _, err := cn.agent.Propose(ctx, metastate.AlterTopic{Name: name, Partitions: partitions}); err != nil {
		return clusterErr(err)
	}
	return cn.await(ctx, name, partitions)
}

// await waits until the table has topic with at least partitions
// partitions.
func (cn *clusterNode) await(ctx context.Context, topic string, partitions int) error {
	for {
		st := cn.agent.Meta().State()
		if t, ok := cn.m.topics.Get(topic); ok && len(t.Parts) >= partitions {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-st.Changed():
		case <-time.After(10 * time.Millisecond):
		}
		if cn.m.closed.Load() {
			return ErrClosed
		}
	}
}

// awaitIndex waits until this node's copy of the metadata has applied the
// entry at index.
func (cn *clusterNode) awaitIndex(ctx context.Context, index uint64) error {
	for {
		st := cn.agent.Meta().State()
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

// clusterErr maps the error of a proposal through the metadata leader: a
// ctx that ended before a leader answered is ErrNoQuorum (and still ctx's
// error); the rest as every error (translate).
func clusterErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %w", ErrNoQuorum, err)
	}
	return translate(err)
}

// ClusterStatus is what a node knows of its cluster.
type ClusterStatus struct {
	NodeID string // this node's
	Addr   string // this node's advertised address
	Leader string // the metadata leader's node id, "" while none is known
	Nodes  []NodeStatus
	// Leading lists the replicated partitions (Raft3, DoubleWrite) whose
	// replica on this node leads now, as "topic/partition", sorted.
	Leading []string
}

// NodeStatus is one node as the metadata group records it.
type NodeStatus struct {
	ID   string
	Addr string
	Up   bool // false once its session expired, until it comes back
}

// ClusterStatus returns what the node knows of its cluster: the zero value
// for a standalone node.
func (m *MQ) ClusterStatus() ClusterStatus {
	if m.cluster == nil {
		return ClusterStatus{}
	}
	a := m.cluster.agent
	leader, _ := a.Meta().Leader()
	st := ClusterStatus{NodeID: a.ID(), Addr: a.Addr(), Leader: leader}
	for _, nd := range a.Meta().State().Nodes() {
		st.Nodes = append(st.Nodes, NodeStatus{ID: nd.ID, Addr: nd.Addr, Up: nd.Up})
	}
	m.cluster.eachRaft3(func(r *replica.Raft3) {
		if r.Leads() {
			st.Leading = append(st.Leading, r.Name())
		}
	})
	m.cluster.eachDoubleWrite(func(d *replica.DoubleWrite) {
		if d.Leads() {
			st.Leading = append(st.Leading, d.Name())
		}
	})
	slices.Sort(st.Leading)
	return st
}
