package txn

import (
	"context"
	"fmt"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/store"
)

// checkLoop sweeps the host stores at start and every few check periods,
// and checks back undecided half messages in between.
func (n *Node) checkLoop(ctx context.Context) {
	clk := n.cfg.Clock
	every := min(max(n.cfg.CheckAfter/4, time.Millisecond), time.Second)
	sweepEvery := 5 * n.cfg.CheckAfter
	n.sweep(ctx)
	lastSweep := clk.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-clk.After(every):
		}
		n.checkBack(ctx)
		if now := clk.Now(); now.Sub(lastSweep) >= sweepEvery {
			n.sweep(ctx)
			lastSweep = now
		}
	}
}

// sweep commits the transactions whose marker is still in a host store,
// because a crash came between the host's commit and the queue's or the
// clean-up did not happen yet, and forgets them. Every marker it lists is
// held in the PruneGuard: its decision may be from an earlier run, of
// unknown age. A sweep that listed every store tells the guard which markers
// are gone.
func (n *Node) sweep(ctx context.Context) {
	const page = 256
	guard := n.cfg.Prune
	start := guard.sweepStart()
	listed := map[string]bool{}
	complete := true
	for _, s := range n.storeList() {
		after := ""
		for {
			if ctx.Err() != nil {
				return
			}
			recs, err := s.Committed(ctx, after, page)
			if err != nil {
				if ctx.Err() == nil {
					n.cfg.Logger.Warn("cannot list committed transactions", "err", err)
				}
				complete = false
				break
			}
			for _, rec := range recs {
				after = rec.TxID
				if !n.owns(rec) { // another node's: that node publishes it
					continue
				}
				listed[rec.TxID] = true
				if n.isOpen(rec.TxID) { // its commit hook is on it
					continue
				}
				guard.hold(rec.TxID, n.cfg.Clock, decidedAnyTime)
				if n.publish(ctx, rec) {
					n.forgetLater(s, rec.TxID)
				}
			}
			if len(recs) == 0 { // a page may be short: an adapter bounds its bytes
				break
			}
		}
	}
	if complete {
		guard.swept(start, listed)
	}
}

// owns reports whether the node publishes the transaction of rec: one whose
// marker names this node or no node; a standalone node, without an id,
// publishes every one, its stores being its own. A marker that cannot be
// read is the node's, so that publish reports it.
func (n *Node) owns(rec localtx.Record) bool {
	owner, _, err := decodeMarker(rec.TxID, rec.Marker)
	return err != nil || owner == "" || n.cfg.NodeID == "" || owner == n.cfg.NodeID
}

// publish commits a committed transaction found in a host store, held
// already, and reports whether its marker may be forgotten.
func (n *Node) publish(ctx context.Context, rec localtx.Record) bool {
	plan, err := planOf(rec)
	if err != nil {
		n.cfg.Logger.Error("cannot read a committed transaction's marker; left in place", "tx", rec.TxID, "err", err)
		return false
	}
	if _, err := n.commit(ctx, rec.TxID, plan); err != nil {
		if ctx.Err() == nil {
			n.cfg.Logger.Warn("cannot publish a committed transaction yet", "tx", rec.TxID, "err", err)
		}
		return false
	}
	return true
}

// halfInfo gathers the half messages of one transaction across partitions.
// The transaction's check count is the highest of its partitions': a
// partition whose prepare landed after a check lags behind.
type halfInfo struct {
	producer  string // the node that prepared it: HalfTx.Producer of the first partition seen
	parts     []Ref
	checks    []int // per part
	messages  int
	firstSeen int64
	lastCheck int64
	maxChecks int
}

// halves scans every partition's undecided transactions.
func (n *Node) halves(ctx context.Context) (map[string]*halfInfo, error) { return n.halvesIn(ctx, nil) }

// halvesIn scans the undecided transactions of the partitions in, or of
// every partition if in is nil.
func (n *Node) halvesIn(ctx context.Context, in func(topic string, part int) bool) (map[string]*halfInfo, error) {
	out := map[string]*halfInfo{}
	var err error
	n.eachPartition(func(ref Ref, part Partition) bool {
		if in != nil && !in(ref.Topic, ref.Part) {
			return true
		}
		err = partition.HalfTxs(ctx, part, func(h store.HalfTx) bool {
			hi := out[h.TxID]
			if hi == nil {
				hi = &halfInfo{producer: h.Producer, firstSeen: h.FirstSeen}
				out[h.TxID] = hi
			}
			hi.parts = append(hi.parts, ref)
			hi.checks = append(hi.checks, h.Checks)
			hi.messages += h.Messages
			hi.firstSeen = min(hi.firstSeen, h.FirstSeen)
			hi.lastCheck = max(hi.lastCheck, h.LastCheck)
			hi.maxChecks = max(hi.maxChecks, h.Checks)
			return true
		})
		if err != nil {
			err = fmt.Errorf("half messages of %s/%d: %w", ref.Topic, ref.Part, err)
		}
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachPartition calls fn for every partition of every topic until fn
// returns false. Topics gone or closed meanwhile are passed over.
func (n *Node) eachPartition(fn func(Ref, Partition) bool) {
	for name, count := range n.cfg.Topics.Topics() {
		for i := range count {
			part, err := n.cfg.Topics.Partition(name, i)
			if err != nil {
				break // closed or gone
			}
			if !fn(Ref{Topic: name, Part: i}, part) {
				return
			}
		}
	}
}

// due says whether the transaction, not yet parked, waited long enough for
// its next check-back.
func (n *Node) due(hi *halfInfo) bool {
	cfg := &n.cfg
	if hi.maxChecks >= cfg.MaxChecks {
		return false
	}
	now := n.cfg.Clock.Now().UnixNano()
	if now-hi.firstSeen < int64(cfg.CheckAfter) {
		return false
	}
	if hi.maxChecks == 0 {
		return true
	}
	// CheckAfter doubled at each check, up to max(CheckAfter, 1 min):
	// doubled only while below that bound, so it never wraps around.
	limit, wait := max(cfg.CheckAfter, time.Minute), cfg.CheckAfter
	for i := 1; i < hi.maxChecks && wait < limit; i++ {
		wait *= 2
	}
	return now-hi.lastCheck >= int64(min(wait, limit))
}

// checkBack asks about the transactions whose half messages in this node's
// partitions, as Config.Owned says, are due: the host stores, for a
// transaction this node prepared; its preparer through Config.AskNode, for
// another node's. It counts an unanswered check, and one whose preparer
// cannot be reached: the transaction waits for it, and is parked after
// MaxChecks.
func (n *Node) checkBack(ctx context.Context) {
	all, err := n.halvesIn(ctx, n.cfg.Owned)
	if err != nil {
		if ctx.Err() == nil {
			n.cfg.Logger.Warn("check-back cannot list half messages", "err", err)
		}
		return
	}
	for txid, hi := range all {
		if ctx.Err() != nil {
			return
		}
		if n.due(hi) {
			n.checkOne(ctx, txid, hi)
		}
	}
}

func (n *Node) checkOne(ctx context.Context, txid string, hi *halfInfo) {
	log := n.cfg.Logger
	var d store.Decision
	var err error
	if n.prepared(hi.producer) {
		d, err = n.CheckBack(ctx, txid, hi.parts)
	} else {
		d, err = n.cfg.AskNode(ctx, hi.producer, txid, hi.parts)
		if err != nil {
			log.Warn("check-back cannot ask the node that prepared a transaction", "tx", txid, "node", hi.producer, "err", err)
		}
	}
	if d != store.Undecided || err != nil && n.prepared(hi.producer) {
		return // decided, or this node failed to apply a decision: the next check tries again
	}
	// Count the check on the partitions at the transaction's count, so
	// the count grows by one per unanswered check.
	checks := 0
	for i, ref := range hi.parts {
		if hi.checks[i] < hi.maxChecks {
			continue
		}
		part, err := n.cfg.Topics.Partition(ref.Topic, ref.Part)
		if err != nil {
			continue
		}
		cmd := &store.Command{Op: store.OpTxChecked, TxID: txid}
		res, err := part.Apply(ctx, cmd)
		if err != nil {
			return
		}
		checks = max(checks, res.Count)
	}
	if checks >= n.cfg.MaxChecks {
		log.Warn("transaction parked: no answer from the check-back; decide it with ResolveTx",
			"tx", txid, "checks", checks)
	}
}

// prepared reports whether this node prepared the half messages producer
// names, or cannot tell another node from itself, as a standalone node and
// an engine without AskNode cannot.
func (n *Node) prepared(producer string) bool {
	return n.cfg.AskNode == nil || producer == "" || producer == standaloneProducer || producer == n.producer()
}

// CheckBack decides txid, a transaction this node prepared whose half
// messages are at least in parts, from the host stores. It is committed if
// a store has its marker, and its messages are then published in every
// partition its marker names and in parts; it is rolled back in parts if
// every store says it finished without one. It returns the decision that
// stands, or Undecided while the transaction may still run or a store
// cannot answer, with an error when a decision could not be applied.
func (n *Node) CheckBack(ctx context.Context, txid string, parts []Ref) (store.Decision, error) {
	log := n.cfg.Logger
	st, rec, owner := n.ask(ctx, txid)
	switch st {
	case localtx.Committed:
		plan, err := planOf(rec)
		if err != nil {
			log.Error("check-back cannot read the marker", "tx", txid, "err", err)
			return store.Undecided, err
		}
		for _, p := range parts {
			if _, ok := plan[p]; !ok {
				plan[p] = nil
			}
		}
		n.cfg.Prune.hold(txid, n.cfg.Clock, decidedAnyTime)
		d, err := n.commit(ctx, txid, plan)
		if err != nil {
			log.Warn("check-back commit failed", "tx", txid, "err", err)
			return store.Undecided, err
		}
		log.Info("check-back committed a transaction", "tx", txid)
		n.forgetLater(owner, txid)
		return d, nil
	case localtx.RolledBack:
		d, err := n.rollback(ctx, txid, parts)
		if err != nil {
			log.Warn("check-back rollback failed", "tx", txid, "err", err)
			return store.Undecided, err
		}
		log.Info("check-back rolled back a transaction", "tx", txid)
		return d, nil
	}
	return store.Undecided, nil
}

// ask asks every host store about txid: committed if one has its marker,
// unknown if one says it is running or cannot answer, or if none is known,
// rolled back otherwise. It returns the store that answered committed.
func (n *Node) ask(ctx context.Context, txid string) (localtx.State, localtx.Record, localtx.Store) {
	stores := n.storeList()
	if len(stores) == 0 {
		return localtx.Unknown, localtx.Record{}, nil
	}
	answer := localtx.RolledBack
	for _, s := range stores {
		st, rec, err := s.Check(ctx, txid)
		if err != nil {
			n.cfg.Logger.Warn("check-back failed", "tx", txid, "err", err)
			st = localtx.Unknown
		}
		switch st {
		case localtx.Committed:
			return st, rec, s
		case localtx.Unknown:
			answer = localtx.Unknown
		}
	}
	return answer, localtx.Record{}, nil
}
