package mq

import (
	"context"
	"fmt"
)

// ReadMessage returns the message stored at offset in one partition of
// topic, without a consumer and without touching any group's offset. It is
// meant for inspection (mqadmin, tests): consumers read in order and are
// faster for bulk reads.
//
// It returns ErrNoTopic, ErrInvalidPartition (partition out of range),
// ErrNoMessage (no message at offset), ErrCorrupt (the stored record fails
// its checksum: the bytes on disk are not the message that was written),
// ErrClosed, or ctx's error.
func (m *MQ) ReadMessage(ctx context.Context, topic string, partition int, offset int64) (*Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	_, parts, err := m.router.partitions(topic)
	if err != nil {
		return nil, err
	}
	if partition < 0 || partition >= len(parts) {
		return nil, fmt.Errorf("%w: partition %d of %s (0..%d)", ErrInvalidPartition, partition, topic, len(parts)-1)
	}
	if offset < 0 {
		return nil, fmt.Errorf("%w: %s/%d offset %d", ErrNoMessage, topic, partition, offset)
	}
	sm, ok, err := parts[partition].Get(uint64(offset))
	if err != nil {
		return nil, fmt.Errorf("read %s/%d at %d: %w", topic, partition, offset, translate(err))
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s/%d offset %d", ErrNoMessage, topic, partition, offset)
	}
	return fromStore(topic, partition, &sm), nil
}
