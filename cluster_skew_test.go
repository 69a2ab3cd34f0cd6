package mq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/store"
)

// skewedClock is the system clock off by d.
type skewedClock struct{ d time.Duration }

func (c skewedClock) Now() time.Time                         { return time.Now().Add(c.d) }
func (c skewedClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// TestRaft3_LeaseSafeAcrossSkewedLeaders: a consumer group's lease is
// renewed under one leader of a Raft3 partition, whose leadership then
// moves to a node whose clock is ahead by most of the session timeout,
// more than the lease. A claim by another owner, which that node's clock
// alone would find past the lease, is refused (ErrClaimed) until the new
// leader has led for a lease by its own clock: the lease holds in real
// time, whatever the clocks say.
func TestRaft3_LeaseSafeAcrossSkewedLeaders(t *testing.T) {
	parallelByDefault(t)
	const session, skew = 4 * time.Second, 3500 * time.Millisecond
	lease := session / 2
	c := newCluster(t, 3, withSession(session), withRaft3(1), withNodeOptions(func(id string) []mq.Option {
		if id == "n3" {
			return []mq.Option{mq.WithClock(skewedClock{skew})}
		}
		return nil
	}))
	leaderNow := func() string {
		var ld string
		waitFor(t, 20*time.Second, "a leader of r3/0", func() bool {
			ld, _ = mq.Raft3Leader(c.nodes["n1"], r3, 0)
			if ld == "" {
				return false
			}
			own, _ := mq.Raft3Leader(c.nodes[ld], r3, 0)
			return own == ld
		})
		return ld
	}
	ld := leaderNow()
	if ld == "n3" {
		if err := mq.Raft3TransferTo(c.nodes["n3"], r3, 0, "n1"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "n1 leading", func() bool { return leaderNow() == "n1" })
		ld = "n1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := mq.ApplyCmd(ctx, c.nodes[ld], r3, 0, &store.Command{Op: store.OpClaim, Group: "g", MaxAge: int64(lease)})
	if err != nil {
		t.Fatal(err)
	}
	owner := res.Generation
	if _, err := mq.ApplyCmd(ctx, c.nodes[ld], r3, 0, &store.Command{Op: store.OpRenew, Group: "g", Generation: owner}); err != nil {
		t.Fatal(err)
	}
	renewed := time.Now()
	if err := mq.Raft3TransferTo(c.nodes[ld], r3, 0, "n3"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "n3 leading", func() bool { return leaderNow() == "n3" })
	_, err = mq.ApplyCmd(ctx, c.nodes["n3"], r3, 0, &store.Command{Op: store.OpClaim, Group: "g", MaxAge: int64(lease)})
	if !errors.Is(err, store.ErrClaimed) {
		t.Fatalf("a claim under a leader whose clock is %v ahead, %v after the owner's renewal (lease %v): %v, want ErrClaimed",
			skew, time.Since(renewed).Round(time.Millisecond), lease, err)
	}
	// Once the lease lapsed in real time, another owner claims: within a
	// few leases, as a leader elected meanwhile on a loaded machine must
	// have led for a lease too.
	defer func() {
		if t.Failed() {
			t.Logf("the last claim: %v", err)
		}
	}()
	waitFor(t, 6*lease, "the claim once the lease lapsed", func() bool {
		res, err = mq.ApplyCmd(ctx, c.nodes["n3"], r3, 0, &store.Command{Op: store.OpClaim, Group: "g", MaxAge: int64(lease)})
		return err == nil
	})
	if since := time.Since(renewed); since < lease || res.Generation == owner {
		t.Fatalf("claimed as generation %d %v after the owner's renewal, within its lease %v", res.Generation, since, lease)
	}
}
