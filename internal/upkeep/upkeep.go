// Package upkeep runs the upkeep of a partition on the node that owns it:
// one goroutine per partition releases delayed messages when they fall due
// and deletes what retention, the dedup window and the transaction decision
// TTL let go. Both are store commands, OpRelease and OpTrim; the upkeep
// runs only where the partition's proposer is and stamps them with the
// time it decided at, to which the transaction guard's cutoff is relative,
// so a replicated partition computes the same result on every replica.
//
// An idle partition costs nothing: the upkeeper sleeps until the earliest
// DeliverAt in the delay index or its next retention check, and a check
// writes only when something is to be deleted. A write that adds to the
// delay index wakes it through Partition.Changed.
package upkeep

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/zeze-go/mq/store"
)

const (
	releaseLimit  = 10_000      // messages moved per OpRelease
	trimLimit     = 10_000      // records deleted per OpTrim, so a trim never stalls sends for long
	fullTrimEvery = time.Hour   // an unconditional OpTrim, the only one that prunes transaction decisions
	upkeepRetry   = time.Second // pause after a failed store command
	bytesSlack    = 16          // a write taking a partition 1/16 over its byte limit trims at once
)

// Partition is what the upkeep needs of the partition it keeps; only the
// partition's owner runs it, so Changed is a local notification.
type Partition interface {
	Apply(ctx context.Context, cmd *store.Command) (store.Result, error)
	Stats() store.Stats
	// Changed returns a channel closed when the log or delay index grows.
	Changed() <-chan struct{}
	NextDue() (int64, bool, error)
	Get(offset uint64) (store.Message, bool, error)
	GroupStates() (map[string]store.GroupState, error)
}

// Clock is the node's source of time.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// Config is the upkeep's part of the node's options.
type Config struct {
	Clock          Clock
	Retention      time.Duration // 0: no age limit
	RetentionBytes int64         // per partition; 0: no size limit
	Consumed       bool          // also delete what every group committed past: store.Command.Consumed
	DedupWindow    time.Duration
	DecisionTTL    time.Duration
	Interval       time.Duration // between retention checks
	// BroadcastTTL removes the offsets of a broadcast instance,
	// group@instance, unchanged for longer; 0 keeps them.
	BroadcastTTL time.Duration
	// DecideTTL returns the TTL to prune transaction decisions with at
	// now, given DecisionTTL: the transaction engine keeps a decision while
	// a host marker may need it. Nil uses DecisionTTL.
	DecideTTL func(now time.Time, ttl time.Duration) time.Duration
}

// Run keeps p until ctx ends.
func Run(ctx context.Context, p Partition, cfg *Config, logger *slog.Logger) {
	u := &upkeeper{cfg: cfg, log: p, logger: logger}
	u.run(ctx)
}

// upkeeper runs the upkeep of one partition. Its fields are owned by run.
type upkeeper struct {
	cfg    *Config
	log    Partition
	logger *slog.Logger

	due         int64 // unix ns: earliest DeliverAt in the delay index, if haveDue
	haveDue     bool
	seenDelayed int64 // Stats().Delayed when due was read

	nextCheck  time.Time // next retention check
	nextFull   time.Time // next unconditional trim, which also prunes transaction decisions
	prunedTo   int64     // unix ns: dedup entries of messages stored before this are pruned
	headOffset uint64    // the log head whose StoredAt is headStored
	headStored int64
}

// run releases and trims until ctx ends.
func (u *upkeeper) run(ctx context.Context) {
	clk := u.cfg.Clock
	now := clk.Now()
	u.nextCheck = now // at once: catch up on what expired while the node was down
	// Decisions are first pruned an hour after Open, and only those that
	// no host marker may need, as Config.DecideTTL says.
	u.nextFull = now.Add(fullTrimEvery)
	var (
		timer     <-chan time.Time // fires at timerAt; nil when none is pending
		timerAt   time.Time
		readDue   = true // the delay index may have changed since due was read
		overBytes bool   // a write took the partition well over its byte limit
	)
	// changed is taken before the reads it guards and renewed only once it
	// fired: a change between a read and the next wait closes the channel
	// that wait selects on, where a fresh channel each turn missed it.
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
			u.nextCheck = now.Add(u.cfg.Interval)
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
				overBytes = u.cfg.RetentionBytes > 0 && st.Bytes > u.cfg.RetentionBytes+u.cfg.RetentionBytes/bytesSlack
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
		return fmt.Errorf("read delay index: %w", err)
	}
	u.due, u.haveDue, u.seenDelayed = due, ok, delayed
	return nil
}

// release moves every message due at now into the log, by DeliverAt and
// then arrival.
func (u *upkeeper) release(ctx context.Context, now time.Time) error {
	cmd := store.Command{Op: store.OpRelease, Now: now.UnixNano(), Limit: releaseLimit}
	for {
		res, err := u.log.Apply(ctx, &cmd)
		if err != nil {
			return fmt.Errorf("release delayed messages: %w", err)
		}
		if !res.More {
			return nil
		}
	}
}

// check trims the partition if a trim would delete something now, and
// removes the offsets of broadcast instances gone for longer than their TTL.
func (u *upkeeper) check(ctx context.Context, now time.Time) error {
	if err := u.expireGroups(ctx, now); err != nil && ctx.Err() == nil {
		// A damaged group record must not stop retention: go on to trim.
		u.logger.Warn("removing idle broadcast offsets failed", "err", err)
	}
	want, err := u.trimWanted(now)
	if err != nil || !want {
		return err
	}
	return u.trim(ctx, now)
}

// expireGroups removes the records of broadcast instances idle for longer
// than BroadcastTTL. The age is compared inside the command, OpDeleteGroup
// with MaxAge, so a running instance that refreshed its record meanwhile
// keeps it. A running instance refreshes it well within the TTL.
func (u *upkeeper) expireGroups(ctx context.Context, now time.Time) error {
	ttl := u.cfg.BroadcastTTL
	if ttl <= 0 {
		return nil
	}
	groups, listErr := u.log.GroupStates() // the good records, even with damaged ones
	if listErr != nil {
		listErr = fmt.Errorf("list groups: %w", listErr)
	}
	cutoff := now.Add(-ttl).UnixNano()
	for name, g := range groups {
		if !strings.Contains(name, "@") || g.Updated == 0 || g.Updated >= cutoff {
			continue
		}
		cmd := store.Command{Op: store.OpDeleteGroup, Now: now.UnixNano(), Group: name, MaxAge: int64(ttl)}
		res, err := u.log.Apply(ctx, &cmd)
		if err != nil {
			return fmt.Errorf("remove idle broadcast offsets %s: %w", name, err)
		}
		if res.Count > 0 {
			u.logger.Info("offsets of an idle broadcast instance removed", "group", name, "idle", now.Sub(time.Unix(0, g.Updated)))
		}
	}
	return listErr
}

// trimWanted tells from the committed stats and the head record whether an
// OpTrim at now has work to do, so that checking an idle partition costs no
// write. It errs on the side of trimming.
func (u *upkeeper) trimWanted(now time.Time) (bool, error) {
	cfg, st, ns := u.cfg, u.log.Stats(), now.UnixNano()
	switch {
	case cfg.RetentionBytes > 0 && st.Bytes > cfg.RetentionBytes:
		return true, nil
	case !now.Before(u.nextFull):
		return true, nil
	case st.LastStored > 0 && st.LastStored >= u.prunedTo && ns-int64(cfg.DedupWindow) > u.prunedTo:
		// Messages stored since the last prune have dedup entries that
		// may have expired.
		return true, nil
	case st.Low == st.Next || cfg.Retention == 0 && !cfg.Consumed:
		return false, nil
	}
	if u.headOffset != st.Low || u.headStored == 0 {
		head, ok, err := u.log.Get(st.Low)
		if err != nil {
			return false, fmt.Errorf("read log head %d: %w", st.Low, err)
		}
		if !ok { // trimmed meanwhile: look again next time
			return false, nil
		}
		u.headOffset, u.headStored = st.Low, head.StoredAt
	}
	if cfg.Retention > 0 && u.headStored < ns-int64(cfg.Retention) {
		return true, nil
	}
	// A consumed record waits for its dedup entry to expire, as store.OpTrim
	// does.
	return cfg.Consumed && u.headStored < ns-int64(cfg.DedupWindow) && u.consumedPast(st.Low), nil
}

// consumedPast reports whether every group of the partition, one at least,
// has committed past offset. A failed read says yes: the trim decides.
func (u *upkeeper) consumedPast(offset uint64) bool {
	groups, err := u.log.GroupStates()
	if err != nil {
		return true
	}
	for _, g := range groups {
		if g.Offset <= offset {
			return false
		}
	}
	return len(groups) > 0
}

// trim deletes the head of the log by age, size and consumption, and prunes
// dedup entries and, once an hour, transaction decisions past their time,
// in steps of trimLimit records.
func (u *upkeeper) trim(ctx context.Context, now time.Time) error {
	cfg := u.cfg
	cmd := store.Command{
		Op:       store.OpTrim,
		Now:      now.UnixNano(), // the guard's cutoff is relative to it
		Limit:    trimLimit,
		MaxAge:   int64(cfg.Retention),
		MaxBytes: cfg.RetentionBytes,
		Consumed: cfg.Consumed,
		DedupTTL: int64(cfg.DedupWindow),
	}
	full := !now.Before(u.nextFull)
	if full {
		// No decision goes while a host marker may need it: Config.DecideTTL.
		ttl := cfg.DecisionTTL
		if cfg.DecideTTL != nil {
			ttl = cfg.DecideTTL(now, ttl)
		}
		cmd.DecideTTL = int64(ttl)
	}
	deleted := 0
	for {
		res, err := u.log.Apply(ctx, &cmd)
		if err != nil {
			return fmt.Errorf("trim: %w", err)
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
