package delivery

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// leasing is a coordinator with a lease that gives every consumer of the
// node every partition (Local, one consumer): two nodes with it disagree,
// as a node cut from the metadata group and the new owner do.
type leasing struct {
	Local
	lease time.Duration
}

func (l leasing) Lease() time.Duration { return l.lease }

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
	a := newEngineWith(t, tb, leasing{lease: lease})
	b := newEngineWith(t, tb, leasing{lease: lease})
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
	e := newEngineWith(t, tb, leasing{lease: lease})
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
