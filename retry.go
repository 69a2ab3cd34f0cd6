package mq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// ConsumeMode says what a failing message does to its partition.
type ConsumeMode int

const (
	// Orderly (the default, the draft's TaskOneByOne) retries a failing
	// message in place after each step of the retry ladder: its partition
	// (with WithKeyParallel, only its key) waits until the message succeeds
	// or is dead-lettered, so order is never broken. The retry count is kept
	// in memory: a restart or a rebalance starts it again at 0.
	Orderly ConsumeMode = iota
	// Concurrent parks a failing message in the group's retry topic
	// %RETRY%<group>, held back (as a delayed message) for the ladder's next
	// step, and goes on with the partition. The consumer also consumes the
	// retry topic, taking only its own parked messages, and hands them to the
	// same listener presented as the original: Topic, PartitionIndex, Offset
	// and ID of the first copy, ReconsumeTimes counting the failures. Order
	// among a key's messages is not kept across a retry.
	Concurrent
)

func (m ConsumeMode) String() string {
	switch m {
	case Orderly:
		return "Orderly"
	case Concurrent:
		return "Concurrent"
	}
	return fmt.Sprintf("ConsumeMode(%d)", int(m))
}

// WithConsumeMode sets what a failing message does to its partition.
// Default Orderly.
func WithConsumeMode(mode ConsumeMode) ConsumerOption {
	return func(c *consumerConfig) error {
		if mode != Orderly && mode != Concurrent {
			return fmt.Errorf("%w: consume mode %d", ErrInvalidOption, int(mode))
		}
		c.mode = mode
		return nil
	}
}

// DefaultMaxReconsumeTimes is how many times a failing message is retried
// before it goes to the dead-letter topic, as in RocketMQ.
const DefaultMaxReconsumeTimes = 16

// DefaultRetryLadder returns the default waits before each retry: 1s 5s 10s
// 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m (RocketMQ's delay levels 3..18).
func DefaultRetryLadder() []time.Duration {
	return []time.Duration{
		time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute,
		6 * time.Minute, 7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute,
		20 * time.Minute, 30 * time.Minute,
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
		c.ladder = append([]time.Duration(nil), steps...)
		return nil
	}
}

// WithMaxReconsumeTimes sets how many times a failing message is retried
// before it is moved to the group's dead-letter topic; 0 dead-letters it at
// its first failure. Default DefaultMaxReconsumeTimes (16).
func WithMaxReconsumeTimes(n int) ConsumerOption {
	return func(c *consumerConfig) error {
		if n < 0 {
			return fmt.Errorf("%w: max reconsume times %d", ErrInvalidOption, n)
		}
		c.maxReconsume = n
		return nil
	}
}

// retryDelay is the wait before retry r+1.
func (c *consumerConfig) retryDelay(r int) time.Duration {
	return c.ladder[min(r, len(c.ladder)-1)]
}

// Properties set on messages parked in a retry topic or moved to a
// dead-letter topic. Names in upper case are reserved for the queue.
const (
	// PropOriginTopic is the topic the message was first delivered from.
	PropOriginTopic = "ORIGIN_TOPIC"
	// PropOriginPartition is its partition there (decimal).
	PropOriginPartition = "ORIGIN_PARTITION"
	// PropOriginOffset is its offset there (decimal).
	PropOriginOffset = "ORIGIN_OFFSET"
	// PropOriginID is the ID the message was sent with. Copies in retry and
	// dead-letter topics, and re-driven messages, are stored under IDs of
	// their own; consumers are handed this one as Message.ID.
	PropOriginID = "ORIGIN_MSG_ID"
	// PropLastError is the error (or panic) of the last failed delivery,
	// cut to 1 KiB.
	PropLastError = "LAST_ERROR"
	// PropRetryGroup is the offset name of the consumer that parked the
	// message in a retry topic; only that consumer takes it back.
	PropRetryGroup = "RETRY_GROUP"
)

const (
	retryPrefix = "%RETRY%"
	dlqPrefix   = "%DLQ%"
	maxLastErr  = 1024
	// redriveOffset is the offset name under which RedriveDeadLetters keeps
	// its progress in a dead-letter topic; '%' keeps it apart from groups.
	redriveOffset = "%redrive"
)

// RetryTopic returns the name of group's retry topic, "%RETRY%<group>".
func RetryTopic(group string) string { return retryPrefix + group }

// DeadLetterTopic returns the name of group's dead-letter topic,
// "%DLQ%<group>".
func DeadLetterTopic(group string) string { return dlqPrefix + group }

// isSystemTopic reports whether name is a retry or dead-letter topic name of
// a valid group.
func isSystemTopic(name string) bool {
	for _, p := range []string{retryPrefix, dlqPrefix} {
		if g, ok := strings.CutPrefix(name, p); ok {
			return checkName(g, ErrInvalidGroup) == nil
		}
	}
	return false
}

// ensureSystemTopic creates the retry or dead-letter topic name, with one
// partition, unless it exists.
func (m *MQ) ensureSystemTopic(name string) error {
	if _, _, err := m.router.partitions(name); err == nil {
		return nil
	}
	err := m.createTopic(context.Background(), name, 1, Options{Type: Single})
	if err != nil && !errors.Is(err, ErrTopicExists) {
		return err
	}
	return nil
}

// present converts a stored message for the listener. A message parked by
// this consumer's parent is presented as the original it copies.
func (c *Consumer) present(part int, sm *store.Message) *Message {
	m := fromStore(c.topic, part, sm)
	if id := sm.Properties[PropOriginID]; id != "" {
		m.ID = id
	}
	if c.parent != nil {
		if t := sm.Properties[PropOriginTopic]; t != "" {
			m.Topic = t
		}
		if p, err := strconv.Atoi(sm.Properties[PropOriginPartition]); err == nil {
			m.PartitionIndex = p
		}
		if o, err := strconv.ParseInt(sm.Properties[PropOriginOffset], 10, 64); err == nil {
			m.Offset = o
		}
	}
	return m
}

// failedCopy builds the copy of sm, which failed with cause, that is parked
// or dead-lettered. Its stored ID is new: an ID derived from sm's position
// would make a move after a crash store one copy, but would also make the
// dedup index swallow the move of a message replayed by a reset within the
// dedup window, and a lost message is worse than a repeated one.
func (w *worker) failedCopy(sm *store.Message, cause error) store.Message {
	c := w.c
	props := make(map[string]string, len(sm.Properties)+6)
	maps.Copy(props, sm.Properties)
	if c.parent == nil { // a first failure: record where the message lives
		props[PropOriginTopic] = c.topic
		props[PropOriginPartition] = strconv.Itoa(w.part)
		props[PropOriginOffset] = strconv.FormatUint(sm.Offset, 10)
	}
	if props[PropOriginID] == "" {
		props[PropOriginID] = sm.ID
	}
	msg := cause.Error()
	if len(msg) > maxLastErr {
		msg = msg[:maxLastErr]
	}
	props[PropLastError] = msg
	delete(props, PropRetryGroup)
	return store.Message{
		ID:         partition.NewID(),
		Key:        sm.Key,
		Tags:       sm.Tags,
		Properties: props,
		Body:       sm.Body,
		Timestamp:  sm.Timestamp,
	}
}

// parkCopy returns the copy of sm, which failed with ReconsumeTimes r, to
// store in the group's retry topic, due after the ladder's step r.
func (w *worker) parkCopy(sm *store.Message, r int, cause error) (topic string, cp store.Message) {
	c := w.c
	cp = w.failedCopy(sm, cause)
	owner := c
	if c.parent != nil {
		owner = c.parent
	}
	cp.Properties[PropRetryGroup] = owner.group.name
	cp.ReconsumeTimes = int32(r + 1)
	d := c.cfg.retryDelay(r)
	if d > 0 {
		cp.DeliverAt = partition.UnixNano(c.m.cfg.clock.Now().Add(d)) // a step past 2262 waits until then
	}
	c.m.cfg.logger.Warn("message handler failed; parked for retry", "topic", c.topic, "group", c.group.name,
		"partition", w.part, "offset", sm.Offset, "attempt", r+1, "after", d, "err", cause)
	return RetryTopic(c.groupName), cp
}

// deadCopy returns the copy of sm, which failed with ReconsumeTimes r, to
// store in the group's dead-letter topic, with ReconsumeTimes r+1 (its
// failed deliveries).
func (w *worker) deadCopy(sm *store.Message, r int, cause error) (topic string, cp store.Message) {
	c := w.c
	cp = w.failedCopy(sm, cause)
	cp.ReconsumeTimes = int32(r + 1)
	c.m.cfg.logger.Error("message handler failed too often; dead-lettered", "topic", c.topic, "group", c.group.name,
		"partition", w.part, "offset", sm.Offset, "attempts", r+1, "err", cause)
	return DeadLetterTopic(c.groupName), cp
}

// appendSystem appends msg to the system topic name, creating it if needed.
func (m *MQ) appendSystem(ctx context.Context, name string, msg *store.Message, now time.Time) error {
	if err := m.ensureSystemTopic(name); err != nil {
		return err
	}
	_, parts, err := m.router.partitions(name)
	if err != nil {
		return err
	}
	return m.appendTo(ctx, name, parts, partition.ForKey(msg.ID, len(parts)), msg, now)
}

func (m *MQ) appendTo(ctx context.Context, topic string, parts []partition.Partition, i int, msg *store.Message, now time.Time) error {
	cmd := store.Command{Op: store.OpAppend, Now: now.UnixNano(), Msgs: []store.Message{*msg}}
	if _, err := parts[i].Apply(ctx, &cmd); err != nil {
		return fmt.Errorf("send to %s/%d: %w", topic, i, translate(err))
	}
	return nil
}

// redriveMu serializes RedriveDeadLetters, an operator's call, in the process.
var redriveMu sync.Mutex

// RedriveDeadLetters sends group's dead letters back to the topics they came
// from (Properties[PropOriginTopic]) as new messages: ReconsumeTimes starts
// again at 0, LAST_ERROR and RETRY_GROUP are dropped, and consumers see the
// original ID (PropOriginID). Keyed messages are routed by key; others go
// back to their original partition. It returns how many it sent.
//
// Progress is kept in the dead-letter topic, so a later call sends only the
// dead letters that arrived since; a call cut short by ctx, an error or a
// crash resumes where it stopped, and a message sent again within the
// node's dedup window is stored once. The dead letters stay in the
// dead-letter topic for its own subscribers. It returns ErrInvalidGroup,
// ErrNoTopic (an origin topic that no longer exists: the dead letters before
// it are sent), ctx's error or ErrClosed.
func (m *MQ) RedriveDeadLetters(ctx context.Context, group string) (int, error) {
	if err := checkName(group, ErrInvalidGroup); err != nil {
		return 0, err
	}
	redriveMu.Lock()
	defer redriveMu.Unlock()
	dlq := DeadLetterTopic(group)
	_, parts, err := m.router.partitions(dlq)
	if errors.Is(err, ErrNoTopic) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	sent := 0
	for i, p := range parts {
		n, err := m.redrivePartition(ctx, dlq, i, p)
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

func (m *MQ) redrivePartition(ctx context.Context, dlq string, part int, p partition.Partition) (int, error) {
	from, ok, err := p.GroupOffset(redriveOffset)
	if err != nil {
		return 0, translate(err)
	}
	if !ok || from < p.Stats().Low {
		from = p.Stats().Low
	}
	sent := 0
	var buf []store.Message
	for {
		if err := ctx.Err(); err != nil {
			return sent, err
		}
		buf, err = p.Read(from, DefaultFlowMessages, DefaultFlowBytes, buf[:0])
		if err != nil {
			return sent, translate(err)
		}
		if len(buf) == 0 {
			return sent, nil
		}
		for i := range buf {
			if err := m.redriveOne(ctx, dlq, part, &buf[i]); err != nil {
				m.commitRedrive(p, from)
				return sent, err
			}
			from = buf[i].Offset + 1
			sent++
		}
		if err := m.commitRedrive(p, from); err != nil {
			return sent, err
		}
	}
}

func (m *MQ) commitRedrive(p partition.Partition, offset uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return m.commitOffset(ctx, p, redriveOffset, offset)
}

func (m *MQ) redriveOne(ctx context.Context, dlq string, part int, sm *store.Message) error {
	topic := sm.Properties[PropOriginTopic]
	if topic == "" {
		return fmt.Errorf("%w: dead letter %s/%d/%d has no %s", ErrNoTopic, dlq, part, sm.Offset, PropOriginTopic)
	}
	_, parts, err := m.router.partitions(topic)
	if err != nil {
		return fmt.Errorf("redrive %s/%d/%d: %w", dlq, part, sm.Offset, err)
	}
	props := maps.Clone(sm.Properties)
	delete(props, PropLastError)
	delete(props, PropRetryGroup)
	if props[PropOriginID] == "" {
		props[PropOriginID] = sm.ID
	}
	cp := store.Message{
		ID:         fmt.Sprintf("redrive:%s/%d/%d", dlq, part, sm.Offset),
		Key:        sm.Key,
		Tags:       sm.Tags,
		Properties: props,
		Body:       sm.Body,
		Timestamp:  sm.Timestamp,
	}
	n := len(parts)
	i := partition.ForKey(cp.ID, n)
	if cp.Key != "" {
		i = partition.ForKey(cp.Key, n)
	} else if op, err := strconv.Atoi(props[PropOriginPartition]); err == nil && op >= 0 && op < n {
		i = op
	}
	return m.appendTo(ctx, topic, parts, i, &cp, m.cfg.clock.Now())
}
