package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/expr-lang/expr/vm"

	"github.com/zeze-go/mq/internal/faultinject"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// workerKey marks the contexts a worker hands to its handlers, so a call
// made with one, even from another goroutine, counts as made by the handler.
type workerKey struct{}

// worker delivers one partition to one consumer.
type worker struct {
	c    *Consumer
	part int
	p    Partition
	// prev is the partition's previous worker in the group, which run waits
	// for, and then clears, before it starts: one owner at a time.
	prev   atomic.Pointer[worker]
	cancel context.CancelFunc
	done   chan struct{} // closed when the worker has ended, prev before it
	held   atomic.Int32  // calls in progress, made by this worker's handlers, that wait

	// A reset of the group's offset here by Engine.Reset sets moved and
	// cancels the current fetch, so the worker claims the partition again
	// before it delivers anything more.
	moved    atomic.Bool
	fetchMu  sync.Mutex
	fetchCtx context.Context    // what fetches wait with until the next claim
	unfetch  context.CancelFunc // cancels fetchCtx
	wake     chan struct{}      // a token when moved was set: ends a retry wait

	gen        uint64 // the generation of the worker's claim; owned by run
	resume     bool   // the next claim starts a missing record at resumeAt; owned by run
	resumeAt   uint64
	committed  uint64 // last offset written to the store; owned by run
	lastCommit time.Time
	vm         vm.VM         // filter evaluation; owned by run
	sem        chan struct{} // key-parallel: bounds handlers in flight

	// With a Leaser's lease: the generation keepLease renews, when the last
	// successful claim, commit or renewal was sent, in unix ns, and whether
	// the lease lapsed.
	leaseGen  atomic.Uint64
	renewedAt atomic.Int64
	leaseLost atomic.Bool
	// adopt is the generation of a reset that took the partition from
	// this worker while it held it: the reset kept the worker's lease in
	// store.GroupState.Lease, and the worker's next claim carries it so
	// that this lease does not hold it off, while another owner's claim
	// waits.
	adopt atomic.Uint64
}

func newWorker(c *Consumer, part int, p Partition) *worker {
	return &worker{c: c, part: part, p: p, done: make(chan struct{}), wake: make(chan struct{}, 1)}
}

// errorPause is the wait before a worker tries again after a store error:
// a failed claim or read, or a failed move to the retry or dead-letter
// topic.
const errorPause = time.Second

// commitEvery bounds how long a handled message may wait for its offset to be
// committed while its partition is busy.
const commitEvery = 200 * time.Millisecond

func (w *worker) run(ctx context.Context) {
	defer w.end()
	defer w.runsHandlers()()
	if prev := w.prev.Load(); prev != nil {
		<-prev.done // even when cancelled: w starts after prev's last commit
		w.prev.Store(nil)
	}
	offset, ok := w.claim(ctx)
	if !ok {
		return
	}
	lease := w.c.e.lease
	if lease > 0 {
		renewing := make(chan struct{})
		w.c.e.spawn(func() {
			defer close(renewing)
			w.keepLease(ctx, lease)
		})
		defer func() {
			<-renewing // ends with ctx, which has ended: run returns only then
			w.unclaim(offset)
		}()
	} else {
		defer func() { w.commit(offset) }()
	}
	if w.c.cfg.KeyParallel > 0 {
		w.runParallel(ctx, &offset)
		return
	}
	cfg := &w.c.cfg
	buf := make([]store.Message, 0, cfg.Batch)
	suspect := false // a read failed since the claim was last known to hold
	for ctx.Err() == nil {
		if w.moved.Load() {
			off, ok := w.claim(ctx)
			if !ok {
				return
			}
			offset, suspect = off, false
			continue
		}
		var err error
		buf, err = w.fetch(offset, cfg.Batch, cfg.BatchBytes, buf[:0], true)
		if err != nil {
			if w.pastEnd(err) {
				continue
			}
			suspect = true
			if ctx.Err() == nil && !w.moved.Load() {
				w.logger().Error("read failed; retrying", "offset", offset, "err", err)
				w.wait(ctx, errorPause, nil)
			}
			continue
		}
		if suspect {
			if !w.claimHolds(ctx) {
				clear(buf)
				if ctx.Err() == nil && !w.moved.Load() {
					w.wait(ctx, errorPause, nil)
				}
				continue
			}
			suspect = false
		}
		offset = w.skipGap(offset, buf[0].Offset)
		for i := range buf {
			if w.moved.Load() {
				break
			}
			if w.accept(&buf[i]) && !w.handle(ctx, &buf[i], nil) {
				break // stopped, or moved while the message waited to be retried
			}
			offset = buf[i].Offset + 1
			if time.Since(w.lastCommit) > commitEvery {
				w.commit(offset)
			}
		}
		clear(buf)
		w.commit(offset)
	}
}

// claim takes the partition for the group with store.OpClaim and returns the
// offset to deliver from: the group's committed offset, or the start
// position for a new group. It tries again after a pause while the store
// fails, and reports false once ctx ends.
func (w *worker) claim(ctx context.Context) (uint64, bool) {
	held := false
	for ctx.Err() == nil {
		w.armFetch(ctx)
		w.moved.Store(false)
		select {
		case <-w.wake:
		default:
		}
		sent := w.c.e.clock.Now()
		res, err := w.p.Apply(ctx, w.claimCommand(ctx))
		if err == nil {
			w.gen, w.committed, w.lastCommit = res.Generation, res.Offset, time.Now()
			w.leaseGen.Store(res.Generation)
			w.renewed(sent)
			if end := partition.Stats(ctx, w.p).Next; res.Offset > end {
				// Stored past the end by a position the partition no
				// longer holds the tail of (store.ErrPastEnd): from its
				// end, what came after the loss.
				w.logger().Warn("committed offset past the end of the partition, whose tail was given up: delivering from its end",
					"committed", res.Offset, "end", end)
				return end, true
			}
			return res.Offset, true
		}
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, store.ErrClaimed) { // another owner's lease runs: see Leaser
			if !held {
				held = true
				w.logger().Info("partition held by another owner's lease; waiting for it", "err", err)
			}
			w.wait(ctx, max(w.c.e.lease/4, 10*time.Millisecond), nil)
			continue
		}
		w.logger().Error("cannot claim the partition; retrying", "err", err, "retry", errorPause)
		w.wait(ctx, errorPause, nil)
	}
	return 0, false
}

func (w *worker) claimCommand(ctx context.Context) *store.Command {
	// With its generation: a worker claiming again is not held off by its
	// own lease, as after a reset's hint when it claimed again by itself,
	// nor by the one a reset kept for it in adopt.
	cmd := &store.Command{Op: store.OpClaim, Group: w.c.group.name, MaxAge: int64(w.c.e.lease), Generation: w.gen}
	if faultinject.ShareOwnership.Load() {
		cmd.MaxAge = 0 // takes the partition whatever lease another owner holds
	}
	if a := w.adopt.Load(); a > w.gen && !w.lapsed() {
		cmd.Generation = a
	}
	if w.resume {
		w.resume = false
		cmd.Start, cmd.Offset = store.StartAt, w.resumeAt
		return cmd
	}
	switch w.c.cfg.Start {
	case StartLast:
		cmd.Start = store.StartLast
	case StartTime:
		off, err := partition.SeekTime(ctx, w.p, w.c.cfg.StartTime)
		if err != nil { // the claim starts a new group at the first message
			w.logger().Warn("cannot find the start time; a new group starts at the first message", "err", err)
			cmd.Start = store.StartFirst
			break
		}
		cmd.Start, cmd.Offset = store.StartAt, off
	default:
		cmd.Start = store.StartFirst
	}
	return cmd
}

// armFetch gives the next fetches a wait that a reset can cut short.
func (w *worker) armFetch(ctx context.Context) {
	w.fetchMu.Lock()
	defer w.fetchMu.Unlock()
	if w.unfetch != nil {
		w.unfetch()
	}
	var fctx context.Context
	fctx, w.unfetch = context.WithCancel(ctx)
	w.fetchCtx = fctx
}

// hint tells w that a reset moved the group's offset under generation
// gen: it claims again before it delivers anything more.
func (w *worker) hint(gen uint64) {
	w.adoptReset(gen)
	w.fetchMu.Lock()
	if w.unfetch != nil {
		w.unfetch()
	}
	w.fetchMu.Unlock()
	w.markMoved()
}

// adoptReset lets w's next claim carry gen, a reset's generation, if w
// held the partition: it claimed, and claimCommand checks that its lease
// has not lapsed, so the reset kept w's lease and no other owner claimed
// since. A worker that waits for another owner's lease has claimed
// nothing and adopts nothing. Generations only grow: an older one than
// w's is of no use.
func (w *worker) adoptReset(gen uint64) {
	if w.leaseGen.Load() == 0 || w.c.e.lease <= 0 {
		return
	}
	for {
		old := w.adopt.Load()
		if gen <= old || w.adopt.CompareAndSwap(old, gen) {
			return
		}
	}
}

// markMoved makes w claim again: a retry wait ends at once.
func (w *worker) markMoved() {
	w.moved.Store(true)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// fetch waits for messages from offset on. With Config.Refresh, a worker
// idle that long stores its offset again with touch, so the record of a
// running broadcast instance never looks abandoned to the upkeep.
func (w *worker) fetch(from uint64, max, maxBytes int, dst []store.Message, touch bool) ([]store.Message, error) {
	w.fetchMu.Lock()
	fctx := w.fetchCtx
	w.fetchMu.Unlock()
	r := w.c.cfg.Refresh
	if r <= 0 || !touch {
		return w.p.Fetch(fctx, from, max, maxBytes, dst)
	}
	for {
		tctx, cancel := context.WithTimeout(fctx, r)
		out, err := w.p.Fetch(tctx, from, max, maxBytes, dst)
		cancel()
		if err == nil || fctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return out, err
		}
		w.store(from)
	}
}

// skipGap logs messages that retention removed before this group read them
// and returns where reading resumes.
func (w *worker) skipGap(offset, first uint64) uint64 {
	if first > offset {
		w.logger().Warn("messages removed by retention before delivery", "from", offset, "to", first, "lost", first-offset)
		return first
	}
	return offset
}

func (w *worker) logger() *slog.Logger {
	return w.c.e.log.With("topic", w.c.topic, "group", w.c.group.name, "partition", w.part)
}

// commit stores offset as the group's, under the worker's claim. A commit
// refused because another owner or a reset took the partition sets moved:
// the worker claims again if it still runs.
func (w *worker) commit(offset uint64) {
	if offset != w.committed {
		w.store(offset)
	}
}

// store writes offset, even when it is the one committed already.
func (w *worker) store(offset uint64) {
	// Commit even while stopping: the offset must reach the store.
	ctx, cancel := w.c.commitCtx()
	defer cancel()
	cmd := store.Command{Op: store.OpCommitOffset, Group: w.c.group.name, Offset: offset, Generation: w.gen}
	sent := w.c.e.clock.Now()
	_, err := w.p.Apply(ctx, &cmd)
	switch {
	case err == nil:
		w.committed = offset
		w.lastCommit = time.Now()
		w.renewed(sent)
	case errors.Is(err, store.ErrStaleGeneration):
		w.committed = offset // nothing more to commit under this claim
		w.fenced()
	case w.pastEnd(err):
	case !errors.Is(err, store.ErrClosed):
		w.logger().Error("offset commit failed", "err", err)
	}
}

// pastEnd reports whether err says the worker's position is past the
// partition's end (store.ErrPastEnd), and if so has it claim again: the
// partition no longer holds the tail the position was taken from (a
// DoubleWrite pair's lost copy given up by an operator), and what is
// stored from the offset it holds on, new sends at the lost ones'
// offsets among them, is delivered again from there.
func (w *worker) pastEnd(err error) bool {
	if !errors.Is(err, store.ErrPastEnd) {
		return false
	}
	w.logger().Warn("position past the end of the partition, whose tail was given up: claiming it again", "err", err)
	w.markMoved()
	return true
}

// claimHolds reports whether the group's record still carries w's
// generation. It is asked before delivering what a read returned after a
// failed one: the partition's leader may have changed in between, and one
// that gave up a lost copy's tail fenced every group first (store.OpFence),
// since new sends take that tail's offsets and a position taken from it
// must not skip them. When the claim no longer holds, fenced decides what
// w does; when the record cannot be read, w reads again after a pause.
func (w *worker) claimHolds(ctx context.Context) bool {
	gs, ok, err := partition.Group(ctx, w.p, w.c.group.name)
	switch {
	case err != nil:
		if !errors.Is(err, store.ErrClosed) {
			w.logger().Error("cannot read the group's record; retrying", "err", err)
		}
		return false
	case ok && gs.Generation == w.gen:
		return true
	}
	w.fencedBy(gs, ok, nil)
	return false
}

// fenced handles a refused commit. When a reset took the partition, or the
// group was deleted, the worker claims it again and goes on from the
// offset stored. When another owner claimed it, because a coordinator gave
// it to a consumer elsewhere before this one knew, the worker stops, and
// the partition is delivered by the newer owner alone.
func (w *worker) fenced() {
	gs, ok, err := w.p.Group(w.c.group.name)
	w.fencedBy(gs, ok, err)
}

// fencedBy is fenced with the group's record as read: gs, ok, err.
func (w *worker) fencedBy(gs store.GroupState, ok bool, err error) {
	switch {
	case err == nil && ok && !gs.Reset:
		w.logger().Warn("partition claimed by another owner; this consumer stops delivering it", "generation", w.gen, "owner", gs.Generation)
		w.c.lose(w)
		return
	case err == nil && ok: // a reset
		w.adoptReset(gs.Generation)
	default:
		// The record is gone, as the upkeep took a broadcast instance for
		// idle, or its commits were all on a copy the partition's new
		// leader gave up, or it could not be read: claim it again where
		// this worker is. A record kept wins; after a fence since this
		// worker claimed, not past the fence's end, whose offsets new
		// sends took (store.FenceRecord).
		w.resumeAt, w.resume = w.committed, true
	}
	w.markMoved()
}

// handle runs one accepted message through the handler until it is
// handled, parked in the retry topic or dead-lettered. It returns false if
// ctx ended, stop was closed or the group's offset moved first; the message
// is then left unhandled.
func (w *worker) handle(ctx context.Context, sm *store.Message, stop <-chan struct{}) bool {
	c := w.c
	d := c.present(w.part, sm)
	for {
		if w.sem != nil { // key-parallel: bound the handlers in flight
			select {
			case w.sem <- struct{}{}:
			case <-stop:
				return false
			case <-ctx.Done():
				return false
			}
		}
		if ctx.Err() != nil || w.moved.Load() || w.lapsed() { // stopped, reset or lease lapsed: deliver nothing more
			if w.sem != nil {
				<-w.sem
			}
			return false
		}
		err := w.call(ctx, d)
		if w.sem != nil {
			<-w.sem
		}
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		r := d.ReconsumeTimes
		switch {
		case r >= c.cfg.MaxReconsume:
			topic, cp := w.deadCopy(sm, r, err)
			return w.settle(ctx, stop, topic, &cp)
		case c.cfg.Concurrent:
			topic, cp := w.parkCopy(sm, r, err)
			return w.settle(ctx, stop, topic, &cp)
		}
		if c.cfg.KeyParallel == 0 {
			// Everything before sm is handled: keep it so while sm waits.
			w.commit(sm.Offset)
		}
		pause := c.cfg.retryDelay(r)
		w.logger().Warn("message handler failed; redelivering", "offset", sm.Offset, "attempt", r+1, "after", pause, "err", err)
		if !w.wait(ctx, pause, stop) {
			return false
		}
		d = c.present(w.part, sm)
		d.ReconsumeTimes = r + 1
	}
}

// settle appends cp, a failed message's copy, to the retry or dead-letter
// topic until it succeeds: a failed message is never dropped, so the
// partition waits for the store. Every try sends the same ID, so a try that
// failed late is not stored twice.
func (w *worker) settle(ctx context.Context, stop <-chan struct{}, topic string, cp *store.Message) bool {
	for {
		err := w.c.e.appendSystem(ctx, topic, cp)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		w.logger().Error("cannot move a failed message; retrying", "err", err)
		if !w.wait(ctx, errorPause, stop) {
			return false
		}
	}
}

// wait waits d on the node's clock. It returns false if ctx ended, stop was
// closed or a reset moved the group's offset first.
func (w *worker) wait(ctx context.Context, d time.Duration, stop <-chan struct{}) bool {
	after := w.c.e.clock.After(d)
	select {
	case <-after:
		return !w.moved.Load()
	case <-w.wake:
		return false
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}

// call runs the handler, turning a panic into an error.
func (w *worker) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mq: OnMessage panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return w.c.handler(ctx, d)
}

// end finishes the worker once run is done with the partition: it gives
// the partition up and closes done, which starts its successor.
func (w *worker) end() {
	w.fetchMu.Lock()
	if w.unfetch != nil {
		w.unfetch()
	}
	w.fetchMu.Unlock()
	g := w.c.group
	g.rebalanceMu.Lock()
	last := g.owners[w.part] == w
	if last {
		delete(g.owners, w.part)
	}
	g.rebalanceMu.Unlock()
	w.c.mu.Lock()
	delete(w.c.live, w)
	w.c.mu.Unlock()
	close(w.done)
	if w.leaseLost.Load() && last {
		// Start it again, if the coordinator still gives it here: it claims
		// anew, safely, since the lease decides. Only if it did not is it
		// Stopped: a coordinator that starts nothing new keeps it here.
		g.rebalance()
		g.rebalanceMu.Lock()
		last = g.owners[w.part] == nil
		g.rebalanceMu.Unlock()
	}
	if s, ok := w.c.e.coord.(Stopper); ok && last {
		s.Stopped(g.topic, g.name, w.part)
	}
	w.c.e.forget(g)
}
