package delivery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/topicdb"
	"github.com/zeze-go/mq/store"
)

// redriveOffset is the offset name under which Redrive keeps its progress
// in a dead-letter topic; '%' keeps it apart from groups.
const redriveOffset = "%redrive"

// redriveMu serializes Redrive, an operator's call, in the process.
var redriveMu sync.Mutex

// ErrNoOrigin marks a dead letter without PropOriginTopic.
var ErrNoOrigin = errors.New("delivery: dead letter without origin topic")

// Redrive sends group's dead letters back to the topics they came from as
// new messages, as the root's RedriveDeadLetters describes, and returns how
// many it sent. noTopic reports whether an error means "no such topic".
func (e *Engine) Redrive(ctx context.Context, group string, noTopic func(error) bool) (int, error) {
	redriveMu.Lock()
	defer redriveMu.Unlock()
	dlq := topicdb.DeadLetterPrefix + group
	parts, err := e.topics.Partitions(dlq)
	if noTopic(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	sent := 0
	for i, p := range parts {
		n, err := e.redrivePartition(ctx, dlq, i, p)
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

func (e *Engine) redrivePartition(ctx context.Context, dlq string, part int, p Partition) (int, error) {
	res, err := p.Apply(ctx, &store.Command{Op: store.OpClaim, Group: redriveOffset, Start: store.StartFirst})
	if err != nil {
		return 0, err
	}
	from, gen := max(res.Offset, partition.Stats(ctx, p).Low), res.Generation
	commit := func(off uint64) error {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := p.Apply(cctx, &store.Command{Op: store.OpCommitOffset, Group: redriveOffset, Offset: off, Generation: gen})
		return err
	}
	sent := 0
	var buf []store.Message
	for from < partition.Stats(ctx, p).Next { // what is there: Fetch does not wait
		if err := ctx.Err(); err != nil {
			return sent, err
		}
		buf, err = p.Fetch(ctx, from, 256, 1<<20, buf[:0])
		if err != nil {
			return sent, err
		}
		for i := range buf {
			if err := e.redriveOne(ctx, dlq, part, &buf[i]); err != nil {
				commit(from)
				return sent, err
			}
			from = buf[i].Offset + 1
			sent++
		}
		if err := commit(from); err != nil {
			return sent, err
		}
	}
	return sent, nil
}

func (e *Engine) redriveOne(ctx context.Context, dlq string, part int, sm *store.Message) error {
	topic := sm.Properties[PropOriginTopic]
	if topic == "" {
		return fmt.Errorf("%w: %s/%d/%d has no %s", ErrNoOrigin, dlq, part, sm.Offset, PropOriginTopic)
	}
	parts, err := e.topics.Partitions(topic)
	if err != nil {
		return fmt.Errorf("redrive %s/%d/%d: %w", dlq, part, sm.Offset, err)
	}
	props := maps.Clone(sm.Properties)
	delete(props, PropLastError)
	delete(props, PropRetryGroup)
	delete(props, PropReconsumeTimes)
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
	return appendTo(ctx, topic, parts, i, &cp)
}
