// Package mq is an embedded, transactional message queue for Go application
// servers. It runs inside the host process: no broker to deploy.
//
// # Basics
//
// Open a node on a directory, create a topic with a number of partitions,
// send with a Producer and receive with a Consumer:
//
//	m, _ := mq.Open(dir)
//	defer m.Close()
//	m.CreateMQ(ctx, "orders", 8, mq.Options{})
//	p, _ := m.NewProducer("orders")
//	res, _ := p.SendMessage(ctx, &mq.Message{Key: "user-42", Body: b})
//	c, _ := m.NewConsumer("orders", "billing", listener)
//
// Each partition is an ordered log in its own bbolt file. Messages with the
// same Key go to the same partition. The partitions of a topic are divided
// among the consumers of a group; a group's offset, its position in each
// partition, is stored with the partition and survives restarts.
//
// # Consuming
//
// By default (Orderly) a partition is delivered one message at a time, in
// offset order, and a failing message blocks its partition while it is
// retried on a backoff ladder; after MaxReconsumeTimes it goes to the
// group's dead-letter topic, DeadLetterTopic(group). Concurrent mode parks a
// failing message in RetryTopic(group) and goes on. WithKeyParallel lets
// messages of different keys in one partition run side by side while each
// key stays one by one. WithBroadcast gives every consumer every message;
// WithTags and WithFilter select messages; Seek and ResetOffset move a group.
//
// # Transactions
//
// A message sent inside the host's local transaction (see package localtx)
// is delivered if and only if that transaction commits. CommitMessage writes
// the messages into the host transaction itself, as an outbox, and publishes
// them after the commit; PrepareMessage stores them as invisible half
// messages first. Either way a crash between the host's commit and the
// queue's is repaired on restart, by the outbox or by check-back.
//
// # Guarantees
//
//   - SendMessage returns only after the message is fsynced to disk,
//     unless WithSyncInterval was chosen.
//   - Order: within a partition, Orderly delivery is in offset order; a
//     message is delivered only after the one before it was handled or
//     dead-lettered. Key-parallel delivery keeps that order per key.
//   - At least once: the offset is committed after OnMessage returns nil; a
//     crash may deliver the last handled messages again, never skip one.
//   - A repeated send of the same message ID within the dedup window stores
//     nothing new and returns the first result.
//   - No consumer sees a message of a transaction that did not commit.
//
// # Caveats
//
// Growing a topic with AlterMQ changes which partition a key hashes to;
// per-key order across the change is kept only for keys whose partition did
// not change. Grow a topic while its queue is drained, as the draft advises.
package mq

import (
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/node"

	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/delivery"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/topicdb"
	"github.com/zeze-go/mq/internal/upkeep"
	"github.com/zeze-go/mq/store"
)

// MaxPartitions is the largest partition count of a topic.
const MaxPartitions = topicdb.MaxPartitions

// MQ is a node: the topics stored in one directory. It is safe for
// concurrent use.
type MQ struct {
	dir  string
	cfg  config
	meta *topicdb.Store
	wal  *store.WAL

	upkeep upkeep.Config

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // background goroutines

	// topics is read without a lock, as every send does. On a standalone
	// node adminMu serializes its changes by CreateMQ and AlterMQ with
	// Close, so that no change opens a file once Close began; a cluster
	// node's table changes under node.Node's own mutex. docs/DESIGN.md §3
	// has the lock order.
	topics  *partition.Table
	adminMu sync.Mutex
	closed  atomic.Bool

	delivery *delivery.Engine // consumers, groups and their workers
	cluster  *node.Node       // nil for a standalone node
}

// Open opens the node stored in dir, creating dir if needed, and reopens
// every topic, partition and group offset found there. Without cluster
// options the node is standalone: it opens no port. Each partition runs a
// writer goroutine, a materializer, which moves what the write-ahead log
// holds into the partition file, and an upkeep goroutine, which releases
// delayed messages and applies retention; the write-ahead log runs a
// writer and a segment pre-allocator; the transaction engine runs its
// check-back loop and its forgetter; each partition a consumer owns runs
// one delivery goroutine (see NewConsumer). With WithCluster the node also
// runs its cluster agent, which runs the metadata raft group, the sessions,
// the port and RPC; the loop that keeps the topic table in step with the
// metadata group; and the consumer groups' coordinator. Close stops them
// all and waits; docs/DESIGN.md §3 lists them and the order.
//
// The topic table is kept in dir/meta.db. Open rebuilds a missing or empty
// one from the topic directories (dir/topics/<topic>/<i>.db) and says so in
// the log; it returns ErrCorrupt, naming the file, for a damaged one, which
// it never overwrites: remove it and Open rebuilds it.
func Open(dir string, opts ...Option) (*MQ, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := store.MkdirAll(filepath.Join(dir, "topics")); err != nil {
		return nil, fmt.Errorf("mq: open %s: %w", dir, err)
	}
	id := ""
	if cfg.cluster != nil {
		id = cfg.cluster.NodeID
	}
	claim, err := node.CheckDir(dir, id)
	if err != nil {
		return nil, fmt.Errorf("mq: %w", translate(err))
	}
	meta, err := topicdb.Open(dir, cfg.logger)
	if err != nil {
		return nil, fmt.Errorf("mq: %w", translate(err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &MQ{
		dir:    dir,
		cfg:    cfg,
		meta:   meta,
		ctx:    ctx,
		cancel: cancel,
		topics: partition.NewTable(nil),
	}
	m.upkeep = upkeep.Config{Clock: cfg.clock, Retention: cfg.retention, RetentionBytes: cfg.retentionBytes,
		Consumed: cfg.retentionConsumed, DedupWindow: cfg.dedupWindow, DecisionTTL: cfg.decisionTTL, Interval: cfg.maintenanceInterval,
		DecideTTL: cfg.tx.prune.DecideTTL, BroadcastTTL: cfg.broadcastTTL}
	// One write-ahead log for the node: one fdatasync covers the sends of
	// every partition (store/wal.go). Whatever the options, Open recovers
	// what the log holds.
	if m.wal, err = store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{SyncInterval: cfg.syncInterval}); err != nil {
		meta.Close()
		cancel()
		return nil, fmt.Errorf("mq: open %s: %w", dir, translate(err))
	}
	if cfg.cluster == nil {
		err = m.load()
	} else if err = m.openCluster(); err == nil && claim { // the topics come from the metadata group
		err = node.Claim(dir, cfg.cluster.NodeID)
	}
	if err == nil {
		err = m.wal.FinishRecovery() // every partition has replayed its records
	}
	if err == nil {
		var coord delivery.Coordinator // standalone: delivery.Local
		if m.cluster != nil {
			coord = m.cluster.Coordinator()
		}
		m.delivery = delivery.New(deliveryTopics{m}, cfg.clock, cfg.logger, coord)
	}
	if err != nil {
		if m.cluster != nil {
			m.cluster.Close()
		}
		m.closeTopics()
		m.wal.Close()
		meta.Close()
		cancel()
		return nil, err
	}
	m.startBackground()
	return m, nil
}

// openCluster starts the node's part in the cluster (internal/node): its
// agent, and the topic table kept in step with the metadata group from
// startBackground on.
func (m *MQ) openCluster() error {
	c := m.cfg.cluster
	maxFrame := c.MaxFrameBytes
	if maxFrame == 0 {
		maxFrame = DefaultMaxFrameBytes
	}
	if maxFrame < m.cfg.maxMessageBytes+frameOverhead {
		return fmt.Errorf("%w: cluster MaxFrameBytes %d cannot carry a message of MaxMessageBytes %d", ErrInvalidOption, maxFrame, m.cfg.maxMessageBytes)
	}
	n, err := node.Open(node.Config{
		Agent: cluster.AgentConfig{
			ID: c.NodeID, Bind: c.Bind, Advertise: c.Advertise,
			Seeds: c.Seeds, Bootstrap: c.Bootstrap, Secret: c.Secret, ServerTLS: c.ServerTLS, ClientTLS: c.ClientTLS, InsecurePlaintext: c.InsecurePlaintext,
			SessionTimeout: c.SessionTimeout, HandshakeTimeout: c.HandshakeTimeout, MaxFrameBytes: maxFrame,
			HeartbeatTimeout: c.ElectionTimeout, ElectionTimeout: c.ElectionTimeout,
			LeaderLeaseTimeout: c.ElectionTimeout / 2, Logger: m.cfg.logger,
		},
		Local: m.localConfig(), Topics: m.topics, Upkeep: &m.upkeep,
		ElectionTimeout: c.ElectionTimeout, MaxBatchBytes: maxFrame - frameOverhead,
		PairCompactEvery: m.cfg.pairCompactEvery, PairKeepEntries: m.cfg.pairKeepEntries, InSyncHook: m.cfg.inSyncHook,
		Rebalance: func(topic string) { m.delivery.Rebalance(topic) },
		Logger:    m.cfg.logger,
	})
	if err != nil {
		return fmt.Errorf("mq: cluster: %w", translate(err))
	}
	m.cluster = n
	return nil
}

// load opens every topic of the table in meta.db.
func (m *MQ) load() error {
	metas, err := m.meta.Load()
	if err != nil {
		return fmt.Errorf("mq: %w", translate(err))
	}
	topics := make(map[string]*partition.Topic, len(metas))
	for _, name := range slices.Sorted(maps.Keys(metas)) {
		tm := metas[name]
		t := &partition.Topic{Name: name, Type: tm.Type, Created: tm.Created}
		topics[name] = t // the table holds every topic opened so far, which Open closes on a failure
		m.topics = partition.NewTable(topics)
		if t.Parts, err = m.openPartitions(name, 0, tm.Partitions); err != nil {
			return err
		}
	}
	return nil
}

// openPartitions opens partitions [from, to) of topic; on error it closes
// those it opened.
func (m *MQ) openPartitions(topic string, from, to int) ([]partition.Partition, error) {
	parts := make([]partition.Partition, 0, to-from)
	for i := from; i < to; i++ {
		p, err := m.openPartition(topic, i)
		if err != nil {
			for _, p := range parts {
				p.Close()
			}
			return nil, err
		}
		parts = append(parts, p)
	}
	return parts, nil
}

func (m *MQ) openPartition(topic string, i int) (partition.Partition, error) {
	p, err := partition.OpenLocal(m.localConfig(), topic, i)
	if err != nil {
		return nil, fmt.Errorf("mq: %w", translate(err))
	}
	return p, nil
}

// localConfig is what the node's Single partitions are opened with.
func (m *MQ) localConfig() partition.LocalConfig {
	return partition.LocalConfig{Dir: m.dir, WAL: m.wal, MaterializeAfter: m.cfg.materializeAfter, Now: m.cfg.clock.Now}
}

// Close stops every consumer, producer and background goroutine of the node,
// waits for them, flushes and closes every partition file. It is idempotent
// and returns the first error met: ErrStorageFailed for a partition whose
// log or file could not be written.
func (m *MQ) Close() error {
	m.adminMu.Lock()
	first := !m.closed.Swap(true)
	m.adminMu.Unlock()
	if !first {
		return nil
	}
	if m.cluster != nil {
		m.cluster.Closing()
	}
	m.delivery.Close()
	m.cancel()
	m.wg.Wait()
	var err error
	if m.cluster != nil { // before the partitions: it serves them
		err = m.cluster.Close()
	}
	if cerr := m.closeTopics(); err == nil {
		err = cerr
	}
	if cerr := m.wal.Close(); err == nil {
		err = cerr
	}
	if cerr := m.meta.Close(); err == nil {
		err = cerr
	}
	return translate(err) // a partition's failure is ErrStorageFailed here too
}

func (m *MQ) closeTopics() error {
	var first error
	for _, t := range m.topics.All() {
		for _, p := range t.Parts {
			if err := p.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// Dir returns the node's data directory.
func (m *MQ) Dir() string { return m.dir }

// CreateMQ creates topic with the given number of partitions. It returns
// ErrInvalidTopic, ErrInvalidPartition, ErrTopicExists, ErrUnsupportedType
// for DoubleWrite and Raft3 on a standalone node, ErrInvalidOption or
// ErrClosed; in a cluster, also ErrDenied, ErrNoQuorum when ctx ends
// before the metadata group took the topic, or ErrUnknownOutcome.
func (m *MQ) CreateMQ(ctx context.Context, topic string, partitions int, opts Options) error {
	if err := checkName(topic, ErrInvalidTopic); err != nil {
		return err
	}
	return m.createTopic(ctx, topic, partitions, opts)
}

// createTopic creates a topic without the name check, for system topics.
func (m *MQ) createTopic(ctx context.Context, name string, partitions int, opts Options) error {
	if partitions < 1 || partitions > MaxPartitions {
		return fmt.Errorf("%w: %d partitions (1..%d)", ErrInvalidPartition, partitions, MaxPartitions)
	}
	opts = opts.withDefaults()
	if err := opts.check(); err != nil {
		return err
	}
	switch opts.Type {
	case Single:
	case Raft3:
		if m.cluster == nil {
			return fmt.Errorf("%w: %v on a standalone node", ErrUnsupportedType, opts.Type)
		}
		if len(name) > node.MaxRaft3Topic {
			return fmt.Errorf("%w: a Raft3 topic's name is at most %d bytes", ErrInvalidTopic, node.MaxRaft3Topic)
		}
	case DoubleWrite:
		if m.cluster == nil {
			return fmt.Errorf("%w: %v on a standalone node", ErrUnsupportedType, opts.Type)
		}
	default:
		return fmt.Errorf("%w: %v", ErrUnsupportedType, opts.Type)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.cluster != nil {
		if m.closed.Load() {
			return ErrClosed
		}
		err := m.cluster.CreateTopic(ctx, metastate.CreateTopic{Name: name, Partitions: partitions, Type: uint8(opts.Type),
			Now: time.Now().UnixNano(), GroupSize: opts.PartitionsPerRaftGroup + opts.PartitionsPerPair, // one of them is zero (Options.check)
			AllowAlone: opts.AckAlone})
		if err != nil {
			return clusterErr(err)
		}
		return translate(m.cluster.AwaitTopic(ctx, name, partitions))
	}
	m.adminMu.Lock()
	defer m.adminMu.Unlock()
	if m.closed.Load() {
		return ErrClosed
	}
	if _, ok := m.topics.Get(name); ok {
		return fmt.Errorf("%w: %s", ErrTopicExists, name)
	}
	t := &partition.Topic{Name: name, Type: uint8(opts.Type), Created: time.Now()}
	var err error
	if t.Parts, err = m.openPartitions(name, 0, partitions); err != nil {
		return err
	}
	if err := m.putTopic(t); err != nil {
		closeAll(t.Parts)
		return err
	}
	m.topics.Put(t)
	m.maintainPartitions(name, 0, t.Parts)
	m.cfg.logger.Info("topic created", "topic", name, "partitions", partitions, "type", opts.Type)
	return nil
}

// AlterMQ grows topic to partitions partitions; the new ones start empty.
// Asking for fewer partitions than the topic has returns ErrPartitionDecrease;
// the same number is a no-op. Consumers of the topic are rebalanced.
func (m *MQ) AlterMQ(ctx context.Context, topic string, partitions int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if partitions < 1 || partitions > MaxPartitions {
		return fmt.Errorf("%w: %d partitions (1..%d)", ErrInvalidPartition, partitions, MaxPartitions)
	}
	if m.cluster != nil {
		if m.closed.Load() {
			return ErrClosed
		}
		if err := m.cluster.AlterTopic(ctx, topic, partitions); err != nil {
			return clusterErr(err)
		}
		return translate(m.cluster.AwaitTopic(ctx, topic, partitions))
	}
	m.adminMu.Lock()
	if m.closed.Load() {
		m.adminMu.Unlock()
		return ErrClosed
	}
	t, ok := m.topics.Get(topic)
	if !ok {
		m.adminMu.Unlock()
		return fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	have := len(t.Parts)
	if partitions < have {
		m.adminMu.Unlock()
		return fmt.Errorf("%w: %s has %d, asked %d", ErrPartitionDecrease, topic, have, partitions)
	}
	if partitions == have {
		m.adminMu.Unlock()
		return nil
	}
	added, err := m.openPartitions(topic, have, partitions)
	if err != nil {
		m.adminMu.Unlock()
		return err
	}
	grown := *t
	grown.Parts = slices.Concat(t.Parts, added)
	if err := m.putTopic(&grown); err != nil {
		closeAll(added)
		m.adminMu.Unlock()
		return err
	}
	m.topics.Put(&grown)
	m.maintainPartitions(topic, have, added)
	m.adminMu.Unlock()
	m.delivery.Rebalance(topic)
	m.cfg.logger.Info("topic altered", "topic", topic, "partitions", partitions)
	return nil
}

// Topics returns the names of the node's topics and their partition counts.
func (m *MQ) Topics() map[string]int {
	if m.closed.Load() {
		return map[string]int{}
	}
	all := m.topics.All()
	out := make(map[string]int, len(all))
	for n, t := range all {
		out[n] = len(t.Parts)
	}
	return out
}

// topic returns the named topic: a snapshot, which AlterMQ replaces and
// never modifies.
func (m *MQ) topic(name string) (*partition.Topic, error) {
	if m.closed.Load() {
		return nil, ErrClosed
	}
	t, ok := m.topics.Get(name)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoTopic, name)
	}
	return t, nil
}

// putTopic records t in meta.db.
func (m *MQ) putTopic(t *partition.Topic) error {
	err := m.meta.Put(t.Name, topicdb.Topic{Partitions: len(t.Parts), Type: t.Type, Created: t.Created})
	if err != nil {
		return fmt.Errorf("mq: %w", translate(err))
	}
	return nil
}

func closeAll(parts []partition.Partition) {
	for _, p := range parts {
		p.Close()
	}
}

// checkGroup returns ErrInvalidGroup for a bad group name.
func checkGroup(name string) error {
	if err := topicdb.CheckGroup(name); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidGroup, err)
	}
	return nil
}

// checkName applies the topic name rules; bad is the error to wrap.
func checkName(name string, bad error) error {
	if err := topicdb.CheckName(name); err != nil {
		return fmt.Errorf("%w: %v", bad, err)
	}
	return nil
}

// goFunc runs fn in a goroutine owned by the node: Close waits for it.
func (m *MQ) goFunc(fn func(ctx context.Context)) { m.wg.Go(func() { fn(m.ctx) }) }

// startBackground starts the node's background goroutines: the upkeep's
// and the transaction engine's through goFunc, a cluster node's through
// its node.Node. Close cancels and waits for all of them.
func (m *MQ) startBackground() {
	m.startMaintenance() // internal/upkeep: delay release, retention, dedup pruning
	m.startTxChecker()   // transaction.go, internal/txn: check-back, sweep, forgetter
	if m.cluster != nil {
		m.cluster.Start() // internal/node: the topic table follows the metadata group, the groups' members the consumers
	}
}

// startMaintenance starts the upkeep of every partition opened by Open.
func (m *MQ) startMaintenance() {
	for name, t := range m.topics.All() {
		m.maintainPartitions(name, 0, t.Parts)
	}
}

// maintainPartitions starts the upkeep of parts, the partitions of topic
// from index first on, of a standalone node. CreateMQ and AlterMQ call it
// for the partitions they add, with m.adminMu held and the node open, so
// Close waits for what it starts. A cluster node's upkeep is its node's
// (internal/node).
func (m *MQ) maintainPartitions(topic string, first int, parts []partition.Partition) {
	for i, p := range parts {
		if p, ok := p.(*partition.Local); ok {
			logger := m.cfg.logger.With("topic", topic, "partition", first+i)
			m.goFunc(func(ctx context.Context) { upkeep.Run(ctx, p, &m.upkeep, logger) })
		}
	}
}

// partitions returns topic's options and partitions from the topic table.
// In a cluster the table holds the partitions placed on other nodes too, as
// remote partitions (internal/node), so every caller works the same on both.
func (m *MQ) partitions(name string) (Options, []partition.Partition, error) {
	t, err := m.topic(name)
	if err != nil {
		return Options{}, nil, err
	}
	return Options{Type: Type(t.Type)}, t.Parts, nil
}

// ReadMessage returns the message stored at offset in one partition of
// topic, without a consumer and without touching any group's offset. It is
// meant for inspection, by an operator's tool or a test: consumers read in
// order and are faster for bulk reads.
//
// It returns ErrNoTopic; ErrInvalidPartition for a partition out of range;
// ErrNoMessage when no message is at offset; ErrCorrupt when the stored
// record fails its checksum, so the bytes on disk are not the message that
// was written; ErrClosed; or ctx's error.
func (m *MQ) ReadMessage(ctx context.Context, topic string, part int, offset int64) (*Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.allowed(topic, Consume); err != nil {
		return nil, err
	}
	_, parts, err := m.partitions(topic)
	if err != nil {
		return nil, err
	}
	if part < 0 || part >= len(parts) {
		return nil, fmt.Errorf("%w: partition %d of %s (0..%d)", ErrInvalidPartition, part, topic, len(parts)-1)
	}
	if offset < 0 {
		return nil, fmt.Errorf("%w: %s/%d offset %d", ErrNoMessage, topic, part, offset)
	}
	sm, ok, err := partition.Get(ctx, parts[part], uint64(offset))
	if err != nil {
		return nil, fmt.Errorf("read %s/%d at %d: %w", topic, part, offset, translate(err))
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s/%d offset %d", ErrNoMessage, topic, part, offset)
	}
	return fromStore(topic, part, &sm), nil
}
