package mq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zeze-go/mq/internal/delivery"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/topicdb"
)

// Listener receives messages. OnMessage is called for one message of a
// partition at a time, in offset order, except with WithKeyParallel, which
// hands over one message per key at a time, and for the retries of
// Concurrent mode. Returning nil commits the message; returning an error or
// panicking redelivers it after the retry ladder's next step, and after
// MaxReconsumeTimes retries moves it to the group's dead-letter topic (see
// WithRetryLadder, WithMaxReconsumeTimes and ConsumeMode). A slow handler
// holds up its partition, or its key with WithKeyParallel; OnMessage may
// run on several goroutines at once, for different partitions or keys.
//
// The message is the handler's own: changing it, its Properties included,
// changes nothing stored, retried or dead-lettered.
//
// ctx is cancelled when the consumer closes or loses the partition; a
// handler that returns ctx's error then is not counted as a failure and the
// message is delivered again to the partition's next owner. In a cluster
// a handler must end soon after its ctx does. A node holds each partition
// under a lease of half of ClusterConfig.SessionTimeout; one that cannot
// renew it cancels its handlers a fifth of the lease before the partition
// may go to a consumer on another node, and a handler that runs longer may
// then overlap with the new owner's.
//
// OnMessage may call any method of the package, among them Close of its own
// consumer, MQ.Close, Seek, ResetOffset and NewConsumer of its own group: a
// call never waits for the handler that makes it (see Consumer.Close).
type Listener interface {
	OnMessage(ctx context.Context, mqName string, m *Message) error
}

// ListenerFunc adapts a function to Listener.
type ListenerFunc func(ctx context.Context, mqName string, m *Message) error

// OnMessage calls f.
func (f ListenerFunc) OnMessage(ctx context.Context, mqName string, m *Message) error {
	return f(ctx, mqName, m)
}

// StartPosition is where a new group starts reading.
type StartPosition int

const (
	// StartFirst starts a new group at the oldest stored message. It is
	// the default.
	StartFirst StartPosition = iota
	// StartLast starts a new group after the newest message: it sees only
	// messages sent after it first subscribed.
	StartLast
)

// ConsumeMode says what a failing message does to its partition.
type ConsumeMode int

const (
	// Orderly, the default and the draft's TaskOneByOne, retries a failing
	// message in place after each step of the retry ladder: its partition
	// waits until the message succeeds or is dead-lettered, so order is
	// never broken. With WithKeyParallel only its key waits. The retry
	// count is kept in memory: a restart, a rebalance or a reset starts it
	// again at 0.
	Orderly ConsumeMode = iota
	// Concurrent parks a failing message in the group's retry topic
	// %RETRY%<group>, held back as a delayed message for the ladder's next
	// step, and goes on with the partition. The consumer also consumes the
	// retry topic, taking only its own parked messages, and hands them to the
	// same listener presented as the original: Topic, PartitionIndex,
	// Offset, ID, Properties and DeliverAt of the first copy, ReconsumeTimes
	// counting the failures. The parked copies, and so their counts, are
	// stored: they survive a restart. Order among a key's messages is not
	// kept across a retry.
	Concurrent
)

// String names the mode: "Orderly", "Concurrent", or "ConsumeMode(n)".
func (m ConsumeMode) String() string {
	switch m {
	case Orderly:
		return "Orderly"
	case Concurrent:
		return "Concurrent"
	}
	return fmt.Sprintf("ConsumeMode(%d)", int(m))
}

// DefaultMaxReconsumeTimes is how many times a failing message is retried
// before it goes to the dead-letter topic, as in RocketMQ.
const DefaultMaxReconsumeTimes = 16

// DefaultRetryLadder returns the default waits before each retry, RocketMQ's
// delay levels 3 to 18: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m.
func DefaultRetryLadder() []time.Duration {
	return []time.Duration{
		time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute,
		6 * time.Minute, 7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute,
		20 * time.Minute, 30 * time.Minute,
	}
}

// Flow control defaults: what one partition's worker holds in memory.
const (
	// DefaultFlowMessages is the default bound on messages held per partition.
	DefaultFlowMessages = 256
	// DefaultFlowBytes is the default bound on bytes held per partition.
	DefaultFlowBytes = 1 << 20
	// MaxFlowMessages and MaxFlowBytes bound WithFlowControl: what one
	// partition's worker may hold in memory.
	MaxFlowMessages = 1 << 16
	MaxFlowBytes    = 1 << 30
)

// Properties set on messages parked in a retry topic or moved to a
// dead-letter topic. Names in upper case are reserved for the queue. A
// retried message is presented as its original, without them.
const (
	// PropOriginTopic is the topic the message was first delivered from.
	PropOriginTopic = delivery.PropOriginTopic
	// PropOriginPartition is its partition there, in decimal.
	PropOriginPartition = delivery.PropOriginPartition
	// PropOriginOffset is its offset there, in decimal.
	PropOriginOffset = delivery.PropOriginOffset
	// PropOriginID is the ID the message was sent with. Copies in retry and
	// dead-letter topics, and re-driven messages, are stored under IDs of
	// their own; consumers are handed this one as Message.ID.
	PropOriginID = delivery.PropOriginID
	// PropLastError is the error or panic of the last failed delivery,
	// cut to 1 KiB.
	PropLastError = delivery.PropLastError
	// PropRetryGroup is the offset name of the consumer that parked the
	// message in a retry topic; only that consumer takes it back.
	PropRetryGroup = delivery.PropRetryGroup
	// PropReconsumeTimes is, on a dead letter, the failed deliveries of the
	// group that gave up on it, in decimal. The group consuming the
	// dead-letter topic counts its own: its ReconsumeTimes starts at 0.
	PropReconsumeTimes = delivery.PropReconsumeTimes
)

// RetryTopic returns the name of group's retry topic, "%RETRY%<group>".
func RetryTopic(group string) string { return topicdb.RetryPrefix + group }

// DeadLetterTopic returns the name of group's dead-letter topic,
// "%DLQ%<group>".
func DeadLetterTopic(group string) string { return topicdb.DeadLetterPrefix + group }

// Consumer is a member of a consumer group: it receives the messages of the
// partitions assigned to it and commits the group's offset in each. The
// partitions are divided among the open consumers of the group on this node;
// each partition is delivered by one consumer at a time. A broadcasting
// consumer (WithBroadcast) gets every partition. It is safe for concurrent
// use.
type Consumer struct {
	m         *MQ
	topic     string
	groupName string
	listener  Listener
	c         *delivery.Consumer
}

// NewConsumer subscribes listener to topic as a member of group and starts
// delivering at once. Group names follow the topic name rules, but are at
// most 248 bytes, since their retry topic's name is 7 bytes longer. topic
// may be a dead-letter or retry topic, such as "%DLQ%billing" or
// "%RETRY%billing", which is created if it does not exist yet. It returns
// ErrNoTopic, ErrInvalidGroup, ErrClosed or ErrInvalidOption, which covers
// a bad filter expression too.
//
// Each partition the consumer owns runs one goroutine; with
// WithKeyParallel, also one per key in flight and one reading, and in a
// cluster one that renews its lease at the partition. A Concurrent
// consumer also consumes the group's retry topic. Close stops them all.
func (m *MQ) NewConsumer(topic, groupName string, listener Listener, opts ...ConsumerOption) (*Consumer, error) {
	if err := checkGroup(groupName); err != nil {
		return nil, err
	}
	if listener == nil {
		return nil, fmt.Errorf("%w: nil listener", ErrInvalidOption)
	}
	if err := m.allowedGroup(topic, groupName, Consume); err != nil {
		return nil, err
	}
	cfg := defaultConsumerConfig()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil consumer option", ErrInvalidOption)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Instance != "" {
		cfg.Refresh = m.cfg.broadcastTTL / 4 // see WithBroadcastOffsetTTL
	}
	c := &Consumer{m: m, topic: topic, groupName: groupName, listener: listener}
	dc, err := m.delivery.Subscribe(topic, groupName, c.handle, cfg)
	if err != nil {
		return nil, translate(err)
	}
	c.c = dc
	return c, nil
}

// handle presents a delivery to the listener.
func (c *Consumer) handle(ctx context.Context, d *delivery.Delivery) error {
	msg := fromStore(d.Topic, d.Partition, d.Msg)
	msg.Offset = int64(d.Offset)
	msg.ReconsumeTimes = d.ReconsumeTimes
	return c.listener.OnMessage(ctx, msg.Topic, msg)
}

// Name returns the consumer's group.
func (c *Consumer) Name() string { return c.groupName }

// OffsetName returns the name the consumer's offsets are stored under: the
// group, or for a broadcasting consumer group@instance. ResetOffset takes it.
func (c *Consumer) OffsetName() string { return c.c.OffsetName() }

// Topic returns the consumer's topic.
func (c *Consumer) Topic() string { return c.topic }

// Options returns the topic's options.
func (c *Consumer) Options() Options {
	o, _, _ := c.m.partitions(c.topic)
	return o
}

// Partition returns the topic's partition count, 0 after the node closes.
func (c *Consumer) Partition() int {
	_, parts, _ := c.m.partitions(c.topic)
	return len(parts)
}

// Assigned returns the partitions assigned to this consumer, in order. A
// partition that just moved here is delivered once its previous owner's
// handler has returned.
func (c *Consumer) Assigned() []int { return c.c.Assigned() }

// Listener returns the consumer's listener.
func (c *Consumer) Listener() Listener { return c.listener }

// Close stops delivery, waits for the consumer's goroutines and the handlers
// in progress to return, commits the offsets reached and hands the
// consumer's partitions to the other consumers of its group. It is
// idempotent and safe for concurrent use; every call waits. Afterwards Seek
// returns ErrClosed.
//
// Close may be called from a handler, of this consumer or another. It then
// does not wait for that handler, nor for a handler that is itself inside a
// call to this package that waits (Close, MQ.Close): such a handler's
// goroutine ends, and its offset is committed, when it returns. It does
// wait for the other handlers, so a handler that waits for another one,
// for instance on a lock of its own, must not call Close, or be waited for
// by a goroutine that calls it.
func (c *Consumer) Close() error { return c.c.Close() }

// Position is where ResetOffset moves a group. Build one with SeekFirst,
// SeekLast, SeekTime or SeekOffset.
type Position struct {
	p delivery.Position
	t time.Time // for String
}

// SeekFirst is the oldest message still stored, in every partition.
func SeekFirst() Position { return Position{p: delivery.Position{Kind: delivery.PosFirst}} }

// SeekLast is the end of every partition: only messages stored afterwards
// are delivered.
func SeekLast() Position { return Position{p: delivery.Position{Kind: delivery.PosLast}} }

// SeekTime is, in every partition, the first message stored at or after t,
// or the end of the partition when there is none.
func SeekTime(t time.Time) Position {
	return Position{p: delivery.Position{Kind: delivery.PosTime, Time: partition.UnixNano(t)}, t: t}
}

// SeekOffset is offset in partition alone; the other partitions keep their
// position. An offset below the oldest stored message starts at the oldest,
// and the skip is logged; one past the end is ErrInvalidOffset.
func SeekOffset(partition int, offset uint64) Position {
	return Position{p: delivery.Position{Kind: delivery.PosOffset, Partition: partition, Offset: offset}}
}

// String describes the position for logs: "first", "last", "time …" or
// "offset partition/offset".
func (p Position) String() string {
	switch p.p.Kind {
	case delivery.PosFirst:
		return "first"
	case delivery.PosLast:
		return "last"
	case delivery.PosTime:
		return "time " + p.t.Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("offset %d/%d", p.p.Partition, p.p.Offset)
}

// ResetOffset moves the committed offset of group in topic's partitions to
// to. group is a consumer's OffsetName: the group, or group@instance for a
// broadcasting consumer. It works on a group that never consumed, which
// then starts there, and while the group's consumers run: each partition
// stores the new offset under a new generation, which no older commit can
// overwrite. A consumer running on this node moves to it before it
// delivers its next message: a handler in progress finishes, and what it
// commits no longer counts. In a cluster, a consumer on another node moves
// to it at its next commit or renewal, and within about SessionTimeout/2
// at most. It waits for no handler, so it may be called from one, of any
// partition. A partition moving between consumers takes the reset with it.
//
// Messages a Concurrent consumer parked in the group's retry topic are not
// affected.
//
// It returns ErrNoTopic, ErrInvalidGroup, ErrInvalidPartition,
// ErrInvalidOffset, ErrClosed, or ctx's error, after which the partitions
// reset before ctx ended stay reset.
func (m *MQ) ResetOffset(ctx context.Context, topic, group string, to Position) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.allowedGroup(topic, group, Admin); err != nil {
		return err
	}
	if err := delivery.CheckOffsetName(group); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidGroup, err)
	}
	if err := m.delivery.Reset(ctx, topic, group, to.p); err != nil {
		return translate(err)
	}
	m.cfg.logger.Info("group offset reset", "topic", topic, "group", group, "to", to.String())
	return nil
}

// Seek moves the consumer's offsets in its topic to to: it is ResetOffset
// with the consumer's OffsetName. It returns ErrClosed after Close.
func (c *Consumer) Seek(ctx context.Context, to Position) error {
	if c.c.Closed() {
		return ErrClosed
	}
	return c.m.ResetOffset(ctx, c.topic, c.c.OffsetName(), to)
}

// DeleteGroup removes the offsets of group, a consumer's OffsetName, from
// every partition of topic, so a consumer of it starts again at its start
// position, and the store keeps nothing of it. It returns ErrGroupInUse
// while a consumer of the group is open on this node, and ErrNoTopic,
// ErrInvalidGroup, ErrClosed or ctx's error.
func (m *MQ) DeleteGroup(ctx context.Context, topic, group string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.allowedGroup(topic, group, Admin); err != nil {
		return err
	}
	if err := delivery.CheckOffsetName(group); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidGroup, err)
	}
	return translate(m.delivery.DeleteGroup(ctx, topic, group))
}

// PartitionLag is a group's backlog in one partition.
type PartitionLag struct {
	Partition int
	// Committed is the group's offset there: the next message it gets.
	// A group that never committed here has Committed at the oldest
	// stored message and Known false.
	Committed uint64
	Known     bool
	// Next is the partition's next offset; Lag is Next - Committed, the
	// messages stored that the group has not handled. Delayed messages
	// count once due.
	Next uint64
	Lag  uint64
}

// Lag returns the backlog of group, a consumer's OffsetName, in every
// partition of topic. It returns ErrNoTopic, ErrInvalidGroup, ErrCorrupt
// or ErrClosed, or ctx's error once it ends.
func (m *MQ) Lag(ctx context.Context, topic, group string) ([]PartitionLag, error) {
	if err := m.allowed(topic, Consume); err != nil {
		return nil, err
	}
	if err := delivery.CheckOffsetName(group); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidGroup, err)
	}
	lags, err := m.delivery.Lags(ctx, topic, group)
	if err != nil {
		return nil, translate(err)
	}
	out := make([]PartitionLag, len(lags))
	for i, l := range lags {
		out[i] = PartitionLag{Partition: i, Committed: l.Committed, Known: l.Known, Next: l.Next, Lag: l.Next - l.Committed}
	}
	return out, nil
}

// RedriveDeadLetters sends group's dead letters back to the topics they came
// from (Properties[PropOriginTopic]) as new messages: ReconsumeTimes starts
// again at 0, LAST_ERROR, RETRY_GROUP and RECONSUME_TIMES are dropped, and
// consumers see the original ID (PropOriginID). Keyed messages are routed
// by key; others go back to their original partition. It returns how many
// it sent.
//
// Progress is kept in the dead-letter topic, so a later call sends only the
// dead letters that arrived since; a call cut short by ctx, an error or a
// crash resumes where it stopped, and a message sent again within the
// node's dedup window is stored once. The dead letters stay in the
// dead-letter topic for its own subscribers. It returns ErrInvalidGroup,
// ctx's error, ErrClosed, or ErrNoTopic for an origin topic that no longer
// exists, once the dead letters before it are sent.
func (m *MQ) RedriveDeadLetters(ctx context.Context, group string) (int, error) {
	if err := checkGroup(group); err != nil {
		return 0, err
	}
	n, err := m.delivery.Redrive(ctx, group, func(err error) bool { return errors.Is(err, ErrNoTopic) })
	return n, translate(err)
}

// deliveryTopics serves the topic table to the delivery engine.
type deliveryTopics struct{ m *MQ }

func (t deliveryTopics) Partitions(topic string) ([]delivery.Partition, error) {
	_, parts, err := t.m.partitions(topic)
	if err != nil {
		return nil, err
	}
	out := make([]delivery.Partition, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func (t deliveryTopics) EnsureSystem(ctx context.Context, name string) error {
	return t.m.ensureSystemTopic(ctx, name)
}

// systemTopicWait bounds the creation of a system topic: in a cluster it
// needs the metadata group, which may have no quorum.
const systemTopicWait = 10 * time.Second

// ensureSystemTopic creates the retry or dead-letter topic name, with one
// partition, unless it exists, waiting at most until ctx ends or
// systemTopicWait passed; in a cluster, such a wait ends with ErrNoQuorum.
func (m *MQ) ensureSystemTopic(ctx context.Context, name string) error {
	if _, _, err := m.partitions(name); err == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, systemTopicWait)
	defer cancel()
	err := m.createTopic(ctx, name, 1, Options{Type: Single})
	if err != nil && !errors.Is(err, ErrTopicExists) {
		return err
	}
	return nil
}
