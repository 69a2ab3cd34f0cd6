package mq_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// sendCut runs one host transaction like sendBoth, with the proxy armed
// with fault for its COMMIT (the connection that carried its id), and
// checks that the fault fired on it.
func sendCut(t *testing.T, e *txEnv, px *txtest.Proxy, fault txtest.ProxyFault, prep, out []*mq.Message) (string, error) {
	t.Helper()
	var id string
	err := e.h.Run(context.Background(), func(ctx context.Context) error {
		id = txID(t, ctx)
		px.Arm(fault, id) // the marker, written below, carries the id
		if err := e.h.Put(ctx, "order-"+id, "paid"); err != nil {
			return err
		}
		if err := e.p.PrepareMessage(ctx, prep...); err != nil {
			return err
		}
		return e.p.CommitMessage(ctx, out...)
	})
	if px.Armed() {
		t.Fatalf("the proxy's %v did not fire on the COMMIT of %s (Run = %v)", fault, id, err)
	}
	return id, err
}

// TestTransaction_LostCommitOnServer: a node over a PostgreSQL or MySQL host
// reached through a proxy that breaks the connection carrying a COMMIT. A
// commit whose reply was lost after the server committed delivers every
// message of the transaction once; a connection cut before the COMMIT
// reached the server delivers none, even after the check-back. Both
// transactions run on the same node, so a read-back that answers the same
// whatever the store says fails one of them.
func TestTransaction_LostCommitOnServer(t *testing.T) {
	for _, server := range []string{"postgres", "mysql"} {
		t.Run(server, func(t *testing.T) {
			h, px := txtest.ProxiedServer(t, server, filepath.Join(t.TempDir(), "host"))
			const checkAfter = 50 * time.Millisecond
			m := openNode(t, "", mq.WithLocalTx(h.Store), mq.WithTxCheckAfter(checkAfter))
			mustCreate(t, m, "orders", 2)
			p, err := m.NewProducer("orders")
			if err != nil {
				t.Fatal(err)
			}
			e := &txEnv{m: m, h: h, p: p, col: collect(t, m, "orders", "billing")}
			spread := func(ms []*mq.Message) []*mq.Message { // over both partitions
				for i, msg := range ms {
					msg.ToPartition(i % 2)
				}
				return ms
			}

			// The server committed; its reply was lost.
			prep, out := spread(msgs("prep", 4)), spread(msgs("out", 4))
			id, err := sendCut(t, e, px, txtest.DropCommitReply, prep, out)
			if err != nil {
				t.Errorf("Run = %v; want nil: the server committed and the marker says so", err)
			}
			if d := mq.TxDecided(m, id); d != mq.TxCommit {
				t.Errorf("decided %v when Run returned, want commit", d)
			}
			committed := append(idsOf(prep), idsOf(out)...)
			checkOnce(t, e, committed)
			if _, ok, err := h.Get("order-" + id); err != nil || !ok {
				t.Errorf("business row of the committed transaction: present %v (%v)", ok, err)
			}

			// The COMMIT never reached the server.
			prep2, out2 := spread(msgs("prep2", 4)), spread(msgs("out2", 4))
			id2, err := sendCut(t, e, px, txtest.CutBeforeCommit, prep2, out2)
			if err == nil || errors.Is(err, localtx.ErrCommitUnknown) {
				t.Errorf("Run = %v; want the commit's error: the server rolled back", err)
			}
			if d := mq.TxDecided(m, id2); d != mq.TxRollback {
				t.Errorf("decided %v when Run returned, want rollback", d)
			}
			// Past several check-backs: nothing of it shows up.
			time.Sleep(10 * checkAfter)
			waitFor(t, 5*time.Second, "no pending transaction", func() bool {
				n, err := mq.PendingTxs(m)
				return err == nil && n == 0
			})
			checkNone(t, e, append(idsOf(prep2), idsOf(out2)...))
			checkOnce(t, e, committed)
			if _, ok, err := h.Get("order-" + id2); err != nil || ok {
				t.Errorf("business row of the rolled back transaction: present %v (%v)", ok, err)
			}
			waitFor(t, 5*time.Second, "markers forgotten", func() bool {
				n, err := h.Markers()
				return err == nil && n == 0
			})
			want := []txtest.Cut{
				{Fault: txtest.DropCommitReply, Reply: map[string]string{"postgres": "COMMIT", "mysql": "OK"}[server]},
				{Fault: txtest.CutBeforeCommit},
			}
			if cuts := px.Cuts(); !reflect.DeepEqual(cuts, want) {
				t.Errorf("proxy cuts %v, want %v", cuts, want)
			}
		})
	}
}
