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

// skewed is a fake partition behind a proposer whose wall clock is off by
// skew (set by the test: an NTP step, a VM resumed).
type skewed struct {
	*fake.Partition
	skew atomic.Int64 // ns
}

func (s *skewed) now() int64 { return time.Now().UnixNano() + s.skew.Load() }

func (s *skewed) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	cmd.Now = s.now()
	return s.Partition.Apply(ctx, cmd)
}

// TestAttack_LeaseClockStepBack attacks "a partition is never left
// undelivered forever while a live consumer of its group exists".
//
// The owner stops (its renewals get no answer) and another consumer waits
// for the lease to lapse. The partition's clock then steps back an hour:
// the owner's last stamp is now in the future, and GroupState.Leased holds
// the partition for the hour plus the lease, whoever asks.
// FAILS: the waiting consumer gets nothing for two leases (an hour, in
// fact).
func TestAttack_LeaseClockStepBack(t *testing.T) {
	const lease = 400 * time.Millisecond
	tb := newTable()
	under := fake.New()
	p := &skewed{Partition: under}
	a := newBlackhole(under)
	tb.topics["t"] = []Partition{a}
	ea := newEngineWith(t, tb, leased{lease: lease})
	if _, err := ea.Subscribe("t", "g", func(context.Context, *Delivery) error { return nil }, testConfig()); err != nil {
		t.Fatal(err)
	}
	a.waitApplied(t, "a's claim", func(c appliedCmd) bool { return c.op == store.OpClaim })
	a.cut.Store(true) // a's node is gone for the partition: it stops after 4/5 of the lease
	defer a.heal()

	tb2 := newTable()
	tb2.topics["t"] = []Partition{p}
	p.skew.Store(-int64(time.Hour))
	l := newLog()
	eb := newEngineWith(t, tb2, leased{lease: lease})
	if _, err := eb.Subscribe("t", "g", l.handler("b", nil), testConfig()); err != nil {
		t.Fatal(err)
	}
	send(t, under, 0, 1)
	select {
	case <-l.all:
	case <-time.After(5 * lease):
		gs, _, _ := under.Group("g")
		t.Fatalf("the partition's clock stepped back an hour: no consumer delivers it for five leases (record %+v, Updated %v ahead of the partition's clock)",
			gs, time.Duration(gs.Updated-p.now()).Round(time.Second))
	}
}

// hooked is a stamping fake partition that calls afterReset once an
// OpResetOffset was applied, before that Apply returns.
type hooked struct {
	*fake.Partition
	afterReset func()
	claims     atomic.Int32 // OpClaims applied
}

func (h *hooked) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	cmd.Now = time.Now().UnixNano()
	res, err := h.Partition.Apply(ctx, cmd)
	if err == nil && cmd.Op == store.OpClaim {
		h.claims.Add(1)
	}
	if err == nil && cmd.Op == store.OpResetOffset && h.afterReset != nil {
		h.afterReset()
	}
	return res, err
}

// TestAttack_ResetHintAfterReclaimSelfBlocks attacks "a partition is never
// left undelivered forever while a live consumer of its group exists".
//
// Engine.Reset stores the new offset, then hints the partition's workers
// on this node, which claim again. A worker that learned of the reset
// first (its commit refused: fenced, claimed again) is hinted anyway and
// claims once more; with a lease that claim is refused, ErrClaimed, by the
// worker's own claim of a moment ago, which keepLease goes on renewing
// (its generation is the record's). The worker waits in claim for its own
// lease forever and delivers nothing more.
// FAILS: a message sent after the reset is never delivered.
func TestAttack_ResetHintAfterReclaimSelfBlocks(t *testing.T) {
	const lease = 400 * time.Millisecond
	tb := newTable()
	p := &hooked{Partition: fake.New()}
	tb.topics["t"] = []Partition{p}
	e := newEngineWith(t, tb, leased{lease: lease})
	l := newLog()
	if _, err := e.Subscribe("t", "g", l.handler("a", nil), testConfig()); err != nil {
		t.Fatal(err)
	}
	send(t, p.Partition, 0, 2)
	l.waitFor(t, 0, 2)
	deadline := time.Now().Add(5 * time.Second)
	for committed(t, p.Partition, "g").Offset != 2 {
		if time.Now().After(deadline) {
			t.Fatal("offset 2 never committed")
		}
		time.Sleep(time.Millisecond)
	}
	// While Reset is between storing the offset and hinting the worker, a
	// message arrives: the worker's commit after it is refused, and the
	// worker claims again at the reset offset (0) by itself.
	p.afterReset = func() {
		before := p.claims.Load()
		send(t, p.Partition, 2, 1)
		deadline := time.Now().Add(5 * time.Second)
		for p.claims.Load() == before {
			if time.Now().After(deadline) {
				t.Error("the worker never claimed again after its refused commit")
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := e.Reset(context.Background(), "t", "g", Position{Kind: PosOffset, Offset: 0}); err != nil {
		t.Fatal(err)
	}
	p.afterReset = nil
	send(t, p.Partition, 3, 1)
	timeout := time.After(10 * lease)
	for {
		select {
		case off := <-l.all:
			if off == 3 {
				return
			}
		case <-timeout:
			gs := committed(t, p.Partition, "g")
			t.Fatalf("offset 3, sent after the reset, not delivered within ten leases (record %+v, updated %v ago: renewed by the waiting worker itself)",
				gs, time.Since(time.Unix(0, gs.Updated)).Round(time.Millisecond))
		}
	}
}

// TestAttack_CloseDuringRenewalReleases (kept as an attack: it passes)
// attacks "run waits for keepLease before its last commit lets go, so that
// no renewal follows": the consumer is closed while a renewal waits at a
// stalled partition; once the partition goes on, the record is let go and
// stays so (no renewal lands after the unclaim), and another owner's
// leased claim succeeds at once.
func TestAttack_CloseDuringRenewalReleases(t *testing.T) {
	const lease = 400 * time.Millisecond
	tb := newTable()
	p := tb.add("t", 1)[0]
	e := newEngineWith(t, tb, leased{lease: lease})
	l := newLog()
	c, err := e.Subscribe("t", "g", l.handler("a", nil), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	send(t, p, 0, 3)
	l.waitFor(t, 0, 3)
	time.Sleep(lease / 2) // commits done: the next Apply is a renewal
	p.Pause()
	time.Sleep(lease / 2) // a renewal waits at the partition
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	time.Sleep(50 * time.Millisecond)
	p.Resume()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	time.Sleep(lease / 2)
	gs := committed(t, p, "g")
	if !gs.Released || gs.Offset != 3 {
		t.Fatalf("record after Close: %+v, want offset 3, released", gs)
	}
	if _, err := p.Apply(context.Background(), &store.Command{Op: store.OpClaim, Now: time.Now().UnixNano(), Group: "g", MaxAge: int64(lease)}); err != nil {
		t.Fatalf("leased claim after the consumer closed: %v", err)
	}
}

// TestAttack_LeaseLossRestartWaitsForHandler (kept as an attack: it
// passes) attacks "two workers of one partition on one node": the worker
// loses its lease while its handler, ignoring its ctx, goes on; the
// partition comes back and the group starts the partition again, but the
// new worker delivers nothing before the old handler returned, and every
// message is delivered.
func TestAttack_LeaseLossRestartWaitsForHandler(t *testing.T) {
	const lease = 400 * time.Millisecond
	tb := newTable()
	p := fake.New()
	a := newBlackhole(p)
	tb.topics["t"] = []Partition{a}
	e := newEngineWith(t, tb, leased{lease: lease})
	var in atomic.Int32
	var overlap atomic.Bool
	seen := make(chan uint64, 64)
	release := make(chan struct{})
	h := func(ctx context.Context, d *Delivery) error {
		if in.Add(1) > 1 {
			overlap.Store(true)
		}
		defer in.Add(-1)
		seen <- d.Offset
		if d.Offset == 0 {
			<-release // ignores ctx
		}
		return nil
	}
	if _, err := e.Subscribe("t", "g", h, testConfig()); err != nil {
		t.Fatal(err)
	}
	send(t, p, 0, 3)
	if off := <-seen; off != 0 {
		t.Fatalf("first delivery %d", off)
	}
	a.cut.Store(true)
	time.Sleep(2 * lease) // the lease is lost
	a.heal()
	time.Sleep(2 * lease) // the group tries to start the partition again
	close(release)
	got := map[uint64]bool{0: true}
	deadline := time.After(10 * time.Second)
	for len(got) < 3 {
		select {
		case off := <-seen:
			got[off] = true
		case <-deadline:
			t.Fatalf("delivered %v of 0..2", got)
		}
	}
	if overlap.Load() {
		t.Fatal("two handlers of the partition ran at once on one node")
	}
}
