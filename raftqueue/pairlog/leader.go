package pairlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

var (
	// ErrDeposed answers the entries in flight once the follower refused
	// the leader's epoch for a newer one: this leader can never ack again.
	// Their outcome is unknown, since the follower may hold them.
	ErrDeposed = errors.New("pairlog: deposed: the follower serves a newer epoch")

	// ErrClosed answers what a closed Leader had not applied; an entry
	// already written may still be in the log.
	ErrClosed = errors.New("pairlog: leader closed")
)

// Peer is the leader's way to its follower: Append delivers a batch to the
// follower's Log.Append and returns its result; Install delivers a piece
// of a snapshot, which the follower assembles and, at the last piece,
// restores, as raftqueue.Pair.Install does.
type Peer interface {
	Append(ctx context.Context, a Append) (uint64, error)
	Install(ctx context.Context, in Install) error
}

// Install is one piece of a snapshot that the leader of Epoch sends a
// follower needing entries its log no longer holds: the state machine's
// state, holding every entry's effects up to Index, in pieces sent in
// order from Offset 0, Done on the last. The follower's log then follows
// Index.
type Install struct {
	Epoch, Index, Offset uint64
	Data                 []byte
	Done                 bool
}

// LeaderConfig configures a Leader.
type LeaderConfig struct {
	Log *Log // this replica's log, serving the leader's epoch
	// Peer is the follower. Nil: the leader alone, whose entries commit
	// on its own write, one copy, as in the risk stage.
	Peer Peer
	// Apply applies committed entries to the state machine, in log order,
	// one call at a time, and returns one response per entry. It must not
	// call the Leader's Close, which waits for it, nor Propose, which may
	// wait for room that only its return frees.
	Apply func(logs []*raft.Log) []any
	// Applied is the index up to which the state machine has applied the
	// log. Entries after it, written under earlier epochs, are applied
	// once the follower holds them too.
	Applied uint64
	// MaxBatch bounds the entries of one Append, 256 by default and at
	// most MaxAppendEntries, and MaxBatchBytes their data, without a bound
	// if 0; an entry larger goes alone.
	MaxBatch, MaxBatchBytes int
	// Async makes the leader commit each entry on its own write while it
	// still sends every entry to Peer: the risk stage, for a follower that
	// is catching up while the metadata records the leader alone in sync.
	// SetSync switches.
	Async bool
	// MaxPending bounds the entries proposed and not yet applied, 1024 by
	// default: beyond it Propose waits for room.
	MaxPending int
	// RetryAfter is the wait after an Append that failed, 20 ms by default.
	RetryAfter time.Duration
	// CheckEvery is how long the leader lets the follower go without an
	// Append while there is nothing to send, 500 ms by default: an empty
	// one then checks that its log still holds what it matched (Lost).
	CheckEvery time.Duration
	// Snapshot returns the state machine's state, holding every effect up
	// to the index it returns, for a follower that needs entries the log
	// no longer holds. It is sent with Peer.Install in pieces of
	// MaxBatchBytes, at most 1 MiB. Nil: such a follower fails the leader
	// with ErrCompacted.
	Snapshot func() (uint64, io.ReadCloser, error)
}

// Leader is the writing side of a pair: it writes each proposed entry to
// its own log and, at the same time, sends it to the follower; an entry
// commits once both hold it durably, and is then applied and answered.
// Safe for concurrent use.
type Leader struct {
	cfg    LeaderConfig
	epoch  uint64
	own    uint64 // the index of the first entry proposed here
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	room   chan struct{} // a token per pending entry

	mu        sync.Mutex
	queue     []*entry // proposed here and not yet applied, by index
	next      uint64   // the index of the next proposal
	written   uint64   // this replica's log holds up to here
	matched   uint64   // the follower's log matches up to here
	sendAfter uint64   // the next Append follows this index
	reset     bool     // no Append taken yet: the next one is a Reset
	told      uint64   // the commit index the follower last heard
	applied   uint64
	async     bool   // commit on this replica's write alone
	acked     uint64 // what may have been acked without the follower: up to here, own-1 at start
	failed    error
	wakeWrite chan struct{}
	wakeSend  chan struct{}
	wakeApply chan struct{}
	// installed is the index of the last snapshot the follower restored:
	// its log holds no entry there, so send checks no epoch at it.
	installed uint64
	// lost is set when the follower answered that its log no longer holds
	// entries it matched (an empty or replaced disk), until it holds
	// again every entry that may have been acked.
	lost bool
	// check is set when the follower has gone CheckEvery without an
	// Append, or Confirm asks: the next one goes even if empty.
	check bool
	// rounds counts the Appends the follower took, each telling that its
	// log matches this one up to where it followed; roundsChanged is
	// closed at each.
	rounds        uint64
	roundsChanged chan struct{}
}

// entry is one proposed entry and its future.
type entry struct {
	log  raft.Log
	done chan struct{}
	resp any
	err  error
}

var _ raft.ApplyFuture = (*entry)(nil)

// Error waits for the entry's outcome: nil once applied.
func (e *entry) Error() error { <-e.done; return e.err }

// Index is the entry's index in the log.
func (e *entry) Index() uint64 { return e.log.Index }

// Response is the state machine's response, after Error returned nil.
func (e *entry) Response() any { return e.resp }

// MaxAppendEntries is the most entries one Append carries: a follower's
// node refuses a request with more before it decodes them.
const MaxAppendEntries = 1024

// NewLeader starts the leader of cfg.Log's epoch.
func NewLeader(cfg LeaderConfig) (*Leader, error) {
	if cfg.Log == nil || cfg.Apply == nil {
		return nil, errors.New("pairlog: a leader needs a Log and an Apply")
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
	}
	cfg.MaxBatch = min(cfg.MaxBatch, MaxAppendEntries)
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 1024
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 20 * time.Millisecond
	}
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = 500 * time.Millisecond
	}
	epoch := cfg.Log.Epoch()
	if epoch == 0 {
		return nil, fmt.Errorf("%w: a leader needs an epoch", ErrStaleEpoch)
	}
	last, _, err := cfg.Log.Last()
	if err != nil {
		return nil, err
	}
	if cfg.Applied > last {
		return nil, fmt.Errorf("pairlog: applied up to %d, the log ends at %d", cfg.Applied, last)
	}
	l := &Leader{
		cfg: cfg, epoch: epoch, own: last + 1,
		room: make(chan struct{}, cfg.MaxPending),
		next: last + 1, written: last, sendAfter: last, applied: cfg.Applied,
		wakeWrite: make(chan struct{}, 1), wakeSend: make(chan struct{}, 1), wakeApply: make(chan struct{}, 1),
		roundsChanged: make(chan struct{}),
	}
	if cfg.Peer == nil {
		l.matched = last
	}
	l.reset = cfg.Peer != nil
	l.async, l.acked = cfg.Async, last
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(3)
	go l.run(l.write)
	go l.run(l.send)
	go l.run(l.apply)
	return l, nil
}

// Propose appends data as the next entry and returns its future, answered
// with its response once the entry is applied, or with the leader's
// failure: ErrDeposed, ErrClosed or a write error, and the outcome is then
// unknown.
func (l *Leader) Propose(data []byte) raft.ApplyFuture {
	if l.ctx.Err() != nil {
		return failedEntry(l.stopped())
	}
	select {
	case l.room <- struct{}{}:
	case <-l.ctx.Done():
		return failedEntry(l.stopped())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil {
		<-l.room
		return failedEntry(l.failed)
	}
	e := &entry{log: raft.Log{Index: l.next, Term: l.epoch, Type: raft.LogCommand, Data: data}, done: make(chan struct{})}
	l.next++
	l.queue = append(l.queue, e)
	signal(l.wakeWrite)
	signal(l.wakeSend)
	return e
}

func failedEntry(err error) *entry {
	e := &entry{err: err, done: make(chan struct{})}
	close(e.done)
	return e
}

// Close stops the leader: what it has not applied is answered with
// ErrClosed.
func (l *Leader) Close() error {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failLocked(ErrClosed)
	return nil
}

// Alone reports whether the leader has no follower: its entries commit on
// its own write, as in the risk stage.
func (l *Leader) Alone() bool { return l.cfg.Peer == nil }

// Verify confirms that the follower still serves this leader's epoch, so
// that no newer leader can have acked anything yet: an empty append, which
// changes nothing on the follower. A refusal for a newer epoch deposes the
// leader with ErrDeposed; a follower not reached is its error. A leader
// without a Peer, or in the risk stage, has no one to ask: nil while it
// serves.
func (l *Leader) Verify(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	alone := l.cfg.Peer == nil || l.async
	l.mu.Unlock()
	if alone {
		return nil
	}
	_, err := l.cfg.Peer.Append(ctx, Append{Epoch: l.epoch})
	var ee *EpochError
	if errors.As(err, &ee) && ee.Epoch > l.epoch {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.failLocked(fmt.Errorf("%w (%d, this leader's %d)", ErrDeposed, ee.Epoch, l.epoch))
		return l.failed
	}
	if err != nil {
		return err
	}
	return l.Err()
}

// stopped returns why the leader stopped: its failure, or ErrClosed.
func (l *Leader) stopped() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil {
		return l.failed
	}
	return ErrClosed
}

// Err returns the leader's failure: ErrDeposed, a write error, ErrClosed;
// nil while it serves.
func (l *Leader) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// run runs step until it reports the leader stopped.
func (l *Leader) run(step func() bool) {
	defer l.wg.Done()
	for step() {
	}
}

// wait waits for a signal on ch, or returns false at the leader's end.
func (l *Leader) wait(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-l.ctx.Done():
		return false
	}
}

// commit is the index up to which the log is committed: both copies hold
// it, or this one in the risk stage. mu is held.
func (l *Leader) commit() uint64 {
	if l.async {
		return l.written
	}
	return min(l.written, l.matched)
}

// SetSync switches the leader between committing on both copies when sync
// and on its own write otherwise, the risk stage of LeaderConfig.Async.
// Switch to async only once the metadata records this leader alone in
// sync; record the follower in sync only once InSync reports it, after the
// switch back.
func (l *Leader) SetSync(sync bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sync == !l.async {
		return
	}
	if !sync {
		l.async = true
		signal(l.wakeApply)
		return
	}
	l.async = false
	l.acked = max(l.acked, l.written) // committed alone, perhaps acked
}

// InSync reports whether the follower holds every entry that may have been
// acknowledged, and every entry committed from now on will need it: the
// leader commits on both copies and the follower's log matches this one up
// to every entry written before that might have been acked, by this run in
// the risk stage or by earlier leaders.
func (l *Leader) InSync() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inSync()
}

// inSync is InSync with mu held.
func (l *Leader) inSync() bool {
	return l.cfg.Peer != nil && !l.async && l.failed == nil && !l.reset && l.matched >= l.acked
}

// Confirm has the follower answer an Append now, even with nothing to
// send, and returns nil once it took one and is InSync: its log was found
// to hold everything that may have been acked, after Confirm began. A
// follower that lost its log, does not answer or serves another epoch
// fails it; so does ctx's end. For a hand-off: the follower may have
// lost its disk since the last round.
func (l *Leader) Confirm(ctx context.Context) error {
	l.mu.Lock()
	from := l.rounds
	l.check = true
	l.mu.Unlock()
	signal(l.wakeSend)
	for {
		l.mu.Lock()
		done, changed, failed, lost, inSync := l.rounds > from, l.roundsChanged, l.failed, l.lost, l.inSync()
		l.mu.Unlock()
		switch {
		case failed != nil:
			return failed
		case lost:
			return errors.New("pairlog: the follower lost its log")
		case done && !inSync:
			return errors.New("pairlog: the follower does not hold everything that may have been acked")
		case done:
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-l.ctx.Done():
			return l.stopped()
		}
	}
}

// Lost reports whether the follower answered that its log no longer holds
// entries it had matched, an empty or replaced disk, and has not yet
// caught up again (InSync): it must not be recorded in sync, nor lead,
// until then. What it matched is then known to be nothing, and the
// leader commits nothing until it holds the entries again.
func (l *Leader) Lost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// Matched returns the index up to which the follower's log is known to
// match this replica's.
func (l *Leader) Matched() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.matched
}

// Lag returns how many entries this replica's log holds past what the
// follower's is known to match.
func (l *Leader) Lag() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.written - min(l.written, l.matched)
}

// failLocked makes the leader's failure err, unless it failed already, and
// answers every entry not applied with it. mu is held.
func (l *Leader) failLocked(err error) {
	if l.failed == nil {
		l.failed = err
	}
	for _, e := range l.queue {
		if e.log.Index > l.applied {
			e.err = l.failed
			close(e.done)
			<-l.room
		}
	}
	l.queue = nil
	l.cancel()
}

// at returns the entry at index i of what was proposed here. mu is held.
func (l *Leader) at(i uint64) *entry { return l.queue[i-l.queue[0].log.Index] }

// write writes the proposed entries not yet in this replica's log, in one
// write.
func (l *Leader) write() bool {
	l.mu.Lock()
	if l.failed != nil || l.ctx.Err() != nil { // closing: no new write
		l.mu.Unlock()
		return false
	}
	var es []*raft.Log
	for i := l.written + 1; i < l.next; i++ {
		es = append(es, &l.at(i).log)
	}
	l.mu.Unlock()
	if len(es) == 0 {
		return l.wait(l.wakeWrite)
	}
	err := l.cfg.Log.Write(es)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failLocked(err)
		return false
	}
	l.written = es[len(es)-1].Index
	if l.cfg.Peer == nil {
		l.matched = l.written
	}
	signal(l.wakeApply)
	signal(l.wakeSend)
	return true
}

// send sends the follower the entries it lacks, or the commit index it has
// not heard, one Append at a time; a refused one is sent again from where
// the follower's log matches, a failed one after RetryAfter. The first
// one, and one after a refusal, may carry no entry: it finds whether the
// follower's log matches this replica's up to where it starts.
func (l *Leader) send() bool {
	if l.cfg.Peer == nil {
		<-l.ctx.Done()
		return false
	}
	l.mu.Lock()
	if l.failed != nil || l.ctx.Err() != nil {
		l.mu.Unlock()
		return false
	}
	prev := l.sendAfter
	to := min(l.next-1, prev+uint64(l.cfg.MaxBatch))
	mem := l.memFrom()
	a := Append{Epoch: l.epoch, PrevIndex: prev, Commit: l.commit(), Reset: l.reset}
	if prev >= mem && prev > 0 {
		a.PrevEpoch = l.at(prev).log.Term
	}
	for i := max(prev+1, mem); i <= to; i++ {
		a.Entries = append(a.Entries, &l.at(i).log)
	}
	idle := l.matched >= prev && to == prev && a.Commit <= l.told && !l.reset && !l.check
	l.check = false
	l.mu.Unlock()
	if idle {
		return l.idle()
	}
	if hi := min(to, mem-1); prev < mem && max(prev, 1) <= hi {
		// prev's epoch, and the entries no longer in memory, applied and so
		// written, from this replica's log.
		es, err := l.cfg.Log.Entries(max(prev, 1), hi)
		atSnapshot := false
		if errors.Is(err, ErrCompacted) && prev > 0 && prev == l.installed {
			// The follower restored this replica's snapshot at prev and
			// holds no entry there, its log following it (Log.Restored),
			// so it checks no epoch at prev: one this log may no longer
			// know, being compacted or restored at prev itself.
			es, err = l.cfg.Log.Entries(prev+1, hi)
			atSnapshot = true
		}
		if errors.Is(err, ErrCompacted) && l.cfg.Snapshot != nil {
			// The follower is behind what this log still holds: it needs
			// a snapshot.
			return l.install()
		}
		if errors.Is(err, ErrCompacted) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.failLocked(err)
			return false
		}
		if err != nil {
			return l.retry()
		}
		if prev > 0 && !atSnapshot {
			a.PrevEpoch, es = es[0].Term, es[1:]
		}
		a.Entries = append(es, a.Entries...)
	}
	if limit := l.cfg.MaxBatchBytes; limit > 0 {
		n, size := 0, 0
		for n < len(a.Entries) && (n == 0 || size+len(a.Entries[n].Data) <= limit) {
			size += len(a.Entries[n].Data)
			n++
		}
		a.Entries = a.Entries[:n]
	}
	end, err := l.cfg.Peer.Append(l.ctx, a)
	if want := prev + uint64(len(a.Entries)); err == nil && end != want {
		// The follower's log matches up to the batch's end and no
		// further: a reply saying otherwise is not trusted.
		err = fmt.Errorf("%w: the follower answered %d to a batch ending at %d", ErrBadAppend, end, want)
	}
	l.mu.Lock()
	var me *MismatchError
	var ee *EpochError
	switch {
	case l.failed != nil:
		l.mu.Unlock()
		return false
	case err == nil:
		l.reset = false
		l.matched, l.sendAfter = max(l.matched, end), max(l.sendAfter, end)
		l.told = max(l.told, a.Commit)
		l.lost = l.lost && !l.inSync()
		l.rounds++
		close(l.roundsChanged)
		l.roundsChanged = make(chan struct{})
		signal(l.wakeApply)
		l.mu.Unlock()
		return true
	case errors.As(err, &me):
		if me.Last < l.matched {
			// An intact follower never loses an entry it matched: it cuts
			// only a tail past what both held, and compacts only what its
			// files hold. Its log was lost; it holds nothing known.
			l.lost, l.matched, l.reset = true, 0, true
			close(l.roundsChanged) // Confirm looks again
			l.roundsChanged = make(chan struct{})
		}
		l.sendAfter = min(me.Last, prev-1)
		l.mu.Unlock()
		return true
	case errors.As(err, &ee) && ee.Epoch > l.epoch:
		l.failLocked(fmt.Errorf("%w (%d, this leader's %d)", ErrDeposed, ee.Epoch, l.epoch))
		l.mu.Unlock()
		return false
	case errors.Is(err, ErrCommitted), errors.Is(err, ErrBadAppend):
		// This replica's log lacks what both copies held, or sent what
		// does not hold together: it must not lead.
		l.failLocked(err)
		l.mu.Unlock()
		return false
	}
	l.mu.Unlock()
	return l.retry()
}

// idle waits for something to send, or CheckEvery, after which the next
// Append goes even if empty; false once the leader stops.
func (l *Leader) idle() bool {
	t := time.NewTimer(l.cfg.CheckEvery)
	defer t.Stop()
	select {
	case <-l.wakeSend:
		return true
	case <-t.C:
		l.mu.Lock()
		l.check = true
		l.mu.Unlock()
		return true
	case <-l.ctx.Done():
		return false
	}
}

// install sends the follower a snapshot of this replica's state, in
// pieces; once it has restored it, its log matches this one up to the
// snapshot's index, and the appends go on from there. A failure starts
// again from the first piece after RetryAfter; a refusal of the epoch for
// a newer one deposes the leader.
func (l *Leader) install() bool {
	index, rc, err := l.cfg.Snapshot()
	if err != nil {
		return l.retry()
	}
	defer rc.Close()
	size := l.cfg.MaxBatchBytes
	if size <= 0 || size > 1<<20 {
		size = 1 << 20
	}
	buf := make([]byte, size)
	for off := uint64(0); ; {
		n, rerr := io.ReadFull(rc, buf)
		done := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		if rerr != nil && !done {
			return l.retry()
		}
		err := l.cfg.Peer.Install(l.ctx, Install{Epoch: l.epoch, Index: index, Offset: off, Data: buf[:n], Done: done})
		var ee *EpochError
		switch {
		case errors.As(err, &ee) && ee.Epoch > l.epoch:
			l.mu.Lock()
			defer l.mu.Unlock()
			l.failLocked(fmt.Errorf("%w (%d, this leader's %d)", ErrDeposed, ee.Epoch, l.epoch))
			return false
		case err != nil:
			return l.retry()
		}
		if done {
			break
		}
		off += uint64(n)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil {
		return false
	}
	l.installed = index
	l.reset = false
	l.matched, l.sendAfter = max(l.matched, index), max(l.sendAfter, index)
	l.lost = l.lost && !l.inSync()
	signal(l.wakeApply)
	return true
}

// memFrom returns the index from which the entries are in the queue in
// memory: those proposed here and not yet applied. mu is held.
func (l *Leader) memFrom() uint64 {
	if len(l.queue) > 0 {
		return l.queue[0].log.Index
	}
	return l.next
}

// retry waits RetryAfter after a failed Append, the follower being
// unreachable or not yet serving this epoch; false once the leader stops.
func (l *Leader) retry() bool {
	t := time.NewTimer(l.cfg.RetryAfter)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.ctx.Done():
		return false
	}
}

// apply applies the committed entries not yet applied, in one call, and
// answers those proposed here.
func (l *Leader) apply() bool {
	l.mu.Lock()
	if l.failed != nil || l.ctx.Err() != nil {
		l.mu.Unlock()
		return false
	}
	from, to := l.applied+1, l.commit()
	var es []*raft.Log
	for i := max(from, l.own); i <= to; i++ {
		es = append(es, &l.at(i).log)
	}
	l.mu.Unlock()
	if from > to {
		return l.wait(l.wakeApply)
	}
	if from < l.own {
		old, err := l.cfg.Log.Entries(from, min(to, l.own-1))
		if err != nil {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.failLocked(err)
			return false
		}
		es = append(old, es...)
	}
	resps := l.cfg.Apply(es)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil {
		return false
	}
	if len(resps) != len(es) {
		l.failLocked(fmt.Errorf("pairlog: %d responses to %d entries applied", len(resps), len(es)))
		return false
	}
	for i, e := range es {
		if e.Index >= l.own {
			f := l.queue[0]
			f.resp = resps[i]
			close(f.done)
			l.queue = l.queue[1:]
			<-l.room
		}
	}
	l.applied = to
	return true
}
