package delivery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// jumpClock is the node's clock moved forward by off: a process paused
// (SIGSTOP) and continued sees its clock jump while none of its
// goroutines ran.
type jumpClock struct{ off atomic.Int64 }

func (c *jumpClock) Now() time.Time                         { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *jumpClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// TestAttack_PausedPastLeaseStartsNoHandler attacks "at most one owner of
// a partition per group delivers at a time".
//
// A node paused longer than its lease and continued runs its goroutines in
// any order: a worker's handlers (a key-parallel worker's lanes with
// messages queued, or a one-by-one worker with a batch in hand) may take
// their next message before keepLease notices that the lease lapsed, while
// another owner, which claimed the partition meanwhile, delivers it. Here
// the pause is a jump of the engine's clock past the lease while the
// partition does not answer (the renewal in flight waits).
// FAILED before the fix: handler calls began after the lease had lapsed
// (seen for real in TestAttack_PausedNode/KeyParallel, with SIGSTOP).
func TestAttack_PausedPastLeaseStartsNoHandler(t *testing.T) {
	for _, kp := range []int{0, 8} {
		t.Run(fmt.Sprintf("KeyParallel%d", kp), func(t *testing.T) {
			const lease = 2 * time.Second
			tb := newTable()
			parts := tb.add("orders", 1)
			clk := &jumpClock{}
			e := New(tb, clk, slog.New(slog.NewTextHandler(io.Discard, nil)), leased{lease: lease})
			t.Cleanup(e.Close)
			t.Cleanup(parts[0].Resume)
			var calls, late atomic.Int32
			var jumped atomic.Bool
			cfg := testConfig()
			cfg.KeyParallel = kp
			if _, err := e.Subscribe("orders", "g", func(ctx context.Context, d *Delivery) error {
				calls.Add(1)
				if jumped.Load() {
					late.Add(1)
				}
				select {
				case <-time.After(20 * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
				return nil
			}, cfg); err != nil {
				t.Fatal(err)
			}
			cmd := store.Command{Op: store.OpAppend, Now: time.Now().UnixNano()}
			for i := range 400 {
				cmd.Msgs = append(cmd.Msgs, store.Message{ID: fmt.Sprint(i), Key: fmt.Sprintf("k%d", i%32), Body: []byte("x")})
			}
			if _, err := parts[0].Apply(context.Background(), &cmd); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "deliveries", func() bool { return calls.Load() >= 20 })
			// The pause: the partition stops answering, the clock moves past
			// the lease.
			parts[0].Pause()
			clk.off.Store(int64(lease))
			jumped.Store(true)
			time.Sleep(lease / 2)
			if n := late.Load(); n > 0 {
				t.Errorf("%d handler calls began after the lease had lapsed", n)
			}
		})
	}
}
