package mq

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/zeze-go/mq/internal/delivery"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/localtx"
)

// Type says how a topic's partitions are replicated. Values follow the draft.
type Type int

// Replication types.
const (
	// Single keeps one copy of each partition on one node. It is the
	// default.
	Single Type = 1
	// DoubleWrite keeps a leader and a synchronous follower. It needs a cluster.
	DoubleWrite Type = 2
	// Raft3 replicates each partition in a 3-voter raft group. It needs a cluster.
	Raft3 Type = 4
)

// String names the type: "Single", "DoubleWrite", "Raft3", or "Type(n)".
func (t Type) String() string {
	switch t {
	case Single:
		return "Single"
	case DoubleWrite:
		return "DoubleWrite"
	case Raft3:
		return "Raft3"
	}
	return fmt.Sprintf("Type(%d)", int(t))
}

// Options are the settings of one topic, fixed by CreateMQ. The zero value
// is a Single topic.
type Options struct {
	// Type is the replication type; zero means Single.
	Type Type
	// PartitionsPerRaftGroup is, for a Raft3 topic, how many of its
	// partitions share one raft group, at most MaxPartitionsPerRaftGroup;
	// zero means DefaultPartitionsPerRaftGroup. They are placed on the same
	// three nodes, one leader serves them all, and one raft entry carries
	// the sends and commits of all of them: fewer, fuller entries, the
	// cheaper the more partitions share them (docs/DESIGN.md §7). 1 gives
	// each partition a group of its own, so their leaders spread over the
	// nodes. AlterMQ's new partitions make groups of their own, of this
	// size. Other types must leave it zero.
	PartitionsPerRaftGroup int
	// PartitionsPerPair is, for a DoubleWrite topic, how many of its
	// partitions share one pair, at most MaxPartitionsPerPair; zero means
	// DefaultPartitionsPerPair. They are placed on the same leader and
	// follower, one write to each copy carries the sends and commits of
	// all of them, and they fail over together, as one record in the
	// metadata. 1 gives each partition a pair of its own, so their leaders
	// spread over the nodes. AlterMQ's new partitions make pairs of their
	// own, of this size. Other types must leave it zero.
	PartitionsPerPair int
	// AckAlone is, for a DoubleWrite topic, the risk stage: a leader whose
	// follower is lost, or still catching up after a failover, goes on
	// acking sends with its own copy alone, recorded in the metadata as
	// alone in sync, until a follower has caught up. An ack then means one
	// copy: losing that node's disk in that time loses what it acked. Off,
	// as by default, such a leader refuses sends with ErrNoQuorum until a
	// follower is in sync again. Other types must leave it false.
	AckAlone bool
}

// Limits of Options.PartitionsPerRaftGroup and Options.PartitionsPerPair.
const (
	DefaultPartitionsPerRaftGroup = 8
	MaxPartitionsPerRaftGroup     = metastate.MaxGroupSize
	DefaultPartitionsPerPair      = 8
	MaxPartitionsPerPair          = metastate.MaxGroupSize
)

func (o Options) withDefaults() Options {
	if o.Type == 0 {
		o.Type = Single
	}
	if o.Type == Raft3 && o.PartitionsPerRaftGroup == 0 {
		o.PartitionsPerRaftGroup = DefaultPartitionsPerRaftGroup
	}
	if o.Type == DoubleWrite && o.PartitionsPerPair == 0 {
		o.PartitionsPerPair = DefaultPartitionsPerPair
	}
	return o
}

// check returns ErrInvalidOption for settings out of range.
func (o Options) check() error {
	n := o.PartitionsPerRaftGroup
	if o.Type == Raft3 && (n < 1 || n > MaxPartitionsPerRaftGroup) || o.Type != Raft3 && n != 0 {
		return fmt.Errorf("%w: PartitionsPerRaftGroup %d for %v (Raft3: 1..%d; others: 0)", ErrInvalidOption, n, o.Type, MaxPartitionsPerRaftGroup)
	}
	n = o.PartitionsPerPair
	if o.Type == DoubleWrite && (n < 1 || n > MaxPartitionsPerPair) || o.Type != DoubleWrite && n != 0 {
		return fmt.Errorf("%w: PartitionsPerPair %d for %v (DoubleWrite: 1..%d; others: 0)", ErrInvalidOption, n, o.Type, MaxPartitionsPerPair)
	}
	if o.AckAlone && o.Type != DoubleWrite {
		return fmt.Errorf("%w: AckAlone is for DoubleWrite topics, not %v", ErrInvalidOption, o.Type)
	}
	return nil
}

// Option configures Open.
type Option func(*config) error

type config struct {
	logger       *slog.Logger
	syncInterval time.Duration
	// materializeAfter is the partitions' store.Options.MaterializeAfter;
	// only tests set it (export_test.go).
	materializeAfter time.Duration
	// pairCompactEvery and pairKeepEntries are the DoubleWrite replicas'
	// raftqueue.PairConfig.CompactEvery and KeepEntries; 0 takes its
	// defaults. Only tests set them (export_test.go).
	pairCompactEvery, pairKeepEntries int
	// inSyncHook is node.Config.InSyncHook; only tests set it.
	inSyncHook      func(inSync []string) error
	dedupWindow     time.Duration
	maxMessageBytes int
	clock           Clock

	// Upkeep (internal/upkeep).
	retention           time.Duration // 0: no age limit
	retentionBytes      int64         // per partition; 0: no size limit
	retentionConsumed   bool          // also delete what every group committed past
	decisionTTL         time.Duration
	maintenanceInterval time.Duration
	broadcastTTL        time.Duration // 0: broadcast offsets are kept forever

	// Transactions (transaction.go).
	tx txConfig

	cluster *ClusterConfig // nil: standalone
}

func defaultConfig() config {
	return config{
		logger:          slog.New(slog.DiscardHandler),
		dedupWindow:     2 * time.Minute,
		maxMessageBytes: 4 << 20,
		clock:           systemClock{},

		retention:           48 * time.Hour,
		decisionTTL:         24 * time.Hour,
		maintenanceInterval: 10 * time.Second,
		broadcastTTL:        7 * 24 * time.Hour,

		tx: defaultTxConfig(),
	}
}

// WithLogger sends the node's logs to l. By default nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// WithSyncInterval acknowledges appends once written to the node's
// write-ahead log and fsyncs the log every d instead, like RocketMQ's
// ASYNC_FLUSH. A process crash loses nothing; a power loss may lose up to
// d of acknowledged messages. Partition files are fsynced as always, so they
// are never damaged by a power loss. The default syncs every group write: a
// message is acknowledged only after the write holding it is fsynced. The
// directory may be reopened with or without this option: Open recovers what
// the log holds either way.
func WithSyncInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: sync interval %v", ErrInvalidOption, d)
		}
		c.syncInterval = d
		return nil
	}
}

// WithDedupWindow sets how long a message ID is remembered: a send that
// repeats an ID within the window returns the first result and stores no
// second copy. Default 2 minutes.
func WithDedupWindow(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: dedup window %v", ErrInvalidOption, d)
		}
		c.dedupWindow = d
		return nil
	}
}

// maxMessageLimit is the most WithMaxMessageBytes accepts.
const maxMessageLimit = 256 << 20

// WithMaxMessageBytes sets the largest message accepted, counting its body,
// key, tags and properties together; the ID is bounded on its own by
// MaxIDBytes. Default 4 MiB.
func WithMaxMessageBytes(n int) Option {
	return func(c *config) error {
		if n <= 0 || n > maxMessageLimit {
			return fmt.Errorf("%w: max message bytes %d", ErrInvalidOption, n)
		}
		c.maxMessageBytes = n
		return nil
	}
}

// Clock is the node's source of time. Tests inject a fake one to run retry
// ladders and delays without sleeping.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// WithClock replaces the system clock.
func WithClock(clk Clock) Option {
	return func(c *config) error {
		if clk == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		c.clock = clk
		return nil
	}
}

// WithRetention deletes, from the head of each partition, the messages
// stored more than d ago, consumed or not, like RocketMQ's fileReservedTime.
// Zero keeps messages whatever their age. Default 48 hours. A group whose
// offset falls below the new head skips forward to it; its consumer logs how
// many messages it lost. Retention also bounds the dedup window: a deleted
// message's ID is forgotten with it.
func WithRetention(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: retention %v", ErrInvalidOption, d)
		}
		c.retention = d
		return nil
	}
}

// WithRetentionConsumed also deletes, from the head of each partition, the
// messages that every consumer group of the partition, and every broadcast
// instance, has committed past: JetStream's interest retention, the
// draft's dropping of the consumed head. A consumed message stays until its
// dedup window (WithDedupWindow) has passed, so a resend within the window
// is still found and not stored again. A partition no group has consumed
// keeps its messages; a group created later, or a ResetOffset to an earlier
// offset, finds them gone. The age and size limits still apply. A Raft3
// snapshot holds the partition's live state, so with this option it holds
// only what some group still needs. Off by default: consumed messages stay
// until the age or size limit, as in RocketMQ.
func WithRetentionConsumed() Option {
	return func(c *config) error {
		c.retentionConsumed = true
		return nil
	}
}

// WithRetentionBytes deletes the oldest messages of each partition while its
// records take more than n bytes; the limit is per partition. Zero, the
// default, sets no size limit. bbolt reuses the freed pages, so a partition
// file stops growing at about its limit, but it does not shrink.
func WithRetentionBytes(n int64) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: retention bytes %d", ErrInvalidOption, n)
		}
		c.retentionBytes = n
		return nil
	}
}

// WithDecisionTTL sets how long each partition remembers whether a
// transaction committed or rolled back, so that a late repeat of the
// decision changes nothing. Default 24 hours. A decision is forgotten within
// an hour after its TTL, and never in the first hour after Open. It is kept
// longer while a host store may still hold the marker of a committed
// transaction, because its clean-up failed or the store could not be listed
// since Open: the sweep that finds such a marker relies on the decision not
// to publish the transaction twice.
func WithDecisionTTL(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: decision TTL %v", ErrInvalidOption, d)
		}
		c.decisionTTL = d
		return nil
	}
}

// WithMaintenanceInterval sets how often each partition checks its
// retention limits and prunes expired dedup entries. Default 10 seconds. A
// check that finds nothing to delete writes nothing. A message ID is
// forgotten between one dedup window and one window plus this interval
// after its message was stored. Delayed messages do not depend on it: they
// are released when due. d is 1ms to 24h.
func WithMaintenanceInterval(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond || d > 24*time.Hour {
			return fmt.Errorf("%w: maintenance interval %v", ErrInvalidOption, d)
		}
		c.maintenanceInterval = d
		return nil
	}
}

// WithTxCheckAfter sets how long half messages may stay undecided before
// the node asks the host store about their transaction: the check-back.
// Later checks back off from there, doubling up to a minute apart, or d
// apart if d is longer. Default 6s; d is 1ms to 7 days.
func WithTxCheckAfter(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond || d > 7*24*time.Hour {
			return fmt.Errorf("%w: tx check after %v", ErrInvalidOption, d)
		}
		c.tx.checkAfter = d
		return nil
	}
}

// WithTxMaxChecks sets how many check-backs may answer "still running"
// before the transaction is parked: listed by UnresolvedTxs, checked no
// more, and left for ResolveTx. Default 15.
func WithTxMaxChecks(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: tx max checks %d", ErrInvalidOption, n)
		}
		c.tx.maxChecks = n
		return nil
	}
}

// WithLocalTx gives the node the host store whose transactions send
// messages (a *localtx.Bolt or *localtx.SQL), for the check-back and to
// publish, at start, the messages of transactions that committed just
// before a crash. Give every such store, once each; a store used by a
// transaction is also learned for the rest of the run. Without it, half
// messages left by a crash are parked for the operator.
func WithLocalTx(s localtx.Store) Option {
	return func(c *config) error {
		if s == nil {
			return fmt.Errorf("%w: nil local tx store", ErrInvalidOption)
		}
		c.tx.stores = append(c.tx.stores, s)
		return nil
	}
}

// WithBroadcastOffsetTTL removes the offsets of a broadcast instance,
// stored as group@instance (see WithBroadcast), from a partition once they
// have not changed for d: the instance was closed for good and its name is
// not used again. An instance opened again later starts at its start
// position. A running instance stores its offsets at least every d/4, so it
// keeps them however idle its partitions are. Zero keeps them forever.
// Default 7 days.
func WithBroadcastOffsetTTL(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: broadcast offset TTL %v", ErrInvalidOption, d)
		}
		c.broadcastTTL = d
		return nil
	}
}

// ProducerOption configures NewProducer. There are none yet; the type keeps
// the signature stable.
type ProducerOption func(*producerConfig) error

// producerConfig is what the producer options set.
type producerConfig struct{}

// ConsumerOption configures NewConsumer.
type ConsumerOption func(*consumerConfig) error

// consumerConfig is what the consumer options set: the delivery engine's
// configuration of one consumer.
type consumerConfig = delivery.Config

func defaultConsumerConfig() consumerConfig {
	return consumerConfig{
		Start:        delivery.StartFirst,
		Ladder:       DefaultRetryLadder(),
		MaxReconsume: DefaultMaxReconsumeTimes,
		Batch:        DefaultFlowMessages,
		BatchBytes:   DefaultFlowBytes,
	}
}

// WithStartPosition sets where a group with no committed offset starts.
func WithStartPosition(s StartPosition) ConsumerOption {
	return func(c *consumerConfig) error {
		switch s {
		case StartFirst:
			c.Start = delivery.StartFirst
		case StartLast:
			c.Start = delivery.StartLast
		default:
			return fmt.Errorf("%w: start position %d", ErrInvalidOption, s)
		}
		return nil
	}
}

// WithStartTime starts a group with no committed offset, in each
// partition, at the first message stored at or after t, or at the end of
// the partition when there is none. It replaces WithStartPosition.
func WithStartTime(t time.Time) ConsumerOption {
	return func(c *consumerConfig) error {
		c.Start, c.StartTime = delivery.StartTime, partition.UnixNano(t)
		return nil
	}
}

// WithRetryPause replaces the retry ladder with a constant pause d before
// every redelivery. It is WithRetryLadder(d).
func WithRetryPause(d time.Duration) ConsumerOption {
	return func(c *consumerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: retry pause %v", ErrInvalidOption, d)
		}
		c.Ladder = []time.Duration{d}
		return nil
	}
}

// WithFlowControl bounds what a consumer holds in memory per partition: at
// most messages messages and, past the first message, bytes bytes: a
// single message larger than bytes is still delivered. Defaults
// DefaultFlowMessages and DefaultFlowBytes. A backlog of any length costs no
// more than this: messages are read from the partition file as they are
// handled.
// With WithKeyParallel the bound is the sliding window: a key blocked on a
// failing message holds the window's head, and reading stops once the window
// is full. messages is 1 to MaxFlowMessages, bytes 1 to MaxFlowBytes.
func WithFlowControl(messages, bytes int) ConsumerOption {
	return func(c *consumerConfig) error {
		if messages <= 0 || bytes <= 0 || messages > MaxFlowMessages || bytes > MaxFlowBytes {
			return fmt.Errorf("%w: flow control %d messages, %d bytes", ErrInvalidOption, messages, bytes)
		}
		c.Batch, c.BatchBytes = messages, bytes
		return nil
	}
}

// WithConsumeMode sets what a failing message does to its partition.
// Default Orderly.
func WithConsumeMode(mode ConsumeMode) ConsumerOption {
	return func(c *consumerConfig) error {
		if mode != Orderly && mode != Concurrent {
			return fmt.Errorf("%w: consume mode %d", ErrInvalidOption, int(mode))
		}
		c.Concurrent = mode == Concurrent
		return nil
	}
}

// WithRetryLadder sets the waits before each retry of a failing message:
// steps[i] before retry i+1, the last step repeating when MaxReconsumeTimes
// is larger. A zero step retries at once. Default DefaultRetryLadder.
func WithRetryLadder(steps ...time.Duration) ConsumerOption {
	return func(c *consumerConfig) error {
		if len(steps) == 0 {
			return fmt.Errorf("%w: empty retry ladder", ErrInvalidOption)
		}
		for _, d := range steps {
			if d < 0 {
				return fmt.Errorf("%w: retry step %v", ErrInvalidOption, d)
			}
		}
		c.Ladder = append([]time.Duration(nil), steps...)
		return nil
	}
}

// WithMaxReconsumeTimes sets how many times a failing message is retried
// before it is moved to the group's dead-letter topic; 0 dead-letters it at
// its first failure. Default DefaultMaxReconsumeTimes.
func WithMaxReconsumeTimes(n int) ConsumerOption {
	return func(c *consumerConfig) error {
		if n < 0 {
			return fmt.Errorf("%w: max reconsume times %d", ErrInvalidOption, n)
		}
		c.MaxReconsume = n
		return nil
	}
}

// WithKeyParallel lets one partition hand messages with different keys to
// the listener in parallel, at most n at a time; messages with the same key
// stay one by one, in offset order, and each message without a key is a key
// of its own. The committed offset advances past a message only once every
// earlier message of the partition is done: the messages in flight are a
// sliding window, bounded by WithFlowControl, so a restart redelivers at
// most the window. In Orderly mode a failing message blocks only its own
// key while it is retried; the other keys go on until the window is full.
// By default it is off: one message of a partition at a time.
func WithKeyParallel(n int) ConsumerOption {
	return func(c *consumerConfig) error {
		if n < 1 {
			return fmt.Errorf("%w: key parallelism %d", ErrInvalidOption, n)
		}
		c.KeyParallel = n
		return nil
	}
}

// WithBroadcast makes the consumer a broadcasting member of its group: it
// gets every message of every partition, whatever other consumers of the
// group get on this node or others, and keeps its own offsets under the
// name group@instance (see Consumer.OffsetName).
//
// instance names the consumer and follows the group name rules. A consumer
// that opens again with the same group and instance, after a Close or a
// restart of the node, resumes where that instance stopped; a new instance
// starts at the start position (WithStartPosition). Consumers on this node
// that share group and instance share those offsets and divide the
// partitions between them, like a clustering group. To reset a
// broadcasting consumer, pass its OffsetName to ResetOffset.
func WithBroadcast(instance string) ConsumerOption {
	return func(c *consumerConfig) error {
		if err := checkName(instance, ErrInvalidOption); err != nil {
			return fmt.Errorf("broadcast instance: %w", err)
		}
		c.Instance = instance
		return nil
	}
}

// WithTags keeps only the messages that carry at least one of the tags in
// list, written "TagA || TagB" as in RocketMQ; "*" or "" keeps every message.
// Messages filtered out advance the group's offset without reaching
// OnMessage. With WithFilter too, a message must pass both.
func WithTags(list string) ConsumerOption {
	return func(c *consumerConfig) error {
		f, err := c.Filter.WithTags(list)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidOption, err)
		}
		c.Filter = f
		return nil
	}
}

// WithFilter keeps only the messages for which expression is true. The
// expression is in the expr-lang/expr language and sees Tags ([]string),
// Properties (map[string]string) and Key (string), for example
//
//	"TagA" in Tags && Properties["region"] == "eu"
//
// A property the message lacks reads as "". The expression is compiled
// once, by NewConsumer, which returns an error wrapping ErrInvalidOption
// for an expression that does not compile or is not boolean. An
// expression that fails while it runs on a message, such as a bad
// conversion of a property, counts as false, and the failure is logged.
// Messages filtered out advance the group's offset without reaching
// OnMessage.
func WithFilter(expression string) ConsumerOption {
	return func(c *consumerConfig) error {
		f, err := c.Filter.WithExpression(expression)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidOption, err)
		}
		c.Filter = f
		return nil
	}
}

// DefaultMaxFrameBytes is ClusterConfig.MaxFrameBytes's default: room for
// the largest message WithMaxMessageBytes allows, so that nodes with
// different message limits still carry each other's messages.
const DefaultMaxFrameBytes = maxMessageLimit + frameOverhead

// frameOverhead is what a frame needs beside one message: the request or
// reply around it.
const frameOverhead = 1 << 20

// ClusterConfig makes a node one of a cluster (WithCluster).
type ClusterConfig struct {
	// NodeID names the node in the cluster, for the life of its data
	// directory: Open refuses the directory under another NodeID with
	// ErrInvalidOption. It is 1 to 64 letters, digits, '.', '-' and '_'.
	// With TLS, the node's certificate must name it as a DNS SAN.
	NodeID string
	// Bind is the TCP address of the node's one port, "host:port"; port 0
	// picks one. Client RPC, raft and replication all use it.
	Bind string
	// Advertise is the address the other nodes dial; empty for the bound
	// address.
	Advertise string
	// Seeds are addresses of nodes of the cluster; the node joins through
	// any of them. A node without metadata state needs seeds, or
	// Bootstrap: Open refuses one with neither (ErrInvalidOption).
	Seeds []string
	// Bootstrap lets the node start a new cluster when its directory has
	// no metadata state and none of its Seeds answers that it knows a
	// leader; otherwise it joins through them. Set it on one node of a
	// new cluster, for its first start: with its seeds listing the other
	// nodes, a node whose disk was replaced and that comes back with the
	// same configuration joins its cluster rather than starting a second
	// one, as long as one seed answers. The cluster's id, made then, is
	// recorded in every node's directory, and a node never joins another
	// cluster with its data.
	Bootstrap bool
	// Secret is the cluster secret, the same on every node: each
	// connection proves it after TLS. It must be at least 32 random bytes
	// (or their hex or base64, as `openssl rand -hex 32` prints); a short
	// or guessable one is refused with ErrInvalidOption.
	Secret []byte
	// ServerTLS and ClientTLS make every link mutual TLS 1.3: client
	// certificates are required, and the peer's certificate is checked
	// against the CAs given and must name the node id it claims. Both are
	// required unless InsecurePlaintext is set; NewClusterCA makes them.
	ServerTLS, ClientTLS *tls.Config
	// InsecurePlaintext runs the node without TLS, for tests and a laptop:
	// a node's id is then claimed, not proven, nothing is encrypted, and
	// anyone holding the secret can speak as any node. Open logs a warning
	// each time. It cannot be set together with ServerTLS and ClientTLS.
	InsecurePlaintext bool
	// SessionTimeout is how long a node may go unheard before the
	// metadata leader marks it down and gives its consumers' partitions to
	// others. Default 5s. Consumers hold their partitions under a lease of
	// half of it, kept by the partition: a node that still reaches a
	// partition goes on delivering it, also while the metadata group has
	// no quorum, until it is marked down; one that cannot renew the lease
	// (cut from the partition, or no longer its owner) cancels its
	// handlers' contexts a fifth of the lease before it lapses.
	SessionTimeout time.Duration
	// HandshakeTimeout bounds a connection's TLS and secret handshake.
	// Default 5s.
	HandshakeTimeout time.Duration
	// ElectionTimeout is the metadata group's raft heartbeat and election
	// timeout; zero takes raft's default, 1s.
	ElectionTimeout time.Duration
	// MaxFrameBytes bounds one frame between nodes; zero means
	// DefaultMaxFrameBytes. Every node of a cluster must use the same, and
	// it must carry the largest message any node accepts: its
	// WithMaxMessageBytes plus 1 MiB. A frame's memory is taken as its
	// bytes arrive, and each connection holds at most 64 MiB of requests
	// and replies at once beyond one frame.
	MaxFrameBytes int
}

// WithCluster makes the node one of a cluster: it listens on one port,
// joins the metadata group through c.Seeds or, with c.Bootstrap and no
// cluster among its seeds, starts one, and its topics are the cluster's: CreateMQ places partitions on
// the nodes by load, and producers and consumers reach every partition from
// any node.
func WithCluster(c ClusterConfig) Option {
	return func(cfg *config) error {
		switch {
		case c.NodeID == "":
			return fmt.Errorf("%w: cluster needs a NodeID", ErrInvalidOption)
		case metastate.CheckNodeID(c.NodeID) != nil:
			return fmt.Errorf("%w: cluster NodeID %q: 1 to %d letters, digits, '.', '-' and '_'", ErrInvalidOption, c.NodeID, metastate.MaxNodeIDLen)
		case c.Bind == "":
			return fmt.Errorf("%w: cluster needs a Bind address", ErrInvalidOption)
		case transport.CheckSecret(c.Secret) != nil:
			return fmt.Errorf("%w: cluster secret: %v", ErrInvalidOption, transport.CheckSecret(c.Secret))
		case (c.ServerTLS == nil) != (c.ClientTLS == nil):
			return fmt.Errorf("%w: cluster TLS needs both ServerTLS and ClientTLS", ErrInvalidOption)
		case c.ServerTLS == nil && !c.InsecurePlaintext:
			return fmt.Errorf("%w: cluster without TLS: give ServerTLS and ClientTLS (NewClusterCA makes them), or set InsecurePlaintext to run without it on purpose", ErrInvalidOption)
		case c.ServerTLS != nil && c.InsecurePlaintext:
			return fmt.Errorf("%w: cluster InsecurePlaintext with ServerTLS and ClientTLS: choose one", ErrInvalidOption)
		case c.SessionTimeout < 0 || c.HandshakeTimeout < 0 || c.ElectionTimeout < 0 || c.MaxFrameBytes < 0:
			return fmt.Errorf("%w: negative cluster timeout or size", ErrInvalidOption)
		}
		c.Seeds = slices.Clone(c.Seeds)
		c.Secret = slices.Clone(c.Secret)
		cfg.cluster = &c
		return nil
	}
}
