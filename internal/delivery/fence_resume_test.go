package delivery

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// failover is a partition served first by copy a (the lost copy, whose
// tail an operator gives up) and then by copy b (the survivor, fenced),
// as a DoubleWrite pair's reads are served by its leader. While down,
// reads fail; failGroup makes that many reads of a group record fail (a
// transient error, as a read routed to a leader that just moved gets).
type failover struct {
	cur       atomic.Pointer[store.Partition]
	down      atomic.Bool
	failGroup atomic.Int32
}

func (f *failover) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	cmd.Now = time.Now().UnixNano()
	return f.cur.Load().Apply(ctx, cmd)
}

func (f *failover) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error) {
	if f.down.Load() {
		return dst, errors.New("leader unreachable")
	}
	out, err := f.cur.Load().Fetch(ctx, from, max, maxBytes, dst)
	if err == nil && f.down.Load() {
		return dst[:0], errors.New("leader unreachable")
	}
	return out, err
}

func (f *failover) Stats() store.Stats               { return f.cur.Load().Stats() }
func (f *failover) SeekTime(t int64) (uint64, error) { return f.cur.Load().SeekTime(t) }

func (f *failover) Group(name string) (store.GroupState, bool, error) {
	if f.failGroup.Add(-1) >= 0 {
		return store.GroupState{}, false, errors.New("leader moved: try again")
	}
	return f.cur.Load().Group(name)
}

func openStore(t *testing.T, name string) *store.Partition {
	t.Helper()
	p, err := store.Open(filepath.Join(t.TempDir(), name), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func sendTo(t *testing.T, p *store.Partition, prefix string, n int) {
	t.Helper()
	cmd := store.Command{Op: store.OpAppend, Now: time.Now().UnixNano()}
	for i := range n {
		cmd.Msgs = append(cmd.Msgs, store.Message{ID: prefix + strconv.Itoa(i), Body: []byte(prefix)})
	}
	if _, err := p.Apply(context.Background(), &cmd); err != nil {
		t.Fatal(err)
	}
}

// TestWorker_OwnerWithoutRecordResumesNotPastTheFence: a worker whose
// group record lived only on the copy given up (its claim and commits
// were on that copy's tail) reads the survivor after the fence: the
// survivor holds no record of the group, its fence's record says the log
// ended at 5, and new sends took offsets 5 to 14. The worker's position
// is 10; it goes on from 5, not 10, also when its read of the group's
// record fails once (a transient error).
func TestWorker_OwnerWithoutRecordResumesNotPastTheFence(t *testing.T) {
	a := openStore(t, "a")
	b := openStore(t, "b")
	// The common prefix: 5 messages on both copies.
	sendTo(t, a, "common", 5)
	sendTo(t, b, "common", 5)
	// The lost copy's tail: 5 more, acked on a alone.
	sendTo(t, a, "lost", 5)

	f := &failover{}
	f.cur.Store(a)
	tb := newTable()
	tb.topics["orders"] = []Partition{f}
	l := newLog()
	e := newEngine(t, tb)
	if _, err := e.Subscribe("orders", "billing", l.handler("c", nil), testConfig()); err != nil {
		t.Fatal(err)
	}
	l.waitFor(t, 0, 10)
	waitFor(t, "offset 10 committed on the lost copy", func() bool {
		g, ok, err := a.Group("billing")
		return err == nil && ok && g.Offset == 10
	})

	// The leader is lost: the worker's read waiting at 10 fails.
	f.down.Store(true)
	sendTo(t, a, "wake", 1)
	time.Sleep(100 * time.Millisecond)

	// The survivor leads after the loss: it fences every group (it holds no
	// record of billing), then new sends take offsets 5 to 14.
	if _, err := b.Apply(context.Background(), &store.Command{Op: store.OpFence, Now: time.Now().UnixNano(), Offset: 2}); err != nil {
		t.Fatal(err)
	}
	if fr, ok, err := b.Group(store.FenceRecord); err != nil || !ok || fr.Offset != 5 {
		t.Fatalf("fence record %+v %v %v", fr, ok, err)
	}
	sendTo(t, b, "new", 10)
	before := len(l.of("c"))
	f.cur.Store(b)
	f.failGroup.Store(1) // one transient failure of the record's read
	f.down.Store(false)

	// Every message stored at 5..14 on the survivor must be delivered.
	seen := map[uint64]bool{}
	deadline := time.After(8 * time.Second)
	for len(seen) < 10 {
		select {
		case off := <-l.all:
			if off >= 5 && off < 15 {
				seen[off] = true
			}
		case <-deadline:
			var missing []uint64
			for o := uint64(5); o < 15; o++ {
				if !seen[o] {
					missing = append(missing, o)
				}
			}
			g, ok, _ := b.Group("billing")
			t.Fatalf("after the fence, offsets %v stored on the survivor were never delivered (delivered since: %v; record %+v %v)",
				missing, l.of("c")[before:], g, ok)
		}
	}
}
