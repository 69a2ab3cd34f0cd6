package partition

import (
	"context"
	"time"

	"github.com/zeze-go/mq/store"
)

// Reads are the reads of a partition that finds where it is first, each
// run there by At: a replicated partition's (Raft3, DoubleWrite) at its
// leader, this node's replica when it leads or the leader's node by RPC;
// a cluster's Single partition where it is, through a move.
type Reads struct {
	At      func(ctx context.Context, fn func(p Partition) error) error
	Ctx     context.Context // the partition's: ends at its Close
	Timeout time.Duration   // bounds the reads that take no ctx
}

// Call is At bounded by Timeout, for the reads that take no ctx.
func (r Reads) Call(fn func(p Partition) error) error {
	ctx, cancel := context.WithTimeout(r.Ctx, r.Timeout)
	defer cancel()
	return r.At(ctx, fn)
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

func (r Reads) Get(offset uint64) (m store.Message, ok bool, err error) {
	err = r.Call(func(p Partition) (err error) {
		m, ok, err = p.Get(offset)
		return err
	})
	return m, ok, err
}

// GetContext is Get ending with ctx (partition.Get).
func (r Reads) GetContext(ctx context.Context, offset uint64) (m store.Message, ok bool, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		m, ok, err = p.Get(offset)
		return err
	})
	return m, ok, err
}

// SeekTimeContext is SeekTime ending with ctx (partition.SeekTime).
func (r Reads) SeekTimeContext(ctx context.Context, t int64) (off uint64, err error) {
	err = r.At(ctx, func(p Partition) (err error) {
		off, err = p.SeekTime(t)
		return err
	})
	return off, err
}

// HalfTxsContext is HalfTxs ending with ctx (partition.HalfTxs).
func (r Reads) HalfTxsContext(ctx context.Context, fn func(store.HalfTx) bool) error {
	return r.At(ctx, func(p Partition) error { return p.HalfTxs(fn) })
}

func (r Reads) Group(name string) (g store.GroupState, ok bool, err error) {
	err = r.Call(func(p Partition) (err error) {
		g, ok, err = p.Group(name)
		return err
	})
	return g, ok, err
}

func (r Reads) GroupStates() (gs map[string]store.GroupState, err error) {
	err = r.Call(func(p Partition) (err error) {
		gs, err = p.GroupStates()
		return err
	})
	return gs, err
}

func (r Reads) SeekTime(t int64) (off uint64, err error) {
	err = r.Call(func(p Partition) (err error) {
		off, err = p.SeekTime(t)
		return err
	})
	return off, err
}

func (r Reads) NextDue() (due int64, ok bool, err error) {
	err = r.Call(func(p Partition) (err error) {
		due, ok, err = p.NextDue()
		return err
	})
	return due, ok, err
}

// HalfTxs lists the half transactions where the partition is. fn may see
// one twice when it moves, or its leadership does, while it runs.
func (r Reads) HalfTxs(fn func(store.HalfTx) bool) error {
	return r.Call(func(p Partition) error { return p.HalfTxs(fn) })
}

func (r Reads) Decision(txid string) (d store.Decision, err error) {
	err = r.Call(func(p Partition) (err error) {
		d, err = p.Decision(txid)
		return err
	})
	return d, err
}
