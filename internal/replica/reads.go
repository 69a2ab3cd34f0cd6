package replica

import (
	"context"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// reads are a replicated partition's reads (Raft3, DoubleWrite), each run
// at the partition's leader by at: this node's replica when it leads, the
// leader's node by RPC otherwise.
type reads struct {
	at      func(ctx context.Context, fn func(p partition.Partition) error) error
	ctx     context.Context // the partition's: ends at its Close
	timeout time.Duration   // bounds the reads that take no ctx
}

// call is read with the partition's CallTimeout, for the reads that take
// no ctx.
func (r reads) call(fn func(p partition.Partition) error) error {
	ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
	defer cancel()
	return r.at(ctx, fn)
}

// Fetch reads from the leader, waiting there as store.Partition.Fetch does.
func (r reads) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) (out []store.Message, err error) {
	err = r.at(ctx, func(p partition.Partition) (err error) {
		out, err = p.Fetch(ctx, from, max, maxBytes, dst)
		return err
	})
	return out, err
}

func (r reads) Get(offset uint64) (m store.Message, ok bool, err error) {
	err = r.call(func(p partition.Partition) (err error) {
		m, ok, err = p.Get(offset)
		return err
	})
	return m, ok, err
}

// GetContext is Get ending with ctx (partition.Get).
func (r reads) GetContext(ctx context.Context, offset uint64) (m store.Message, ok bool, err error) {
	err = r.at(ctx, func(p partition.Partition) (err error) {
		m, ok, err = p.Get(offset)
		return err
	})
	return m, ok, err
}

// SeekTimeContext is SeekTime ending with ctx (partition.SeekTime).
func (r reads) SeekTimeContext(ctx context.Context, t int64) (off uint64, err error) {
	err = r.at(ctx, func(p partition.Partition) (err error) {
		off, err = p.SeekTime(t)
		return err
	})
	return off, err
}

// HalfTxsContext is HalfTxs ending with ctx (partition.HalfTxs).
func (r reads) HalfTxsContext(ctx context.Context, fn func(store.HalfTx) bool) error {
	return r.at(ctx, func(p partition.Partition) error { return p.HalfTxs(fn) })
}

func (r reads) Group(name string) (g store.GroupState, ok bool, err error) {
	err = r.call(func(p partition.Partition) (err error) {
		g, ok, err = p.Group(name)
		return err
	})
	return g, ok, err
}

func (r reads) GroupStates() (gs map[string]store.GroupState, err error) {
	err = r.call(func(p partition.Partition) (err error) {
		gs, err = p.GroupStates()
		return err
	})
	return gs, err
}

func (r reads) SeekTime(t int64) (off uint64, err error) {
	err = r.call(func(p partition.Partition) (err error) {
		off, err = p.SeekTime(t)
		return err
	})
	return off, err
}

func (r reads) NextDue() (due int64, ok bool, err error) {
	err = r.call(func(p partition.Partition) (err error) {
		due, ok, err = p.NextDue()
		return err
	})
	return due, ok, err
}

// HalfTxs lists the leader's half transactions. fn may see one twice when
// leadership moves while it runs.
func (r reads) HalfTxs(fn func(store.HalfTx) bool) error {
	return r.call(func(p partition.Partition) error { return p.HalfTxs(fn) })
}

func (r reads) Decision(txid string) (d store.Decision, err error) {
	err = r.call(func(p partition.Partition) (err error) {
		d, err = p.Decision(txid)
		return err
	})
	return d, err
}
