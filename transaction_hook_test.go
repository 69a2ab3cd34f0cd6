package mq_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestTransaction_TestHook: the test hook is a setting of one node; a
// transaction of another node in the same process never calls it.
func TestTransaction_TestHook(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	hook := func(point, txid string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, point)
	}
	points := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	send := func(m *mq.MQ, h *txtest.Host) {
		t.Helper()
		mustCreate(t, m, "orders", 1)
		p, err := m.NewProducer("orders")
		if err != nil {
			t.Fatal(err)
		}
		err = h.Run(context.Background(), func(ctx context.Context) error {
			return p.PrepareMessage(ctx, msgs("m", 1)...)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	plainHost := txtest.Bolt(t, filepath.Join(t.TempDir(), "plain.db"))
	hookedHost := txtest.Bolt(t, filepath.Join(t.TempDir(), "hooked.db"))
	hooked := openNode(t, "", mq.WithLocalTx(hookedHost.Store), mq.WithTxTestHook(hook))
	plain := openNode(t, "", mq.WithLocalTx(plainHost.Store))
	send(plain, plainHost)
	if got := points(); len(got) != 0 {
		t.Fatalf("another node's transaction called the hook: %v", got)
	}
	send(hooked, hookedHost)
	want := []string{"sent", "local-committed", "partition-committing", "partition-committed"}
	if got := points(); !slices.Equal(got, want) {
		t.Errorf("hook points %v, want %v", got, want)
	}
}
