package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// The fault matrix of a DoubleWrite pair, in the manner of the
// Raft3 one (fault_test.go): writers append messages of their own IDs, each
// retried with the same ID until acked, readers read the highest offset
// acked through LeaderPartition, while the test (as the metadata group)
// kills, isolates and promotes; then it heals, and checks the history of
// the partition: every ack in the final log at its offset, acked by the
// replica that led an epoch of an entry holding it, nothing stored twice,
// the replicas alike, the history linearizable (porcupine).

// pairLoad is a pair's clients.
type pairLoad struct {
	*clients
	ps *pairs
	h  *history
}

func startPairLoad(ps *pairs) *pairLoad {
	w := &pairLoad{clients: newClients(ps.t), ps: ps, h: newHistory()}
	w.start(w.send, w.read)
	return w
}

// send appends id until it is acked, at the current leader first.
func (w *pairLoad) send(client int, id string) error {
	deadline := time.Now().Add(patience)
	try := w.ps.current()
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		call := w.h.now()
		res, err := w.ps.send(ctx, try, msg(id))
		ret := w.h.now()
		cancel()
		switch {
		case err == nil && len(res.Acks) == 1:
			w.h.appended(client, id, call, ret, res.Acks[0], w.ps.id(try))
			w.acked.Add(1)
			return nil
		case err == nil:
			return fmt.Errorf("%s: %d acks", id, len(res.Acks))
		case errors.Is(err, ErrUnknownOutcome):
			w.h.unknown(client, id, call)
		case errors.Is(err, ErrNotLeader), errors.Is(err, ErrClosed), errors.Is(err, context.DeadlineExceeded):
		default:
			return fmt.Errorf("send %s to %s: %w", id, w.ps.id(try), err)
		}
		try = w.ps.current()
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("%s not acked within %v", id, patience)
}

// read reads the highest offset acked before the read began (it must find
// it), or the one after it, at whichever replica's LeaderPartition answers.
func (w *pairLoad) read(client int) {
	rng := rand.New(rand.NewPCG(uint64(client), 0))
	for !w.stopped() {
		hi := w.h.highest()
		if hi < 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		off := uint64(hi) + uint64(rng.IntN(2))
		call := w.h.now()
		if id, replica, ok := w.readAt(off, rng.IntN(2)); ok {
			w.h.read(client, off, id, call, w.h.now(), replica)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (w *pairLoad) readAt(off uint64, first int) (string, raft.ServerID, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	for k := range 2 {
		i := (first + k) % 2
		rp := w.ps.rep(i)
		if rp == nil {
			continue
		}
		p, err := rp.LeaderPartition(ctx, 0)
		if err == nil {
			err = rp.Verify(ctx)
		}
		if err != nil {
			continue
		}
		got, err := p.Read(off, 1, 0, nil)
		switch {
		case err != nil:
			return "", "", false
		case len(got) == 0:
			return "", w.ps.id(i), true
		}
		return got[0].ID, w.ps.id(i), true
	}
	return "", "", false
}

// verify heals the pair, stops the clients, and checks the history.
func (w *pairLoad) verify() verdict {
	w.ps.t.Helper()
	w.ps.cut[0].Store(false)
	w.ps.cut[1].Store(false)
	w.ps.rejoin()
	w.halt()
	// The leader applies what it holds once the follower does: a read at
	// the leader sees every acked append.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	leader := w.ps.current()
	if _, err := w.ps.rep(leader).LeaderPartition(ctx, 0); err != nil {
		w.ps.t.Fatalf("settle: %v", err)
	}
	final := w.ps.settle()
	v := w.h.check(w.ps.t, final, w.ps.seenEpochs(), w.ps.leaderOf)
	w.ps.t.Logf("%v; the log holds %d messages, %s", v, len(final), w.ps)
	return v
}

// runPairFaults runs fault times against a loaded pair, healing after each,
// and checks the history.
func runPairFaults(t *testing.T, times int, fault func(ps *pairs, w *pairLoad)) verdict {
	t.Helper()
	// Compacted every few entries, keeping almost none: a replica that
	// comes back, or was cut off, mostly needs a snapshot.
	ps := newPairs(t, func(cfg *PairConfig) { cfg.CompactEvery, cfg.KeepEntries = 8, 2 })
	w := startPairLoad(ps)
	w.progress(30)
	for range times {
		fault(ps, w)
		ps.cut[0].Store(false)
		ps.cut[1].Store(false)
		ps.rejoin()
		w.progress(30)
	}
	return w.verify()
}

// killPairLeader kills the leader, promotes its follower (alone: the risk
// stage) and, after a while, brings the old leader back as its follower.
func killPairLeader(alone bool) func(ps *pairs, w *pairLoad) {
	return func(ps *pairs, w *pairLoad) {
		ps.stop(ps.current())
		ps.promote(alone)
		if alone {
			w.progress(20) // acked on one copy
		} else {
			time.Sleep(50 * time.Millisecond) // nothing can be acked
		}
	}
}

// isolatePairLeader cuts the leader from its follower both ways while the
// clients still reach both, and promotes the follower: the old leader,
// alive, must ack nothing more.
func isolatePairLeader(alone bool) func(ps *pairs, w *pairLoad) {
	return func(ps *pairs, w *pairLoad) {
		ps.cut[0].Store(true)
		ps.cut[1].Store(true)
		time.Sleep(20 * time.Millisecond)
		ps.promote(alone)
		if alone {
			w.progress(20)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
		ps.cut[0].Store(false)
		ps.cut[1].Store(false)
		time.Sleep(20 * time.Millisecond) // the old leader's appends meet the new epoch
	}
}

// TestPairFault runs the pair's fault matrix.
func TestPairFault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		times int
		fault func(ps *pairs, w *pairLoad)
	}{
		{"KillLeader", 6, killPairLeader(false)},
		{"KillLeaderRiskStage", 6, killPairLeader(true)},
		{"IsolateLeader", 4, isolatePairLeader(false)},
		{"IsolateLeaderRiskStage", 4, isolatePairLeader(true)},
		{"KillFollower", 4, func(ps *pairs, w *pairLoad) {
			ps.stop(1 - ps.current())
			time.Sleep(50 * time.Millisecond)
		}},
		{"WipeFollower", 4, func(ps *pairs, w *pairLoad) {
			// A new, empty follower (its disk replaced): it catches up
			// from a snapshot of the leader's.
			f := 1 - ps.current()
			ps.stop(f)
			if err := os.RemoveAll(ps.dirs[f]); err != nil {
				ps.t.Fatal(err)
			}
		}},
		{"CutFollowerLink", 4, func(ps *pairs, w *pairLoad) {
			ps.cut[ps.current()].Store(true)
			time.Sleep(50 * time.Millisecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runPairFaults(t, rounds(tc.times), tc.fault).report(t)
		})
	}
}

// TestPairFault_NegativeControl: the checks fail a proposer that acks each
// entry as soon as it is handed to the pair, before both copies hold it.
func TestPairFault_NegativeControl(t *testing.T) {
	t.Parallel()
	v := runPairFaults(t, 2, func(ps *pairs, w *pairLoad) {
		for i := range 2 {
			if p := ps.rep(i); p != nil {
				p.prop.ackBeforeCommit.Store(true)
			}
		}
		isolatePairLeader(true)(ps, w)
	})
	if v.ok() {
		t.Fatalf("the checks passed a proposer that acks before the commit: %v", v)
	}
	t.Logf("the checks failed the proposer that acks before the commit, as they must: %v", v)
}
