package partition

import (
	"context"
	"time"

	"github.com/zeze-go/mq/store"
)

// Reads are the reads of a partition that finds where it is first, each
// run there by At: a replicated partition's (Raft3, DoubleWrite) at its
// leader, this node's replica when it leads or the leader's node by RPC;
// a cluster's Single partition where it is, through a move. Each read
// has a form ending with a ctx (XxxContext, used by this package's
// functions of the same name) and one without, bounded by Timeout.
type Reads struct {
	At      func(ctx context.Context, fn func(p Partition) error) error
	Ctx     context.Context // the partition's: ends at its Close
	Timeout time.Duration   // bounds the reads that take no ctx
}

// Bounded runs fn with a ctx that ends after Timeout or at the
// partition's Close, for the reads that take no ctx.
func (r Reads) Bounded(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(r.Ctx, r.Timeout)
	defer cancel()
	return fn(ctx)
}

// Fetch reads where the partition is, waiting there as store.Partition.Fetch
// does.
func (r Reads) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) (out []store.Message, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		out, err = p.Fetch(ctx, from, max, maxBytes, dst)
		return err
	})
	return out, err
}

func (r Reads) GetContext(ctx context.Context, offset uint64) (m store.Message, ok bool, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		m, ok, err = Get(ctx, p, offset)
		return err
	})
	return m, ok, err
}

func (r Reads) Get(offset uint64) (m store.Message, ok bool, err error) {
	err = r.Bounded(func(ctx context.Context) (err error) {
		m, ok, err = r.GetContext(ctx, offset)
		return err
	})
	return m, ok, err
}

func (r Reads) GroupContext(ctx context.Context, name string) (g store.GroupState, ok bool, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		g, ok, err = Group(ctx, p, name)
		return err
	})
	return g, ok, err
}

func (r Reads) Group(name string) (g store.GroupState, ok bool, err error) {
	err = r.Bounded(func(ctx context.Context) (err error) {
		g, ok, err = r.GroupContext(ctx, name)
		return err
	})
	return g, ok, err
}

func (r Reads) GroupStatesContext(ctx context.Context) (gs map[string]store.GroupState, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		gs, err = GroupStates(ctx, p)
		return err
	})
	return gs, err
}

func (r Reads) GroupStates() (gs map[string]store.GroupState, err error) {
	err = r.Bounded(func(ctx context.Context) (err error) {
		gs, err = r.GroupStatesContext(ctx)
		return err
	})
	return gs, err
}

func (r Reads) SeekTimeContext(ctx context.Context, t int64) (off uint64, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		off, err = SeekTime(ctx, p, t)
		return err
	})
	return off, err
}

func (r Reads) SeekTime(t int64) (off uint64, err error) {
	err = r.Bounded(func(ctx context.Context) (err error) {
		off, err = r.SeekTimeContext(ctx, t)
		return err
	})
	return off, err
}

func (r Reads) NextDueContext(ctx context.Context) (due int64, ok bool, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		due, ok, err = NextDue(ctx, p)
		return err
	})
	return due, ok, err
}

func (r Reads) NextDue() (due int64, ok bool, err error) {
	err = r.Bounded(func(ctx context.Context) (err error) {
		due, ok, err = r.NextDueContext(ctx)
		return err
	})
	return due, ok, err
}

// HalfTxsContext lists the half transactions where the partition is. fn
// may see one twice when it moves, or its leadership does, while it runs.
func (r Reads) HalfTxsContext(ctx context.Context, fn func(store.HalfTx) bool) error {
	return r.At(ctx, func(p Partition) error { return HalfTxs(ctx, p, fn) })
}

// HalfTxs is HalfTxsContext bounded by Timeout.
func (r Reads) HalfTxs(fn func(store.HalfTx) bool) error {
	return r.Bounded(func(ctx context.Context) error { return r.HalfTxsContext(ctx, fn) })
}

func (r Reads) DecisionContext(ctx context.Context, txid string) (d store.Decision, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		d, err = Decision(ctx, p, txid)
		return err
	})
	return d, err
}

func (r Reads) Decision(txid string) (d store.Decision, err error) {
	err = r.Bounded(func(ctx context.Context) (err error) {
		d, err = r.DecisionContext(ctx, txid)
		return err
	})
	return d, err
}
