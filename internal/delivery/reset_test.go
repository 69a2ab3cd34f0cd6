package delivery

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/partition/fake"
	"github.com/zeze-go/mq/store"
)

// gated is a stamped fake partition whose resets and claims a test can
// hold: beforeReset blocks an OpResetOffset before it is applied,
// afterReset after it is applied (before Apply returns), and blockClaims
// makes OpClaim wait for its ctx.
type gated struct {
	stamped
	beforeReset chan struct{} // nil: no wait
	resetIn     chan struct{} // gets a token when a reset reaches the gate
	afterReset  chan struct{} // nil: no wait
	blockClaims atomic.Bool
	// blockCommits makes OpCommitOffset signal commitIn and wait for
	// commitGate.
	blockCommits atomic.Bool
	commitIn     chan struct{}
	commitGate   chan struct{}
}

func (g *gated) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	if cmd.Op == store.OpClaim && g.blockClaims.Load() {
		<-ctx.Done()
		return store.Result{}, ctx.Err()
	}
	if cmd.Op == store.OpCommitOffset && g.blockCommits.Load() {
		select {
		case g.commitIn <- struct{}{}:
		default:
		}
		<-g.commitGate
	}
	if cmd.Op == store.OpResetOffset && g.beforeReset != nil {
		g.resetIn <- struct{}{}
		<-g.beforeReset
	}
	res, err := g.stamped.Apply(ctx, cmd)
	if cmd.Op == store.OpResetOffset && g.afterReset != nil {
		g.resetIn <- struct{}{}
		<-g.afterReset
	}
	return res, err
}

func gatedTable(name string) (*table, *fake.Partition, *gated) {
	tb := newTable()
	p := fake.New()
	g := &gated{stamped: stamped{p}, resetIn: make(chan struct{}, 1), commitIn: make(chan struct{}, 1)}
	tb.topics[name] = []Partition{g}
	return tb, p, g
}

func sendKeys(t *testing.T, p *fake.Partition, keys ...string) {
	t.Helper()
	cmd := store.Command{Op: store.OpAppend, Now: time.Now().UnixNano()}
	for _, k := range keys {
		cmd.Msgs = append(cmd.Msgs, store.Message{Key: k, Body: []byte(k)})
	}
	if _, err := p.Apply(context.Background(), &cmd); err != nil {
		t.Fatal(err)
	}
}

func waitGroupState(t *testing.T, p *fake.Partition, what string, cond func(store.GroupState) bool) store.GroupState {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		gs := committed(t, p, "billing")
		if cond(gs) {
			return gs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: group at %+v", what, gs)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReset_KeyParallelWaitingLanesMove: a running consumer moves to the
// reset before it delivers its next message, also with key-parallel
// delivery, whose lanes wait for a handler slot (KeyParallel bounds them)
// while the worker's goroutine is busy (here: in an offset write to a slow
// store). This broke when the lanes checked for a reset only before they
// waited (the reset reached them through the worker's goroutine,
// stopLanes): a slot freed after Reset returned went to a message from
// before the reset.
func TestReset_KeyParallelWaitingLanesMove(t *testing.T) {
	tb, p, g := gatedTable("orders")
	// Eight keys, one handler slot: the first message's handler holds the
	// slot, the other seven lanes wait for it.
	sendKeys(t, p, "A", "B", "C", "D", "E", "F", "G", "H")
	inside := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	var got []uint64
	cfg := testConfig()
	cfg.KeyParallel = 1
	cfg.Refresh = 50 * time.Millisecond // the worker writes its offset while its lanes wait
	e := newEngine(t, tb)
	c, err := e.Subscribe("orders", "billing", func(ctx context.Context, d *Delivery) error {
		mu.Lock()
		got = append(got, d.Offset)
		n := len(got)
		mu.Unlock()
		if n == 1 {
			close(inside)
			<-release
		}
		return nil
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-inside
	time.Sleep(20 * time.Millisecond) // the other lanes wait for the handler slot
	g.commitGate = make(chan struct{})
	g.blockCommits.Store(true)
	<-g.commitIn // the worker's goroutine is inside a (slow) offset write
	if err := e.Reset(context.Background(), "orders", "billing", Position{Kind: PosLast}); err != nil {
		t.Fatal(err)
	}
	close(release) // the handler in progress returns after the reset
	time.Sleep(100 * time.Millisecond)
	g.blockCommits.Store(false)
	close(g.commitGate)
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("after ResetOffset(last) returned (offset 8), the consumer still delivered %v: messages from before the reset reached the handler", got)
	}
}

// TestReset_RacingFirstClaim: a consumer that subscribes while Reset runs,
// and claims before the reset is applied, delivers from the reset's
// position once Reset returned. This broke when Reset looked the group up
// once, before it applied the resets: the new consumer got no hint and
// went on from its old position.
func TestReset_RacingFirstClaim(t *testing.T) {
	tb, p, g := gatedTable("orders")
	send(t, p, 0, 5)
	g.beforeReset = make(chan struct{})
	e := newEngine(t, tb)
	resetDone := make(chan error, 1)
	go func() {
		resetDone <- e.Reset(context.Background(), "orders", "billing", Position{Kind: PosFirst})
	}()
	<-g.resetIn // Reset resolved the offsets and looked the group up: none yet
	l := newLog()
	c, err := e.Subscribe("orders", "billing", l.handler("a", nil), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l.waitFor(t, 0, 5)
	waitGroupState(t, p, "first pass", func(gs store.GroupState) bool { return gs.Offset == 5 })
	close(g.beforeReset)
	if err := <-resetDone; err != nil {
		t.Fatal(err)
	}
	// The reset (to 0) is done and the consumer runs: its next delivery
	// must come from offset 0.
	send(t, p, 5, 1)
	select {
	case off := <-l.all:
		if off != 0 {
			t.Fatalf("after ResetOffset(first) returned, the running consumer delivered offset %d before moving to 0", off)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing delivered after the reset")
	}
}

// TestReset_CloseDuringReclaimKeepsOffset: a worker told of a reset that
// it has already taken (it claimed again after its commit was refused,
// before the hint arrived) claims once more, and Close ends that claim:
// the group keeps its offset. This broke when run's deferred commit stored
// offset 0 (claim's failure value) under the worker's valid generation,
// rewinding the group to the start.
func TestReset_CloseDuringReclaimKeepsOffset(t *testing.T) {
	tb, p, g := gatedTable("orders")
	send(t, p, 0, 10)
	l := newLog()
	e := newEngine(t, tb)
	c, err := e.Subscribe("orders", "billing", l.handler("a", nil), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	l.waitFor(t, 0, 10)
	waitGroupState(t, p, "first pass", func(gs store.GroupState) bool { return gs.Offset == 10 })
	g.afterReset = make(chan struct{})
	resetDone := make(chan error, 1)
	go func() {
		resetDone <- e.Reset(context.Background(), "orders", "billing", Position{Kind: PosLast})
	}()
	<-g.resetIn // applied (offset 10, a new generation), not yet hinted
	resetGen := committed(t, p, "billing").Generation
	send(t, p, 10, 1) // the worker handles 10, its commit is refused, it re-claims
	waitGroupState(t, p, "re-claim after the refused commit", func(gs store.GroupState) bool {
		return gs.Generation > resetGen && gs.Offset == 11
	})
	g.blockClaims.Store(true)
	close(g.afterReset) // the hint: the worker claims again, and waits
	if err := <-resetDone; err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	c.Close()
	if gs := committed(t, p, "billing"); gs.Offset != 11 {
		t.Fatalf("after Close the group is at offset %d (%+v), want 11: nothing handled 0..10 again", gs.Offset, gs)
	}
}

// TestReset_IntoFilteredRun: a reset whose target lies inside a run of
// filtered messages redelivers the first accepted message after it, and
// nothing before; the offset ends past the log.
func TestReset_IntoFilteredRun(t *testing.T) {
	for _, kp := range []int{0, 2} {
		t.Run("KeyParallel"+strconv.Itoa(kp), func(t *testing.T) {
			tb := newTable()
			p := tb.add("orders", 1)[0]
			e := newEngine(t, tb)
			f, err := (*Filter)(nil).WithTags("T")
			if err != nil {
				t.Fatal(err)
			}
			sendTagged(t, p, 10, map[int]bool{0: true, 9: true})
			cfg := testConfig()
			cfg.Filter, cfg.KeyParallel = f, kp
			l := newLog()
			c, err := e.Subscribe("orders", "billing", l.handler("c", nil), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			l.waitFor(t, 9, 10)
			waitFor(t, "offset 10", func() bool { return committed(t, p, "billing").Offset == 10 })
			if err := e.Reset(context.Background(), "orders", "billing", Position{Kind: PosOffset, Offset: 5}); err != nil {
				t.Fatal(err)
			}
			l.waitFor(t, 9, 10)
			waitFor(t, "offset 10 after the reset", func() bool { return committed(t, p, "billing").Offset == 10 })
			time.Sleep(50 * time.Millisecond)
			got := l.of("c")
			if len(got) != 3 || got[0] != 0 || got[1] != 9 || got[2] != 9 {
				t.Fatalf("deliveries %v, want [0 9 9]", got)
			}
		})
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

// TestReset_HintAfterReclaimDelivers: a partition is never left
// undelivered while a live consumer of its group exists. Engine.Reset
// stores the new offset, then hints the partition's workers on this node,
// which claim again; a worker that learned of the reset first (its commit
// refused, it claimed again) is hinted anyway and claims once more. This
// broke when, with a lease, that claim was refused (ErrClaimed) by the
// worker's own claim of a moment ago, which keepLease went on renewing:
// the worker waited for its own lease forever and delivered nothing more.
func TestReset_HintAfterReclaimDelivers(t *testing.T) {
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
