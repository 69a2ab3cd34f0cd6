package txn

import (
	"sync"
	"time"
)

// PruneGuard keeps transaction decisions from being pruned while a host
// marker may still need them: a sweep that finds a marker whose decision is
// gone publishes the transaction again. It holds every committed
// transaction whose marker may remain, until a Forget of the marker
// succeeds or a sweep that started later no longer lists it, and allows no
// pruning at all until a sweep has listed every host store since Open and
// since the last store was learned. It is safe for concurrent use.
type PruneGuard struct {
	mu    sync.Mutex        // guards the fields below
	held  map[string]txHold // txid -> hold
	seq   uint64            // of the last hold
	epoch uint64            // stores learned
	whole bool              // a sweep listed every store of the current epoch
}

// txHold is a held transaction: its decisions are no older than since, in
// unix ns, or of unknown age if since is 0. seq orders it against sweeps.
type txHold struct {
	since int64
	seq   uint64
}

// decidedAge says what a commit knows of the transaction's earlier
// decisions, if any.
type decidedAge int

const (
	// decidedFromNow: none predates the hold, as for a transaction of this
	// run committed by its own hook.
	decidedFromNow decidedAge = iota
	// decidedAnyTime: one may be of any age, as for one found in a host store.
	decidedAnyTime
)

// NewPruneGuard returns a guard that allows no pruning until a sweep has
// listed every host store.
func NewPruneGuard() *PruneGuard { return &PruneGuard{held: map[string]txHold{}} }

// hold holds txid before the node commits it and returns the time of the
// hold, read under the lock: an upkeep that computed its cutoff before saw
// a clock no later than it, and the commit's decisions, stamped by their
// partitions after the hold, are no earlier. A transaction held already
// keeps its age: it has been held since before any decision of this run,
// and it had none before unless that hold says so.
func (g *PruneGuard) hold(txid string, clk Clock, age decidedAge) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := clk.Now()
	g.seq++
	h, ok := g.held[txid]
	switch {
	case ok:
	case age == decidedFromNow:
		h.since = now.UnixNano()
	default:
		h.since = 0
	}
	h.seq = g.seq
	g.held[txid] = h
	return now
}

// release lets go of txids: their markers were forgotten.
func (g *PruneGuard) release(txids []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range txids {
		delete(g.held, id)
	}
}

// learned notes a host store new to the node: its markers are unknown.
func (g *PruneGuard) learned() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.epoch++
	g.whole = false
}

// sweepToken is what a sweep's start tells swept.
type sweepToken struct{ seq, epoch uint64 }

func (g *PruneGuard) sweepStart() sweepToken {
	g.mu.Lock()
	defer g.mu.Unlock()
	return sweepToken{seq: g.seq, epoch: g.epoch}
}

// swept takes the listing of a sweep that listed every store: a hold older
// than the sweep whose marker was not listed is gone, since a marker exists
// from the host's commit, before its hold, until a Forget.
func (g *PruneGuard) swept(t sweepToken, listed map[string]bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, h := range g.held {
		if h.seq <= t.seq && !listed[id] {
			delete(g.held, id)
		}
	}
	if t.epoch == g.epoch {
		g.whole = true
	}
}

// DecideTTL returns the DecideTTL of an OpTrim at now: ttl, or more while
// a held transaction's decisions are older than now-ttl, or 0, pruning
// none, while one is of unknown age or no sweep has listed every store yet.
func (g *PruneGuard) DecideTTL(now time.Time, ttl time.Duration) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.whole {
		return 0
	}
	cutoff := now.UnixNano() - int64(ttl)
	for _, h := range g.held {
		if h.since == 0 {
			return 0
		}
		cutoff = min(cutoff, h.since)
	}
	return time.Duration(now.UnixNano() - cutoff)
}
