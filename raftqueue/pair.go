package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// PairConfig configures one replica of a DoubleWrite pair.
type PairConfig struct {
	// Dir holds the replica, and OpenPair creates it if missing: its
	// partition files, named as a Group's, and pair.db, raft-boltdb's file
	// of the epoch it serves, the partition count and, unless Log is set,
	// the log.
	Dir string
	// Log replaces pair.db as the pair's log: the seam for the node's
	// shared write-ahead log. It must be durable when StoreLogs returns.
	Log raft.LogStore
	// Partitions is how many partitions the pair carries, 1 by default.
	Partitions int
	// MaxEntryBytes, MaxEntryCmds, InFlight and QueueDepth tune the
	// leader's proposer as Config's do; MaxBatch, MaxBatchBytes, MaxPending
	// and RetryAfter tune the leader's replication, as in
	// pairlog.LeaderConfig. Zero: the defaults.
	MaxEntryBytes, MaxEntryCmds, InFlight, QueueDepth int
	MaxBatch, MaxBatchBytes, MaxPending               int
	RetryAfter                                        time.Duration
	// CompactEvery is how many entries are applied between two compactions
	// of the log, 1024 by default, never if negative. KeepEntries is how
	// many applied entries each keeps, 256 by default, so that a follower a
	// little behind needs no snapshot. The leader keeps what its follower
	// lacks.
	CompactEvery, KeepEntries int
}

// Pair is one replica of a DoubleWrite partition: the same state machine as
// a Group's, over a pairlog log that a leader writes to its own copy and
// its follower's at once, and whose leader the metadata group assigns
// rather than an election. The node makes it Lead or Follow an epoch as the
// partition's record says. As the follower it takes the leader's batches
// with Append, which a Pair's leader calls through a pairlog.Peer, and
// applies what both copies hold.
//
// Apply and ApplyTo have Group's outcomes: the command's result once both
// copies hold its entry and it is applied here; ErrNotLeader, with nothing
// proposed, on a replica that does not lead, or no longer may because a
// follower serving a newer epoch deposed it; ErrUnknownOutcome for an
// entry proposed whose fate is not known, the leader deposed or closed
// while committing.
//
// Goroutines: the proposer's two, the follower's applier, and the
// pairlog.Leader's three while it leads, all stopped by Close.
type Pair struct {
	cfg    PairConfig
	fsm    *fsm
	stable *raftboltdb.BoltStore
	log    *pairlog.Log
	prop   *proposer

	roleMu sync.Mutex                     // serializes Lead, Follow and Close
	lead   atomic.Pointer[pairlog.Leader] // while this replica leads
	leadAt atomic.Pointer[time.Time]      // when lead was last set, by this process's clock
	closed bool                           // guarded by roleMu

	// appendMu serializes the follower's Appends and orders them with Lead
	// and Follow.
	appendMu sync.Mutex
	// applyMu serializes the state machine's applies: the leader's, in its
	// Apply, and the follower's applier. Lock order: roleMu, appendMu,
	// applyMu.
	applyMu sync.Mutex
	applied uint64 // guarded by applyMu: the log is applied up to here
	// The follower's applier, woken by Append, stopped by Close.
	applyWake                chan struct{}
	applierStop, applierDone chan struct{}
	readyAt                  uint64        // guarded by applyMu: the log's end when this replica took the lead
	closing                  bool          // guarded by applyMu: Close began
	changed                  chan struct{} // guarded by applyMu: closed when applied, the role or closed change
	// The compactor, woken when CompactEvery entries were applied since the
	// last compaction, stopped by Close.
	compactWake              chan struct{}
	compactStop, compactDone chan struct{}
	compactedAt              uint64 // guarded by applyMu: applied at the last compaction
	compactions, installs    atomic.Int64
	// The snapshot the follower is receiving by Install, guarded by appendMu.
	inst   *os.File
	instAt pairlog.Install // the pieces' epoch and index, and Offset: the size received
}

// OpenPair opens the replica in cfg.Dir, creating it if needed. It neither
// leads nor follows until told by Lead or Follow; its log is applied up to
// what its files hold.
func OpenPair(cfg PairConfig) (*Pair, error) {
	if cfg.Dir == "" {
		return nil, errors.New("raftqueue: PairConfig needs a Dir")
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 1
	}
	if cfg.CompactEvery == 0 {
		cfg.CompactEvery = 1024
	}
	if cfg.KeepEntries <= 0 {
		cfg.KeepEntries = 256
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	p := &Pair{cfg: cfg}
	ok := false
	defer func() {
		if !ok {
			p.closeFiles()
		}
	}()
	path := filepath.Join(cfg.Dir, "pair.db")
	if _, serr := os.Stat(path); serr == nil {
		if err := boltsafe.CheckView(path, &bolt.Options{Timeout: time.Second}, checkStable); err != nil {
			return nil, fmt.Errorf("raftqueue: %w: %s: %w", store.ErrCorrupt, path, err)
		}
	}
	var err error
	p.stable, err = raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bolt.Options{Timeout: time.Second}})
	if err != nil {
		return nil, fmt.Errorf("raftqueue: open pair.db: %w", err)
	}
	if err := checkPartitions(p.stable, cfg.Partitions); err != nil {
		return nil, err
	}
	paths := []string{filepath.Join(cfg.Dir, "partition.db")}
	for i := 1; i < cfg.Partitions; i++ {
		paths = append(paths, filepath.Join(cfg.Dir, "partition-"+strconv.Itoa(i)+".db"))
	}
	if p.fsm, err = openFSM(paths); err != nil {
		return nil, fmt.Errorf("raftqueue: %w", err)
	}
	// The files hold the log up to the lowest of their positions. When the
	// rest is applied again, each file skips what it holds.
	p.applied = p.fsm.applied[0].Index
	for _, at := range p.fsm.applied {
		p.applied = min(p.applied, at.Index)
	}
	var logs raft.LogStore = p.stable
	if cfg.Log != nil {
		logs = cfg.Log
	}
	if p.log, err = pairlog.OpenLog(logs, p.stable, p.applied); err != nil {
		return nil, fmt.Errorf("raftqueue: %w", err)
	}
	// The files hold every effect up to where the log was compacted or
	// restored.
	p.applied = max(p.applied, p.log.Synced())
	p.compactedAt = p.applied
	for _, pat := range []string{installFile, sendPattern} { // a run's leftovers
		old, _ := filepath.Glob(filepath.Join(cfg.Dir, pat))
		for _, f := range old {
			_ = os.Remove(f)
		}
	}
	p.changed = make(chan struct{})
	p.prop = newProposer(p, Config{Partitions: cfg.Partitions, MaxEntryBytes: cfg.MaxEntryBytes,
		MaxEntryCmds: cfg.MaxEntryCmds, InFlight: cfg.InFlight, QueueDepth: cfg.QueueDepth})
	p.applyWake, p.applierStop, p.applierDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	p.compactWake, p.compactStop, p.compactDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go p.applier()
	go p.compactor()
	ok = true
	return p, nil
}

// maxApply bounds the entries the follower's applier applies at once.
const maxApply = 256

// applier is the follower's applier: it applies what the leader said both
// copies hold, off the path of the appends, which are answered once in the
// log, until Close.
func (p *Pair) applier() {
	defer close(p.applierDone)
	for {
		select {
		case <-p.applyWake:
		case <-p.applierStop:
			return
		}
		for p.applyCommitted() {
		}
	}
}

// applyCommitted applies up to maxApply committed entries not applied yet,
// and reports whether more remain. It applies nothing while this replica
// leads, since its leader applies, or closes; a failure stays in the fsm,
// which refuses the appends after it.
func (p *Pair) applyCommitted() bool {
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	if p.lead.Load() != nil || p.closing {
		return false
	}
	commit := p.log.Commit()
	if commit <= p.applied {
		return false
	}
	to := min(commit, p.applied+maxApply)
	es, err := p.log.Entries(p.applied+1, to)
	if err != nil {
		p.fsm.fail(err)
		return false
	}
	p.fsm.ApplyBatch(es)
	p.appliedTo(to)
	return to < commit
}

// Epoch returns the epoch the replica serves, 0 before its first.
func (p *Pair) Epoch() uint64 { return p.log.Epoch() }

// LeaderSince returns when this replica last took the lead, by this
// process's monotonic clock; the zero time while it does not lead.
func (p *Pair) LeaderSince() time.Time {
	if t := p.leadAt.Load(); t != nil && p.leading() {
		return *t
	}
	return time.Time{}
}

// Leading reports whether the replica leads and may still ack: it was
// told to lead, and its follower has not refused its epoch for a newer one.
func (p *Pair) Leading() bool { return p.leading() }

// Lead makes the replica the leader of epoch, replicating to peer: each
// entry commits once both copies hold it, or on this replica's write alone
// when async. That is the risk stage, pairlog.LeaderConfig.Async, which
// SetSync switches. A nil peer leads alone: each entry commits on this
// replica's write, one copy. The epoch is persisted before it returns; a
// lower epoch than the one served is pairlog.ErrStaleEpoch. The entries of
// the log not yet applied, written under earlier epochs, are applied once
// peer holds them too, and LeaderPartition waits for them. Leading again
// replaces the replication, for a new follower: what the previous leader
// had in flight is answered ErrUnknownOutcome.
func (p *Pair) Lead(epoch uint64, peer pairlog.Peer, async bool) error {
	return p.LeadAfterLoss(epoch, peer, async, 0)
}

// LeadAfterLoss is Lead for a pair whose operator gave up, at epoch
// accepted (non-zero), the tail its lost copy alone held
// (metastate.Partition.Accepted): unless the log holds an entry written at
// that epoch or later, its first entry fences every consumer group of
// every partition (store.OpFence), and LeaderPartition waits for it. New
// sends take the offsets of the tail given up; a consumer's position taken
// from that tail must not skip them.
func (p *Pair) LeadAfterLoss(epoch uint64, peer pairlog.Peer, async bool, accepted uint64) error {
	return p.serve("lead", epoch, p.log.CheckLead, p.log.Lead, func() error { return p.startLeading(peer, async, accepted) })
}

// startLeading starts the leader of the epoch served, fencing first after
// a loss accepted at epoch accepted. roleMu and applyMu are held.
func (p *Pair) startLeading(peer pairlog.Peer, async bool, accepted uint64) error {
	last, lastEpoch, err := p.log.Last()
	if err != nil {
		return fmt.Errorf("raftqueue: lead: %w", err)
	}
	l, err := pairlog.NewLeader(pairlog.LeaderConfig{Log: p.log, Peer: peer, Apply: p.applyLeader, Applied: p.applied,
		Async: async, MaxBatch: p.cfg.MaxBatch, MaxBatchBytes: p.cfg.MaxBatchBytes, MaxPending: p.cfg.MaxPending,
		RetryAfter: p.cfg.RetryAfter, Snapshot: p.snapshot})
	if err != nil {
		return err
	}
	if accepted != 0 && lastEpoch < accepted {
		// Proposed before the leader is published: no entry of the epoch
		// comes before it.
		data := entryHeader(nil, p.prop.version, p.prop.nparts, p.prop.nparts)
		fence := store.Command{Op: store.OpFence, Now: time.Now().UnixNano(), Offset: accepted}
		for i := range p.prop.nparts {
			data = appendEntryCommand(data, p.prop.version, i, &fence)
		}
		f := l.Propose(data)
		if f.Index() == 0 {
			// Refused: the leader failed (Err), so it never leads. Kept
			// for stopLeading to close, which cannot be done here, with
			// applyMu held.
			p.lead.Store(l)
			return fmt.Errorf("raftqueue: lead: fence the groups: %w", f.Error())
		}
		last = f.Index()
	}
	p.readyAt = last
	now := time.Now()
	p.leadAt.Store(&now)
	p.lead.Store(l)
	p.wake()
	return nil
}

// Follow makes the replica the follower of epoch: it stops leading, and
// what its leader had in flight is answered ErrUnknownOutcome; it persists
// the epoch and from then on takes the appends of that epoch's leader only.
func (p *Pair) Follow(epoch uint64) error {
	return p.serve("follow", epoch, p.log.CheckEpoch, p.log.SetEpoch, func() error { return nil })
}

// serve checks that epoch may be served in role with check, whose refusal
// changes nothing, so that a late, stale call does not stop a live leader.
// Then it stops leading, persists epoch with set and runs then, Lead's
// start, with the state machine's applies held.
func (p *Pair) serve(role string, epoch uint64, check, set func(uint64) error, then func() error) error {
	p.roleMu.Lock()
	defer p.roleMu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := check(epoch); err != nil {
		return fmt.Errorf("raftqueue: %s epoch %d: %w", role, epoch, err)
	}
	p.stopLeading()
	p.appendMu.Lock()
	defer p.appendMu.Unlock()
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	defer p.wake()
	err := set(epoch)
	if err == nil {
		err = then()
	}
	if err != nil {
		return fmt.Errorf("raftqueue: %s epoch %d: %w", role, epoch, err)
	}
	return nil
}

// wake wakes the LeaderPartition reads waiting for the leader to be ready
// to look again. applyMu is held.
func (p *Pair) wake() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// stopLeading closes the leader, if any. roleMu is held, not applyMu,
// which the leader's Apply takes.
func (p *Pair) stopLeading() {
	if l := p.lead.Swap(nil); l != nil {
		_ = l.Close()
	}
}

// applyLeader is the leader's Apply: the state machine applies the
// committed entries.
func (p *Pair) applyLeader(logs []*raft.Log) []any {
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	out := p.fsm.ApplyBatch(logs)
	p.appliedTo(logs[len(logs)-1].Index)
	return out
}

// appliedTo records that the log is applied up to i. applyMu is held.
func (p *Pair) appliedTo(i uint64) {
	p.applied = max(p.applied, i)
	if every := p.cfg.CompactEvery; every > 0 && p.applied >= p.compactedAt+uint64(every) {
		p.compactedAt = p.applied
		select {
		case p.compactWake <- struct{}{}:
		default:
		}
	}
	p.wake()
}

// compactor compacts the log each time it is woken, until Close. A
// failure is left for the next time: the log just stays longer.
func (p *Pair) compactor() {
	defer close(p.compactDone)
	for {
		select {
		case <-p.compactWake:
		case <-p.compactStop:
			return
		}
		if p.compact() == nil {
			p.compactions.Add(1)
		}
	}
}

// compact drops the log's entries up to KeepEntries before what this
// replica applied and, leading, what its follower holds: first the
// partition files are synced with every effect applied, then the log
// records that and drops them with pairlog.Log.Compact.
func (p *Pair) compact() error {
	p.applyMu.Lock()
	upTo := p.applied
	p.applyMu.Unlock()
	if l := p.lead.Load(); l != nil {
		upTo = min(upTo, l.Matched())
	}
	keep := uint64(p.cfg.KeepEntries)
	first, _, err := p.log.Bounds()
	if err != nil || upTo < first+keep {
		return err
	}
	if _, err := p.syncFiles(); err != nil {
		return err
	}
	return p.log.Compact(upTo - keep)
}

// syncFiles puts everything applied into the synced partition files and
// returns the lowest position they hold.
func (p *Pair) syncFiles() (uint64, error) {
	lowest := uint64(math.MaxUint64)
	for i := range p.cfg.Partitions {
		sp, err := p.fsm.partition(i)
		if err != nil {
			return 0, err
		}
		pos, err := sp.Sync()
		if err != nil {
			return 0, err
		}
		lowest = min(lowest, pos.Index)
	}
	return lowest, nil
}

// Compactions returns how many times the log was compacted, Installs how
// many snapshots of the leader's this replica restored.
func (p *Pair) Compactions() int64 { return p.compactions.Load() }
func (p *Pair) Installs() int64    { return p.installs.Load() }

// installFile is where a follower assembles a snapshot's pieces,
// sendPattern the leader's snapshots being sent. Open removes both.
const (
	installFile = "install.snap"
	sendPattern = "send-*.snap"
)

// snapshot is the leader's pairlog.LeaderConfig.Snapshot: this replica's
// state, written to a file in Dir that is removed when the reader closes,
// holding every effect up to what it had applied when it began.
func (p *Pair) snapshot() (uint64, io.ReadCloser, error) {
	p.applyMu.Lock()
	index := p.applied
	p.applyMu.Unlock()
	f, err := os.CreateTemp(p.cfg.Dir, sendPattern)
	if err != nil {
		return 0, nil, err
	}
	rc := &removeOnClose{f}
	if err := (&snapshot{f: p.fsm}).Persist(&fileSink{f}); err != nil {
		rc.Close()
		return 0, nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		rc.Close()
		return 0, nil, err
	}
	return index, rc, nil
}

// removeOnClose is a file removed when closed.
type removeOnClose struct{ *os.File }

func (r *removeOnClose) Close() error {
	err := r.File.Close()
	_ = os.Remove(r.File.Name())
	return err
}

// fileSink is a raft.SnapshotSink writing to a file that stays open.
type fileSink struct{ *os.File }

func (s *fileSink) ID() string    { return s.File.Name() }
func (s *fileSink) Cancel() error { return nil }
func (s *fileSink) Close() error  { return nil }

// Install takes a piece of the leader's snapshot: it is the follower's side
// of pairlog.Peer.Install. The pieces are assembled in Dir in order, and
// the last one restores the state machine from them and makes the log
// follow the snapshot's index; a partition whose file holds the snapshot's
// state or more is kept. The log is emptied first with pairlog.Log.Truncate,
// so a crash in between leaves a replica consistent with its files. An
// epoch other than the one served, or a replica that leads, is refused
// with a *pairlog.EpochError; a piece out of order is pairlog.ErrBadAppend,
// and the leader starts again.
func (p *Pair) Install(ctx context.Context, in pairlog.Install) error {
	p.appendMu.Lock()
	defer p.appendMu.Unlock()
	if e := p.log.Epoch(); p.lead.Load() != nil || in.Epoch != e || e == 0 {
		return &pairlog.EpochError{Epoch: e}
	}
	p.applyMu.Lock()
	closing := p.closing
	p.applyMu.Unlock()
	if closing {
		return ErrClosed
	}
	if in.Index == math.MaxUint64 {
		return fmt.Errorf("%w: a snapshot at %d", pairlog.ErrBadAppend, in.Index)
	}
	if in.Index < p.log.Synced() {
		return fmt.Errorf("%w: a snapshot at %d, the replica holds %d", pairlog.ErrBadAppend, in.Index, p.log.Synced())
	}
	path := filepath.Join(p.cfg.Dir, installFile)
	if in.Offset == 0 {
		p.dropInstall()
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		p.inst, p.instAt = f, pairlog.Install{Epoch: in.Epoch, Index: in.Index}
	}
	if p.inst == nil || in.Offset != p.instAt.Offset || in.Index != p.instAt.Index || in.Epoch != p.instAt.Epoch {
		p.dropInstall()
		return fmt.Errorf("%w: a snapshot piece at %d, expected %d", pairlog.ErrBadAppend, in.Offset, p.instAt.Offset)
	}
	if _, err := p.inst.Write(in.Data); err != nil {
		p.dropInstall()
		return err
	}
	p.instAt.Offset += uint64(len(in.Data))
	if !in.Done {
		return nil
	}
	defer p.dropInstall()
	if _, err := p.inst.Seek(0, io.SeekStart); err != nil {
		return err
	}
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	if p.closing {
		return ErrClosed
	}
	defer p.wake()
	// The snapshot is read first, its partitions restored beside their
	// files: a damaged or hostile one changes nothing, the log included.
	if err := p.fsm.restore(p.inst, func() error { return p.log.Truncate(p.applied) }); err != nil {
		return err
	}
	// Restored records the state durable: every file must hold it, those
	// the snapshot left as they were as well, since their position was
	// this replica's in memory, perhaps not yet in the file. The state may
	// hold effects past in.Index, as the leader went on applying while it
	// wrote it: the log follows the lowest position the files hold, as a
	// restart would find it.
	lowest, err := p.syncFiles()
	if err != nil {
		return err
	}
	index := max(lowest, in.Index)
	if err := p.log.Restored(index); err != nil {
		return err
	}
	p.applied, p.compactedAt = index, index
	p.installs.Add(1)
	return nil
}

// dropInstall closes and removes the snapshot being received. appendMu is
// held.
func (p *Pair) dropInstall() {
	if p.inst != nil {
		_ = p.inst.Close()
		_ = os.Remove(p.inst.Name())
		p.inst = nil
	}
	p.instAt = pairlog.Install{}
}

// Append takes a batch of the leader's, durably in the log before it
// returns: it is the follower's side, what a pairlog.Peer delivers. The
// applier then applies what the batch says both copies hold. It returns the
// index up to which the log matches the leader's, or pairlog.Log.Append's
// refusals; a replica that leads refuses any append with a
// *pairlog.EpochError.
func (p *Pair) Append(ctx context.Context, a pairlog.Append) (uint64, error) {
	p.appendMu.Lock()
	defer p.appendMu.Unlock()
	if p.lead.Load() != nil {
		return 0, &pairlog.EpochError{Epoch: p.log.Epoch()}
	}
	if _, err := p.fsm.partition(0); err != nil {
		return 0, err // closed, or failed: take nothing more
	}
	end, err := p.log.Append(a)
	if err != nil {
		return 0, err
	}
	select {
	case p.applyWake <- struct{}{}:
	default:
	}
	return end, nil
}

// Apply proposes cmd to partition 0, as Group.Apply does.
func (p *Pair) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	return p.prop.apply(ctx, 0, cmd)
}

// ApplyTo is Apply for the pair's partition part.
func (p *Pair) ApplyTo(ctx context.Context, part int, cmd *store.Command) (store.Result, error) {
	if part < 0 || part >= len(p.fsm.paths) {
		return store.Result{}, fmt.Errorf("%w: partition %d of a pair of %d", store.ErrBadCommand, part, len(p.fsm.paths))
	}
	return p.prop.apply(ctx, part, cmd)
}

// Partition returns the replica's partition i as it applied it: a
// follower's may lag the leader's.
func (p *Pair) Partition(i int) (*store.Partition, error) {
	if i < 0 || i >= len(p.fsm.paths) {
		return nil, fmt.Errorf("%w: partition %d of a pair of %d", store.ErrBadCommand, i, len(p.fsm.paths))
	}
	part, err := p.fsm.partition(i)
	if errors.Is(err, store.ErrClosed) {
		return nil, ErrClosed
	}
	return part, err
}

// LeaderPartition returns partition i for reads at the leader, and
// ErrNotLeader unless this replica leads; it may not know yet that it was
// deposed, which Verify checks. A new leader first waits until it has
// applied the entries its predecessors wrote, or ctx ends. What it holds
// was committed.
func (p *Pair) LeaderPartition(ctx context.Context, i int) (*store.Partition, error) {
	for {
		if !p.leading() {
			return nil, p.notLeader()
		}
		p.applyMu.Lock()
		ready, changed, closed := p.applied >= p.readyAt, p.changed, p.closing
		p.applyMu.Unlock()
		switch {
		case closed:
			return nil, ErrClosed
		case ready:
			return p.Partition(i)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Verify confirms that this replica still leads: its follower still
// serves its epoch, so no newer leader can have acked anything. It costs a
// round trip, as raft's VerifyLeader does. A read at LeaderPartition after
// Verify returned nil sees every ack given before Verify began. A leader
// alone or in the risk stage has no one to ask: nil while it leads.
func (p *Pair) Verify(ctx context.Context) error {
	l := p.lead.Load()
	if l == nil {
		return p.notLeader()
	}
	if err := l.Verify(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w (%w)", p.notLeader(), err)
	}
	return nil
}

// SetSync switches the leader between committing on both copies and on
// its own write (see Lead); a no-op when it does not lead.
func (p *Pair) SetSync(sync bool) {
	if l := p.lead.Load(); l != nil {
		l.SetSync(sync)
	}
}

// InSync reports whether this replica leads and its follower holds every
// entry that may have been acked, every later one needing it too, as
// pairlog.Leader.InSync says: the follower may be recorded in sync.
func (p *Pair) InSync() bool {
	l := p.lead.Load()
	return l != nil && l.InSync()
}

// ConfirmFollower has the follower answer an append now and returns nil
// once it did, holding everything that may have been acked
// (pairlog.Leader.Confirm); an error when this replica does not lead.
func (p *Pair) ConfirmFollower(ctx context.Context) error {
	l := p.lead.Load()
	if l == nil {
		return p.notLeader()
	}
	return l.Confirm(ctx)
}

// FollowerLost reports whether this replica leads and its follower
// answered that its log no longer holds what it had matched (an empty or
// replaced disk), and has not caught up since (pairlog.Leader.Lost): it
// must not be recorded in sync.
func (p *Pair) FollowerLost() bool {
	l := p.lead.Load()
	return l != nil && l.Lost()
}

// Matched returns the index up to which the follower's log is known to
// match the leader's, 0 when this replica does not lead.
func (p *Pair) Matched() uint64 {
	if l := p.lead.Load(); l != nil {
		return l.Matched()
	}
	return 0
}

// Lag returns how many entries the leader's log holds past what its
// follower's is known to match, 0 when it does not lead.
func (p *Pair) Lag() uint64 {
	if l := p.lead.Load(); l != nil {
		return l.Lag()
	}
	return 0
}

// Failed returns why this replica can no longer serve, nil while it can:
// its state machine failed on a file it could not write, or, leading, its
// own log failed a write. A leader deposed by a newer epoch, or closed, has
// not failed; nor has one whose follower's log contradicts what both held,
// with pairlog.ErrCommitted or ErrBadAppend: which copy is at fault is not
// known, and the follower must not be handed the pair.
func (p *Pair) Failed() error {
	if _, err := p.fsm.partition(0); err != nil {
		return err
	}
	if l := p.lead.Load(); l != nil {
		err := l.Err()
		for _, not := range []error{pairlog.ErrDeposed, pairlog.ErrClosed, pairlog.ErrCommitted, pairlog.ErrBadAppend} {
			if errors.Is(err, not) {
				return nil
			}
		}
		return err
	}
	return nil
}

func (p *Pair) leading() bool {
	l := p.lead.Load()
	return l != nil && l.Err() == nil
}

func (p *Pair) notLeader() error { return &NotLeaderError{} }

// propose hands data to the leader; a replica that no longer leads
// proposes nothing and answers ErrNotLeader.
func (p *Pair) propose(data []byte) raft.ApplyFuture {
	l := p.lead.Load()
	if l == nil || l.Err() != nil {
		return failedFuture{p.notLeader()}
	}
	return l.Propose(data)
}

// failedFuture is a proposal refused before it was made.
type failedFuture struct{ err error }

func (f failedFuture) Error() error  { return f.err }
func (f failedFuture) Index() uint64 { return 0 }
func (f failedFuture) Response() any { return nil }

// Close stops leading, answering what was not applied with ErrClosed or
// ErrUnknownOutcome, stops the proposer and closes the files. It is
// idempotent.
func (p *Pair) Close() error {
	p.roleMu.Lock()
	defer p.roleMu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.stopLeading()
	p.prop.close()
	close(p.applierStop)
	<-p.applierDone
	close(p.compactStop)
	<-p.compactDone
	p.appendMu.Lock()
	defer p.appendMu.Unlock()
	p.dropInstall()
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	p.closing = true
	p.wake()
	return p.closeFiles()
}

func (p *Pair) closeFiles() error { return closeFiles(p.fsm, p.stable) }

var _ io.Closer = (*Pair)(nil)
var _ pairlog.Peer = (*Pair)(nil)
