package store_test

import (
	"context"
	"errors"
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
