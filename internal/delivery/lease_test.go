package delivery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/partition/fake"
	"github.com/zeze-go/mq/store"
)

// TestLease_OneOwnerAtATime: two nodes whose coordinators both give them
// the partition deliver it one at a time: the second waits for the first's
// lease, and takes over as soon as the first lets go (OpUnclaim), well
// before the lease would lapse.
func TestLease_OneOwnerAtATime(t *testing.T) {
	const lease = 2 * time.Second
	tb := newTable()
	parts := tb.add("orders", 1)
	var in atomic.Int32
	var overlap atomic.Bool
	var mu sync.Mutex
	var who []string
	handler := func(node string) Handler {
		return func(ctx context.Context, d *Delivery) error {
			if in.Add(1) > 1 {
				overlap.Store(true)
			}
			defer in.Add(-1)
			mu.Lock()
			who = append(who, node)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return nil
		}
	}
	a := newEngineWith(t, tb, leased{lease: lease})
	b := newEngineWith(t, tb, leased{lease: lease})
	ca, err := a.Subscribe("orders", "g", handler("a"), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	send(t, parts[0], 0, 10)
	waitFor(t, "a delivering", func() bool { mu.Lock(); defer mu.Unlock(); return len(who) >= 10 })
	if _, err := b.Subscribe("orders", "g", handler("b"), testConfig()); err != nil {
		t.Fatal(err)
	}
	// a renews its lease: b waits, through more than one lease.
	for i := range 5 {
		send(t, parts[0], 10+10*i, 10)
		time.Sleep(lease / 2)
	}
	mu.Lock()
	for i, n := range who {
		if n != "a" {
			mu.Unlock()
			t.Fatalf("delivery %d by %s while a held the lease", i, n)
		}
	}
	mu.Unlock()
	closed := time.Now()
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	send(t, parts[0], 60, 1)
	waitFor(t, "b taking over", func() bool { mu.Lock(); defer mu.Unlock(); return who[len(who)-1] == "b" })
	if d := time.Since(closed); d > lease/2 {
		t.Errorf("b took over %v after a closed, want well under the lease %v (a lets go)", d, lease)
	}
	if overlap.Load() {
		t.Fatal("two handlers of the partition ran at once")
	}
}

// TestLease_LostStopsHandlers: a worker that cannot renew its lease (the
// partition does not answer) ends its handler's ctx within 4/5 of the
// lease plus one renewal period, and delivers again once it can claim.
func TestLease_LostStopsHandlers(t *testing.T) {
	const lease = 800 * time.Millisecond
	tb := newTable()
	parts := tb.add("orders", 1)
	started := make(chan time.Time, 16)
	ended := make(chan time.Time, 16)
	e := newEngineWith(t, tb, leased{lease: lease})
	if _, err := e.Subscribe("orders", "g", func(ctx context.Context, d *Delivery) error {
		started <- time.Now()
		if d.Offset == 0 {
			<-ctx.Done() // slow work that ends with its ctx
			ended <- time.Now()
			return ctx.Err()
		}
		return nil
	}, testConfig()); err != nil {
		t.Fatal(err)
	}
	send(t, parts[0], 0, 1)
	<-started
	parts[0].Pause() // renewals (and commits) hang
	paused := time.Now()
	select {
	case at := <-ended:
		if d := at.Sub(paused); d > lease*4/5+lease/4+200*time.Millisecond {
			t.Errorf("handler's ctx ended %v after renewals stopped, want about 4/5 of the lease %v", d, lease)
		}
	case <-time.After(5 * lease):
		t.Fatal("the handler's ctx never ended while the lease could not be renewed")
	}
	parts[0].Resume()
	select {
	case <-started: // offset 0 again, from a new claim
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery after the partition answered again")
	}
}

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

type appliedCmd struct {
	op  store.Op
	at  time.Time
	off uint64
}

func newBlackhole(p *fake.Partition) *blackhole {
	return &blackhole{Partition: p, notify: make(chan struct{}, 1), healed: make(chan struct{})}
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

// jumpClock is the node's clock moved forward by off: a process paused
// (SIGSTOP) and continued sees its clock jump while none of its
// goroutines ran.
type jumpClock struct{ off atomic.Int64 }

func (c *jumpClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

func (c *jumpClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// TestLease_LostBeforeOthersMayClaim: at most one node delivers a
// partition of a group at a time. A worker whose renewals get no answer (a
// link that drops packets) ends its handler's ctx before the partition lets
// another node claim with the same lease, even when its last commit came
// just after a renewal tick. This broke when keepLease checked the lease
// only after a renewal attempt returned: the worker stopped about 1.25
// leases after its last commit, another owner could claim after one.
func TestLease_LostBeforeOthersMayClaim(t *testing.T) {
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

// TestLease_ClockStepBackStillDelivered: a partition is never left
// undelivered while a live consumer of its group exists. The owner stops
// (its renewals get no answer) and another consumer waits for the lease to
// lapse; then the partition's clock steps back an hour, which puts the
// owner's last stamp in the future. This broke when GroupState.Leased held
// the partition for that hour plus the lease, whoever asked.
func TestLease_ClockStepBackStillDelivered(t *testing.T) {
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

// TestLease_CloseDuringRenewalReleases: run waits for keepLease before its
// last commit lets go, so that no renewal follows the release: a consumer
// closed while a renewal waits at a stalled partition leaves the record
// released once the partition goes on (no renewal lands after the unclaim),
// and another owner's leased claim succeeds at once.
func TestLease_CloseDuringRenewalReleases(t *testing.T) {
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

// TestLease_RestartAfterLossWaitsForHandler: never two workers of one
// partition on one node. A worker loses its lease while its handler,
// ignoring its ctx, goes on; the partition comes back and the group starts
// it again, but the new worker delivers nothing before the old handler
// returned, and every message is delivered.
func TestLease_RestartAfterLossWaitsForHandler(t *testing.T) {
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

// TestLease_PausedPastLeaseStartsNoHandler: at most one owner of a
// partition per group delivers at a time, also on a node paused longer
// than its lease. Continued, such a node runs its goroutines in any order:
// a worker's handlers (a key-parallel worker's lanes with messages queued,
// or a one-by-one worker with a batch in hand) must not take their next
// message before keepLease notices that the lease lapsed, while another
// owner, which claimed the partition meanwhile, delivers it. Here the
// pause is a jump of the engine's clock past the lease while the partition
// does not answer (the renewal in flight waits). This broke on a node
// stopped with SIGSTOP: handler calls began after the lease had lapsed.
func TestLease_PausedPastLeaseStartsNoHandler(t *testing.T) {
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

// TestLease_ResetKeepsOwnersLease: at most one owner of a partition per
// group delivers at a time, across an offset reset. Two nodes'
// coordinators both give the partition (a node cut from the metadata
// leader goes on, the new owner waits for its lease), and the waiting node
// resets the offset: the reset keeps the owner's lease, and the owner's
// claim carries the reset's generation. This broke when the reset's new
// generation held no lease: the waiting worker, told by the reset, claimed
// at once and delivered while the holder's handler still ran.
func TestLease_ResetKeepsOwnersLease(t *testing.T) {
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
