package mq_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestTransaction is the conformance suite of transactional sends: every
// case runs against each localtx adapter.
func TestTransaction(t *testing.T) {
	cases := []struct {
		name string
		fn   func(t *testing.T, e *txEnv)
	}{
		{"Commit", testTxCommit},
		{"Rollback", testTxRollback},
		{"Panic", testTxPanic},
		{"SeveralPrepares", testTxSeveralPrepares},
		{"Mixed", testTxMixed},
		{"Redo", testTxRedo},
		{"Delayed", testTxDelayed},
		{"OutsideTransaction", testTxOutside},
		{"LongRunning", testTxLongRunning},
	}
	for _, adapter := range txtest.Names {
		t.Run(adapter, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					c.fn(t, newTxEnv(t, adapter))
				})
			}
		})
	}
}

func testTxCommit(t *testing.T, e *txEnv) {
	prep, out := msgs("prep", 3), msgs("out", 2)
	var id string
	err := e.h.Run(context.Background(), func(ctx context.Context) error {
		id = txID(t, ctx)
		if err := e.h.Put(ctx, "order-1", "paid"); err != nil {
			return err
		}
		if err := e.p.PrepareMessage(ctx, prep...); err != nil {
			return err
		}
		return e.p.CommitMessage(ctx, out...)
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	all := append(idsOf(prep), idsOf(out)...)
	waitSeen(t, e.col, all...)
	fence(t, e.m, e.col, "orders")
	for id, n := range e.col.ids() {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	for _, m := range append(prep, out...) {
		if got := e.col.byID(m.ID); got == nil || string(got.Body) != string(m.Body) || got.Key != m.Key || got.PartitionIndex != m.PartitionIndex {
			t.Errorf("delivered %+v, sent %+v", got, m)
		}
	}
	// The marker and outbox rows are forgotten once the decision is durable.
	waitFor(t, 5*time.Second, "markers forgotten", func() bool {
		n, err := e.h.Markers()
		return err == nil && n == 0
	})
	// A late decision changes nothing and says what stands.
	if d, err := e.m.ResolveTx(context.Background(), id, mq.TxRollback); err != nil || d != mq.TxCommit {
		t.Errorf("ResolveTx(rollback) after commit = %v, %v; want commit", d, err)
	}
	if u, err := e.m.UnresolvedTxs(context.Background()); err != nil || len(u) != 0 {
		t.Errorf("UnresolvedTxs = %v, %v", u, err)
	}
}

func testTxRollback(t *testing.T, e *txEnv) {
	prep, out := msgs("prep", 3), msgs("out", 2)
	var id string
	err := e.h.Run(context.Background(), func(ctx context.Context) error {
		id = txID(t, ctx)
		if err := e.h.Put(ctx, "order-1", "paid"); err != nil {
			return err
		}
		if err := e.p.PrepareMessage(ctx, prep...); err != nil {
			return err
		}
		if err := e.p.CommitMessage(ctx, out...); err != nil {
			return err
		}
		return errAbort
	})
	if !errors.Is(err, errAbort) {
		t.Fatalf("Run = %v, want %v", err, errAbort)
	}
	checkNone(t, e, append(idsOf(prep), idsOf(out)...))
	if _, ok, _ := e.h.Get("order-1"); ok {
		t.Error("business row of the rolled back transaction is there")
	}
	if d, err := e.m.ResolveTx(context.Background(), id, mq.TxCommit); err != nil || d != mq.TxRollback {
		t.Errorf("ResolveTx(commit) after rollback = %v, %v; want rollback", d, err)
	}
	checkNone(t, e, idsOf(prep))
}

func testTxPanic(t *testing.T, e *txEnv) {
	prep, out := msgs("prep", 2), msgs("out", 2)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the panic to go on", r)
			}
		}()
		e.h.Run(context.Background(), func(ctx context.Context) error {
			if err := e.p.PrepareMessage(ctx, prep...); err != nil {
				return err
			}
			if err := e.p.CommitMessage(ctx, out...); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	checkNone(t, e, append(idsOf(prep), idsOf(out)...))
}

func testTxSeveralPrepares(t *testing.T, e *txEnv) {
	mustCreate(t, e.m, "audit", 2)
	audit, err := e.m.NewProducer("audit")
	if err != nil {
		t.Fatal(err)
	}
	auditCol := collect(t, e.m, "audit", "billing")
	var sent []*mq.Message
	err = e.h.Run(context.Background(), func(ctx context.Context) error {
		for call := range 3 {
			batch := msgs(fmt.Sprint("call", call), 4)
			for i, m := range batch {
				m.ToPartition((i + call) % 4)
			}
			sent = append(sent, batch...)
			if err := e.p.PrepareMessage(ctx, batch...); err != nil {
				return err
			}
		}
		return audit.PrepareMessage(ctx, msgs("audit", 3)...)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSeen(t, e.col, idsOf(sent)...)
	waitSeen(t, auditCol, idsOf(msgs("audit", 3))...)
	// Per partition, the half messages keep their prepare order.
	last := map[int]int64{}
	for _, m := range sent {
		got := e.col.byID(m.ID)
		if prev, ok := last[got.PartitionIndex]; ok && got.Offset != prev+1 {
			t.Errorf("%s at %d/%d, want right after %d", m.ID, got.PartitionIndex, got.Offset, prev)
		}
		last[got.PartitionIndex] = got.Offset
	}
}

func testTxMixed(t *testing.T, e *txEnv) {
	// Half messages, outbox messages and more half messages in one
	// partition, with a plain send in between: the transaction's messages
	// get their offsets at commit, together, halves first.
	var plain *mq.Message
	p1, out, p2 := msgs("p1", 2), msgs("out", 2), msgs("p2", 1)
	for _, m := range append(append(append([]*mq.Message{}, p1...), out...), p2...) {
		m.ToPartition(1)
	}
	err := e.h.Run(context.Background(), func(ctx context.Context) error {
		if err := e.p.PrepareMessage(ctx, p1...); err != nil {
			return err
		}
		if err := e.p.CommitMessage(ctx, out...); err != nil {
			return err
		}
		plain = (&mq.Message{ID: "plain", Body: []byte("plain")}).ToPartition(1)
		if _, err := e.p.SendMessage(ctx, plain); err != nil {
			return err
		}
		waitSeen(t, e.col, "plain")
		if n := e.col.count("p1-0"); n != 0 {
			t.Error("a half message is visible before the commit")
		}
		return e.p.PrepareMessage(ctx, p2...)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"p1-0", "p1-1", "p2-0", "out-0", "out-1"}
	waitSeen(t, e.col, want...)
	base := e.col.byID("plain").Offset
	for i, id := range want {
		if got := e.col.byID(id); got.Offset != base+1+int64(i) {
			t.Errorf("%s at offset %d, want %d", id, got.Offset, base+1+int64(i))
		}
	}
}

func testTxRedo(t *testing.T, e *txEnv) {
	attempt := 0
	var ids []string
	err := e.h.Run(context.Background(), func(ctx context.Context) error {
		attempt++
		ids = append(ids, txID(t, ctx))
		prefix := fmt.Sprint("a", attempt)
		if err := e.p.PrepareMessage(ctx, msgs(prefix+"p", 2)...); err != nil {
			return err
		}
		if err := e.p.CommitMessage(ctx, msgs(prefix+"c", 2)...); err != nil {
			return err
		}
		if attempt == 1 {
			return localtx.ErrRedo
		}
		return nil
	})
	if err != nil || attempt != 2 {
		t.Fatalf("Run = %v after %d attempts", err, attempt)
	}
	waitSeen(t, e.col, append(idsOf(msgs("a2p", 2)), idsOf(msgs("a2c", 2))...)...)
	checkNone(t, e, append(idsOf(msgs("a1p", 2)), idsOf(msgs("a1c", 2))...))
	if d, _ := e.m.ResolveTx(context.Background(), ids[0], mq.TxCommit); d != mq.TxRollback {
		t.Errorf("the redone attempt stands as %v, want rollback", d)
	}
}

func testTxDelayed(t *testing.T, e *txEnv) {
	const delay = 300 * time.Millisecond
	run := func(prefix string, fail error) {
		err := e.h.Run(context.Background(), func(ctx context.Context) error {
			p, c := msgs(prefix+"p", 1), msgs(prefix+"c", 1)
			p[0].DeliverAfter(delay)
			c[0].DeliverAfter(delay)
			if err := e.p.PrepareMessage(ctx, p...); err != nil {
				return err
			}
			if err := e.p.CommitMessage(ctx, c...); err != nil {
				return err
			}
			return fail
		})
		if !errors.Is(err, fail) {
			t.Fatalf("Run = %v, want %v", err, fail)
		}
	}
	start := time.Now()
	run("ok", nil)
	run("bad", errAbort)
	waitSeen(t, e.col, "okp-0", "okc-0")
	if d := time.Since(start); d < delay-10*time.Millisecond {
		t.Errorf("delayed messages delivered after %v, want at least %v", d, delay)
	}
	checkNone(t, e, []string{"badp-0", "badc-0"})
}

// testTxLongRunning: a transaction still running long after TxCheckAfter is
// asked about again and again, never rolled back, and commits normally.
func testTxLongRunning(t *testing.T, e *txEnv) {
	prep := msgs("long", 2)
	err := e.h.Run(context.Background(), func(ctx context.Context) error {
		if err := e.p.PrepareMessage(ctx, prep...); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond) // six check periods
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSeen(t, e.col, idsOf(prep)...)
}

func testTxOutside(t *testing.T, e *txEnv) {
	ctx := context.Background()
	if err := e.p.PrepareMessage(ctx, msgs("x", 1)...); !errors.Is(err, mq.ErrNotInTransaction) {
		t.Errorf("PrepareMessage outside a transaction = %v", err)
	}
	if err := e.p.CommitMessage(ctx, msgs("x", 1)...); !errors.Is(err, mq.ErrNotInTransaction) {
		t.Errorf("CommitMessage outside a transaction = %v", err)
	}
	closed, _ := e.m.NewProducer("orders")
	closed.Close()
	err := e.h.Run(ctx, func(ctx context.Context) error {
		if err := closed.PrepareMessage(ctx, msgs("x", 1)...); !errors.Is(err, mq.ErrClosed) {
			t.Errorf("PrepareMessage of a closed producer = %v", err)
		}
		if err := e.p.PrepareMessage(ctx, nil); !errors.Is(err, mq.ErrNilMessage) {
			t.Errorf("PrepareMessage(nil) = %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkNone(t, e, []string{"x-0"})
}

// TestTransaction_Parked: a host store that answers unknown forever gets
// TxMaxChecks check-backs; then the transaction is listed as unresolved and
// waits for the operator, whose decision delivers or discards it.
func TestTransaction_Parked(t *testing.T) {
	const maxChecks = 3
	us := &unknownStore{}
	m := openNode(t, "", mq.WithLocalTx(us), mq.WithTxCheckAfter(5*time.Millisecond), mq.WithTxMaxChecks(maxChecks))
	mustCreate(t, m, "orders", 4)
	p, _ := m.NewProducer("orders")
	col := collect(t, m, "orders", "billing")
	ctx := context.Background()
	deliver, discard := msgs("deliver", 3), msgs("discard", 2)
	start := time.Now()
	if err := p.PrepareMessage(localtx.WithTx(ctx, &fakeTx{id: "tx-deliver"}), deliver...); err != nil {
		t.Fatal(err)
	}
	if err := p.PrepareMessage(localtx.WithTx(ctx, &fakeTx{id: "tx-discard"}), discard...); err != nil {
		t.Fatal(err)
	}
	var parked []mq.UnresolvedTx
	waitFor(t, 10*time.Second, "two parked transactions", func() bool {
		var err error
		parked, err = m.UnresolvedTxs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(parked) == 2
	})
	for _, u := range parked {
		want := 3
		if u.TxID == "tx-discard" {
			want = 2
		}
		if u.Checks != maxChecks || u.Messages != want || u.Age <= 0 || u.Age > time.Since(start)+time.Second || len(u.Partitions) == 0 {
			t.Errorf("parked %+v: want %d checks, %d messages, an age, partitions", u, maxChecks, want)
		}
	}
	// Parked means no more check-backs.
	n := us.count("tx-deliver")
	if n != maxChecks {
		t.Errorf("%d check-backs, want %d", n, maxChecks)
	}
	time.Sleep(50 * time.Millisecond) // ten check periods: nothing may happen
	if again := us.count("tx-deliver"); again != n {
		t.Errorf("a parked transaction was checked again: %d -> %d", n, again)
	}
	fence(t, m, col, "orders")
	if len(col.ids()) != 4 {
		t.Errorf("half messages visible before the operator decided: %v", col.ids())
	}

	if d, err := m.ResolveTx(ctx, "tx-deliver", mq.TxCommit); err != nil || d != mq.TxCommit {
		t.Fatalf("ResolveTx(commit) = %v, %v", d, err)
	}
	if d, err := m.ResolveTx(ctx, "tx-discard", mq.TxRollback); err != nil || d != mq.TxRollback {
		t.Fatalf("ResolveTx(rollback) = %v, %v", d, err)
	}
	waitSeen(t, col, idsOf(deliver)...)
	checkNone(t, &txEnv{m: m, col: col}, idsOf(discard))
	if u, _ := m.UnresolvedTxs(context.Background()); len(u) != 0 {
		t.Errorf("still unresolved: %+v", u)
	}
	// The first decision stands.
	if d, _ := m.ResolveTx(ctx, "tx-deliver", mq.TxRollback); d != mq.TxCommit {
		t.Errorf("second ResolveTx = %v, want commit", d)
	}
	if d, _ := m.ResolveTx(ctx, "tx-discard", mq.TxCommit); d != mq.TxRollback {
		t.Errorf("second ResolveTx = %v, want rollback", d)
	}
	if d, _ := m.ResolveTx(ctx, "tx-never", mq.TxCommit); d != mq.TxUndecided {
		t.Errorf("ResolveTx of an unknown transaction = %v", d)
	}
	if _, err := m.ResolveTx(ctx, "tx-deliver", mq.TxUndecided); !errors.Is(err, mq.ErrInvalidOption) {
		t.Errorf("ResolveTx(undecided) = %v", err)
	}
}

// TestTransaction_CheckBack: half messages whose hooks never run (the
// process "died") are committed when the host store holds the marker and
// rolled back when it does not, once TxCheckAfter has passed.
func TestTransaction_CheckBack(t *testing.T) {
	for _, adapter := range txtest.Names {
		t.Run(adapter, func(t *testing.T) {
			e := newTxEnv(t, adapter)
			ctx := context.Background()
			// A committed transaction of an earlier run: its marker and
			// outbox rows were written by a real transaction of the host
			// store, whose hooks ran nothing.
			var committedID string
			err := e.h.Run(ctx, func(ctx context.Context) error {
				real, _ := localtx.FromContext(ctx)
				committedID = real.ID()
				fake := &fakeTx{id: real.ID(), put: real.Put}
				fctx := localtx.WithTx(ctx, fake)
				if err := e.p.PrepareMessage(fctx, msgs("cp", 2)...); err != nil {
					return err
				}
				return e.p.CommitMessage(fctx, msgs("cc", 2)...)
			})
			if err != nil {
				t.Fatal(err)
			}
			// One that never committed: nothing reached the host store.
			if err := e.p.PrepareMessage(localtx.WithTx(ctx, &fakeTx{id: "0123456789abcdef-77"}), msgs("rp", 2)...); err != nil {
				t.Fatal(err)
			}
			waitSeen(t, e.col, "cp-0", "cp-1", "cc-0", "cc-1")
			waitFor(t, 5*time.Second, "markers forgotten", func() bool {
				n, err := e.h.Markers()
				return err == nil && n == 0
			})
			waitFor(t, 5*time.Second, "rollback of the uncommitted one", func() bool {
				return mq.TxDecided(e.m, "0123456789abcdef-77") == mq.TxRollback
			})
			checkNone(t, e, []string{"rp-0", "rp-1"})
			if d, _ := e.m.ResolveTx(ctx, committedID, mq.TxRollback); d != mq.TxCommit {
				t.Errorf("check-back decision of the committed one = %v", d)
			}
		})
	}
}

// TestTransaction_OutboxOnRestart: outbox rows of a transaction that
// committed in the host store just before a crash are published when the
// node opens again, long before any check-back.
func TestTransaction_OutboxOnRestart(t *testing.T) {
	for _, adapter := range txtest.Names {
		t.Run(adapter, func(t *testing.T) {
			h := txtest.Open(t, adapter, filepath.Join(t.TempDir(), "host"))
			dir := t.TempDir()
			ctx := context.Background()
			m1, err := mq.Open(dir, mq.WithLocalTx(h.Store))
			if err != nil {
				t.Fatal(err)
			}
			mustCreate(t, m1, "orders", 4)
			p, _ := m1.NewProducer("orders")
			err = h.Run(ctx, func(ctx context.Context) error {
				real, _ := localtx.FromContext(ctx)
				fctx := localtx.WithTx(ctx, &fakeTx{id: real.ID(), put: real.Put})
				if err := p.PrepareMessage(fctx, msgs("half", 2)...); err != nil {
					return err
				}
				return p.CommitMessage(fctx, msgs("outbox", 3)...)
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := m1.Close(); err != nil {
				t.Fatal(err)
			}
			m2 := openNode(t, dir, mq.WithLocalTx(h.Store), mq.WithTxCheckAfter(time.Hour))
			col := collect(t, m2, "orders", "billing")
			want := append(idsOf(msgs("half", 2)), idsOf(msgs("outbox", 3))...)
			waitSeen(t, col, want...)
			waitFor(t, 5*time.Second, "markers forgotten", func() bool {
				n, err := h.Markers()
				return err == nil && n == 0
			})
			fence(t, m2, col, "orders")
			if got := len(col.ids()); got != len(want)+4 {
				t.Errorf("%d distinct messages, want %d and 4 fences", got, len(want))
			}
		})
	}
}

// TestTransaction_Property runs seeded random schedules: concurrent
// transactions that commit, fail, panic or redo, with Prepare and
// CommitMessage mixed, while consumers come and go. No consumer may ever see
// a message of a transaction that did not commit, and every committed
// message must be seen, by the single-consumer group exactly once.
func TestTransaction_Property(t *testing.T) {
	seeds := 10
	if testing.Short() {
		seeds = 2
	}
	for seed := 1; seed <= seeds; seed++ {
		adapter := txtest.Names[seed%len(txtest.Names)]
		t.Run(fmt.Sprintf("seed%d-%s", seed, adapter), func(t *testing.T) {
			propertyRun(t, uint64(seed), adapter)
		})
	}
}

func propertyRun(t *testing.T, seed uint64, adapter string) {
	e := newTxEnv(t, adapter, mq.WithTxCheckAfter(20*time.Millisecond))
	ctx := context.Background()
	rng := newRand(seed)
	const workers, perWorker = 4, 15

	// A second group whose membership changes during the run.
	churn := &collector{}
	var churnMu sync.Mutex
	var churners []*mq.Consumer
	addChurner := func() {
		c, err := e.m.NewConsumer("orders", "churn", churn)
		if err != nil {
			t.Error(err)
			return
		}
		churnMu.Lock()
		churners = append(churners, c)
		churnMu.Unlock()
	}
	addChurner()
	t.Cleanup(func() {
		for _, c := range churners {
			c.Close()
		}
	})

	type plan struct {
		outcome  int // 0 commit, 1 error, 2 panic, 3 redo then commit
		prepares []int
		commits  []int
	}
	plans := make([][]plan, workers)
	for w := range plans {
		for range perWorker {
			p := plan{outcome: []int{0, 0, 0, 1, 2, 3}[rng.IntN(6)]}
			for range rng.IntN(3) {
				p.prepares = append(p.prepares, 1+rng.IntN(3))
			}
			for range rng.IntN(3) {
				p.commits = append(p.commits, 1+rng.IntN(3))
			}
			plans[w] = append(plans[w], p)
		}
	}

	var mu sync.Mutex
	committed := map[string]bool{} // message ID -> its transaction committed
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, pl := range plans[w] {
				attempt := 0
				var lastIDs []string
				var err error
				func() {
					defer func() {
						if r := recover(); r != nil && r != "boom" {
							panic(r)
						}
					}()
					err = e.h.Run(ctx, func(ctx context.Context) error {
						attempt++
						lastIDs = nil
						send := func(calls []int, fn func(context.Context, ...*mq.Message) error, kind string) error {
							for c, n := range calls {
								batch := msgs(fmt.Sprintf("w%d-t%d-a%d-%s%d", w, i, attempt, kind, c), n)
								mu.Lock()
								for _, m := range batch {
									committed[m.ID] = false
								}
								mu.Unlock()
								if err := fn(ctx, batch...); err != nil {
									return err
								}
								lastIDs = append(lastIDs, idsOf(batch)...)
							}
							return nil
						}
						if err := send(pl.prepares, e.p.PrepareMessage, "p"); err != nil {
							return err
						}
						if err := send(pl.commits, e.p.CommitMessage, "c"); err != nil {
							return err
						}
						switch {
						case pl.outcome == 1:
							return errAbort
						case pl.outcome == 2:
							panic("boom")
						case pl.outcome == 3 && attempt == 1:
							return localtx.ErrRedo
						}
						return nil
					})
				}()
				if pl.outcome == 0 || pl.outcome == 3 {
					if err != nil {
						t.Errorf("worker %d tx %d: %v", w, i, err)
						continue
					}
					mu.Lock()
					for _, id := range lastIDs {
						committed[id] = true
					}
					mu.Unlock()
				}
				if w == 0 && i%5 == 4 { // consumers come and go
					churnMu.Lock()
					if len(churners) > 1 {
						churners[0].Close()
						churners = churners[1:]
					}
					churnMu.Unlock()
					addChurner()
				}
			}
		}()
	}
	wg.Wait()

	var want []string
	for id, ok := range committed {
		if ok {
			want = append(want, id)
		}
	}
	sort.Strings(want)
	waitSeen(t, e.col, want...)
	waitSeen(t, churn, want...)
	fence(t, e.m, e.col, "orders")
	fence(t, e.m, churn, "orders")
	// Half messages of aborted transactions may only be left for the
	// check-back if a hook failed; wait until none is left and fence again.
	waitFor(t, 5*time.Second, "no half messages left", func() bool {
		u, err := e.m.UnresolvedTxs(context.Background())
		return err == nil && len(u) == 0
	})
	fence(t, e.m, e.col, "orders")
	for _, col := range []*collector{e.col, churn} {
		for id, n := range col.ids() {
			if strings.HasPrefix(id, "w") && !committed[id] {
				t.Errorf("seed %d: %s of an uncommitted transaction delivered", seed, id)
			}
			if col == e.col && n != 1 {
				t.Errorf("seed %d: %s delivered %d times to the single consumer", seed, id, n)
			}
		}
	}
	t.Logf("seed %d: %d messages sent, %d committed", seed, len(committed), len(want))
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0)) }

func TestOpen_TxOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  mq.Option
	}{
		{"CheckAfterZero", mq.WithTxCheckAfter(0)},
		{"CheckAfterBelow1ms", mq.WithTxCheckAfter(time.Millisecond - 1)},
		{"CheckAfterPast7Days", mq.WithTxCheckAfter(7*24*time.Hour + 1)},
		{"CheckAfterHuge", mq.WithTxCheckAfter(math.MaxInt64)},
		{"MaxChecksZero", mq.WithTxMaxChecks(0)},
		{"NilLocalTx", mq.WithLocalTx(nil)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if m, err := mq.Open(t.TempDir(), c.opt); !errors.Is(err, mq.ErrInvalidOption) {
				if err == nil {
					m.Close()
				}
				t.Errorf("Open = %v, want ErrInvalidOption", err)
			}
		})
	}
}

func TestMQ_UnresolvedTxs(t *testing.T) {
	t.Run("ErrClosed", func(t *testing.T) {
		m, err := mq.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
		if _, err := m.UnresolvedTxs(context.Background()); !errors.Is(err, mq.ErrClosed) {
			t.Errorf("UnresolvedTxs after Close = %v", err)
		}
		if _, err := m.ResolveTx(context.Background(), "x", mq.TxCommit); !errors.Is(err, mq.ErrClosed) {
			t.Errorf("ResolveTx after Close = %v", err)
		}
	})
}

// TestTransaction_ForgetAfterSync: with WithSyncInterval a decision is
// acknowledged before its fsync, so the marker is kept until the decision
// has been synced.
func TestTransaction_ForgetAfterSync(t *testing.T) {
	e := newTxEnv(t, "bolt", mq.WithSyncInterval(time.Second))
	err := e.h.Run(context.Background(), func(ctx context.Context) error {
		return e.p.CommitMessage(ctx, msgs("m", 1)...)
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitSeen(t, e.col, "m-0")
	if n, err := e.h.Markers(); err != nil || n != 1 {
		t.Fatalf("markers right after the commit: %d, %v; want 1 until the sync", n, err)
	}
	waitFor(t, 10*time.Second, "markers forgotten", func() bool {
		n, err := e.h.Markers()
		return err == nil && n == 0
	})
	if d := time.Since(start); d < 2*time.Second-100*time.Millisecond {
		t.Errorf("marker forgotten after %v, before two sync intervals", d)
	}
}
