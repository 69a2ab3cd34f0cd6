package mq

import (
	"context"
	"fmt"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/upkeep"
)

// WithRetention deletes, from the head of each partition, the messages
// stored more than d ago, consumed or not (RocketMQ's fileReservedTime).
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
// transaction (its clean-up failed, or the store could not be listed since
// Open): the sweep that finds such a marker relies on the decision not to
// publish the transaction twice.
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
// are released when due.
func WithMaintenanceInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: maintenance interval %v", ErrInvalidOption, d)
		}
		c.maintenanceInterval = d
		return nil
	}
}

// startMaintenance starts the upkeep of every partition opened by Open.
func (m *MQ) startMaintenance() {
	for name, t := range m.topics.All() {
		m.maintainPartitions(name, 0, t.Parts)
	}
}

// maintainPartitions starts the upkeep of parts, the partitions of topic
// from index first on. CreateMQ and AlterMQ call it for the partitions they
// add, with m.adminMu held and the node open, so Close waits for what it starts.
func (m *MQ) maintainPartitions(topic string, first int, parts []partition.Partition) {
	for i, p := range parts {
		logger := m.cfg.logger.With("topic", topic, "partition", first+i)
		m.goFunc(func(ctx context.Context) { upkeep.Run(ctx, p, &m.upkeep, logger) })
	}
}
