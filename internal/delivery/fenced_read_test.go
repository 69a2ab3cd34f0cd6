package delivery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/zeze-go/mq/store"
)

// unreachable is a partition whose reads fail while down is set, as reads
// from a leader that is lost do; a read that began before fails too.
type unreachable struct {
	stamped
	down   atomic.Bool
	failed atomic.Int64
}

func (u *unreachable) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error) {
	if u.down.Load() {
		u.failed.Add(1)
		return dst, errors.New("leader unreachable")
	}
	out, err := u.stamped.Fetch(ctx, from, max, maxBytes, dst)
	if err == nil && u.down.Load() {
		u.failed.Add(1)
		return dst, errors.New("leader unreachable")
	}
	return out, err
}

// TestWorker_ReadAfterFailureChecksItsClaim: while a worker's reads fail,
// its group's record is fenced with a lower offset (as the new leader of
// a pair whose lost copy's tail was given up fences every group), and new
// messages take offsets past the worker's position. Once reads work
// again, the worker delivers nothing from its old position: it claims
// again and goes on from the offset stored, in offset order (each message
// its own key with WithKeyParallel).
func TestWorker_ReadAfterFailureChecksItsClaim(t *testing.T) {
	for _, keyParallel := range []int{0, 4} {
		t.Run(fmt.Sprintf("KeyParallel-%d", keyParallel), func(t *testing.T) {
			tb := newTable()
			p := tb.add("orders", 1)[0]
			u := &unreachable{stamped: stamped{p}}
			tb.topics["orders"] = []Partition{u}
			l := newLog()
			e := newEngine(t, tb)
			cfg := testConfig()
			cfg.KeyParallel = keyParallel
			if _, err := e.Subscribe("orders", "billing", l.handler("a", nil), cfg); err != nil {
				t.Fatal(err)
			}
			send(t, p, 0, 10)
			l.waitFor(t, 0, 10)
			waitFor(t, "offset 10 committed", func() bool { return committed(t, p, "billing").Offset == 10 })

			u.down.Store(true)
			send(t, p, 10, 1) // wakes the read waiting at 10, which fails
			waitFor(t, "a failed read", func() bool { return u.failed.Load() > 0 })
			before := len(l.of("a"))
			if _, err := u.Apply(context.Background(), &store.Command{Op: store.OpResetOffset, Group: "billing", Offset: 5}); err != nil {
				t.Fatal(err)
			}
			send(t, p, 11, 4)
			u.down.Store(false)
			l.waitFor(t, 5, 15)
			got := l.of("a")[before:]
			first := slices.Clone(got[:min(len(got), 10)])
			if keyParallel > 0 {
				slices.Sort(first) // each message its own key: no order between them
			}
			for i, off := range first {
				if off != uint64(5+i) {
					t.Fatalf("delivered after the failed reads: %v, want 5 to 14 once each, first", got)
				}
			}
		})
	}
}
