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

// TestAttack_ResetLetsClaimUnderLiveLease attacks "at most one owner of a
// partition per group delivers at a time".
//
// Two nodes' coordinators both give the partition (a node cut from the
// metadata leader goes on, the new owner waits for its lease). An offset
// reset made on the waiting node (OpResetOffset) takes a new generation
// marked Reset, which holds no lease: the waiting worker, told by the
// reset, claims at once, while the holder's handler still runs (its ctx
// ends only when its renewal, refused as stale, makes it lapse, or when a
// commit is refused after the handler returned).
// FAILED before the fix: "b began a delivery while the other node's
// handler of the partition ran" (0.5 s after the reset). Now the reset
// keeps the owner's lease, and the owner's claim carries the reset's
// generation.
func TestAttack_ResetLetsClaimUnderLiveLease(t *testing.T) {
	const lease = 2 * time.Second
	tb := newTable()
	parts := tb.add("orders", 1)
	var in atomic.Int32
	var overlap atomic.Bool
	started := make(chan string, 100)
	handler := func(node string) Handler {
		return func(ctx context.Context, d *Delivery) error {
			if in.Add(1) > 1 {
				overlap.Store(true)
			}
			defer in.Add(-1)
			started <- node
			select { // slow work that ends with its ctx
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
			}
			return nil
		}
	}
	a := newEngineWith(t, tb, leased{lease: lease})
	b := newEngineWith(t, tb, leased{lease: lease})
	if _, err := a.Subscribe("orders", "g", handler("a"), testConfig()); err != nil {
		t.Fatal(err)
	}
	send(t, parts[0], 0, 3)
	if n := <-started; n != "a" {
		t.Fatalf("first delivery by %s", n)
	}
	if _, err := b.Subscribe("orders", "g", handler("b"), testConfig()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease / 4) // b waits for a's lease
	if err := b.Reset(context.Background(), "orders", "g", Position{Kind: PosFirst}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-started:
		if overlap.Load() {
			t.Fatalf("%s began a delivery while the other node's handler of the partition ran", n)
		}
	case <-time.After(3 * lease):
		t.Fatal("nothing delivered within three leases of the reset")
	}
}
