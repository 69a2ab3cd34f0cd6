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
// among the consumers of a group; a group's position in each partition (its
// offset) is stored with the partition and survives restarts.
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
// the messages into the host transaction itself (an outbox) and publishes
// them after the commit; PrepareMessage stores them as invisible half
// messages first. Either way a crash between the host's commit and the
// queue's is repaired on restart, by the outbox or by check-back.
//
// # Guarantees
//
//   - SendMessage returns only after the message is on disk (fsync), unless
//     WithSyncInterval was chosen.
//   - Order: within a partition, Orderly delivery is in offset order; a
//     message is delivered only after the one before it was handled (or
//     dead-lettered). Key-parallel delivery keeps that order per key.
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
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/store"
)

// Errors returned by this package; compare with errors.Is.
var (
	// ErrClosed is returned by every method of a node, producer or consumer
	// after its Close.
	ErrClosed = errors.New("mq: closed")
	// ErrTopicExists is returned by CreateMQ for a topic that exists.
	ErrTopicExists = errors.New("mq: topic exists")
	// ErrNoTopic is returned for a topic that does not exist.
	ErrNoTopic = errors.New("mq: no such topic")
	// ErrInvalidTopic is returned for a topic name that is empty, longer
	// than 255 bytes, has characters other than letters, digits, '.', '_'
	// and '-', or starts with '%' (reserved for system topics).
	ErrInvalidTopic = errors.New("mq: invalid topic name")
	// ErrInvalidPartition is returned for a partition count below 1 or above
	// MaxPartitions, or a partition index out of range.
	ErrInvalidPartition = errors.New("mq: invalid partition")
	// ErrPartitionDecrease is returned by AlterMQ when asked to shrink a topic.
	ErrPartitionDecrease = errors.New("mq: partitions can only grow")
	// ErrMessageTooLarge is returned by SendMessage, before anything is
	// written, for a message over the node's MaxMessageBytes.
	ErrMessageTooLarge = errors.New("mq: message too large")
	// ErrInvalidMessage is returned by SendMessage, PrepareMessage and
	// CommitMessage, before anything is written, for a message whose ID is
	// longer than MaxIDBytes, whose Timestamp is outside what int64 Unix
	// nanoseconds hold (1677-09-21 to 2262-04-11), or whose DeliverAt is
	// after that range.
	ErrInvalidMessage = errors.New("mq: invalid message")
	// ErrUnsupportedType is returned by CreateMQ for a replication type this
	// node cannot provide (DoubleWrite and Raft3 need a cluster).
	ErrUnsupportedType = errors.New("mq: replication type not supported here")
	// ErrInvalidOption is returned by Open, NewProducer and NewConsumer for a
	// bad option.
	ErrInvalidOption = errors.New("mq: invalid option")
	// ErrInvalidGroup is returned by NewConsumer for a bad group name (the
	// same rules as topic names).
	ErrInvalidGroup = errors.New("mq: invalid group name")
	// ErrNilMessage is returned by SendMessage for a nil *Message.
	ErrNilMessage = errors.New("mq: nil message")
	// ErrInvalidOffset is returned by ResetOffset and Seek for an offset past
	// the end of its partition.
	ErrInvalidOffset = errors.New("mq: invalid offset")
	// ErrTxDecided is returned by PrepareMessage when the transaction was
	// already decided (committed or rolled back) in a partition.
	ErrTxDecided = errors.New("mq: transaction already decided")
	// ErrNoMessage is returned by ReadMessage for an offset that holds no
	// message: not written yet, or already removed by retention.
	ErrNoMessage = errors.New("mq: no message at offset")
	// ErrCorrupt is returned when stored data fails its checksum or a file
	// is damaged (the error names the file), and by Open for a meta.db
	// written by a newer version.
	ErrCorrupt = errors.New("mq: corrupt data")
	// ErrNotInTransaction is returned by PrepareMessage and CommitMessage
	// when ctx carries no host transaction.
	ErrNotInTransaction = errors.New("mq: not in a transaction")
	// ErrNoQuorum is returned when a replicated partition cannot reach a
	// quorum before ctx ends.
	ErrNoQuorum = errors.New("mq: no quorum")
	// ErrStorageFailed is returned for every write to a partition after a
	// write or sync of its log or file failed (an I/O error, a full disk),
	// until the node is reopened: the outcome of the writes in flight is
	// unknown, and nothing is retried and acknowledged. Resend with the same
	// IDs after reopening.
	ErrStorageFailed = errors.New("mq: storage failed")
)

// MaxPartitions is the largest partition count of a topic.
const MaxPartitions = 1024

// MQ is a node: the topics stored in one directory. It is safe for
// concurrent use.
type MQ struct {
	dir    string
	cfg    config
	meta   *bolt.DB
	wal    *store.WAL
	router router

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // background goroutines

	mu     sync.Mutex // guards closed, topics, groups; order: MQ.mu before group.mu
	closed bool
	topics map[string]*topic
	groups map[string]*group // topic + "\x00" + group
}

type topic struct {
	name    string
	opts    Options
	created time.Time      // as recorded in meta.db; zero if unknown
	parts   []partitionLog // replaced, never modified, on AlterMQ; guarded by MQ.mu
}

// Open opens the node stored in dir, creating dir if needed, and reopens
// every topic, partition and group offset found there. Without cluster
// options the node is standalone: it opens no port. Each partition runs one
// writer goroutine and one upkeep goroutine (delayed-message release,
// retention); each partition a consumer owns runs one delivery goroutine; the
// transaction checker runs one more. Close stops them all and waits.
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
	meta, err := openMeta(dir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &MQ{
		dir:    dir,
		cfg:    cfg,
		meta:   meta,
		ctx:    ctx,
		cancel: cancel,
		topics: map[string]*topic{},
		groups: map[string]*group{},
	}
	m.router = localRouter{m}
	// One write-ahead log for the node: one fdatasync covers the sends of
	// every partition (store/wal.go). Whatever the options, Open recovers
	// what the log holds.
	if m.wal, err = store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{SyncInterval: cfg.syncInterval}); err != nil {
		meta.Close()
		cancel()
		return nil, fmt.Errorf("mq: open %s: %w", dir, translate(err))
	}
	err = m.load()
	if err == nil {
		err = m.wal.FinishRecovery() // every partition has replayed its records
	}
	if err != nil {
		m.closeTopics()
		m.wal.Close()
		meta.Close()
		cancel()
		return nil, err
	}
	m.startBackground()
	return m, nil
}

func (m *MQ) partitionPath(topic string, i int) string {
	return filepath.Join(m.dir, "topics", topic, strconv.Itoa(i)+".db")
}

func (m *MQ) openPartition(topic string, i int) (partitionLog, error) {
	path := m.partitionPath(topic, i)
	if err := store.MkdirAll(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("mq: %s/%d: %w", topic, i, err)
	}
	p, err := store.Open(path, store.Options{WAL: m.wal, Stream: topic + "/" + strconv.Itoa(i), MaterializeAfter: m.cfg.materializeAfter})
	if err != nil {
		return nil, fmt.Errorf("mq: %s/%d: %w", topic, i, translate(err))
	}
	return p, nil
}

// Close stops every consumer, producer and background goroutine of the node,
// waits for them, flushes and closes every partition file. It is idempotent
// and returns the first error met (ErrStorageFailed for a partition whose
// log or file could not be written).
func (m *MQ) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	var consumers []*Consumer
	for _, g := range m.groups {
		consumers = append(consumers, g.members()...)
	}
	m.mu.Unlock()

	for _, c := range consumers {
		c.Close()
	}
	m.cancel()
	m.wg.Wait()
	err := m.closeTopics()
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
	for _, t := range m.topics {
		for _, p := range t.parts {
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
// (DoubleWrite and Raft3 on a standalone node) or ErrClosed.
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
	switch opts.Type {
	case Single:
	case DoubleWrite, Raft3:
		return fmt.Errorf("%w: %v on a standalone node", ErrUnsupportedType, opts.Type)
	default:
		return fmt.Errorf("%w: %v", ErrUnsupportedType, opts.Type)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if _, ok := m.topics[name]; ok {
		return fmt.Errorf("%w: %s", ErrTopicExists, name)
	}
	t := &topic{name: name, opts: opts, created: time.Now()}
	for i := 0; i < partitions; i++ {
		p, err := m.openPartition(name, i)
		if err != nil {
			for _, p := range t.parts {
				p.Close()
			}
			return err
		}
		t.parts = append(t.parts, p)
	}
	if err := m.putTopicMeta(name, topicMeta{Partitions: partitions, Type: opts.Type, Created: t.created}); err != nil {
		for _, p := range t.parts {
			p.Close()
		}
		return err
	}
	m.topics[name] = t
	m.maintainPartitions(name, 0, t.parts)
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
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	t, ok := m.topics[topic]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	have := len(t.parts)
	if partitions < have {
		m.mu.Unlock()
		return fmt.Errorf("%w: %s has %d, asked %d", ErrPartitionDecrease, topic, have, partitions)
	}
	if partitions == have {
		m.mu.Unlock()
		return nil
	}
	parts := append([]partitionLog(nil), t.parts...)
	for i := have; i < partitions; i++ {
		p, err := m.openPartition(topic, i)
		if err != nil {
			for _, p := range parts[have:] {
				p.Close()
			}
			m.mu.Unlock()
			return err
		}
		parts = append(parts, p)
	}
	if err := m.putTopicMeta(topic, topicMeta{Partitions: partitions, Type: t.opts.Type, Created: t.created}); err != nil {
		for _, p := range parts[have:] {
			p.Close()
		}
		m.mu.Unlock()
		return err
	}
	t.parts = parts
	m.maintainPartitions(topic, have, parts[have:])
	var groups []*group
	for _, g := range m.groups {
		if g.topic == topic {
			groups = append(groups, g)
		}
	}
	m.mu.Unlock()
	for _, g := range groups {
		g.rebalance()
	}
	m.cfg.logger.Info("topic altered", "topic", topic, "partitions", partitions)
	return nil
}

// Topics returns the names of the node's topics and their partition counts.
func (m *MQ) Topics() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int, len(m.topics))
	for n, t := range m.topics {
		out[n] = len(t.parts)
	}
	return out
}

// topic returns the named topic and its current partitions.
func (m *MQ) topic(name string) (*topic, []partitionLog, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, ErrClosed
	}
	t, ok := m.topics[name]
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s", ErrNoTopic, name)
	}
	return t, t.parts, nil
}

// checkName applies the topic name rules; bad is the error to wrap.
func checkName(name string, bad error) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("%w: %q: length %d (1..255)", bad, name, len(name))
	}
	if name[0] == '%' {
		return fmt.Errorf("%w: %q: names starting with %% are reserved", bad, name)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%w: %q", bad, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q: character %q", bad, name, c)
		}
	}
	return nil
}

// translate maps store and boltsafe errors to mq ones.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrClosed):
		return fmt.Errorf("%w: %v", ErrClosed, err)
	case errors.Is(err, store.ErrCorrupt), errors.Is(err, boltsafe.ErrCorrupt):
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	case errors.Is(err, store.ErrDecided):
		return fmt.Errorf("%w: %v", ErrTxDecided, err)
	case errors.Is(err, store.ErrTooLarge):
		return fmt.Errorf("%w: %v", ErrMessageTooLarge, err)
	case errors.Is(err, store.ErrFailed), errors.Is(err, store.ErrWALFailed):
		return fmt.Errorf("%w: %v", ErrStorageFailed, err)
	}
	return err
}

// goFunc runs fn in a goroutine owned by the node: Close waits for it.
func (m *MQ) goFunc(fn func(ctx context.Context)) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn(m.ctx)
	}()
}
