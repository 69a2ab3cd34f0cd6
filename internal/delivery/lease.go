package delivery

import (
	"context"
	"errors"
	"time"

	"github.com/zeze-go/mq/store"
)

// Leaser is an optional side of a Coordinator (a cluster's): with a Lease
// above zero, a worker holds its partition under a lease kept by the
// partition itself, so that no two nodes deliver a partition at once even
// when the coordinator's own view is stale (a node cut from the metadata
// group, or the metadata group without a quorum, keeps delivering what it
// holds while it reaches the partition):
//
//   - its claim respects the current owner's lease (store.OpClaim with
//     MaxAge): while another owner renews it, the worker waits;
//   - it renews the lease every quarter of it (store.OpRenew), and stops
//     (its handlers' contexts end) when no renewal succeeded for 4/5 of
//     it, counted from when the last successful one was sent: the
//     partition stamps a renewal no earlier, so it stops before the
//     partition may let another owner claim;
//   - its last commit lets go (store.OpUnclaim), so the next owner needs
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

// keepLease renews w's lease until ctx ends (see Leaser); when it lapses, it
// stops w, which its group then starts again (end), to claim the partition
// anew. It is started by run after the first claim; run waits for it to end
// before its last commit lets go, so that no renewal follows.
func (w *worker) keepLease(ctx context.Context, lease time.Duration) {
	every := max(lease/4, time.Millisecond)
	clk := w.c.e.clock
	for {
		select {
		case <-ctx.Done():
			return
		case <-clk.After(every):
		}
		if sent := clk.Now(); sent.UnixNano()-w.renewedAt.Load() >= int64(every) {
			rctx, cancel := context.WithTimeout(ctx, every)
			cmd := store.Command{Op: store.OpRenew, Group: w.c.group.name, Generation: w.leaseGen.Load()}
			if _, err := w.p.Apply(rctx, &cmd); err == nil {
				w.renewed(sent)
			} else if ctx.Err() == nil && !errors.Is(err, store.ErrStaleGeneration) {
				w.logger().Debug("lease renewal failed", "err", err)
			}
			cancel()
		}
		if clk.Now().UnixNano()-w.renewedAt.Load() > int64(lease)*4/5 && ctx.Err() == nil {
			w.logger().Warn("the partition's lease was not renewed in time; this consumer stops delivering it and claims it again", "lease", lease)
			w.leaseLost.Store(true)
			w.c.lose(w)
			return
		}
	}
}

// unclaim is the last commit of a worker with a lease: offset, and the
// partition let go (store.OpUnclaim).
func (w *worker) unclaim(offset uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := store.Command{Op: store.OpUnclaim, Group: w.c.group.name, Offset: offset, Generation: w.gen}
	_, err := w.p.Apply(ctx, &cmd)
	if err != nil && !errors.Is(err, store.ErrStaleGeneration) && !errors.Is(err, store.ErrClosed) {
		w.logger().Error("last offset commit failed", "err", err)
	}
}
