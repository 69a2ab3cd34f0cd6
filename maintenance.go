package mq

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// Upkeep: one goroutine per partition (its "upkeeper") releases delayed
// messages when they fall due and deletes what retention, the dedup window
// and the transaction decision TTL let go. Both are store commands
// (OpRelease, OpTrim) carrying Now from the node's clock, so a replicated
// partition would compute the same result on every replica.
//
// An idle partition costs nothing: the upkeeper sleeps until the earliest
// DeliverAt in the delay index or its next retention check, and a check
// writes only when something is to be deleted. A write that adds to the
// delay index wakes it (store.Partition.Changed).

const (
	releaseLimit  = 10_000      // messages moved per OpRelease
	trimLimit     = 10_000      // records deleted per OpTrim, so a trim never stalls sends for long
	fullTrimEvery = time.Hour   // an unconditional OpTrim, the only one that prunes transaction decisions
	upkeepRetry   = time.Second // pause after a failed store command
	bytesSlack    = 16          // a write taking a partition 1/16 over its byte limit trims at once
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
		u := &upkeeper{
			cfg:    &m.cfg,
			log:    p,
			logger: m.cfg.logger.With("topic", topic, "partition", first+i),
		}
		m.goFunc(u.run)
	}
}

// upkeeper runs the upkeep of one partition. Its fields are owned by run.
type upkeeper struct {
	cfg    *config
	log    partition.Partition
	logger *slog.Logger

	due         int64 // earliest DeliverAt in the delay index (unix ns), if haveDue
	haveDue     bool
	seenDelayed int64 // Stats().Delayed when due was read

	nextCheck  time.Time // next retention check
	nextFull   time.Time // next unconditional trim, which also prunes transaction decisions
	prunedTo   int64     // dedup entries of messages stored before this are pruned (unix ns)
	headOffset uint64    // the log head whose StoredAt is headStored
	headStored int64
}

// run releases and trims until ctx ends.
func (u *upkeeper) run(ctx context.Context) {
	clk := u.cfg.clock
	now := clk.Now()
	u.nextCheck = now // at once: catch up on what expired while the node was down
	// Decisions are first pruned an hour after Open, and only those that
	// no host marker may need (txn.PruneGuard).
	u.nextFull = now.Add(fullTrimEvery)
	var (
		timer     <-chan time.Time // fires at timerAt; nil when none is pending
		timerAt   time.Time
		readDue   = true // the delay index may have changed since due was read
		overBytes bool   // a write took the partition well over its byte limit
	)
	// changed is taken before the reads it guards and renewed only once it
	// fired: a change between a read and the next wait closes the channel
	// that wait selects on (a fresh channel each turn missed it).
	changed := u.log.Changed()
	for ctx.Err() == nil {
		now = clk.Now()
		var err error
		switch {
		case readDue:
			err = u.readDue()
			readDue = err != nil
		case u.haveDue && u.due <= now.UnixNano():
			err = u.release(ctx, now)
			readDue = true
		case overBytes || !now.Before(u.nextCheck):
			err = u.check(ctx, now)
			overBytes = false
			u.nextCheck = now.Add(u.cfg.maintenanceInterval)
		default:
			wake := u.nextCheck
			if u.haveDue && u.due < wake.UnixNano() {
				wake = time.Unix(0, u.due)
			}
			if timer == nil || wake.Before(timerAt) {
				timerAt = wake
				timer = clk.After(wake.Sub(now))
			}
			select {
			case <-ctx.Done():
			case <-changed:
				changed = u.log.Changed() // before reading
				st := u.log.Stats()
				readDue = st.Delayed != u.seenDelayed
				overBytes = u.cfg.retentionBytes > 0 && st.Bytes > u.cfg.retentionBytes+u.cfg.retentionBytes/bytesSlack
			case <-timer:
				timer = nil
			}
		}
		if err != nil && ctx.Err() == nil {
			u.logger.Error("partition upkeep failed; retrying", "err", err, "retry", upkeepRetry)
			select {
			case <-ctx.Done():
			case <-clk.After(upkeepRetry):
			}
		}
	}
}

// readDue reads the earliest DeliverAt of the delay index.
func (u *upkeeper) readDue() error {
	delayed := u.log.Stats().Delayed
	due, ok, err := u.log.NextDue()
	if err != nil {
		return fmt.Errorf("read delay index: %w", translate(err))
	}
	u.due, u.haveDue, u.seenDelayed = due, ok, delayed
	return nil
}

// release moves every message due at now into the log, in (DeliverAt,
// arrival) order.
func (u *upkeeper) release(ctx context.Context, now time.Time) error {
	cmd := store.Command{Op: store.OpRelease, Now: now.UnixNano(), Limit: releaseLimit}
	for {
		res, err := u.log.Apply(ctx, &cmd)
		if err != nil {
			return fmt.Errorf("release delayed messages: %w", translate(err))
		}
		if !res.More {
			return nil
		}
	}
}

// check trims the partition if a trim would delete something now.
func (u *upkeeper) check(ctx context.Context, now time.Time) error {
	want, err := u.trimWanted(now)
	if err != nil || !want {
		return err
	}
	return u.trim(ctx, now)
}

// trimWanted tells from the committed stats and the head record whether an
// OpTrim at now has work to do, so that checking an idle partition costs no
// write. It errs on the side of trimming.
func (u *upkeeper) trimWanted(now time.Time) (bool, error) {
	cfg, st, ns := u.cfg, u.log.Stats(), now.UnixNano()
	switch {
	case cfg.retentionBytes > 0 && st.Bytes > cfg.retentionBytes:
		return true, nil
	case !now.Before(u.nextFull):
		return true, nil
	case st.LastStored > 0 && st.LastStored >= u.prunedTo && ns-int64(cfg.dedupWindow) > u.prunedTo:
		// Messages stored since the last prune have dedup entries that
		// may have expired.
		return true, nil
	case cfg.retention > 0 && st.Low < st.Next:
		if u.headOffset != st.Low || u.headStored == 0 {
			head, ok, err := u.log.Get(st.Low)
			if err != nil {
				return false, fmt.Errorf("read log head %d: %w", st.Low, translate(err))
			}
			if !ok { // trimmed meanwhile: look again next time
				return false, nil
			}
			u.headOffset, u.headStored = st.Low, head.StoredAt
		}
		return u.headStored < ns-int64(cfg.retention), nil
	}
	return false, nil
}

// trim deletes the head of the log by age and size, and prunes dedup entries
// and, once an hour, transaction decisions past their time, in steps of
// trimLimit records.
func (u *upkeeper) trim(ctx context.Context, now time.Time) error {
	cfg := u.cfg
	cmd := store.Command{
		Op:       store.OpTrim,
		Now:      now.UnixNano(),
		Limit:    trimLimit,
		MaxAge:   int64(cfg.retention),
		MaxBytes: cfg.retentionBytes,
		DedupTTL: int64(cfg.dedupWindow),
	}
	full := !now.Before(u.nextFull)
	if full {
		// No decision goes while a host marker may need it (txn.PruneGuard).
		cmd.DecideTTL = int64(cfg.tx.prune.DecideTTL(now, cfg.decisionTTL))
	}
	deleted := 0
	for {
		res, err := u.log.Apply(ctx, &cmd)
		if err != nil {
			return fmt.Errorf("trim: %w", translate(err))
		}
		deleted += res.Count
		if !res.More {
			break
		}
	}
	u.prunedTo = cmd.Now - cmd.DedupTTL
	if full {
		u.nextFull = now.Add(fullTrimEvery)
	}
	if deleted > 0 {
		st := u.log.Stats()
		u.logger.Info("retention deleted messages", "count", deleted, "head", st.Low, "bytes", st.Bytes)
	}
	return nil
}
