package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/transport"
)

// MaxVoters is the number of raft voters of the metadata group; further
// nodes join as nonvoters.
const MaxVoters = 5

// DefaultSessionTimeout is MetaConfig.SessionTimeout's default.
const DefaultSessionTimeout = 5 * time.Second

// lockTimeout is how long OpenMeta waits for raft.db's file lock.
const lockTimeout = time.Second

// MetaConfig configures OpenMeta. NodeID, Dir and Transport are required;
// zero durations take raft's defaults.
type MetaConfig struct {
	NodeID    string         // this node's id: 1..64 bytes of [A-Za-z0-9._-]
	Dir       string         // raft.db, holding the log and stable store, and snapshots/
	Transport raft.Transport // the group's network, closed by Close; LocalAddr is this node's raft address
	// RaftAddr is the raft address of node id registered at addr: addr if
	// nil. Over a transport.RaftMux it is the id, which the mux resolves.
	RaftAddr func(id, addr string) raft.ServerAddress
	// Addr is the address recorded for this node, its advertised RPC
	// address, when it registers itself as leader; "" for the raft address.
	Addr string
	// Incarnation is this node's data directory's identity
	// (node.Incarnation), which it registers with itself as leader.
	Incarnation string
	// ClusterID is the cluster id this node's directory records, or made
	// to start a cluster: as leader, it registers itself with it while
	// the state has none (metastate.State.ClusterID).
	ClusterID string
	Logger    *slog.Logger // raft's logs and ours; nil for none

	// Bootstrap makes this node, if it has no raft state yet, the single
	// voter of a new group: the first seed. Without state and without
	// Bootstrap the node waits to be added by the leader.
	Bootstrap bool

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	SnapshotThreshold  uint64 // log entries between snapshots
	TrailingLogs       uint64 // log entries kept after a snapshot

	// SessionTimeout is how long the leader waits for a node's heartbeat
	// before it marks the node down; zero means DefaultSessionTimeout.
	SessionTimeout time.Duration

	// stores, set only by tests for fault injection, wraps raft.db's log
	// and stable store.
	stores func(*raftboltdb.BoltStore) (raft.LogStore, raft.StableStore)
}

// Meta is this node's member of the metadata raft group: the replicated
// State, proposals on the leader, and, while leader, the node sessions.
// Safe for concurrent use.
//
// Lock order: lifeMu, then sessMu; neither is held across a raft call that
// waits.
type Meta struct {
	id       string
	addr     string
	inc      string // this node's incarnation
	cluster  string // the cluster id this node's directory records, "" if none
	raftAddr func(id, addr string) raft.ServerAddress
	log      *slog.Logger
	timeout  time.Duration // session timeout
	raft     *raft.Raft
	trans    raft.Transport // MetaConfig.Transport
	fsm      *fsm
	store    *raftboltdb.BoltStore
	dir      string // Dir: raft.db, snapshots, the state cache

	cacheSaved uint64 // the index of the State in the cache; cache.go

	barrierTerm uint64 // the term whose entries the FSM applied before reconcileMembers; the session loop's

	// members serializes the leader's choices of a server's suffrage
	// (AddNode, reconcileMembers) with the voters raft has yet to show:
	// raft takes one configuration change at a time, so its configuration
	// lags the voters AddNode added without waiting. pending holds those,
	// until the configuration shows them, their term ends, or their
	// request could no longer be taken. Guarded by members.
	members sync.Mutex
	pending map[raft.ServerID]pendingVoter

	noVote atomic.Bool // this replica neither votes nor campaigns; metavote.go
	// voteLog is raft's log while noVote may be set, voteScanned the last
	// of its entries registeredInLog read; OpenMeta's, then the session
	// loop's.
	voteLog     raft.LogStore
	voteScanned uint64
	running     atomic.Bool // raft runs: set once NewRaft returned; termStore
	failed      atomic.Bool // raft.db could not save a term or vote; termStore

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the session and cache loops
	// waiters counts the goroutines waiting for a raft future (wait):
	// Close waits for them a bounded time only (see Close).
	waiters atomic.Int64

	lifeMu sync.Mutex
	closed bool // guarded by lifeMu; no wg.Add once set

	closeOnce sync.Once
	closeErr  error
	stopOnce  sync.Once
	down      raft.Future // raft's Shutdown, once Stop or Close called it

	sessMu   sync.Mutex
	sessTerm uint64             // guarded by sessMu: the term sessions belong to
	sessions map[string]session // guarded by sessMu: node id → its session here
}

// session is what the leader knows of a node's session: when it last heard
// from it, in leader memory only.
type session struct {
	last    time.Time
	session uint64
}

// OpenMeta opens this node's member of the metadata group, bootstrapping a
// new group when cfg.Bootstrap asks and Dir has no raft state, and starts
// raft, the session loop and the cache loop. The session loop, while this
// node leads, marks nodes down whose heartbeats stopped and registers this
// node itself; the cache loop saves the state cache. Close stops them.
func OpenMeta(cfg MetaConfig) (*Meta, error) {
	if err := metastate.CheckNodeID(cfg.NodeID); err != nil {
		return nil, err
	}
	if cfg.Dir == "" || cfg.Transport == nil {
		return nil, fmt.Errorf("%w: MetaConfig needs Dir and Transport", metastate.ErrInvalid)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(cfg.NodeID)
	conf.Logger = newHCLogger(log, "raft")
	conf.NoLegacyTelemetry = true
	if cfg.HeartbeatTimeout > 0 {
		conf.HeartbeatTimeout = cfg.HeartbeatTimeout
		conf.LeaderLeaseTimeout = min(conf.LeaderLeaseTimeout, cfg.HeartbeatTimeout)
		conf.ElectionTimeout = max(conf.ElectionTimeout, cfg.HeartbeatTimeout)
	}
	if cfg.ElectionTimeout > 0 {
		conf.ElectionTimeout = cfg.ElectionTimeout
	}
	if cfg.LeaderLeaseTimeout > 0 {
		conf.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	}
	if cfg.CommitTimeout > 0 {
		conf.CommitTimeout = cfg.CommitTimeout
	}
	if cfg.SnapshotThreshold > 0 {
		conf.SnapshotThreshold = cfg.SnapshotThreshold
	}
	if cfg.TrailingLogs > 0 {
		conf.TrailingLogs = cfg.TrailingLogs
	}
	if err := raft.ValidateConfig(conf); err != nil {
		return nil, fmt.Errorf("%w: %v", metastate.ErrInvalid, err)
	}
	timeout := cfg.SessionTimeout
	if timeout <= 0 {
		timeout = DefaultSessionTimeout
	}

	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("metadata dir: %w", err)
	}
	path := filepath.Join(cfg.Dir, "raft.db")
	// A second Meta on Dir fails instead of waiting for the lock forever.
	bopts := &bolt.Options{Timeout: lockTimeout}
	// raft-boltdb opens bbolt directly: check the file first, so damage is
	// ErrCorrupt rather than a panic in bbolt.
	if info, err := os.Stat(path); err == nil && info.Size() > 0 {
		if err := boltsafe.Check(path, bopts); err != nil {
			if errors.Is(err, boltsafe.ErrCorrupt) {
				return nil, fmt.Errorf("%w: %w", metastate.ErrCorrupt, err)
			}
			return nil, fmt.Errorf("check metadata log: %w", err)
		}
	}
	store, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: bopts})
	if err != nil {
		return nil, fmt.Errorf("open metadata log %s: %w", path, err)
	}
	m := &Meta{
		id:       cfg.NodeID,
		addr:     cmp.Or(cfg.Addr, string(cfg.Transport.LocalAddr())),
		trans:    cfg.Transport,
		inc:      cfg.Incarnation,
		cluster:  cfg.ClusterID,
		raftAddr: cfg.RaftAddr,
		log:      log,
		timeout:  timeout,
		fsm:      newFSM(log),
		store:    store,
		dir:      cfg.Dir,
		sessions: map[string]session{},
	}
	m.raft, err = func() (*raft.Raft, error) {
		snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, newHCLogger(log, "raft-snapshots"))
		if err != nil {
			return nil, fmt.Errorf("open metadata snapshots: %w", err)
		}
		if err := checkSnapshots(cfg.Dir, snaps); err != nil {
			return nil, err
		}
		var logs raft.LogStore = store
		var stable raft.StableStore = store
		if cfg.stores != nil {
			logs, stable = cfg.stores(store)
		}
		stable = &termStore{StableStore: stable, m: m}
		existing, err := raft.HasExistingState(logs, stable, snaps)
		if err != nil {
			return nil, fmt.Errorf("metadata state: %w", err)
		}
		if existing {
			if c := m.loadCache(cfg.Dir); c != nil {
				m.fsm.seed(c)
			}
		} else if err := os.Remove(cachePath(cfg.Dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
			// a cache beside no raft state belongs to another group: a node
			// restarting before its first save must not show it
			return nil, fmt.Errorf("remove a stale metadata state cache: %w", err)
		}
		if err := m.openVoteGate(existing, cfg.Bootstrap, logs); err != nil {
			return nil, err
		}
		if cfg.Bootstrap && !existing {
			boot := raft.Configuration{Servers: []raft.Server{{
				Suffrage: raft.Voter, ID: conf.LocalID, Address: cfg.Transport.LocalAddr(),
			}}}
			if err := raft.BootstrapCluster(conf, logs, stable, snaps, cfg.Transport, boot); err != nil {
				return nil, fmt.Errorf("bootstrap metadata group: %w", err)
			}
		}
		return newRaft(conf, m.fsm, logs, stable, snaps, cfg.Transport, path)
	}()
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	m.running.Store(true)
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.goFunc(m.sessionLoop)
	m.goFunc(m.cacheLoop)
	return m, nil
}

// errMetaFailed is Close's error after raft.db failed to save a term.
var errMetaFailed = errors.New("cluster: the metadata log failed to save a term or vote; this node's member stopped")

// termStore is raft.db's stable store as raft sees it. hashicorp/raft
// panics, in its own goroutines, when it cannot save a new term
// (setCurrentTerm): the process embedding the node would die of a disk
// error. Once raft runs, a failed SetUint64 of a term or a vote instead
// stops this node's member of the metadata group until it is reopened.
// The failure is logged, and the goroutine that called it, raft's main
// loop or the transport's handling a heartbeat, ends with runtime.Goexit,
// which runs its deferred calls, so that raft's Shutdown still finds every
// goroutine done. Nothing of raft's may go on from a term perhaps not on
// disk, since a failed sync is sticky; the node leads no more, and
// proposals go to another leader.
type termStore struct {
	raft.StableStore
	m *Meta
}

func (s *termStore) SetUint64(key []byte, v uint64) error {
	err := s.StableStore.SetUint64(key, v)
	if err == nil || !s.m.running.Load() {
		return err // before NewRaft returned: OpenMeta fails
	}
	if !s.m.failed.Swap(true) {
		s.m.log.Error("metadata log cannot save the raft term or vote: this node's member of the metadata group stops until the node is reopened",
			"key", string(key), "err", err)
	}
	runtime.Goexit()
	return err
}

// newRaft is raft.NewRaft, whose panic when the log lacks an entry it
// replays is ErrCorrupt naming raft.db: the entries a snapshot covered were
// compacted away, and the snapshot is gone. It panics before it starts any
// goroutine.
func newRaft(conf *raft.Config, f *fsm, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, tr raft.Transport, path string) (r *raft.Raft, err error) {
	defer func() {
		p := recover()
		if pe, ok := p.(error); ok && errors.Is(pe, raft.ErrLogNotFound) {
			r, err = nil, fmt.Errorf("%w: %s lacks entries it needs (%v): a snapshot removed?", metastate.ErrCorrupt, path, p)
		} else if p != nil {
			r, err = nil, fmt.Errorf("start metadata raft: %v", p) // a term it could not save
		}
	}()
	r, err = raft.NewRaft(conf, f, logs, stable, snaps, tr)
	if err != nil {
		return nil, fmt.Errorf("start metadata raft: %w", err)
	}
	return r, nil
}

// checkSnapshots returns ErrCorrupt, naming it, for a snapshot in
// Dir/snapshots that raft would skip or fail on: its meta.json missing,
// unreadable or another's, or its state.bin failing its checksum. Raft
// skips the first kind without a word and replays the log from before it,
// which compaction removed, and reports the second naming nothing.
// Temporary snapshots, left by a crash while writing one, are raft's to
// ignore.
func checkSnapshots(dir string, snaps *raft.FileSnapshotStore) error {
	root := filepath.Join(dir, "snapshots")
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("metadata snapshots: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		path := filepath.Join(root, e.Name())
		b, err := os.ReadFile(filepath.Join(path, "meta.json"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("metadata snapshot: %w", err)
		}
		var meta struct{ ID string }
		if err == nil {
			err = json.Unmarshal(b, &meta)
		}
		if err == nil && meta.ID != e.Name() {
			err = fmt.Errorf("its meta.json names %q", meta.ID)
		}
		if err == nil {
			var rc io.ReadCloser
			if _, rc, err = snaps.Open(e.Name()); err == nil {
				rc.Close()
			}
			if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
				return fmt.Errorf("metadata snapshot: %w", err) // I/O, not damage
			}
		}
		if err != nil {
			return fmt.Errorf("%w: metadata snapshot %s: %v", metastate.ErrCorrupt, path, err)
		}
	}
	return nil
}

// Stop tells the member's raft to shut down, without waiting for it: its
// proposals fail from then on. A node that closes stops it before it
// closes the raft streams' sessions, so that nothing of raft's waits on a
// stalled link meanwhile; Close waits for it.
func (m *Meta) Stop() raft.Future {
	m.stopOnce.Do(func() { m.down = m.raft.Shutdown() })
	return m.down
}

// Close stops the session and cache loops and raft, waits for them, saves
// the state cache a last time and closes the log.
// It is idempotent and safe to call concurrently; afterwards Propose,
// AddNode and Heartbeat return ErrClosed, and State returns the last state.
func (m *Meta) Close() error {
	m.closeOnce.Do(func() {
		m.lifeMu.Lock()
		m.closed = true
		m.lifeMu.Unlock()
		m.cancel()
		err := transport.ShutdownRaft(m.Stop(), m.trans)
		m.wg.Wait()
		m.awaitWaiters()
		m.saveCache() // what raft applied last
		if e := m.store.Close(); err == nil && e != nil {
			err = fmt.Errorf("close metadata log: %w", e)
		}
		if err == nil && m.failed.Load() {
			err = errMetaFailed
		}
		m.closeErr = err
	})
	return m.closeErr
}

// awaitWaiters waits, once raft has shut down, for the goroutines waiting
// for its futures, at most waitersGrace. Shutdown fails the pending
// futures, but hashicorp/raft v1.7.3 drops those of committed entries still
// queued for its FSM (runFSM returns without answering them, and an
// ApplyFuture has no shutdown channel): their waiters would wait for ever,
// and with them Close. Such a waiter, given up here, holds only its
// goroutine; its proposer's ctx has ended, with ErrUnknownOutcome.
func (m *Meta) awaitWaiters() {
	deadline := time.Now().Add(waitersGrace)
	for m.waiters.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := m.waiters.Load(); n > 0 {
		m.log.Warn("raft left proposals unanswered at its shutdown; their waiting goroutines are given up", "count", n)
	}
}

// waitersGrace bounds Close's wait for the waiters of raft futures.
const waitersGrace = time.Second

// enter registers one more goroutine with wg, or reports false once Close
// has begun.
func (m *Meta) enter() bool {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	return true
}

// goFunc runs fn in a goroutine that Close waits for, and reports false,
// running nothing, once Close has begun. It starts the loops; wait, whose
// raft call must not start once Close has begun, registers its waiter with
// enter before that call.
func (m *Meta) goFunc(fn func()) bool {
	if !m.enter() {
		return false
	}
	go func() {
		defer m.wg.Done()
		fn()
	}()
	return true
}

func (m *Meta) isClosed() bool {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	return m.closed
}

// State returns the current state, immutable; State().Changed() is closed
// when a newer one is published.
func (m *Meta) State() *metastate.State { return m.fsm.state() }

// Watch returns a channel closed on the next applied change; then call
// Watch or State again. To read a state and wait for the next one without
// a gap, use State().Changed().
func (m *Meta) Watch() <-chan struct{} { return m.fsm.state().Changed() }

// Leader returns the metadata leader's node id and address, empty if none is
// known.
func (m *Meta) Leader() (id, addr string) {
	a, i := m.raft.LeaderWithID()
	return string(i), string(a)
}

// IsLeader reports whether this node is the metadata leader.
func (m *Meta) IsLeader() bool { return m.raft.State() == raft.Leader }

func (m *Meta) notLeader() error {
	id, addr := m.Leader()
	return &NotLeaderError{LeaderID: id, LeaderAddr: addr}
}

// Propose applies c through the group and returns its Result or the error
// Apply returned (ErrTopicExists, ErrNoTopic, …). It blocks until c is
// applied on this node, ctx ends or Meta closes. Other errors:
// *NotLeaderError (ErrNotLeader) off the leader, with nothing applied;
// ErrUnknownOutcome when leadership was lost while committing or ctx ended
// after c was handed to raft; ErrClosed.
func (m *Meta) Propose(ctx context.Context, c metastate.Command) (metastate.Result, error) {
	b, err := metastate.EncodeCommand(c)
	if err != nil {
		return metastate.Result{}, err
	}
	if m.isClosed() {
		return metastate.Result{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return metastate.Result{}, err
	}
	if m.raft.State() != raft.Leader {
		return metastate.Result{}, m.notLeader()
	}
	var f raft.ApplyFuture
	err = m.wait(ctx, func() raft.Future {
		f = m.raft.Apply(b, enqueueTimeout(ctx))
		return f
	})
	if err != nil {
		return metastate.Result{}, err
	}
	resp, ok := f.Response().(applyResponse)
	if !ok {
		return metastate.Result{}, fmt.Errorf("%w: response %T", ErrUnknownOutcome, f.Response())
	}
	return resp.res, resp.err
}

// enqueueTimeout is how long raft may take to accept an entry: ctx's
// deadline, or no limit.
func enqueueTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return 0
}

// wait starts start's raft call and waits for its future, which a goroutine
// of m's watches so that ctx can end the wait; Close ends it by shutting
// raft down.
func (m *Meta) wait(ctx context.Context, start func() raft.Future) error {
	m.lifeMu.Lock()
	if m.closed {
		m.lifeMu.Unlock()
		return ErrClosed
	}
	m.waiters.Add(1)
	m.lifeMu.Unlock()
	f := start()
	done := make(chan error, 1)
	go func() {
		defer m.waiters.Add(-1)
		done <- f.Error()
	}()
	select {
	case err := <-done:
		return m.raftErr(err)
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
	}
}

// raftErr translates an error of a raft future. Unknown errors are unknown
// outcomes: an entry raft accepted may have been committed.
func (m *Meta) raftErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w (%v)", m.notLeader(), err)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("cluster: not proposed: %w (%v)", context.DeadlineExceeded, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w (%v)", ErrUnknownOutcome, ErrClosed, err)
	default:
		return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
	}
}

// AddNode registers a node on the leader: RegisterNode records it, up and
// with a new session if it was down or comes back as another incarnation
// (metastate.RegisterNode), then it joins the raft configuration as a
// voter while the group has fewer than MaxVoters, else as a nonvoter: the
// change is started, not waited for.
// Calling it again for a known node is how a node comes back up. It blocks
// like Propose and returns its errors.
func (m *Meta) AddNode(ctx context.Context, reg metastate.RegisterNode) error {
	id, addr := reg.ID, reg.Addr
	if err := metastate.CheckNodeID(id); err != nil {
		return err
	}
	if m.isClosed() {
		return ErrClosed
	}
	if m.raft.State() != raft.Leader {
		return m.notLeader()
	}
	found, err := m.server(id)
	if err != nil {
		return err
	}
	if found != nil && found.Suffrage == raft.Voter && m.otherIncarnation(reg) {
		// A voter back with another data directory: its log lacks what
		// it acknowledged. It leaves the voters before the group records
		// its new incarnation, which lets it vote again (metavote.go),
		// and joins again below as a new server.
		if err := m.removeVoter(ctx, id); err != nil {
			return err
		}
		found = nil
	}
	// Suffrage is chosen under m.members, a new voter's place reserved
	// (pending) before the lock is let go: no raft wait is made under it.
	m.members.Lock()
	cf := m.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		m.members.Unlock()
		return m.raftErr(err)
	}
	voter := m.votersLocked(cf.Configuration()) < MaxVoters
	if found != nil {
		voter = found.Suffrage == raft.Voter
	} else if voter {
		m.addPendingLocked(ctx, raft.ServerID(id))
	}
	m.members.Unlock()
	// The address first: the leader's raft dials the node by id as soon
	// as it is in the configuration, through the address book.
	reg.Voter = voter
	res, err := m.Propose(ctx, reg)
	if err != nil {
		if found == nil && voter {
			m.dropPending(raft.ServerID(id))
		}
		return fmt.Errorf("register %s: %w", id, err)
	}
	// A registration is a sign of life: a process restarted within its
	// session keeps the session, whose last heartbeat came from the one
	// before and would otherwise expire under the new one.
	m.heard(id, res.Session)
	raddr := raft.ServerAddress(addr)
	if m.raftAddr != nil {
		raddr = m.raftAddr(id, addr)
	}
	if found == nil || found.Address != raddr {
		// Not waited for: the change may need the node's own
		// acknowledgement to commit, which its replica gives only once
		// the join's reply named this leader (Agent.metaMayFollow). One
		// that is lost is made again (reconcileMembers).
		if voter {
			m.raft.AddVoter(raft.ServerID(id), raddr, 0, enqueueTimeout(ctx))
		} else {
			m.raft.AddNonvoter(raft.ServerID(id), raddr, 0, enqueueTimeout(ctx))
		}
	}
	return nil
}

// pendingVoter is a voter AddNode added that raft's configuration may not
// show yet: added in term, its request taken by raft until, at the latest.
type pendingVoter struct {
	term  uint64
	until time.Time
}

// addPendingLocked reserves a voter's place for id, whose request raft
// takes within ctx's deadline, or a minute without one. m.members is
// held.
func (m *Meta) addPendingLocked(ctx context.Context, id raft.ServerID) {
	until := time.Now().Add(time.Minute)
	if d, ok := ctx.Deadline(); ok {
		until = d
	}
	if m.pending == nil {
		m.pending = map[raft.ServerID]pendingVoter{}
	}
	m.pending[id] = pendingVoter{term: m.raft.CurrentTerm(), until: until.Add(time.Second)}
}

// dropPending takes back the place addPendingLocked reserved for id.
func (m *Meta) dropPending(id raft.ServerID) {
	m.members.Lock()
	defer m.members.Unlock()
	delete(m.pending, id)
}

// server returns node id's server in raft's latest configuration, nil
// when it is none.
func (m *Meta) server(id string) (*raft.Server, error) {
	cf := m.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, m.raftErr(err)
	}
	for _, srv := range cf.Configuration().Servers {
		if string(srv.ID) == id {
			return &srv, nil
		}
	}
	return nil, nil
}

// votersLocked returns the voters of cf, raft's latest configuration,
// and those added or promoted this term that it does not show as voters
// yet (pending).
// m.members is held.
func (m *Meta) votersLocked(cf raft.Configuration) int {
	n, in := 0, map[raft.ServerID]bool{} // in: the voters
	for _, srv := range cf.Servers {
		if srv.Suffrage == raft.Voter {
			in[srv.ID] = true
			n++
		}
	}
	term := m.raft.CurrentTerm()
	for id, p := range m.pending {
		if in[id] || p.term != term || time.Now().After(p.until) {
			delete(m.pending, id)
			continue
		}
		n++
	}
	return n
}

// otherIncarnation reports whether reg registers its node with another
// incarnation than the state records for it.
func (m *Meta) otherIncarnation(reg metastate.RegisterNode) bool {
	nd, ok := m.State().Node(reg.ID)
	return ok && reg.Incarnation != "" && nd.Incarnation != reg.Incarnation
}

// removeVoter removes node id, a voter back with another incarnation, from
// the group's configuration. It refuses while fewer than a majority of the
// other voters are up, which the removal needs to commit: the node
// registers again later.
func (m *Meta) removeVoter(ctx context.Context, id string) error {
	cf := m.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return m.raftErr(err)
	}
	st := m.State()
	rest, up := 0, 0
	for _, srv := range cf.Configuration().Servers {
		if srv.Suffrage != raft.Voter || string(srv.ID) == id {
			continue
		}
		rest++
		if nd, ok := st.Node(string(srv.ID)); string(srv.ID) == m.id || ok && nd.Up {
			up++
		}
	}
	if up <= rest/2 {
		return fmt.Errorf("cluster: %s came back with another data directory, and %d of the other %d metadata voters are up: it rejoins once a majority is", id, up, rest)
	}
	m.log.Warn("metadata voter came back with another data directory: it leaves the voters and joins again as a new server", "node", id)
	err := m.wait(ctx, func() raft.Future {
		return m.raft.RemoveServer(raft.ServerID(id), 0, enqueueTimeout(ctx))
	})
	if err != nil {
		return fmt.Errorf("remove %s, back with another data directory, from the metadata voters: %w", id, err)
	}
	return nil
}

// Heartbeat records, on the leader, that node id is alive. It returns
// ErrNotLeader off the leader, ErrNoNode for a node never registered and
// ErrNodeDown for a node marked down: it registers again with AddNode.
// Heartbeats are leader memory, not log entries.
func (m *Meta) Heartbeat(id string) error {
	if m.isClosed() {
		return ErrClosed
	}
	if m.raft.State() != raft.Leader {
		return m.notLeader()
	}
	term := m.raft.CurrentTerm()
	nd, ok := m.State().Node(id)
	switch {
	case !ok:
		return fmt.Errorf("%w: %q", metastate.ErrNoNode, id)
	case !nd.Up:
		return fmt.Errorf("%w: %s", metastate.ErrNodeDown, id)
	}
	m.heardIn(term, id, nd.Session)
	return nil
}

// heard records that node id was heard from now, in its session.
func (m *Meta) heard(id string, sess uint64) {
	m.heardIn(m.raft.CurrentTerm(), id, sess)
}

func (m *Meta) heardIn(term uint64, id string, sess uint64) {
	m.sessMu.Lock()
	defer m.sessMu.Unlock()
	m.resetSessions(term)
	m.sessions[id] = session{last: time.Now(), session: sess}
}

// resetSessions starts every session afresh when term is a new leadership:
// a new leader gives every node a full timeout. sessMu is held.
func (m *Meta) resetSessions(term uint64) {
	if m.sessTerm != term {
		m.sessTerm = term
		clear(m.sessions)
	}
}

// sessionLoop runs checkSessions on a ticker, and at once when this node
// becomes leader, until Close.
func (m *Meta) sessionLoop() {
	t := time.NewTicker(min(max(m.timeout/10, 5*time.Millisecond), 200*time.Millisecond))
	defer t.Stop()
	leaderCh := m.raft.LeaderCh()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		case <-leaderCh:
		}
		m.checkVote()
		m.checkSessions(time.Now())
	}
}

// checkSessions, on the leader, registers this node if the state does not
// have it up at its address, proposes NodeDown for every other up node
// not heard from within the session timeout, and then the failover of the
// DoubleWrite pairs on down nodes. Failed proposals are retried on the
// next tick.
func (m *Meta) checkSessions(now time.Time) {
	if m.raft.State() != raft.Leader {
		return
	}
	term := m.raft.CurrentTerm()
	s := m.State()
	var expired []metastate.NodeDown
	m.sessMu.Lock()
	m.resetSessions(term)
	for _, nd := range s.Nodes() {
		if nd.ID == m.id || !nd.Up {
			delete(m.sessions, nd.ID)
			continue
		}
		se, ok := m.sessions[nd.ID]
		if !ok || se.session != nd.Session {
			m.sessions[nd.ID] = session{last: now, session: nd.Session}
			continue
		}
		if now.Sub(se.last) > m.timeout {
			expired = append(expired, metastate.NodeDown{ID: nd.ID, Session: nd.Session})
		}
	}
	m.sessMu.Unlock()

	ctx, cancel := context.WithTimeout(m.ctx, m.timeout)
	defer cancel()
	if self, ok := s.Node(m.id); !ok || !self.Up || self.Addr != m.addr || !self.Voter || m.inc != "" && self.Incarnation != m.inc || s.ClusterID() == "" {
		// A cluster of an older release has no id: its leader gives it
		// one, which every node then records.
		cluster := cmp.Or(s.ClusterID(), m.cluster)
		if cluster == "" {
			cluster = uuid.NewString()
		}
		if _, err := m.Propose(ctx, metastate.RegisterNode{ID: m.id, Addr: m.addr, Voter: true, Incarnation: m.inc, Cluster: cluster}); err != nil {
			m.log.Warn("metadata leader cannot register itself", "node", m.id, "err", err)
		}
	}
	for _, c := range expired {
		m.log.Info("node session expired", "node", c.ID, "session", c.Session)
		if _, err := m.Propose(ctx, c); err != nil && !errors.Is(err, metastate.ErrStaleSession) {
			m.log.Warn("cannot mark node down", "node", c.ID, "err", err)
		}
	}
	m.failover(ctx)
	m.drain(ctx)
	m.reconcileMembers(ctx)
}

// isMember reports whether node id is a server of the group's latest raft
// configuration, which raft keeps without waiting for its main loop, or a
// node of the metadata state.
func (m *Meta) isMember(id string) bool {
	if _, ok := m.State().Node(id); ok {
		return true
	}
	return transport.InConfiguration(m.raft, id)
}
