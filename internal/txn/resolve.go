package txn

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/store"
)

// Parked is a transaction whose half messages got no answer from the
// check-back MaxChecks times.
type Parked struct {
	TxID      string
	Parts     []Ref     // where its half messages are, by topic and partition
	Messages  int       // half messages in all
	FirstSeen time.Time // when its first half message was stored
	Checks    int       // check-backs without an answer: the most of its partitions'
}

// Parked lists the transactions parked in the partitions whose check-back
// this node runs, as Config.Owned says, oldest first.
func (n *Node) Parked(ctx context.Context) ([]Parked, error) {
	all, err := n.halvesIn(ctx, n.cfg.Owned)
	if err != nil {
		return nil, err
	}
	var out []Parked
	for txid, hi := range all {
		if hi.maxChecks < n.cfg.MaxChecks {
			continue
		}
		p := Parked{TxID: txid, Parts: slices.Clone(hi.parts), Messages: hi.messages, Checks: hi.maxChecks,
			FirstSeen: time.Unix(0, hi.firstSeen)}
		slices.SortFunc(p.Parts, func(a, b Ref) int {
			return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Part, b.Part))
		})
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Parked) int {
		return cmp.Or(a.FirstSeen.Compare(b.FirstSeen), cmp.Compare(a.TxID, b.TxID))
	})
	return out, nil
}

// Pending counts the transactions with undecided half messages.
func (n *Node) Pending() (int, error) {
	all, err := n.halves(context.Background())
	return len(all), err
}

// Resolve is the operator's decision d, Committed or RolledBack, on txid:
// Committed publishes its half messages and the outbox rows its host store
// still holds, RolledBack discards the half messages. It returns the
// decision that stands, which differs from d when the transaction had been
// decided otherwise, and is Undecided when the node knows nothing of txid.
// Committed first reads the transaction's rows from the host stores: a
// store that cannot answer, or a row that cannot be read with ErrCorrupt,
// fails the call, and nothing is decided.
func (n *Node) Resolve(ctx context.Context, txid string, d store.Decision) (store.Decision, error) {
	all, err := n.halves(ctx)
	if err != nil {
		return store.Undecided, err
	}
	var parts []Ref
	if hi := all[txid]; hi != nil {
		parts = hi.parts
	}
	if d == store.RolledBack {
		if len(parts) == 0 {
			return n.Decided(ctx, txid), nil
		}
		standing, err := n.rollback(ctx, txid, parts)
		if err == nil {
			n.cfg.Logger.Info("operator resolved a transaction", "tx", txid, "decision", standing)
		}
		return standing, err
	}
	plan := txPlan{}
	for _, p := range parts {
		plan[p] = nil
	}
	// The outbox rows too: a store that cannot answer or a row that cannot
	// be read fails the call, since committing without rows that exist
	// would lose them for good.
	var owner localtx.Store
	for _, s := range n.storeList() {
		st, rec, err := s.Check(ctx, txid)
		if err != nil {
			return store.Undecided, fmt.Errorf("mq: resolve %s: %w", txid, err)
		}
		if st != localtx.Committed {
			continue
		}
		p, err := planOf(rec)
		if err != nil {
			return store.Undecided, fmt.Errorf("mq: resolve %s: %w", txid, err)
		}
		for ref, msgs := range p {
			plan[ref] = msgs
		}
		owner = s
		break
	}
	if len(plan) == 0 {
		return n.Decided(ctx, txid), nil
	}
	// Held even without a marker found: one may appear yet, from a
	// transaction still running; the next sweep lets it go if none does.
	n.cfg.Prune.hold(txid, n.cfg.Clock, decidedAnyTime)
	standing, err := n.commit(ctx, txid, plan)
	if err != nil {
		return standing, err
	}
	n.cfg.Logger.Info("operator resolved a transaction", "tx", txid, "decision", standing)
	if owner != nil {
		n.forgetLater(owner, txid)
	}
	return standing, nil
}

// Decided returns the decision recorded for txid in any partition, or
// Undecided; Undecided too for a partition that cannot answer before ctx
// ends.
func (n *Node) Decided(ctx context.Context, txid string) store.Decision {
	d := store.Undecided
	n.eachPartition(func(_ Ref, p Partition) bool {
		d, _ = partition.Decision(ctx, p, txid)
		return d == store.Undecided
	})
	return d
}
