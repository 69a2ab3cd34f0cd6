package mq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestDoubleWrite_AckAloneFollowerGoneBeforeRecordedInSync: with the
// risk stage (AckAlone), a follower whose replies stall (the link cut one
// way, from the follower to the leader) gets the leader recorded alone.
// Back, it catches up, and the leader commits on both copies again; gone
// again before it is recorded in sync (the recording held here), it must
// not hold sends: the leader has itself recorded alone again and acks
// alone within FollowerTimeout (2 s), so no send waits much longer than
// that, and every acked message is stored once. Once the follower is back
// for good, it is recorded in sync.
func TestDoubleWrite_AckAloneFollowerGoneBeforeRecordedInSync(t *testing.T) {
	parallelByDefault(t)
	var hold atomic.Bool
	// Sessions outlast each cut, should the metadata leader move to one
	// of the pair's nodes meanwhile.
	c := newCluster(t, 3, withSession(8*time.Second), withDoubleWrite(3, mq.Options{AckAlone: true, PartitionsPerPair: 1}),
		withNodeOptions(func(string) []mq.Option {
			return []mq.Option{mq.WithInSyncHook(func(inSync []string) error {
				if hold.Load() && len(inSync) == 2 {
					return errors.New("held by the test")
				}
				return nil
			})}
		}))
	ctx := testCtx(t)
	// A pair of which neither replica is the metadata leader: the cut
	// between them leaves each node's session alone.
	meta := c.nodes["n1"].ClusterStatus().Leader
	part, leader, follower := -1, "", ""
	for i := range 3 {
		l := c.leaderOf("d", i)
		_, replicas, _, _ := mq.PairRecord(c.nodes["n1"], "d", i)
		if l != meta && !slices.Contains(replicas, meta) && len(replicas) == 2 {
			part, leader, follower = i, l, replicas[0]
			if follower == leader {
				follower = replicas[1]
			}
			break
		}
	}
	if part < 0 {
		t.Fatalf("every pair has a replica on the metadata leader %s", meta)
	}
	p, err := c.nodes[leader].NewProducer("d")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	stop := make(chan struct{})
	var (
		mu      sync.Mutex
		acked   []string
		slowest time.Duration
		failed  error
		wg      sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			msg := (&mq.Message{ID: fmt.Sprintf("m-%d", 3*i+part), Body: []byte("x")}).ToPartition(part)
			sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			start := time.Now()
			_, err := p.SendMessage(sctx, msg)
			took := time.Since(start)
			cancel()
			mu.Lock()
			slowest = max(slowest, took)
			switch {
			case err == nil:
				acked = append(acked, msg.ID)
			case errors.Is(err, mq.ErrUnknownOutcome), errors.Is(err, mq.ErrNoQuorum):
			default:
				failed = fmt.Errorf("send %s after %v: %w", msg.ID, took, err)
			}
			mu.Unlock()
			if err != nil && !errors.Is(err, mq.ErrUnknownOutcome) && !errors.Is(err, mq.ErrNoQuorum) {
				return
			}
		}
	}()

	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	goesOn := func(what string) {
		t.Helper()
		from := count()
		waitFor(t, 20*time.Second, "sends acked "+what, func() bool {
			mu.Lock()
			err := failed
			mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			return !c.inSync("d", part, follower) && count() >= from+20
		})
	}
	mq.SetLinkMuted(c.nodes[follower], leader, true)
	goesOn("with the follower cut off")
	hold.Store(true)
	mq.SetLinkMuted(c.nodes[follower], leader, false)
	time.Sleep(time.Second) // it catches up: the leader commits on both copies
	goesOn("with the follower back, not recorded in sync")
	mq.SetLinkMuted(c.nodes[follower], leader, true)
	goesOn("with the follower cut off again before it was recorded in sync")
	hold.Store(false)
	mq.SetLinkMuted(c.nodes[follower], leader, false)
	waitFor(t, 20*time.Second, "the follower recorded in sync", func() bool { return c.inSync("d", part, follower) })
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if failed != nil {
		t.Fatal(failed)
	}
	// FollowerTimeout and the record's proposal.
	if slowest > 6*time.Second {
		t.Fatalf("a send waited %v for a follower that blinked", slowest)
	}
	if len(acked) == 0 {
		t.Fatal("nothing acked")
	}
	seen := readAll(ctx, t, c.nodes[leader], "d", 3)
	for _, id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
	t.Logf("%d acked, slowest send %v", len(acked), slowest)
}
