package delivery

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEngine_TwoGenerations: two nodes' consumers of one group own one
// partition at once, as when a coordinator moves it before the old owner
// knows. The newer claim fences the older: the older consumer's next
// commit is refused, it stops delivering, and the group's offset is never
// moved back by it. Every message is delivered, each consumer's deliveries
// are in offset order, and after the handover only the new owner delivers.
func TestEngine_TwoGenerations(t *testing.T) {
	tb := newTable()
	p := tb.add("orders", 1)[0]
	l := newLog()
	a := newEngine(t, tb)
	if _, err := a.Subscribe("orders", "billing", l.handler("a", nil), testConfig()); err != nil {
		t.Fatal(err)
	}
	send(t, p, 0, 50)
	l.waitFor(t, 0, 50)
	// a's commit of 50 must land before b claims; refused, it would fence
	// a before 50..59 exist, which is correct but not what this test is for.
	deadline := time.Now().Add(5 * time.Second)
	for committed(t, p, "billing").Offset != 50 {
		if time.Now().After(deadline) {
			t.Fatalf("a never committed 50: group at %+v", committed(t, p, "billing"))
		}
		time.Sleep(time.Millisecond)
	}
	genA := committed(t, p, "billing").Generation

	gate := make(chan struct{})
	b := newEngine(t, tb)
	if _, err := b.Subscribe("orders", "billing", l.handler("b", gate), testConfig()); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for committed(t, p, "billing").Generation == genA {
		if time.Now().After(deadline) {
			t.Fatal("the second consumer never claimed the partition")
		}
		time.Sleep(time.Millisecond)
	}
	genB := committed(t, p, "billing").Generation
	// a delivers 50..59 (b is held at its gate), then its commit is refused.
	send(t, p, 50, 10)
	deadline = time.Now().Add(5 * time.Second)
	for len(l.of("a")) < 60 {
		if time.Now().After(deadline) {
			t.Fatalf("a delivered %d of 60 before its commit", len(l.of("a")))
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a's commit of 60 is refused by now
	if gs := committed(t, p, "billing"); gs.Generation != genB || gs.Offset > 50 {
		t.Fatalf("after a's stale commit the group is at %+v, want generation %d at offset <= 50", gs, genB)
	}
	close(gate)
	send(t, p, 60, 40)
	l.waitFor(t, 60, 100)
	deadline = time.Now().Add(5 * time.Second)
	for committed(t, p, "billing").Offset != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("group at %+v, want offset 100", committed(t, p, "billing"))
		}
		time.Sleep(time.Millisecond)
	}
	if n := len(l.of("a")); n != 60 {
		t.Fatalf("a delivered %d messages after it was fenced (60 before)", n-60)
	}
	for _, name := range []string{"a", "b"} {
		got := l.of(name)
		for i := 1; i < len(got); i++ {
			if got[i] <= got[i-1] {
				t.Fatalf("%s delivered %d after %d", name, got[i], got[i-1])
			}
		}
	}
	if got := l.of("b"); len(got) == 0 || got[0] != 50 {
		t.Fatalf("b started at %v, want 50 (the offset a had committed when b claimed)", got[:min(len(got), 3)])
	}
}

// TestEngine_ClaimRetries: a worker whose claim fails (a store error)
// tries again after a pause instead of leaving its partition assigned and
// undelivered.
func TestEngine_ClaimRetries(t *testing.T) {
	tb := newTable()
	p := tb.add("orders", 1)[0]
	send(t, p, 0, 3)
	p.FailNext(errors.New("disk on fire"))
	l := newLog()
	e := newEngine(t, tb)
	c, err := e.Subscribe("orders", "billing", l.handler("a", nil), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	l.waitFor(t, 0, 3)
	if got := c.Assigned(); len(got) != 1 {
		t.Fatalf("assigned %v", got)
	}
}

// TestEngine_ResetDuringClose: a reset that runs while a consumer closes,
// its handler still inside a message, wins: the closing worker's last
// commit is refused (it used to overwrite the reset).
func TestEngine_ResetDuringClose(t *testing.T) {
	tb := newTable()
	p := tb.add("orders", 1)[0]
	send(t, p, 0, 10)
	inside := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	e := newEngine(t, tb)
	c, err := e.Subscribe("orders", "billing", func(ctx context.Context, d *Delivery) error {
		once.Do(func() { close(inside) })
		<-release
		return nil
	}, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	<-inside
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	time.Sleep(20 * time.Millisecond) // Close has left the group and waits for the handler
	if err := e.Reset(context.Background(), "orders", "billing", Position{Kind: PosOffset, Offset: 5}); err != nil {
		t.Fatal(err)
	}
	close(release)
	<-closed
	if gs := committed(t, p, "billing"); gs.Offset != 5 {
		t.Fatalf("after the reset to 5 and the close, the group is at %d", gs.Offset)
	}
}

// TestEngine_SeekFromHandlers: handlers of two partitions of one group
// reset the group at the same time; neither waits for the other (they
// deadlocked when each waited for the other partition's worker, inside its
// handler).
func TestEngine_SeekFromHandlers(t *testing.T) {
	tb := newTable()
	parts := tb.add("orders", 2)
	for _, p := range parts {
		send(t, p, 0, 5)
	}
	e := newEngine(t, tb)
	var (
		both  sync.WaitGroup
		once  [2]sync.Once
		errs  = make(chan error, 2)
		ready = make(chan struct{})
	)
	both.Add(2)
	go func() { both.Wait(); close(ready) }()
	_, err := e.Subscribe("orders", "billing", func(ctx context.Context, d *Delivery) error {
		once[d.Partition].Do(func() {
			both.Done()
			<-ready // both handlers are inside
			errs <- e.Reset(ctx, "orders", "billing", Position{Kind: PosLast})
		})
		return nil
	}, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("two handlers resetting their group deadlocked")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range parts {
		for committed(t, p, "billing").Offset != 5 {
			if time.Now().After(deadline) {
				t.Fatalf("group at %+v after the reset to the end", committed(t, p, "billing"))
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// only is a coordinator that gives this node's members part alone, as a
// cluster-wide one would when the other partitions live with consumers on
// other nodes.
type only struct{ part int }

func (o only) Share(_, _ string, members []uint64, _ int) [][]int {
	out := make([][]int, len(members))
	if len(members) > 0 {
		out[0] = []int{o.part}
	}
	return out
}

// TestEngine_Coordinator: the engine delivers what its coordinator assigns,
// and nothing else.
func TestEngine_Coordinator(t *testing.T) {
	tb := newTable()
	parts := tb.add("orders", 3)
	for _, p := range parts {
		send(t, p, 0, 4)
	}
	l := newLog()
	e := newEngineWith(t, tb, only{part: 1})
	c, err := e.Subscribe("orders", "billing", l.handler("a", nil), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	l.waitFor(t, 0, 4)
	if got := c.Assigned(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("assigned %v, want [1]", got)
	}
	time.Sleep(20 * time.Millisecond)
	for i, p := range parts {
		_, claimed, _ := p.Group("billing")
		if claimed != (i == 1) {
			t.Fatalf("partition %d claimed %v", i, claimed)
		}
	}
	if got := len(l.of("a")); got != 4 {
		t.Fatalf("delivered %d messages, want partition 1's 4", got)
	}
}

// TestLocal_Share: the local coordinator divides n partitions among the
// members in turn, and gives none to no member.
func TestLocal_Share(t *testing.T) {
	got := Local{}.Share("t", "g", []uint64{1, 2, 3}, 7)
	want := [][]int{{0, 3, 6}, {1, 4}, {2, 5}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Share(3, 7) = %v, want %v", got, want)
	}
	if got := (Local{}).Share("t", "g", nil, 4); len(got) != 0 {
		t.Fatalf("Share(0, 4) = %v", got)
	}
}

// handoff is a coordinator shared by two engines ("nodes") as a cluster's
// is: partition 0 of the group belongs to node a until moved, then to node
// b, but only once a reported (Stopper) that it no longer delivers it.
type handoff struct {
	mu      sync.Mutex
	moved   bool // the coordinator decided to move the partition to b
	stopped bool // a reported it stopped delivering the partition
	engines map[string]*Engine
}

type handoffNode struct {
	h    *handoff
	name string
}

func (n handoffNode) Share(_, _ string, members []uint64, _ int) [][]int {
	n.h.mu.Lock()
	defer n.h.mu.Unlock()
	out := make([][]int, len(members))
	owner := "a"
	if n.h.moved {
		owner = ""
		if n.h.stopped {
			owner = "b"
		}
	}
	if len(members) > 0 && owner == n.name {
		out[0] = []int{0}
	}
	return out
}

func (n handoffNode) Stopped(topic, _ string, part int) {
	if n.name != "a" || part != 0 {
		return
	}
	n.h.mu.Lock()
	n.h.stopped = n.h.moved
	b := n.h.engines["b"]
	n.h.mu.Unlock()
	go b.Rebalance(topic) // Stopped must not block: a cluster's proposes
}

// TestEngine_Handoff: a coordinator that implements Stopper hears when the
// old owner's worker has ended (after its last commit), and only then gives
// the partition to a consumer of another engine. The two never run a
// handler at once, the new owner starts at the old one's committed offset,
// and every message is delivered once.
func TestEngine_Handoff(t *testing.T) {
	tb := newTable()
	p := tb.add("orders", 1)[0]
	h := &handoff{engines: map[string]*Engine{}}
	a := newEngineWith(t, tb, handoffNode{h, "a"})
	b := newEngineWith(t, tb, handoffNode{h, "b"})
	h.engines["a"], h.engines["b"] = a, b

	var active atomic.Int32 // handlers running, on either engine
	var overlap atomic.Bool
	release, entered := make(chan struct{}), make(chan struct{})
	l := newLog()
	slow := func(name string) Handler {
		inner := l.handler(name, nil)
		return func(ctx context.Context, d *Delivery) error {
			if active.Add(1) > 1 {
				overlap.Store(true)
			}
			defer active.Add(-1)
			if name == "a" && d.Offset == 5 {
				close(entered)
				<-release // a is inside a handler when the move is decided
			}
			return inner(context.Background(), d)
		}
	}
	if _, err := a.Subscribe("orders", "billing", slow("a"), testConfig()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Subscribe("orders", "billing", slow("b"), testConfig()); err != nil {
		t.Fatal(err)
	}
	send(t, p, 0, 10)
	l.waitFor(t, 0, 5)
	<-entered // not only 0..4 handled: a is in 5's handler, not between two
	h.mu.Lock()
	h.moved = true
	h.mu.Unlock()
	a.Rebalance("orders") // a stops its worker; b gets nothing yet
	b.Rebalance("orders")
	time.Sleep(20 * time.Millisecond)
	if got := l.of("b"); len(got) != 0 {
		t.Fatalf("b delivered %v while a's handler was running", got)
	}
	close(release)
	l.waitFor(t, 5, 10)
	if overlap.Load() {
		t.Fatal("handlers of a and b ran at once")
	}
	if got, want := fmt.Sprint(l.of("a")), "[0 1 2 3 4 5]"; got != want {
		t.Fatalf("a delivered %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(l.of("b")), "[6 7 8 9]"; got != want {
		t.Fatalf("b delivered %s, want %s (from a's committed offset)", got, want)
	}
}

// TestEngine_ForgetsGroups: a group is held in memory only while it has
// consumers or workers. Broadcast instances, and names given only to
// Reset, leave nothing behind once closed (every (topic, offset name)
// ever used once stayed for the node's life).
func TestEngine_ForgetsGroups(t *testing.T) {
	tb := newTable()
	p := tb.add("orders", 2)[0]
	send(t, p, 0, 4)
	l := newLog()
	e := newEngine(t, tb)
	var consumers []*Consumer
	for _, instance := range []string{"", "i1", "i2"} {
		cfg := testConfig()
		cfg.Instance = instance
		c, err := e.Subscribe("orders", "billing", l.handler("billing@"+instance, nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, c)
	}
	if err := e.Reset(context.Background(), "orders", "audit", Position{Kind: PosFirst}); err != nil {
		t.Fatal(err)
	}
	groups := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.groups)
	}
	if n := groups(); n != 3 {
		t.Fatalf("%d groups in memory with three open consumers (a group and two instances), want 3", n)
	}
	for _, c := range consumers {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for groups() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d groups still in memory after every consumer closed", groups())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEngine_StartTimeExtremes: a start time before 1970 (clamped to
// MinInt64 by the root) starts at the first message, one after 2262
// (MaxInt64) at the end.
func TestEngine_StartTimeExtremes(t *testing.T) {
	for _, tc := range []struct {
		at   int64
		want int
	}{{math.MinInt64, 3}, {-1, 3}, {math.MaxInt64, 0}} {
		tb := newTable()
		p := tb.add("orders", 1)[0]
		e := newEngine(t, tb)
		sendTagged(t, p, 3, nil)
		cfg := testConfig()
		cfg.Start, cfg.StartTime = StartTime, tc.at
		l := newLog()
		c, err := e.Subscribe("orders", "billing", l.handler("c", nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a claim", func() bool { _, ok, _ := p.Group("billing"); return ok })
		time.Sleep(100 * time.Millisecond)
		c.Close()
		if got := len(l.of("c")); got != tc.want {
			t.Errorf("start time %d: %d delivered, want %d", tc.at, got, tc.want)
		}
		gs := committed(t, p, "billing")
		if tc.want == 0 && gs.Offset != 3 {
			t.Errorf("start time %d: group at %d, want 3", tc.at, gs.Offset)
		}
	}
}
