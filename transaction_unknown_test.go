package mq_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// newFaultyTxEnv is newTxEnv over an SQLite host whose commits fail on the
// test's command.
func newFaultyTxEnv(t *testing.T, opts ...mq.Option) (*txEnv, *txtest.Faults) {
	t.Helper()
	h, f := txtest.FaultySQLite(t, filepath.Join(t.TempDir(), "host.sqlite"))
	return txEnvOn(t, h, opts...), f
}

// errLostReply stands for a connection reset after COMMIT was sent.
var errLostReply = errors.New("connection reset by peer")

// sendBoth runs one host transaction that writes a business row and sends
// prep as half messages and out through the outbox; it returns the
// transaction's id and Run's error.
func sendBoth(t *testing.T, e *txEnv, ctx context.Context, prep, out []*mq.Message) (string, error) {
	t.Helper()
	var id string
	err := e.h.Run(ctx, func(ctx context.Context) error {
		id = txID(t, ctx)
		if err := e.h.Put(ctx, "order-"+id, "paid"); err != nil {
			return err
		}
		if err := e.p.PrepareMessage(ctx, prep...); err != nil {
			return err
		}
		return e.p.CommitMessage(ctx, out...)
	})
	return id, err
}

// waitDecided waits for the node's decision on txid and fails unless it is
// want.
func waitDecided(t *testing.T, m *mq.MQ, txid string, want mq.TxDecision) {
	t.Helper()
	var d mq.TxDecision
	waitFor(t, 10*time.Second, "a decision on "+txid, func() bool {
		d = mq.TxDecided(m, txid)
		return d != mq.TxUndecided
	})
	if d != want {
		t.Fatalf("transaction %s decided %v, want %v", txid, d, want)
	}
}

// TestTransaction_CommitUnknown: the host's COMMIT returns an error whose
// outcome is unknown. The queue never takes it for a rollback: it reads the
// outcome from the host store (the marker), at once or, while the store
// cannot answer, through the check-back.
func TestTransaction_CommitUnknown(t *testing.T) {
	for _, c := range []struct {
		name      string
		fault     txtest.CommitFault
		err       error
		committed bool
	}{
		{"LostReply", txtest.CommitLostReply, errLostReply, true},
		{"LostReplyBadConn", txtest.CommitLostReply, driver.ErrBadConn, true},
		{"Failed", txtest.CommitFailed, errLostReply, false},
		{"FailedBadConn", txtest.CommitFailed, driver.ErrBadConn, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, f := newFaultyTxEnv(t)
			prep, out := msgs("prep", 3), msgs("out", 2)
			f.NextCommit(c.fault, c.err, false)
			id, err := sendBoth(t, e, context.Background(), prep, out)
			all := append(idsOf(prep), idsOf(out)...)
			if c.committed {
				if err != nil {
					t.Errorf("Run = %v; want nil: the marker says the transaction committed", err)
				}
				waitDecided(t, e.m, id, mq.TxCommit)
				checkOnce(t, e, all)
			} else {
				if !errors.Is(err, c.err) {
					t.Errorf("Run = %v, want the commit's error %v", err, c.err)
				}
				waitDecided(t, e.m, id, mq.TxRollback)
				checkNone(t, e, all)
			}
			if _, ok, _ := e.h.Get("order-" + id); ok != c.committed {
				t.Errorf("business row present %v, want %v", ok, c.committed)
			}
			waitFor(t, 5*time.Second, "markers forgotten", func() bool {
				n, err := e.h.Markers()
				return err == nil && n == 0
			})
		})
	}
}

// TestTransaction_CommitUnknownStoreDown: the host's COMMIT fails
// ambiguously and the store stops answering, so Run cannot read the
// outcome before its ctx ends. The half messages stay undecided; once the
// store is back, the check-back and the sweep read the outcome from it.
func TestTransaction_CommitUnknownStoreDown(t *testing.T) {
	for _, c := range []struct {
		name      string
		fault     txtest.CommitFault
		committed bool
	}{
		{"Committed", txtest.CommitLostReply, true},
		{"NotCommitted", txtest.CommitFailed, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, f := newFaultyTxEnv(t)
			prep, out := msgs("prep", 3), msgs("out", 2)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { // end Run's ctx once it asked the store in vain
				for f.Refused() == 0 {
					time.Sleep(time.Millisecond)
				}
				cancel()
			}()
			f.NextCommit(c.fault, driver.ErrBadConn, true)
			id, err := sendBoth(t, e, ctx, prep, out)
			if !errors.Is(err, localtx.ErrCommitUnknown) || !errors.Is(err, driver.ErrBadConn) {
				t.Fatalf("Run = %v; want ErrCommitUnknown wrapping the commit's error", err)
			}
			if d := mq.TxDecided(e.m, id); d != mq.TxUndecided {
				t.Fatalf("decided %v while the outcome was unknown", d)
			}
			f.SetDown(false)
			all := append(idsOf(prep), idsOf(out)...)
			if c.committed {
				waitDecided(t, e.m, id, mq.TxCommit)
				checkOnce(t, e, all)
			} else {
				waitDecided(t, e.m, id, mq.TxRollback)
				checkNone(t, e, all)
			}
		})
	}
}

// TestTransaction_CommitUnknownClose: the node closes while Run is still
// reading back the outcome of a commit that failed ambiguously; the outcome
// (committed) arrives after Close, and the next Open delivers the
// transaction once.
func TestTransaction_CommitUnknownClose(t *testing.T) {
	h, f := txtest.FaultySQLite(t, filepath.Join(t.TempDir(), "host.sqlite"))
	dir := t.TempDir()
	opts := []mq.Option{mq.WithLocalTx(h.Store), mq.WithTxCheckAfter(50 * time.Millisecond)}
	m1, err := mq.Open(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m1, "orders", 4)
	p, err := m1.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	prep, out := msgs("prep", 2), msgs("out", 2)
	closed := make(chan error, 1)
	go func() { // close the node while Run waits for the store, then bring it back
		for f.Refused() == 0 {
			time.Sleep(time.Millisecond)
		}
		closed <- m1.Close()
		f.SetDown(false)
	}()
	f.NextCommit(txtest.CommitLostReply, driver.ErrBadConn, true)
	e := &txEnv{m: m1, h: h, p: p}
	id, err := sendBoth(t, e, context.Background(), prep, out)
	if err != nil {
		t.Fatalf("Run = %v; want nil: the commit happened", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	m2 := openNode(t, dir, opts...)
	p, err = m2.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	e = &txEnv{m: m2, h: h, p: p, col: collect(t, m2, "orders", "billing")}
	waitDecided(t, e.m, id, mq.TxCommit)
	checkOnce(t, e, append(idsOf(prep), idsOf(out)...))
}

// TestTransaction_CtxEndsBeforeCommit: Run's ctx ends after the sends and
// before the COMMIT, which database/sql then refuses and rolls back. The
// read-back still runs once (past the ended ctx) and finds the rollback.
func TestTransaction_CtxEndsBeforeCommit(t *testing.T) {
	e := newTxEnv(t, "sqlite")
	prep, out := msgs("prep", 2), msgs("out", 2)
	ctx, cancel := context.WithCancel(context.Background())
	var id string
	err := e.h.Run(ctx, func(ctx context.Context) error {
		id = txID(t, ctx)
		if err := e.p.PrepareMessage(ctx, prep...); err != nil {
			return err
		}
		if err := e.p.CommitMessage(ctx, out...); err != nil {
			return err
		}
		cancel()
		return nil
	})
	if err == nil || errors.Is(err, localtx.ErrCommitUnknown) {
		t.Fatalf("Run = %v; want the commit's error, the rollback read back", err)
	}
	waitDecided(t, e.m, id, mq.TxRollback)
	checkNone(t, e, append(idsOf(prep), idsOf(out)...))
}
