package delivery

import (
	"context"
	"errors"
	"time"

	"github.com/zeze-go/mq/store"
)

// Leaser is an optional side of a Coordinator, a cluster's: with a Lease
// above zero, a worker holds its partition under a lease kept by the
// partition itself, so that no two nodes deliver a partition at once even
// when the coordinator's own view is stale. A node cut from the metadata
// group, or the metadata group without a quorum, keeps delivering what it
// holds while it reaches the partition:
//
//   - its claim, store.OpClaim with MaxAge, respects the current owner's
//     lease: while another owner renews it, the worker waits;
//   - it renews the lease every quarter of it with store.OpRenew, and
//     stops, its handlers' contexts ending, when no renewal succeeded for
//     4/5 of it, counted from when the last successful one was sent: the
//     partition stamps a renewal no earlier, so it stops before the
//     partition may let another owner claim; no handler call begins past
//     that deadline, even before the renewing goroutine noticed it, as in
//     a process paused and continued;
//   - its last commit, store.OpUnclaim, lets go, so the next owner needs
//     not wait.
type Leaser interface {
	Lease() time.Duration
}

// leaseOf is the lease of the engine's coordinator, or 0.
func leaseOf(c Coordinator) time.Duration {
	if l, ok := c.(Leaser); ok {
		return max(l.Lease(), 0)
	}
	return 0
}

// renewed records that a claim, commit or renewal sent at sent succeeded.
func (w *worker) renewed(sent time.Time) {
	ns := sent.UnixNano()
	for {
		old := w.renewedAt.Load()
		if ns <= old || w.renewedAt.CompareAndSwap(old, ns) {
			return
		}
	}
}

// keepLease renews w's lease until ctx ends, as Leaser describes; when it
// lapses, it stops w, which its group then starts again in end, to claim the
// partition anew. It is started by run after the first claim; run waits for
// it to end before its last commit lets go, so that no renewal follows.
//
// The lease counts from when the last successful claim, commit or renewal
// was sent; w stops at 4/5 of it, and a renewal waits no longer than that.
func (w *worker) keepLease(ctx context.Context, lease time.Duration) {
	every := max(lease/4, time.Millisecond)
	clk := w.c.e.clock
	for ctx.Err() == nil {
		last := w.renewedAt.Load()
		deadline := last + int64(lease)*4/5
		now := clk.Now().UnixNano()
		if now >= deadline {
			w.lapse()
			return
		}
		wait := min(last+int64(every), deadline) - now
		if wait <= 0 { // due: renew
			rctx, cancel := context.WithTimeout(ctx, time.Duration(deadline-now))
			cmd := store.Command{Op: store.OpRenew, Group: w.c.group.name, Generation: w.leaseGen.Load()}
			_, err := w.p.Apply(rctx, &cmd)
			cancel()
			if err == nil {
				w.renewed(time.Unix(0, now))
				continue
			}
			if ctx.Err() == nil && !errors.Is(err, store.ErrStaleGeneration) {
				w.logger().Debug("lease renewal failed", "err", err)
			}
			wait = min(int64(every)/4, deadline-clk.Now().UnixNano()) // then try again
		}
		select {
		case <-ctx.Done():
		case <-clk.After(time.Duration(max(wait, 0))):
		}
	}
}

// lapsed reports whether w's lease lapsed, 4/5 of it having passed since
// the last successful renewal was sent; if so, it stops w as keepLease
// does. A handler call begins only while the lease runs: keepLease may
// notice a lapse after the handlers' goroutines do, since a process paused
// past the deadline runs its goroutines in any order when it continues.
func (w *worker) lapsed() bool {
	lease := w.c.e.lease
	if lease <= 0 || w.c.e.clock.Now().UnixNano() < w.renewedAt.Load()+int64(lease)*4/5 {
		return false
	}
	w.lapse()
	return true
}

// lapse stops w, whose lease lapsed; its group starts it again in end.
func (w *worker) lapse() {
	if w.leaseLost.CompareAndSwap(false, true) {
		w.logger().Warn("the partition's lease was not renewed in time; this consumer stops delivering it and claims it again", "lease", w.c.e.lease)
	}
	w.c.lose(w)
}

// unclaim is the last commit of a worker with a lease: offset, and the
// partition let go with store.OpUnclaim.
func (w *worker) unclaim(offset uint64) {
	ctx, cancel := w.c.commitCtx()
	defer cancel()
	cmd := store.Command{Op: store.OpUnclaim, Group: w.c.group.name, Offset: offset, Generation: w.gen}
	_, err := w.p.Apply(ctx, &cmd)
	if err != nil && !errors.Is(err, store.ErrStaleGeneration) && !errors.Is(err, store.ErrClosed) {
		w.logger().Error("last offset commit failed", "err", err)
	}
}
