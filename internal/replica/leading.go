package replica

import (
	"context"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// Leading is what Raft3.Leading returns: a partition.Partition, and the
// half messages' producer for the partition service's ACL.
type Leading struct{ r leader }

// leader is a replicated partition as Leading serves it: through this
// node's replica while it leads.
type leader interface {
	// leaderPartition returns the replica's partition while it leads,
	// once it has applied what its predecessors committed.
	leaderPartition(ctx context.Context) (*store.Partition, error)
	// leaderApply applies cmd through the replica, stamping a zero Now.
	leaderApply(ctx context.Context, cmd *store.Command) (store.Result, error)
	// checkDamage maps a local call's error (see Raft3.checkDamage).
	checkDamage(err error) error
	// replicaPartition is the replica's partition, leading or not.
	replicaPartition() (*store.Partition, error)
	// callCtx bounds a read that takes no ctx.
	callCtx() (context.Context, context.CancelFunc)
}

var _ partition.Partition = (*Leading)(nil)

// partition returns the replica's partition if it leads.
func (l *Leading) partition(ctx context.Context) (*store.Partition, error) {
	return l.r.leaderPartition(ctx)
}

func (l *Leading) call(fn func(p *store.Partition) error) error {
	ctx, cancel := l.r.callCtx()
	defer cancel()
	p, err := l.partition(ctx)
	if err != nil {
		return err
	}
	return l.r.checkDamage(fn(p))
}

func (l *Leading) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	res, err := l.r.leaderApply(ctx, cmd)
	return res, l.r.checkDamage(err)
}

func (l *Leading) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error) {
	p, err := l.partition(ctx)
	if err != nil {
		return nil, err
	}
	out, err := p.Fetch(ctx, from, max, maxBytes, dst)
	return out, l.r.checkDamage(err)
}

func (l *Leading) Get(offset uint64) (m store.Message, ok bool, err error) {
	err = l.call(func(p *store.Partition) (err error) {
		m, ok, err = p.Get(offset)
		return err
	})
	return m, ok, err
}

// Stats is the replica's, leading or not: advisory.
func (l *Leading) Stats() store.Stats {
	p, err := l.r.replicaPartition()
	if err != nil {
		return store.Stats{}
	}
	return p.Stats()
}

func (l *Leading) Group(name string) (g store.GroupState, ok bool, err error) {
	err = l.call(func(p *store.Partition) (err error) {
		g, ok, err = p.Group(name)
		return err
	})
	return g, ok, err
}

func (l *Leading) GroupStates() (gs map[string]store.GroupState, err error) {
	err = l.call(func(p *store.Partition) (err error) {
		gs, err = p.GroupStates()
		return err
	})
	return gs, err
}

func (l *Leading) SeekTime(t int64) (off uint64, err error) {
	err = l.call(func(p *store.Partition) (err error) {
		off, err = p.SeekTime(t)
		return err
	})
	return off, err
}

func (l *Leading) NextDue() (due int64, ok bool, err error) {
	err = l.call(func(p *store.Partition) (err error) {
		due, ok, err = p.NextDue()
		return err
	})
	return due, ok, err
}

func (l *Leading) HalfTxs(fn func(store.HalfTx) bool) error {
	return l.call(func(p *store.Partition) error { return p.HalfTxs(fn) })
}

func (l *Leading) Decision(txid string) (d store.Decision, err error) {
	err = l.call(func(p *store.Partition) (err error) {
		d, err = p.Decision(txid)
		return err
	})
	return d, err
}

// Close does nothing: the Raft3 partition owns the replica.
func (l *Leading) Close() error { return nil }

// HalfProducer returns the producer of txid's half messages on the leader
// (this node's replica must lead).
func (l *Leading) HalfProducer(txid string) (producer string, ok bool, err error) {
	err = l.call(func(p *store.Partition) (err error) {
		producer, ok, err = p.HalfProducer(txid)
		return err
	})
	return producer, ok, err
}
