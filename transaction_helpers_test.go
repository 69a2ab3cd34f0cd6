package mq_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// txEnv is one node with one host store bound to it.
type txEnv struct {
	m    *mq.MQ
	h    *txtest.Host
	p    *mq.Producer
	col  *collector
	opts []mq.Option
}

func newTxEnv(t *testing.T, adapter string, opts ...mq.Option) *txEnv {
	t.Helper()
	return txEnvOn(t, txtest.Open(t, adapter, filepath.Join(t.TempDir(), "host")), opts...)
}

// txEnvOn is newTxEnv over the host h.
func txEnvOn(t *testing.T, h *txtest.Host, opts ...mq.Option) *txEnv {
	t.Helper()
	opts = append([]mq.Option{mq.WithLocalTx(h.Store), mq.WithTxCheckAfter(50 * time.Millisecond)}, opts...)
	m := openNode(t, "", opts...)
	mustCreate(t, m, "orders", 4)
	p, err := m.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	return &txEnv{m: m, h: h, p: p, col: collect(t, m, "orders", "billing"), opts: opts}
}

// txID returns the id of the transaction carried by ctx.
func txID(t testing.TB, ctx context.Context) string {
	t.Helper()
	tx, ok := localtx.FromContext(ctx)
	if !ok {
		t.Fatal("no transaction in ctx")
	}
	return tx.ID()
}

var errAbort = errors.New("abort")

// checkNone fences the topic and checks none of ids was ever delivered.
func checkNone(t *testing.T, e *txEnv, ids []string) {
	t.Helper()
	fence(t, e.m, e.col, "orders")
	for _, id := range ids {
		if n := e.col.count(id); n != 0 {
			t.Errorf("%s of an aborted transaction delivered %d times", id, n)
		}
	}
}

// fakeTx is a host transaction driven by the test: its hooks never run, as
// if the process died before its outcome. Put writes through put (nil:
// discards, as if the transaction never committed).
type fakeTx struct {
	id  string
	put func(bucket, key, value []byte) error
}

func (f *fakeTx) ID() string { return f.id }

func (f *fakeTx) Put(bucket, key, value []byte) error {
	if f.put == nil {
		return nil
	}
	return f.put(bucket, key, value)
}

func (f *fakeTx) WhileCommit(func()) {}

func (f *fakeTx) WhileRollback(func()) {}

var _ localtx.Tx = (*fakeTx)(nil)

// unknownStore answers every check-back with Unknown, forever.
type unknownStore struct {
	mu     sync.Mutex
	checks map[string]int
}

func (s *unknownStore) Check(_ context.Context, txid string) (localtx.State, localtx.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.checks == nil {
		s.checks = map[string]int{}
	}
	s.checks[txid]++
	return localtx.Unknown, localtx.Record{}, nil
}

func (s *unknownStore) Committed(context.Context, string, int) ([]localtx.Record, error) {
	return nil, nil
}

func (s *unknownStore) Forget(context.Context, []string) error { return nil }

func (s *unknownStore) count(txid string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checks[txid]
}

var _ localtx.Store = (*unknownStore)(nil)

// checkOnce fences the topic and checks each of ids was delivered exactly
// once.
func checkOnce(t *testing.T, e *txEnv, ids []string) {
	t.Helper()
	waitSeen(t, e.col, ids...)
	fence(t, e.m, e.col, "orders")
	for _, id := range ids {
		if n := e.col.count(id); n != 1 {
			t.Errorf("%s delivered %d times, want once", id, n)
		}
	}
}
