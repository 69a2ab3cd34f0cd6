// Package raftqueue replicates partitions, each a store.Partition. A Group
// is a replica of a hashicorp/raft group of three, the Raft3 type; a Pair
// is a replica of a DoubleWrite pair, over package pairlog's log.
//
// A Group is one raft.Raft whose FSM applies store commands to the
// replica's partition files, one per partition the group carries. On the
// leader a proposer packs the commands of concurrent Apply calls into one
// raft entry. It has no timer: it takes what is queued once an entry slot
// is free, with at most two entries in flight by default. Each caller gets
// the result the FSM computed for its command.
//
// Outcomes of Apply:
//   - the command's Result and its own error, such as
//     store.ErrStaleGeneration: the entry was committed and applied;
//   - a *NotLeaderError, which wraps ErrNotLeader and names the leader:
//     this replica does not lead, nothing was proposed; retry at the leader;
//   - an error wrapping ErrUnknownOutcome: the entry was proposed and may
//     have been committed. Leadership was lost while committing, the
//     caller's ctx ended after the proposal, or the replica failed while
//     applying. A retry with the same message IDs is deduplicated by the
//     store.
//
// The raft log is the durable record: the partition applies without a sync
// of its own and records in its file how far into the log it holds, so a
// replica restarting from its directory replays only what the file lacks.
package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/store"
)

// Errors returned by Group.
var (
	// ErrNotLeader is wrapped by the *NotLeaderError Apply returns on a
	// replica that does not lead the group: nothing was proposed.
	ErrNotLeader = errors.New("raftqueue: not the leader")
	// ErrUnknownOutcome is returned when a command was proposed but its
	// outcome is not known: leadership was lost while its entry was being
	// committed, the caller's ctx ended after the proposal, or this replica
	// failed applying it. A retry with the same message IDs is deduplicated.
	ErrUnknownOutcome = errors.New("raftqueue: outcome unknown")
	// ErrClosed is returned by Apply after Close, and for the commands still
	// queued when Close began, which were never proposed. It wraps
	// store.ErrClosed.
	ErrClosed = fmt.Errorf("raftqueue: group closed: %w", store.ErrClosed)
)

// NotLeaderError is Apply's error on a replica that is not the leader. It
// names the leader this replica knows of; both fields are empty while
// there is none.
type NotLeaderError struct {
	Leader   raft.ServerAddress
	LeaderID raft.ServerID
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "raftqueue: not the leader; no leader known"
	}
	return fmt.Sprintf("raftqueue: not the leader; the leader is %s at %s", e.LeaderID, e.Leader)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// Defaults of Config.
const (
	DefaultMaxEntryBytes = 1 << 20
	DefaultMaxEntryCmds  = 1024
	DefaultInFlight      = 2
	DefaultQueueDepth    = 4096
)

// Config configures one replica of a group.
type Config struct {
	// ID is this replica's raft server id, unique in the group.
	ID raft.ServerID
	// Dir holds the replica, and Open creates it if missing: the partition
	// files (see Partitions); raft.db, raft-boltdb's file of the terms and
	// votes and, unless LogStore is set, of the log; and snapshots/.
	Dir string
	// Transport is the group's network: a transport.RaftMux stream layer in
	// a node, raft.NewInmemTransport in tests. Raft's shutdown closes it.
	Transport raft.Transport
	// LogStore replaces raft.db as the raft log: the seam for the node's
	// shared write-ahead log. It must be durable when StoreLogs returns.
	LogStore raft.LogStore
	// Raft tunes raft: timeouts, MaxAppendEntries, snapshots. Nil: the
	// defaults of raft.DefaultConfig with MaxAppendEntries 256. LocalID,
	// Logger and NoSnapshotRestoreOnStart are set by Open.
	Raft *raft.Config
	// Logger receives raft's logs. Nil: silent.
	Logger hclog.Logger
	// Partitions is how many partitions the group carries, 1 by default:
	// partition 0 in partition.db, partition i in partition-<i>.db. Every
	// replica of a group has the same number. Many partitions in one group
	// share its entries, so their senders fill them: fewer, larger entries
	// cost less than many small ones.
	Partitions int
	// MaxEntryBytes and MaxEntryCmds bound the commands packed into one
	// entry, and a larger command goes alone. InFlight bounds the entries
	// proposed and not yet applied; QueueDepth bounds the commands waiting
	// for the proposer, beyond which Apply blocks. Zero: the defaults.
	MaxEntryBytes, MaxEntryCmds, InFlight, QueueDepth int
}

// Group is one replica of a raft group of partitions. It is safe for
// concurrent use.
//
// Goroutines: raft's own, the proposer and its completer, and watchLeader,
// all stopped by Close.
type Group struct {
	id    raft.ServerID
	raft  *raft.Raft
	fsm   *fsm
	bolt  *raftboltdb.BoltStore
	trans raft.Transport
	prop  *proposer
	// ready is the term in which this replica, leading, has applied every
	// entry committed before its term, as a raft barrier proves: see
	// LeaderPartition.
	ready atomic.Uint64

	// For LeaderChanged, watchLeader closes leadChanged at each leadership
	// change and makes a new one, until watchStop.
	leadMu      sync.Mutex
	leadChanged chan struct{}             // guarded by leadMu
	leadSince   atomic.Pointer[time.Time] // when this replica last took the lead, by this process's clock; nil while it does not lead
	watchStop   chan struct{}
	watchDone   chan struct{}
}

// Open opens the replica in cfg.Dir, creating it if needed, and starts its
// raft. A new group needs Bootstrap on one replica, or on all with the same
// servers; a replica with state rejoins its group as raft does.
func Open(cfg Config) (*Group, error) {
	if cfg.ID == "" || cfg.Dir == "" || cfg.Transport == nil {
		return nil, errors.New("raftqueue: Config needs ID, Dir and Transport")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	conf := raft.DefaultConfig()
	conf.MaxAppendEntries = 256
	if cfg.Raft != nil {
		c := *cfg.Raft
		conf = &c
	}
	conf.LocalID = cfg.ID
	conf.NoSnapshotRestoreOnStart = true // the partition file holds its own position
	conf.Logger = cfg.Logger
	if conf.Logger == nil {
		conf.Logger = hclog.NewNullLogger()
	}
	if err := raft.ValidateConfig(conf); err != nil {
		return nil, fmt.Errorf("raftqueue: %w", err)
	}

	g := &Group{id: cfg.ID, trans: cfg.Transport}
	ok := false
	defer func() {
		if !ok {
			g.closeFiles()
		}
	}()
	var err error
	// raft-boltdb opens bbolt itself, and bbolt panics or faults on a
	// damaged file: check it first, as every other bbolt file is.
	stable := filepath.Join(cfg.Dir, "raft.db")
	if _, serr := os.Stat(stable); serr == nil {
		if err := boltsafe.CheckView(stable, &bolt.Options{Timeout: time.Second}, checkStable); err != nil {
			return nil, fmt.Errorf("raftqueue: %w: %s: %w", store.ErrCorrupt, stable, err)
		}
	}
	g.bolt, err = raftboltdb.New(raftboltdb.Options{
		Path:        stable,
		BoltOptions: &bolt.Options{Timeout: time.Second},
	})
	if err != nil {
		return nil, fmt.Errorf("raftqueue: open raft.db: %w", err)
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 1
	}
	if err := checkPartitions(g.bolt, cfg.Partitions); err != nil {
		return nil, err
	}
	var logs raft.LogStore = g.bolt
	if cfg.LogStore != nil {
		logs = cfg.LogStore
	}
	logs, err = raft.NewLogCache(512, logs)
	if err != nil {
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, conf.Logger.Named("snapshots"))
	if err != nil {
		return nil, fmt.Errorf("raftqueue: %w", err)
	}
	paths := []string{filepath.Join(cfg.Dir, "partition.db")}
	for i := 1; i < cfg.Partitions; i++ {
		paths = append(paths, filepath.Join(cfg.Dir, "partition-"+strconv.Itoa(i)+".db"))
	}
	if g.fsm, err = openFSM(paths); err != nil {
		return nil, fmt.Errorf("raftqueue: %w", err)
	}
	if err := g.fsm.catchUp(snaps); err != nil {
		return nil, err
	}
	g.raft, err = raft.NewRaft(conf, g.fsm, logs, g.bolt, snaps, cfg.Transport)
	if err != nil {
		return nil, fmt.Errorf("raftqueue: %w", err)
	}
	g.prop = newProposer(g, cfg)
	g.leadChanged, g.watchStop, g.watchDone = make(chan struct{}), make(chan struct{}), make(chan struct{})
	go g.watchLeader()
	ok = true
	return g, nil
}

// LeaderChanged returns a channel closed at the next change of this
// replica's leadership, when it becomes the leader or stops being it, or
// when the replica closes. Take it before looking at State, as with
// store.Partition.Changed.
func (g *Group) LeaderChanged() <-chan struct{} {
	g.leadMu.Lock()
	defer g.leadMu.Unlock()
	return g.leadChanged
}

// watchLeader turns raft's leadership notifications into LeaderChanged,
// until Close. Nothing else reads raft's LeaderCh.
func (g *Group) watchLeader() {
	defer close(g.watchDone)
	changed := func() {
		g.leadMu.Lock()
		close(g.leadChanged)
		g.leadChanged = make(chan struct{})
		g.leadMu.Unlock()
	}
	for {
		select {
		case leads := <-g.raft.LeaderCh():
			if leads {
				t := time.Now()
				g.leadSince.Store(&t)
			} else {
				g.leadSince.Store(nil)
			}
			changed()
		case <-g.watchStop:
			changed()
			return
		}
	}
}

// checkStable refuses a raft.db that raft-boltdb would repair in silence: a
// bucket whose name is damaged is made anew as empty, and the replica would
// forget its term, its vote and the partition count the file records, and
// could vote twice in a term. A file with buckets must hold raft-boltdb's
// two and no other, and its conf bucket, once raft wrote to it, the
// partition count, which the first Open writes before raft starts.
func checkStable(tx *bolt.Tx) error {
	n := 0
	err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		n++
		if string(name) != "logs" && string(name) != "conf" {
			return fmt.Errorf("unknown bucket %q", name)
		}
		return nil
	})
	if err != nil || n == 0 {
		return err
	}
	conf := tx.Bucket([]byte("conf"))
	if conf == nil {
		return errors.New("no conf bucket beside the logs")
	}
	if k, _ := conf.Cursor().First(); k != nil && conf.Get(partitionsKey) == nil {
		return errors.New("terms and votes without the partition count")
	}
	return nil
}

// partitionsKey is where raft.db records how many partitions the group
// carries: a replica reopened with another number would apply a part of the
// entries and drop the rest.
var partitionsKey = []byte("raftqueue-partitions")

// checkPartitions records n in stable on the replica's first open, and
// refuses another n after.
func checkPartitions(stable *raftboltdb.BoltStore, n int) error {
	had, err := stable.GetUint64(partitionsKey)
	switch {
	case errors.Is(err, raftboltdb.ErrKeyNotFound):
		if err := stable.SetUint64(partitionsKey, uint64(n)); err != nil {
			return fmt.Errorf("raftqueue: record the partitions: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("raftqueue: read the partitions: %w", err)
	case had != uint64(n):
		return fmt.Errorf("raftqueue: the group carries %d partitions, not %d", had, n)
	}
	return nil
}

// catchUp restores the newest snapshot into the partitions whose files
// stand before it: with NoSnapshotRestoreOnStart raft replays only the log
// after its newest snapshot, and a replica that crashed while restoring a
// snapshot sent by the leader has the snapshot but not the files.
func (f *fsm) catchUp(snaps *raft.FileSnapshotStore) error {
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("raftqueue: snapshots: %w", err)
	}
	// A file at the snapshot's index may hold only a part of that entry's
	// commands: readSnapshot compares whole positions.
	if len(list) == 0 || !slices.ContainsFunc(f.applied, func(p store.Position) bool { return p.Index <= list[0].Index }) {
		return nil
	}
	_, rc, err := snaps.Open(list[0].ID)
	if err != nil {
		return fmt.Errorf("raftqueue: snapshot %s: %w", list[0].ID, err)
	}
	return f.Restore(rc)
}

// Bootstrap makes servers the group's first configuration. It is a no-op on
// a replica that has state already.
func (g *Group) Bootstrap(servers []raft.Server) error {
	err := g.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		return nil
	}
	return err
}

// ID returns this replica's server id.
func (g *Group) ID() raft.ServerID { return g.id }

// State returns this replica's raft state.
func (g *Group) State() raft.RaftState { return g.raft.State() }

// Leader returns the leader this replica knows of; both are empty while
// there is none.
func (g *Group) Leader() (raft.ServerAddress, raft.ServerID) { return g.raft.LeaderWithID() }

// LeaderSince returns when this replica last took the lead, by this
// process's monotonic clock; the zero time while it does not lead.
func (g *Group) LeaderSince() time.Time {
	if t := g.leadSince.Load(); t != nil && g.raft.State() == raft.Leader {
		return *t
	}
	return time.Time{}
}

// Raft returns the replica's raft, for membership changes and tests.
func (g *Group) Raft() *raft.Raft { return g.raft }

// Partitions returns how many partitions the group carries.
func (g *Group) Partitions() int { return len(g.fsm.paths) }

// Partition returns the replica's partition i, for reads: what it holds is
// what this replica applied. It returns ErrClosed after Close, and the
// failure after the replica failed. A follower's restore replaces it: a
// reader holding the old one gets store.ErrClosed.
func (g *Group) Partition(i int) (*store.Partition, error) {
	if err := g.checkPart(i); err != nil {
		return nil, err
	}
	p, err := g.fsm.partition(i)
	if errors.Is(err, store.ErrClosed) {
		return nil, ErrClosed
	}
	return p, err
}

// LeaderPartition returns the replica's partition i for reads that must see
// every acknowledged command: it returns a *NotLeaderError unless this
// replica leads, and a new leader first waits with a raft barrier, until
// it has applied every entry its predecessors committed or ctx ends. A
// replica that just won an election may hold less than what was acked.
// Each call confirms the leadership with one round of heartbeats to a
// quorum, so a deposed leader that has not noticed yet never answers.
func (g *Group) LeaderPartition(ctx context.Context, i int) (*store.Partition, error) {
	for {
		if g.raft.State() != raft.Leader {
			return nil, g.notLeader()
		}
		term := g.raft.CurrentTerm()
		if g.ready.Load() == term {
			// raft's leader state is kept by its main loop, which also
			// checks the lease: a replica stalled past the election
			// timeout, by a frozen process or a slow disk, still says
			// it leads while the others elect another and ack writes it
			// never saw. A round of heartbeats, which concurrent reads
			// share, proves it still leads.
			if err := g.verifyLeader(ctx); err != nil {
				return nil, err
			}
			return g.Partition(i)
		}
		timeout := time.Duration(0)
		if d, ok := ctx.Deadline(); ok {
			if timeout = time.Until(d); timeout <= 0 {
				return nil, context.DeadlineExceeded
			}
		}
		err := g.raft.Barrier(timeout).Error()
		switch {
		case err == nil:
			if g.raft.CurrentTerm() == term {
				g.ready.Store(term)
			}
		case errors.Is(err, raft.ErrRaftShutdown):
			return nil, ErrClosed
		case errors.Is(err, raft.ErrEnqueueTimeout):
			return nil, context.DeadlineExceeded
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
			errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return nil, g.notLeader()
		default:
			return nil, fmt.Errorf("raftqueue: barrier: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// verifyLeader waits until a quorum confirmed that this replica leads, or
// ctx ends. Raft's future is then left to a goroutine of its own, which
// raft answers once the replica steps down, resumes or shuts down.
func (g *Group) verifyLeader(ctx context.Context) error {
	f := g.raft.VerifyLeader()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	default:
		return g.notLeader()
	}
}

func (g *Group) leading() bool { return g.raft.State() == raft.Leader }

func (g *Group) propose(data []byte) raft.ApplyFuture { return g.raft.Apply(data, 0) }

// notLeader returns the error for a replica that does not lead.
func (g *Group) notLeader() error {
	addr, id := g.raft.LeaderWithID()
	return &NotLeaderError{Leader: addr, LeaderID: id}
}

// Apply proposes cmd to partition 0, with the commands other callers
// propose meanwhile, in one raft entry, and returns the result the FSM
// computed once the entry is committed and applied on this replica. cmd.Now
// must be set: a zero Now is store.ErrBadCommand, as everywhere. It returns
// ctx's error if ctx ends before cmd was proposed, and ErrUnknownOutcome
// wrapping it after; the caller may reuse cmd once Apply returns. See the
// package doc for the other outcomes.
func (g *Group) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	return g.prop.apply(ctx, 0, cmd)
}

// ApplyTo is Apply for the group's partition part.
func (g *Group) ApplyTo(ctx context.Context, part int, cmd *store.Command) (store.Result, error) {
	if err := g.checkPart(part); err != nil {
		return store.Result{}, err
	}
	return g.prop.apply(ctx, part, cmd)
}

// checkPart refuses a partition index the group does not carry.
func (g *Group) checkPart(i int) error {
	if i < 0 || i >= len(g.fsm.paths) {
		return fmt.Errorf("%w: partition %d of a group of %d", store.ErrBadCommand, i, len(g.fsm.paths))
	}
	return nil
}

// Close stops proposing, answering the commands still queued with
// ErrClosed, waits for the entries in flight to be applied or lost, shuts
// raft down, closing Transport (transport.ShutdownRaft), and closes the
// files. It is idempotent.
func (g *Group) Close() error {
	var err error
	g.prop.once.Do(func() {
		g.prop.close()
		err = transport.ShutdownRaft(g.raft.Shutdown(), g.trans)
		close(g.watchStop)
		<-g.watchDone
		if cerr := g.closeFiles(); err == nil {
			err = cerr
		}
	})
	return err
}

func (g *Group) closeFiles() error { return closeFiles(g.fsm, g.bolt) }

// closeFiles closes a replica's partitions and its raft-boltdb file, either
// nil when it did not open.
func closeFiles(f *fsm, stable *raftboltdb.BoltStore) error {
	var err error
	if f != nil {
		err = f.close()
	}
	if stable != nil {
		if cerr := stable.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

var _ io.Closer = (*Group)(nil)
