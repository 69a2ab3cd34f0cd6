package mq_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

var errForget = errors.New("forget failed")

// flakyForget is a host store whose Forget fails while fail is set (after
// forgetting, with forgetFirst), and whose listing fails while listFail is.
// It counts the sweeps' listings.
type flakyForget struct {
	localtx.Store
	fail, forgetFirst, listFail atomic.Bool
	lists                       atomic.Int64
}

func (s *flakyForget) Forget(ctx context.Context, txids []string) error {
	if !s.fail.Load() {
		return s.Store.Forget(ctx, txids)
	}
	if s.forgetFirst.Load() {
		if err := s.Store.Forget(ctx, txids); err != nil {
			return err
		}
	}
	return errForget
}

func (s *flakyForget) Committed(ctx context.Context, after string, max int) ([]localtx.Record, error) {
	s.lists.Add(1)
	if s.listFail.Load() {
		return nil, errForget
	}
	return s.Store.Committed(ctx, after, max)
}

// viaStore is a host transaction that names store as its own, so that the
// node forgets its marker through store.
type viaStore struct {
	localtx.Tx
	store localtx.Store
}

func (v viaStore) Store() localtx.Store { return v.store }

// storedCopies counts the stored copies of each message ID in topic's
// partitions.
func storedCopies(t testing.TB, m *mq.MQ, topic string, parts int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for p := range parts {
		for off := int64(0); ; off++ {
			msg, err := m.ReadMessage(context.Background(), topic, p, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				t.Fatalf("ReadMessage(%s/%d, %d): %v", topic, p, off, err)
			}
			out[msg.ID]++
		}
	}
	return out
}

// pruneEnv is a node on a fake clock whose host store's Forget fails on
// command, with a one-hour decision TTL and a one-minute dedup window.
type pruneEnv struct {
	t     *testing.T
	dir   string
	clk   *retryClock
	h     *txtest.Host
	store *flakyForget
	m     *mq.MQ
	p     *mq.Producer
}

func newPruneEnv(t *testing.T) *pruneEnv {
	e := &pruneEnv{t: t, dir: t.TempDir(), clk: newRetryClock()}
	e.h = txtest.Bolt(t, filepath.Join(t.TempDir(), "host.db"))
	e.store = &flakyForget{Store: e.h.Store}
	e.open()
	mustCreate(t, e.m, "orders", 2)
	e.producer()
	return e
}

func (e *pruneEnv) open() {
	e.t.Helper()
	m, err := mq.Open(e.dir, mq.WithLocalTx(e.store), mq.WithClock(e.clk),
		mq.WithDecisionTTL(time.Hour), mq.WithDedupWindow(time.Minute),
		mq.WithMaintenanceInterval(time.Minute), mq.WithTxCheckAfter(time.Minute))
	if err != nil {
		e.t.Fatal(err)
	}
	e.m = m
	e.t.Cleanup(func() { m.Close() })
}

func (e *pruneEnv) producer() {
	e.t.Helper()
	p, err := e.m.NewProducer("orders")
	if err != nil {
		e.t.Fatal(err)
	}
	e.p = p
}

// reopen closes the node and opens it again on the same clock.
func (e *pruneEnv) reopen() {
	e.t.Helper()
	if err := e.m.Close(); err != nil {
		e.t.Fatal(err)
	}
	e.open()
	e.producer()
}

// send commits one host transaction with a half message on partition 1
// and an outbox message on partition 0, prefix-p and prefix-c, and returns
// its id once both are stored.
func (e *pruneEnv) send(prefix string) string {
	e.t.Helper()
	var id string
	err := e.h.Run(context.Background(), func(ctx context.Context) error {
		real, _ := localtx.FromContext(ctx)
		id = real.ID()
		ctx = localtx.WithTx(ctx, viaStore{real, e.store})
		if err := e.p.PrepareMessage(ctx, (&mq.Message{ID: prefix + "-p", Body: []byte(prefix)}).ToPartition(1)); err != nil {
			return err
		}
		return e.p.CommitMessage(ctx, (&mq.Message{ID: prefix + "-c", Body: []byte(prefix)}).ToPartition(0))
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.waitStored(prefix+"-p", prefix+"-c")
	return id
}

func (e *pruneEnv) waitStored(ids ...string) {
	e.t.Helper()
	waitFor(e.t, 10*time.Second, "messages stored", func() bool {
		got := storedCopies(e.t, e.m, "orders", 2)
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
}

// advanceUntil moves the clock a minute at a time until cond holds.
func (e *pruneEnv) advanceUntil(what string, cond func() bool) {
	e.t.Helper()
	waitFor(e.t, 60*time.Second, what, func() bool {
		e.clk.Advance(time.Minute)
		return cond()
	})
}

// sweeps advances the clock until the node swept its host store n more
// times.
func (e *pruneEnv) sweeps(n int64) {
	e.t.Helper()
	from := e.store.lists.Load()
	e.advanceUntil("sweeps", func() bool { return e.store.lists.Load() >= from+n })
}

// checkOnce fails unless each of ids is stored exactly once.
func (e *pruneEnv) checkOnce(ids ...string) {
	e.t.Helper()
	got := storedCopies(e.t, e.m, "orders", 2)
	for _, id := range ids {
		if got[id] != 1 {
			e.t.Errorf("%s stored %d times, want once", id, got[id])
		}
	}
}

// TestTransaction_PruneWhileMarked: a committed transaction whose marker
// the host store cannot forget keeps its decision past the decision TTL,
// whatever else is pruned, so that the sweep that finds the marker again
// never publishes its outbox a second time, in the same run or after a
// restart. Once the marker is forgotten, the decision goes.
func TestTransaction_PruneWhileMarked(t *testing.T) {
	e := newPruneEnv(t)
	// y's marker is forgotten at once; x's stays.
	y := e.send("y")
	waitFor(t, 10*time.Second, "y's marker forgotten", func() bool {
		n, err := e.h.Markers()
		return err == nil && n == 0
	})
	e.clk.Advance(time.Second)
	e.store.fail.Store(true)
	x := e.send("x")

	// Past the TTL and the dedup window, y's decision goes; x's stays and
	// the sweeps that find x's marker publish nothing again.
	e.advanceUntil("y's decision pruned", func() bool { return mq.TxDecided(e.m, y) == mq.TxUndecided })
	e.sweeps(3)
	e.checkOnce("x-p", "x-c", "y-p", "y-c")
	if d := mq.TxDecided(e.m, x); d != mq.TxCommit {
		t.Fatalf("x, still marked, decided %v after the TTL; want its commit kept", d)
	}

	// After a restart too, with the clock well past the TTL.
	e.reopen()
	e.sweeps(3)
	e.clk.Advance(3 * time.Hour)
	e.sweeps(3)
	e.checkOnce("x-p", "x-c", "y-p", "y-c")
	if d := mq.TxDecided(e.m, x); d != mq.TxCommit {
		t.Fatalf("x, still marked, decided %v after a restart; want its commit kept", d)
	}

	// Once the marker is forgotten, the decision is pruned like any other,
	// and nothing is published again.
	e.store.fail.Store(false)
	e.advanceUntil("x's decision pruned", func() bool { return mq.TxDecided(e.m, x) == mq.TxUndecided })
	if n, err := e.h.Markers(); err != nil || n != 0 {
		t.Errorf("markers %d, %v after x's decision was pruned; want 0", n, err)
	}
	e.sweeps(3)
	e.checkOnce("x-p", "x-c", "y-p", "y-c")
}

// TestTransaction_PruneForgetLost: a Forget that deleted the marker but
// returned an error holds the decision only until a sweep finds the marker
// gone; then it is pruned like any other.
func TestTransaction_PruneForgetLost(t *testing.T) {
	e := newPruneEnv(t)
	e.store.fail.Store(true)
	e.store.forgetFirst.Store(true)
	x := e.send("x")
	waitFor(t, 10*time.Second, "x's marker deleted", func() bool {
		n, err := e.h.Markers()
		return err == nil && n == 0
	})
	e.advanceUntil("x's decision pruned", func() bool { return mq.TxDecided(e.m, x) == mq.TxUndecided })
	e.sweeps(3)
	e.checkOnce("x-p", "x-c")
}

// TestTransaction_PruneStoreDown: after a restart no decision is pruned
// before a sweep has listed the host store, however long it cannot answer:
// a marker it holds may need one.
func TestTransaction_PruneStoreDown(t *testing.T) {
	e := newPruneEnv(t)
	e.store.fail.Store(true)
	x := e.send("x")
	e.store.listFail.Store(true)
	e.reopen()
	e.clk.Advance(3 * time.Hour)
	e.sweeps(3) // failed listings
	e.clk.Advance(3 * time.Hour)
	e.sweeps(3)
	if d := mq.TxDecided(e.m, x); d != mq.TxCommit {
		t.Fatalf("x decided %v while its store could not be listed; want its commit kept", d)
	}
	e.store.listFail.Store(false)
	e.store.fail.Store(false)
	e.advanceUntil("x's decision pruned", func() bool { return mq.TxDecided(e.m, x) == mq.TxUndecided })
	e.sweeps(3)
	e.checkOnce("x-p", "x-c")
}
