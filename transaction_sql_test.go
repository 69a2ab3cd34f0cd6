package mq_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestTransaction_LargeMessage: messages of the node's size limit (4 MiB)
// go through every adapter, by the commit hook and by the outbox read on a
// restart (as after a crash between the two commits), whole.
func TestTransaction_LargeMessage(t *testing.T) {
	body := func(seed byte) []byte {
		b := make([]byte, 4<<20)
		for i := range b {
			b[i] = seed + byte(i*7)
		}
		return b
	}
	for _, adapter := range txtest.Names {
		t.Run(adapter, func(t *testing.T) {
			h := txtest.Open(t, adapter, filepath.Join(t.TempDir(), "host"))
			dir := t.TempDir()
			ctx := context.Background()
			m1, err := mq.Open(dir, mq.WithLocalTx(h.Store))
			if err != nil {
				t.Fatal(err)
			}
			mustCreate(t, m1, "orders", 2)
			p, _ := m1.NewProducer("orders")
			live := []*mq.Message{{ID: "live-commit", Body: body(1)}, {ID: "live-prepare", Body: body(2)}}
			if err := h.Run(ctx, func(ctx context.Context) error {
				if err := p.CommitMessage(ctx, live[0]); err != nil {
					return err
				}
				return p.PrepareMessage(ctx, live[1])
			}); err != nil {
				t.Fatal(err)
			}
			// The queue's commit hook never runs for these: the node finds
			// them in the host store when it opens again.
			left := []*mq.Message{{ID: "left-commit", Body: body(3)}, {ID: "left-prepare", Body: body(4)}}
			if err := h.Run(ctx, func(ctx context.Context) error {
				real, _ := localtx.FromContext(ctx)
				fctx := localtx.WithTx(ctx, &fakeTx{id: real.ID(), put: real.Put})
				if err := p.CommitMessage(fctx, left[0]); err != nil {
					return err
				}
				return p.PrepareMessage(fctx, left[1])
			}); err != nil {
				t.Fatal(err)
			}
			if err := m1.Close(); err != nil {
				t.Fatal(err)
			}
			m2 := openNode(t, dir, mq.WithLocalTx(h.Store), mq.WithTxCheckAfter(time.Hour))
			col := collect(t, m2, "orders", "billing")
			all := append(live, left...)
			waitSeen(t, col, idsOf(all)...)
			for _, want := range all {
				got := col.byID(want.ID)
				if !bytes.Equal(got.Body, want.Body) {
					t.Errorf("%s: %d bytes delivered, not the %d sent", want.ID, len(got.Body), len(want.Body))
				}
				if n := col.count(want.ID); n != 1 {
					t.Errorf("%s delivered %d times", want.ID, n)
				}
			}
		})
	}
}

// TestTransaction_Concurrent: 16 goroutines each run 200 transactions (50
// on the embedded stores, which other tests load more) that write a
// business row and send one message with CommitMessage and one with
// PrepareMessage, every fifth rolled back. Each message of a committed
// transaction is delivered exactly once, none of a rolled back one.
func TestTransaction_Concurrent(t *testing.T) {
	const workers = 16
	for _, adapter := range txtest.Names {
		t.Run(adapter, func(t *testing.T) {
			t.Parallel() // the servers' commits wait on their fsyncs, not on this process
			each := 200
			if adapter == "bolt" || adapter == "sqlite" {
				each = 50
			}
			e := newTxEnv(t, adapter)
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						label := fmt.Sprintf("w%d-%d", w, i)
						err := e.h.Run(context.Background(), func(ctx context.Context) error {
							if err := e.h.Put(ctx, label, "1"); err != nil {
								return err
							}
							if err := e.p.CommitMessage(ctx, &mq.Message{ID: label + "-c", Key: label, Body: []byte(label)}); err != nil {
								return err
							}
							if err := e.p.PrepareMessage(ctx, &mq.Message{ID: label + "-p", Key: label, Body: []byte(label)}); err != nil {
								return err
							}
							if i%5 == 4 {
								return errAbort
							}
							return nil
						})
						if err != nil && (i%5 != 4 || err != errAbort) {
							errs <- fmt.Errorf("%s: %w", label, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			var want []string
			for w := range workers {
				for i := range each {
					if i%5 != 4 {
						label := fmt.Sprintf("w%d-%d", w, i)
						want = append(want, label+"-c", label+"-p")
					}
				}
			}
			waitFor(t, 60*time.Second, "every committed message", func() bool {
				ids := e.col.ids()
				for _, id := range want {
					if ids[id] == 0 {
						return false
					}
				}
				return true
			})
			fence(t, e.m, e.col, "orders")
			ids := e.col.ids()
			for id, n := range ids {
				if string(e.col.byID(id).Body) == "fence" {
					continue
				}
				if n != 1 {
					t.Errorf("%s delivered %d times", id, n)
				}
			}
			if got := len(ids) - 4; got != len(want) { // 4 fences
				t.Errorf("%d messages delivered, want %d", got, len(want))
			}
			keys, err := e.h.Keys()
			if err != nil || len(keys) != len(want)/2 {
				t.Errorf("%d business rows (%v), want %d", len(keys), err, len(want)/2)
			}
		})
	}
}
