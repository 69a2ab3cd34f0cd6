package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// TestPartition_CloseWhileApplying closes partitions under a stream of
// commands: every Apply must return (applied or ErrClosed), none may be left
// waiting for a writer that has stopped.
func TestPartition_CloseWhileApplying(t *testing.T) {
	var hung, closed atomic.Int64
	for round := 0; round < 100; round++ {
		p, err := store.Open(filepath.Join(t.TempDir(), "p.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					_, err := p.Apply(ctx, &store.Command{Op: store.OpCommitOffset, Now: 1, Group: "g", Offset: 1})
					switch {
					case err == nil:
						continue
					case errors.Is(err, store.ErrClosed):
						closed.Add(1)
					case errors.Is(err, context.DeadlineExceeded):
						hung.Add(1)
					default:
						t.Errorf("Apply: %v", err)
					}
					return
				}
			}()
		}
		time.Sleep(time.Millisecond)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		cancel()
	}
	if hung.Load() != 0 {
		t.Fatalf("%d Apply calls never returned after Close", hung.Load())
	}
	if closed.Load() == 0 {
		t.Fatal("no Apply saw ErrClosed: the test did not race Close")
	}
}

// TestPartition_CloseConcurrent: Close racing Apply, ApplyBatch and every
// reader, with and without a WAL: nothing panics or hangs, every call
// returns a result or ErrClosed, and what was acked is there after reopen.
func TestPartition_CloseConcurrent(t *testing.T) {
	for _, withW := range []bool{false, true} {
		for round := range 20 {
			dir := t.TempDir()
			var w *store.WAL
			opts := store.Options{}
			if withW {
				var err error
				if w, err = store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{}); err != nil {
					t.Fatal(err)
				}
				opts = store.Options{WAL: w, Stream: "s", MaterializeAfter: time.Duration(round) * time.Millisecond}
			}
			path := filepath.Join(dir, "0.db")
			p, err := store.Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var acked []string
			var wg sync.WaitGroup
			ok := func(err error) bool {
				return err == nil || errors.Is(err, store.ErrClosed)
			}
			for s := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := 0; ; k++ {
						id := fmt.Sprint(s, "-", k)
						var err error
						switch k % 4 {
						case 0:
							var errs []error
							_, errs, err = p.ApplyBatch(context.Background(), []*store.Command{
								{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}},
								{Op: store.OpAppend}, // bad: zero Now
								{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: uint64(k)},
							})
							if err == nil && errs[0] == nil {
								mu.Lock()
								acked = append(acked, "id-"+id)
								mu.Unlock()
							}
							if err == nil && !errors.Is(errs[1], store.ErrBadCommand) && !errors.Is(errs[1], store.ErrClosed) {
								t.Errorf("bad command in a batch: %v", errs[1])
							}
						case 1:
							_, err = p.Read(0, 10, 0, nil)
						case 2:
							_, _, err = p.Get(uint64(k))
							if err == nil {
								_, err = p.Groups()
							}
							if err == nil {
								_, _, err = p.NextDue()
							}
						case 3:
							err = p.HalfTxs(func(store.HalfTx) bool { return true })
						}
						if !ok(err) {
							t.Errorf("op %d: %v", k%4, err)
							return
						}
						if errors.Is(err, store.ErrClosed) {
							return
						}
					}
				}()
			}
			time.Sleep(time.Duration(round) * time.Millisecond)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if w != nil {
				w.Close()
				if w, err = store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{}); err != nil {
					t.Fatal(err)
				}
				opts.WAL = w
			}
			p, err = store.Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := p.Read(0, 1<<20, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			have := map[string]bool{}
			for _, m := range msgs {
				have[m.ID] = true
			}
			for _, id := range acked {
				if !have[id] {
					t.Fatalf("acked %s missing after Close and reopen", id)
				}
			}
			p.Close()
			if w != nil {
				w.Close()
			}
		}
	}
}
