package replica

import (
	"context"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// Leading is what Partition.Leading returns: this node's replica of the
// partition as a partition.Partition that answers only while it leads,
// and the half messages' producer for the partition service's ACL.
type Leading struct{ p *Partition }

var _ partition.Partition = (*Leading)(nil)

// partition returns the replica's partition if it leads, once it has
// applied what its predecessors committed.
func (l *Leading) partition(ctx context.Context) (*store.Partition, error) {
	rt := l.p.kind.next()
	if rt.local == nil {
		return nil, raftqueue.ErrNotLeader
	}
	return rt.local.LeaderPartition(ctx, l.p.part())
}

func (l *Leading) call(fn func(p *store.Partition) error) error {
	ctx, cancel := context.WithTimeout(l.p.ctx, l.p.cfg.CallTimeout)
	defer cancel()
	p, err := l.partition(ctx)
	if err != nil {
		return err
	}
	return l.p.kind.checkDamage(fn(p))
}

// Apply applies cmd through the replica while it leads, stamping a zero
// Now.
func (l *Leading) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	rt := l.p.kind.next()
	if rt.local == nil {
		return store.Result{}, raftqueue.ErrNotLeader
	}
	res, err := l.p.applyAt(ctx, rt.local, rt.refuse, cmd)
	return res, l.p.kind.checkDamage(err)
}
func (l *Leading) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error) {
	p, err := l.partition(ctx)
	if err != nil {
		return nil, err
	}
	out, err := p.Fetch(ctx, from, max, maxBytes, dst)
	return out, l.p.kind.checkDamage(err)
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
	r := l.p.kind.replica()
	if r == nil {
		return store.Stats{}
	}
	p, err := r.Partition(l.p.part())
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

// Close does nothing: the Partition owns the replica.
func (l *Leading) Close() error { return nil }

// HalfProducer returns the producer of txid's half messages on the leader;
// this node's replica must lead.
func (l *Leading) HalfProducer(txid string) (producer string, ok bool, err error) {
	err = l.call(func(p *store.Partition) (err error) {
		producer, ok, err = p.HalfProducer(txid)
		return err
	})
	return producer, ok, err
}
