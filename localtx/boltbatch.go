package localtx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Group commit of Bolt.Run.
//
// A bbolt write transaction costs one fsync at its commit, whatever it
// holds, and bbolt runs one at a time; so concurrent Runs share one. A Run
// queues its caller as a member; a member that finds no coordinator running
// starts one, a goroutine that runs batches until the queue is empty. A
// batch begins a bbolt transaction and gives each queued member, in queue
// order, a turn to run its function in it; the member runs the function in
// its own goroutine, so that a panic or runtime.Goexit stays with its
// caller. Members that queue meanwhile join, until the queue is empty or
// the batch has maxBatch members; the batch then commits once, and callers
// queued during the commit form the next batch. Each member has its own
// attempt, an id and hooks, and runs its own hooks, in its own goroutine,
// once its outcome is known.
//
// bbolt has no savepoints, so when a function fails with an error, ErrRedo
// or a panic, the whole transaction rolls back: the failing member has its
// rollback, and the members that ran before it in the batch run again, in a
// new transaction, before the batch goes on. Like a redo, such a re-run is
// a new attempt with a new id: the earlier attempt's rollback hooks run and
// its commit hooks are dropped. It is not the function's doing, though, and
// does not count against MaxAttempts.
//
// Why not bbolt's DB.Batch, which has the same redo semantics: it waits up
// to the DB's MaxBatchDelay, 10 ms by default and a setting that belongs to
// the host, before running a batch that is not full. That made one caller
// 10 times slower, 76 instead of 830 transactions/s in mqbench -cases tx
// -c 1, and no faster at -c 16. And it runs the functions in its own
// goroutine, where a panic is turned into an error and runtime.Goexit ends
// the wrong goroutine. The coordinator here commits as soon as no member
// waits.

// maxBatch bounds the members of one batch, so that a steady stream of
// callers does not hold a commit back.
const maxBatch = 128

// boltGroup is the queue of a Bolt adapter's Runs.
type boltGroup struct {
	lead chan struct{} // capacity 1: holds a token while a coordinator runs

	mu    sync.Mutex // guards queue
	queue []*member  // waiting to be taken by a batch, in arrival order
}

// A member's states. Only its coordinator moves a member from waiting to
// claimed, when a batch takes it, and to running, when its turn comes; only
// the member itself moves from waiting or claimed to cancelled.
const (
	memberWaiting int32 = iota
	memberClaimed
	memberRunning
	memberCancelled
)

// member is one Run in the group.
type member struct {
	ctx   context.Context
	state atomic.Int32
	in    chan batchMsg // capacity 1, from the coordinator: a turn, then the outcome
	ran   chan error    // capacity 1, to the coordinator: how the function of a turn ended
	t     *BoltTx       // the member's current attempt; set by the member before it reports
}

// Messages from a coordinator to a member.
type msgKind int

const (
	msgTurn         msgKind = iota // run the function in tx
	msgCommitted                   // the batch committed
	msgRolledBack                  // the member's function failed; the transaction rolled back
	msgFailed                      // the member's attempt rolled back; Run returns err
	msgCommitFailed                // Commit returned err; st and rerr are the first read-back
	msgPanic                       // bbolt panicked with val on a damaged file: the member goes on with it
)

type batchMsg struct {
	kind     msgKind
	tx       *bolt.Tx
	err      error
	st       State
	rerr     error
	deadline time.Time // of the read-back
	val      any
}

// What a member reports of its turn: nil, its function returned nil.
var (
	errSkipped = errors.New("localtx: ctx ended before the turn") // nothing ran
	errFailed  = errors.New("localtx: function failed")           // the member keeps its own error
)

// try runs one attempt of b.Run for fn as a member of a batch; attempts
// that the batch rolled back because another member failed run again inside
// it.
func (b *Bolt) try(ctx context.Context, fn func(context.Context) error) error {
	m := &member{ctx: ctx, in: make(chan batchMsg, 1), ran: make(chan error, 1)}
	a := newAttempt()
	var hooks []func() // of the attempts rolled back by the batch
	used := false      // fn ran in attempt a
	b.group.enqueue(m)
	for {
		msg, ok := b.group.wait(b, m)
		if !ok {
			runHooks(append(hooks, a.end(RolledBack)...))
			return ctx.Err()
		}
		switch msg.kind {
		case msgTurn:
			if err := ctx.Err(); err != nil {
				m.ran <- errSkipped
				runHooks(append(hooks, a.end(RolledBack)...))
				return err
			}
			if used {
				hooks = append(hooks, a.end(RolledBack)...)
				a = newAttempt()
			}
			used = true
			m.t = &BoltTx{attempt: a, tx: msg.tx, txid: msg.tx.ID(), store: b}
			if err := m.call(fn, hooks); err != nil {
				return err
			}
		case msgCommitted:
			runHooks(append(hooks, a.end(Committed)...))
			return nil
		case msgFailed:
			runHooks(append(hooks, a.end(RolledBack)...))
			return msg.err
		case msgCommitFailed:
			// The transaction may have committed anyway: read back, as
			// once does, while the attempt still counts as running.
			st, rerr := settleFrom(ctx, m.t, msg.deadline, msg.st, msg.rerr)
			runHooks(append(hooks, a.end(st)...))
			return commitError(st, msg.err, rerr)
		case msgPanic:
			runHooks(append(hooks, a.end(Unknown)...))
			panic(msg.val)
		}
	}
}

// call runs fn in m's turn and reports to the coordinator how it ended. When
// fn fails with an error, a panic or runtime.Goexit, call waits for the
// rollback, runs the rollback hooks of the earlier attempts, hooks, and of
// this one, and returns fn's error or goes on panicking. It returns nil
// once it reported success.
func (m *member) call(fn func(context.Context) error, hooks []func()) error {
	fail := func() {
		m.ran <- errFailed
		<-m.in // msgRolledBack: the transaction rolled back
		runHooks(append(hooks, m.t.end(RolledBack)...))
	}
	finished := false
	defer func() {
		if finished {
			return
		}
		r := recover()
		fail()
		if r != nil {
			panic(r)
		}
	}()
	err := fn(WithTx(m.ctx, m.t))
	finished = true
	if err != nil {
		fail()
		return err
	}
	m.ran <- nil
	return nil
}

func (g *boltGroup) enqueue(m *member) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.queue = append(g.queue, m)
}

// wait returns the coordinator's next message to m; false when m's ctx
// ended before its turn, after m left. While m waits to be taken and no
// coordinator runs, it starts one.
func (g *boltGroup) wait(b *Bolt, m *member) (batchMsg, bool) {
	done := m.ctx.Done()
	for {
		var lead chan struct{} // nil, never ready, unless m waits in the queue
		if m.state.Load() == memberWaiting {
			lead = g.lead
		}
		select {
		case lead <- struct{}{}:
			go b.coordinate() // owned by the queue: it ends when the queue is empty
		case msg := <-m.in:
			return msg, true
		case <-done:
			if m.state.CompareAndSwap(memberWaiting, memberCancelled) {
				g.remove(m)
				return batchMsg{}, false
			}
			if m.state.CompareAndSwap(memberClaimed, memberCancelled) {
				return batchMsg{}, false
			}
			done = nil // its turn came: the outcome follows, or the turn of a re-run sees ctx
		}
	}
}

// take claims up to max waiting members, in queue order, and drops them
// from the queue with the cancelled ones it passes.
func (g *boltGroup) take(max int) []*member {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*member
	n := 0
	for _, m := range g.queue {
		if len(out) == max {
			break
		}
		n++
		if m.state.CompareAndSwap(memberWaiting, memberClaimed) {
			out = append(out, m)
		}
	}
	g.queue = slices.Delete(g.queue, 0, n)
	return out
}

func (g *boltGroup) remove(m *member) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.queue, m); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
	}
}

// coordinate holds the group's token and runs batches while members queue.
func (b *Bolt) coordinate() {
	defer func() { <-b.group.lead }()
	for b.batch() {
	}
}

// batch gives the queued members their turns in one bbolt transaction and
// commits it; false when no member was queued.
func (b *Bolt) batch() (more bool) {
	var (
		tx   *bolt.Tx
		ran  []*member // their functions ran in tx, in order
		todo []*member // claimed, to run in tx
		cur  *member   // running, owed a turn or its rollback
	)
	defer func() {
		// Only bbolt runs here, as the functions run in their members'
		// goroutines: a panic of bbolt's, which a damaged file causes,
		// goes on in each member of the batch, in its caller's goroutine.
		// The outcome is unknown.
		r := recover()
		if r == nil {
			return
		}
		if tx != nil {
			func() {
				defer func() { _ = recover() }()
				_ = tx.Rollback()
			}()
		}
		msg := batchMsg{kind: msgPanic, val: r}
		for _, m := range ran {
			m.in <- msg
		}
		if cur != nil {
			cur.in <- msg
		}
		for _, m := range todo {
			if m.state.CompareAndSwap(memberClaimed, memberRunning) {
				m.in <- msg
			}
		}
		more = true
	}()
	took := false
	for {
		if len(todo) == 0 {
			if len(ran) >= maxBatch {
				break
			}
			if todo = b.group.take(maxBatch - len(ran)); len(todo) == 0 {
				break
			}
			took = true
		}
		m := todo[0]
		todo = todo[1:]
		if !m.state.CompareAndSwap(memberClaimed, memberRunning) {
			continue // its ctx ended: it left
		}
		cur = m
		if tx == nil {
			var err error
			if tx, err = b.db.Begin(true); err != nil {
				tx, cur = nil, nil
				b.fail(m, todo, err)
				todo = nil
				return true
			}
		}
		m.in <- batchMsg{kind: msgTurn, tx: tx}
		switch <-m.ran {
		case nil:
			ran, cur = append(ran, m), nil
		case errSkipped:
			cur = nil
		default:
			_ = tx.Rollback()
			tx, cur = nil, nil
			m.in <- batchMsg{kind: msgRolledBack}
			for _, o := range ran {
				o.state.Store(memberClaimed)
			}
			todo = slices.Concat(ran, todo)
			ran = nil
		}
	}
	if tx == nil {
		return took
	}
	if len(ran) == 0 { // every member's ctx ended before its turn
		_ = tx.Rollback()
		return true
	}
	cerr := b.commitTx(tx)
	if cerr == nil {
		for _, m := range ran {
			m.in <- batchMsg{kind: msgCommitted}
		}
		ran = nil
		return true
	}
	_ = tx.Rollback() // releases whatever the failed commit still holds
	tx = nil
	// The first read-back of every member runs here, before the next batch
	// can write: a later commit moves bbolt's meta on, which hides whether
	// this one was written, as BoltTx.outcome explains.
	deadline := time.Now().Add(settleFor)
	for len(ran) > 0 { // a member leaves ran once it has its message
		m := ran[0]
		st, rerr := readBack(context.WithoutCancel(m.ctx), m.t, deadline)
		m.in <- batchMsg{kind: msgCommitFailed, err: cerr, st: st, rerr: rerr, deadline: deadline}
		ran = ran[1:]
	}
	return true
}

// fail ends the attempts of m and of the claimed members of todo with the
// error of a failed begin.
func (b *Bolt) fail(m *member, todo []*member, err error) {
	err = fmt.Errorf("localtx: begin: %w", err)
	m.in <- batchMsg{kind: msgFailed, err: err}
	for _, o := range todo {
		if o.state.CompareAndSwap(memberClaimed, memberRunning) {
			o.in <- batchMsg{kind: msgFailed, err: err}
		}
	}
}
