package mq

import (
	"fmt"
	"log/slog"
	"time"
)

// Type says how a topic's partitions are replicated. Values follow the draft.
type Type int

// Replication types.
const (
	// Single keeps one copy of each partition on one node (the default).
	Single Type = 1
	// DoubleWrite keeps a leader and a synchronous follower. It needs a cluster.
	DoubleWrite Type = 2
	// Raft3 replicates each partition in a 3-voter raft group. It needs a cluster.
	Raft3 Type = 4
)

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
}

func (o Options) withDefaults() Options {
	if o.Type == 0 {
		o.Type = Single
	}
	return o
}

// Option configures Open.
type Option func(*config) error

type config struct {
	logger       *slog.Logger
	syncInterval time.Duration
	// materializeAfter is the partitions' store.Options.MaterializeAfter;
	// only tests set it (export_test.go).
	materializeAfter time.Duration
	dedupWindow      time.Duration
	maxMessageBytes  int
	clock            Clock

	// Upkeep (maintenance.go).
	retention           time.Duration // 0: no age limit
	retentionBytes      int64         // per partition; 0: no size limit
	decisionTTL         time.Duration
	maintenanceInterval time.Duration

	// Transactions (transaction.go).
	tx txConfig
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
// write-ahead log and fsyncs the log every d instead (RocketMQ's
// ASYNC_FLUSH). A process crash loses nothing; a power loss may lose up to d
// of acknowledged messages. Partition files are fsynced as always, so they
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

// WithMaxMessageBytes sets the largest message accepted (body, key, tags and
// properties together; the ID is bounded on its own by MaxIDBytes). Default
// 4 MiB.
func WithMaxMessageBytes(n int) Option {
	return func(c *config) error {
		if n <= 0 || n > 256<<20 {
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
