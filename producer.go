package mq

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq/internal/fanout"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// Message is one message. Set Key, Tags, Properties, Body and optionally ID,
// Timestamp and DeliverAt before sending; the fields marked "filled" are set
// by SendMessage and on delivery.
type Message struct {
	Topic          string            // filled
	PartitionIndex int               // filled: the partition it was stored in; see ToPartition
	Offset         int64             // filled: its position in the partition, -1 while delayed
	ID             string            // unique id, at most MaxIDBytes; a time-ordered UUID is filled in when empty
	Key            string            // ordering key: same key, same partition, one by one
	Tags           []string          // matched by tag filters
	Properties     map[string]string // matched by expression filters
	Body           []byte
	// Timestamp is filled with the send time when zero. Like DeliverAt it is
	// stored as int64 Unix nanoseconds: a time outside 1677-09-21 to
	// 2262-04-11 is refused with ErrInvalidMessage. A consumer gets it back
	// as time.Unix(0, ns): the same instant, in the local time zone,
	// without the monotonic clock reading, so compare it with Equal.
	Timestamp time.Time
	// DeliverAt holds the message back: it is delivered no earlier than this.
	// A time not after the send, however far in the past, delivers at once,
	// and one before 1677-09-21 is delivered with a zero DeliverAt; one after
	// 2262-04-11 is refused with ErrInvalidMessage.
	DeliverAt time.Time
	// ReconsumeTimes counts earlier failed deliveries; it is filled on
	// delivery.
	ReconsumeTimes int

	// pinned means PartitionIndex was chosen, by ToPartition or by round
	// robin on an earlier send of this struct, and must be kept on a resend,
	// so a retried send finds its first copy.
	pinned bool
	// freshID means the last routing of this struct generated its ID, so
	// no earlier copy can exist and the store may skip the dedup lookup.
	freshID bool
}

// ToPartition pins m to partition i instead of routing it by key or round
// robin, and returns m. A partition out of range fails the send with
// ErrInvalidPartition.
func (m *Message) ToPartition(i int) *Message {
	m.PartitionIndex = i
	m.pinned = true
	return m
}

// MaxIDBytes is the longest Message.ID accepted. The ID does not count
// against MaxMessageBytes (see WithMaxMessageBytes), so a resend of a struct
// whose ID SendMessage filled in is judged like its first send.
const MaxIDBytes = store.MaxKeyBytes

// size is what counts against MaxMessageBytes: body, key, tags and
// properties.
func (m *Message) size() int {
	n := len(m.Key) + len(m.Body)
	for _, t := range m.Tags {
		n += len(t)
	}
	for k, v := range m.Properties {
		n += len(k) + len(v)
	}
	return n
}

// DeliverAfter sets m.DeliverAt to d from now and returns m, for a relative
// delay:
//
//	p.SendMessage(ctx, (&mq.Message{Key: k, Body: b}).DeliverAfter(30*time.Second))
//
// "Now" is the system clock at the call; a node opened WithClock compares
// DeliverAt with its own clock. A d of zero or less delivers at once.
//
// A delayed message is held in its partition's delay index and moved into
// the log when due: it is delivered no earlier than DeliverAt and, on an
// idle node, a few milliseconds after it. It gets its offset when it is
// moved, so SendMessage reports Offset -1 and Delayed, and it is ordered
// among the other messages by due time, not send time; messages with the
// same due time keep their send order. Delayed messages survive a restart.
func (m *Message) DeliverAfter(d time.Duration) *Message {
	m.DeliverAt = time.Now().Add(d)
	return m
}

// SendResult says where a sent message was stored.
type SendResult struct {
	Partition int
	Offset    int64 // -1 for a delayed message, whose offset is given at release
	Delayed   bool
	Duplicate bool // an earlier send of the same ID within the dedup window stored it
}

// Producer sends messages to one topic. It is safe for concurrent use.
type Producer struct {
	m      *MQ
	cfg    producerConfig
	topic  string
	rr     atomic.Uint64
	closed atomic.Bool
}

// NewProducer returns a producer for topic, or ErrNoTopic.
func (m *MQ) NewProducer(topic string, opts ...ProducerOption) (*Producer, error) {
	if _, _, err := m.partitions(topic); err != nil {
		return nil, err
	}
	p := &Producer{m: m, topic: topic}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil producer option", ErrInvalidOption)
		}
		if err := o(&p.cfg); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Name returns the producer's topic.
func (p *Producer) Name() string { return p.topic }

// Options returns the topic's options.
func (p *Producer) Options() Options {
	o, _, _ := p.m.partitions(p.topic)
	return o
}

// Partition returns the topic's current partition count, 0 after the node
// closes.
func (p *Producer) Partition() int {
	_, parts, _ := p.m.partitions(p.topic)
	return len(parts)
}

// Close marks the producer closed; later sends return ErrClosed. Sends in
// progress finish.
func (p *Producer) Close() error {
	p.closed.Store(true)
	return nil
}

// SendMessage stores msgs and returns, per message, its partition and offset.
// It returns when every message is durable (see WithSyncInterval) or ctx
// ends. The messages of one call that go to one partition are appended in one
// step, in order. The messages are checked before anything is written:
// ErrNilMessage, ErrMessageTooLarge, ErrInvalidMessage and
// ErrInvalidPartition refuse the whole call. After a partial failure, when
// ctx ended or a disk failed, some partitions may hold their messages:
// resend the same messages, and their IDs make the resend store each one
// once.
//
// SendMessage fills in msgs their Topic, PartitionIndex and Offset, their
// ID when empty and their Timestamp when zero.
func (p *Producer) SendMessage(ctx context.Context, msgs ...*Message) ([]SendResult, error) {
	results := make([]SendResult, len(msgs))
	err := p.send(ctx, msgs, results)
	return results, err
}

func (p *Producer) send(ctx context.Context, msgs []*Message, results []SendResult) error {
	if p.closed.Load() {
		return ErrClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := p.m.allowed(p.topic, Produce); err != nil {
		return err
	}
	_, parts, err := p.m.partitions(p.topic)
	if err != nil {
		return err
	}
	if err := p.route(msgs, len(parts)); err != nil {
		return err
	}
	now := p.m.cfg.clock.Now()
	first := msgs[0].PartitionIndex
	single := true
	for _, m := range msgs[1:] {
		if m.PartitionIndex != first {
			single = false
			break
		}
	}
	if single {
		return p.sendTo(ctx, parts[first], first, msgs, results, now)
	}
	// Several partitions: one command each, applied in parallel. Each
	// command fills its own entries of results.
	byPart := map[int][]int{}
	for i, m := range msgs {
		byPart[m.PartitionIndex] = append(byPart[m.PartitionIndex], i)
	}
	groups := make([][]int, 0, len(byPart))
	for _, idx := range byPart {
		groups = append(groups, idx)
	}
	return fanout.Each(groups, func(idx []int) error {
		part := msgs[idx[0]].PartitionIndex
		sub := make([]*Message, len(idx))
		subRes := make([]SendResult, len(idx))
		for j, i := range idx {
			sub[j] = msgs[i]
		}
		err := p.sendTo(ctx, parts[part], part, sub, subRes, now)
		for j, i := range idx {
			results[i] = subRes[j]
		}
		return err
	})
}

// route checks msgs and sets each one's ID, Topic and PartitionIndex.
func (p *Producer) route(msgs []*Message, n int) error {
	limit := p.m.cfg.maxMessageBytes
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("%w: message %d", ErrNilMessage, i)
		}
		if s := m.size(); s > limit {
			return fmt.Errorf("%w: message %d is %d bytes, limit %d", ErrMessageTooLarge, i, s, limit)
		}
		if err := m.check(); err != nil {
			return fmt.Errorf("%w: message %d: %v", ErrInvalidMessage, i, err)
		}
		if m.pinned && (m.PartitionIndex < 0 || m.PartitionIndex >= n) {
			return fmt.Errorf("%w: partition %d of %s (0..%d)", ErrInvalidPartition, m.PartitionIndex, p.topic, n-1)
		}
	}
	for _, m := range msgs {
		idGiven := m.ID != ""
		if !idGiven {
			m.ID = partition.NewID()
		}
		m.freshID = !idGiven
		m.Topic = p.topic
		switch {
		case m.pinned:
		case m.Key != "":
			m.PartitionIndex = partition.ForKey(m.Key, n)
		case idGiven:
			// A caller's own ID routes like a key, so a resend in a new
			// struct reaches the partition that holds the first copy.
			m.PartitionIndex = partition.ForKey(m.ID, n)
		default:
			m.PartitionIndex = int((p.rr.Add(1) - 1) % uint64(n))
			m.pinned = true
		}
	}
	return nil
}

// check refuses what the store cannot keep: an ID over MaxIDBytes, which
// the dedup index keys on, a Timestamp outside the nanosecond range and a
// DeliverAt after it. A DeliverAt before the range is in the past: the
// message is delivered at once, and toStore stores no delay.
func (m *Message) check() error {
	if len(m.ID) > MaxIDBytes {
		return fmt.Errorf("ID of %d bytes, limit %d", len(m.ID), MaxIDBytes)
	}
	if !m.Timestamp.IsZero() && (m.Timestamp.Before(partition.MinTime) || m.Timestamp.After(partition.MaxTime)) {
		return fmt.Errorf("timestamp %v outside %v..%v", m.Timestamp, partition.MinTime.UTC(), partition.MaxTime.UTC())
	}
	if m.DeliverAt.After(partition.MaxTime) {
		return fmt.Errorf("delivery time %v after %v", m.DeliverAt, partition.MaxTime.UTC())
	}
	return nil
}

var cmdPool = sync.Pool{New: func() any { return &store.Command{} }}

func (p *Producer) sendTo(ctx context.Context, part partition.Partition, idx int, msgs []*Message, results []SendResult, now time.Time) error {
	// Apply does not read cmd after it returns, whatever ctx did: the
	// command goes back to the pool then.
	cmd := cmdPool.Get().(*store.Command)
	defer func() {
		clear(cmd.Msgs)
		*cmd = store.Command{Msgs: cmd.Msgs[:0]}
		cmdPool.Put(cmd)
	}()
	cmd.Op = store.OpAppend // the partition stamps Now
	for _, m := range msgs {
		if m.Timestamp.IsZero() {
			m.Timestamp = now
		}
		s := toStore(m)
		s.FreshID = m.freshID
		cmd.Msgs = append(cmd.Msgs, s)
	}
	res, err := part.Apply(ctx, cmd)
	if err != nil {
		return fmt.Errorf("send to %s/%d: %w", p.topic, idx, translate(err))
	}
	for i, m := range msgs {
		a := res.Acks[i]
		r := SendResult{Partition: idx, Offset: int64(a.Offset), Delayed: a.Delayed, Duplicate: a.Duplicate}
		if a.Delayed {
			r.Offset = -1
		}
		m.Offset = r.Offset
		results[i] = r
	}
	return nil
}

func toStore(m *Message) store.Message {
	s := store.Message{
		ID:             m.ID,
		Key:            m.Key,
		Tags:           m.Tags,
		Properties:     m.Properties,
		Body:           m.Body,
		Timestamp:      m.Timestamp.UnixNano(),
		ReconsumeTimes: int32(m.ReconsumeTimes),
	}
	if !m.DeliverAt.IsZero() && !m.DeliverAt.Before(partition.MinTime) { // earlier: past, no delay
		s.DeliverAt = m.DeliverAt.UnixNano()
	}
	return s
}

func fromStore(topic string, partition int, s *store.Message) *Message {
	m := &Message{
		Topic:          topic,
		PartitionIndex: partition,
		Offset:         int64(s.Offset),
		ID:             s.ID,
		Key:            s.Key,
		Tags:           s.Tags,
		Properties:     s.Properties,
		Body:           s.Body,
		Timestamp:      time.Unix(0, s.Timestamp),
		ReconsumeTimes: int(s.ReconsumeTimes),
	}
	if s.DeliverAt != 0 {
		m.DeliverAt = time.Unix(0, s.DeliverAt)
	}
	return m
}
