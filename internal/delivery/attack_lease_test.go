package delivery

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/partition/fake"
	"github.com/zeze-go/mq/store"
)

// leased is the Local coordinator with a lease, as a cluster's is.
type leased struct {
	Local
	lease time.Duration
}

func (l leased) Lease() time.Duration { return l.lease }

// blackhole is one node's view of a fake partition: it stamps Now as the
// partition's proposer does, reports every Apply that succeeded, and once
// cut, every Apply waits for its ctx (a link whose packets are dropped: the
// call gets no answer). Reads go on.
type blackhole struct {
	*fake.Partition
	cut     atomic.Bool
	healed  chan struct{} // closed by heal
	mu      sync.Mutex
	applied []appliedCmd
	notify  chan struct{}
}

type appliedCmd struct {
	op  store.Op
	at  time.Time
	off uint64
}

func newBlackhole(p *fake.Partition) *blackhole {
	return &blackhole{Partition: p, notify: make(chan struct{}, 1), healed: make(chan struct{})}
}

// heal ends the cut: the calls waiting go on.
func (b *blackhole) heal() {
	if b.cut.Swap(false) {
		close(b.healed)
	}
}

func (b *blackhole) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	if b.cut.Load() {
		select {
		case <-ctx.Done():
			return store.Result{}, ctx.Err()
		case <-b.healed: // the answer comes late
		}
	}
	cmd.Now = time.Now().UnixNano()
	res, err := b.Partition.Apply(ctx, cmd)
	if err == nil {
		b.mu.Lock()
		b.applied = append(b.applied, appliedCmd{cmd.Op, time.Unix(0, cmd.Now), cmd.Offset})
		b.mu.Unlock()
		select {
		case b.notify <- struct{}{}:
		default:
		}
	}
	return res, err
}

// waitApplied waits for an applied command that ok accepts and returns it.
func (b *blackhole) waitApplied(t *testing.T, what string, ok func(appliedCmd) bool) appliedCmd {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		for _, a := range b.applied {
			if ok(a) {
				b.mu.Unlock()
				return a
			}
		}
		b.applied = b.applied[:0]
		b.mu.Unlock()
		select {
		case <-b.notify:
		case <-deadline:
			t.Fatalf("%s never applied", what)
		}
	}
}

// TestAttack_LeaseLossDetectedAfterLeaseExpired attacks "at most one node
// delivers a partition of a group at a time" (Leaser: a worker stops "when
// no renewal succeeded for 4/5 of the lease ... before the partition may
// let another owner claim").
//
// keepLease checks the lease only after a renewal attempt returns, on a
// tick of lease/4, and a renewal to a partition that does not answer (a
// link that drops packets) waits for its own timeout, lease/4 more; a
// commit between ticks shifts the phase and makes the next tick skip its
// renewal. So a worker whose last successful commit was just after a tick
// stops about 1.25 leases after it, while the partition lets another owner
// claim 1 lease after it: for a quarter of the lease two owners deliver.
// FAILS: another node's leased claim succeeds while the first worker's
// handler still runs with a live ctx.
func TestAttack_LeaseLossDetectedAfterLeaseExpired(t *testing.T) {
	const lease = 2 * time.Second
	tb := newTable()
	p := fake.New()
	a := newBlackhole(p)
	tb.topics["t"] = []Partition{a}
	e := newEngineWith(t, tb, leased{lease: lease})

	var handling atomic.Int32
	started := make(chan uint64, 4)
	var cancelledAt atomic.Int64
	h := func(ctx context.Context, d *Delivery) error {
		handling.Add(1)
		defer handling.Add(-1)
		started <- d.Offset
		if d.Offset == 0 {
			return nil
		}
		<-ctx.Done() // slow work that ends with its ctx, as a handler must
		cancelledAt.Store(time.Now().UnixNano())
		return ctx.Err()
	}
	if _, err := e.Subscribe("t", "g", h, testConfig()); err != nil {
		t.Fatal(err)
	}
	// Just after a renewal (a tick of keepLease), m0 is handled and committed.
	a.waitApplied(t, "a renewal", func(c appliedCmd) bool { return c.op == store.OpRenew })
	time.Sleep(20 * time.Millisecond)
	send(t, p, 0, 1)
	last := a.waitApplied(t, "the commit of m0", func(c appliedCmd) bool { return c.op == store.OpCommitOffset && c.off == 1 })
	send(t, p, 1, 1)
	if off := <-started; off != 0 {
		t.Fatalf("first delivery %d", off)
	}
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("m1 never delivered")
	}
	a.cut.Store(true) // from now on this node's renewals get no answer
	defer a.heal()

	// Another node claims with the same lease as soon as the partition lets it.
	for {
		now := time.Now()
		if now.Sub(last.at) > 3*lease {
			t.Fatal("no other owner could claim within three leases")
		}
		res, err := p.Apply(context.Background(), &store.Command{Op: store.OpClaim, Now: now.UnixNano(), Group: "g", MaxAge: int64(lease)})
		if err == nil {
			c := cancelledAt.Load()
			if c == 0 && handling.Load() > 0 {
				claimed := now.Sub(last.at).Round(time.Millisecond)
				for cancelledAt.Load() == 0 && time.Since(now) < lease {
					time.Sleep(time.Millisecond)
				}
				t.Fatalf("another owner claimed the partition (generation %d) %v after the first owner's last commit, while the first owner's handler still ran with a live ctx (ended %v after that commit)",
					res.Generation, claimed, time.Unix(0, cancelledAt.Load()).Sub(last.at).Round(time.Millisecond))
			}
			t.Logf("claimed %v after the last commit; the first owner's handler ctx ended %v after it",
				now.Sub(last.at).Round(time.Millisecond), time.Unix(0, c).Sub(last.at).Round(time.Millisecond))
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}
