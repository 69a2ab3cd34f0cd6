package delivery

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/topicdb"
	"github.com/zeze-go/mq/store"
)

// Properties set on messages parked in a retry topic or moved to a
// dead-letter topic. The root documents them.
const (
	PropOriginTopic     = "ORIGIN_TOPIC"
	PropOriginPartition = "ORIGIN_PARTITION"
	PropOriginOffset    = "ORIGIN_OFFSET"
	PropOriginID        = "ORIGIN_MSG_ID"
	PropLastError       = "LAST_ERROR"
	PropRetryGroup      = "RETRY_GROUP"
	PropReconsumeTimes  = "RECONSUME_TIMES"

	maxLastErr = 1024
	// savedPrefix keeps, on a parked copy, the original's own value of a
	// property the copy overwrites, as a dead letter being retried has
	// ORIGIN_* of its own, and its DeliverAt: presenting the copy restores
	// them.
	savedPrefix    = "%SAVED%"
	savedDeliverAt = savedPrefix + "%DELIVER_AT"
)

// parkProps are the properties a parked copy carries for the queue.
var parkProps = []string{PropOriginTopic, PropOriginPartition, PropOriginOffset, PropOriginID, PropLastError, PropRetryGroup}

// present builds the delivery of sm: a copy the handler owns. A message
// parked by this consumer's parent is presented as the original it copies:
// its topic, partition, offset, ID, properties and DeliverAt, with the
// failures the group counted. Any other message starts the group's count
// at 0, whatever ReconsumeTimes it was stored with: a dead letter carries
// the failures of the group that gave up on it.
func (c *Consumer) present(part int, sm *store.Message) *Delivery {
	m := *sm
	m.Properties = maps.Clone(sm.Properties)
	d := &Delivery{Topic: c.topic, Partition: part, Offset: sm.Offset, Msg: &m}
	if id := sm.Properties[PropOriginID]; id != "" {
		m.ID = id
	}
	if c.parent == nil {
		m.ReconsumeTimes = 0
		return d
	}
	d.ReconsumeTimes = int(sm.ReconsumeTimes)
	if t := sm.Properties[PropOriginTopic]; t != "" {
		d.Topic = t
	}
	if p, err := strconv.Atoi(sm.Properties[PropOriginPartition]); err == nil {
		d.Partition = p
	}
	if o, err := strconv.ParseUint(sm.Properties[PropOriginOffset], 10, 64); err == nil {
		d.Offset = o
	}
	m.DeliverAt = 0
	for _, k := range parkProps {
		delete(m.Properties, k)
	}
	for k, v := range sm.Properties {
		if orig, ok := strings.CutPrefix(k, savedPrefix); ok {
			delete(m.Properties, k)
			if k == savedDeliverAt {
				m.DeliverAt, _ = strconv.ParseInt(v, 10, 64)
			} else {
				m.Properties[orig] = v
			}
		}
	}
	if len(m.Properties) == 0 {
		m.Properties = nil // as the original was stored
	}
	m.Offset = d.Offset
	return d
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
	if c.parent == nil { // a first failure: keep the original's own values, record where it lives
		for _, k := range parkProps {
			if old, ok := props[k]; ok {
				props[savedPrefix+k] = old
			}
		}
		props[PropOriginTopic] = c.topic
		props[PropOriginPartition] = strconv.Itoa(w.part)
		props[PropOriginOffset] = strconv.FormatUint(sm.Offset, 10)
		if sm.DeliverAt != 0 {
			props[savedDeliverAt] = strconv.FormatInt(sm.DeliverAt, 10)
		}
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
		cp.DeliverAt = partition.UnixNano(c.e.clock.Now().Add(d)) // a step past 2262 waits until then
	}
	w.logger().Warn("message handler failed; parked for retry", "offset", sm.Offset, "attempt", r+1, "after", d, "err", cause)
	return topicdb.RetryPrefix + c.groupName, cp
}

// deadCopy returns the copy of sm, which failed with ReconsumeTimes r, to
// store in the group's dead-letter topic, with ReconsumeTimes r+1, its
// failed deliveries.
func (w *worker) deadCopy(sm *store.Message, r int, cause error) (topic string, cp store.Message) {
	c := w.c
	cp = w.failedCopy(sm, cause)
	for k := range cp.Properties { // a dead letter keeps where it failed, not what a retry saved
		if strings.HasPrefix(k, savedPrefix) {
			delete(cp.Properties, k)
		}
	}
	cp.ReconsumeTimes = int32(r + 1)
	cp.Properties[PropReconsumeTimes] = strconv.Itoa(r + 1)
	w.logger().Error("message handler failed too often; dead-lettered", "offset", sm.Offset, "attempts", r+1, "err", cause)
	return topicdb.DeadLetterPrefix + c.groupName, cp
}

// appendSystem appends msg to the system topic name, creating it if needed.
func (e *Engine) appendSystem(ctx context.Context, name string, msg *store.Message) error {
	if err := e.topics.EnsureSystem(ctx, name); err != nil {
		return err
	}
	parts, err := e.topics.Partitions(name)
	if err != nil {
		return err
	}
	return appendTo(ctx, name, parts, partition.ForKey(msg.ID, len(parts)), msg)
}

func appendTo(ctx context.Context, topic string, parts []Partition, i int, msg *store.Message) error {
	cmd := store.Command{Op: store.OpAppend, Msgs: []store.Message{*msg}}
	if _, err := parts[i].Apply(ctx, &cmd); err != nil {
		return fmt.Errorf("send to %s/%d: %w", topic, i, err)
	}
	return nil
}
