package mq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestDoubleWrite_PausedLeader: the node leading a DoubleWrite pair runs in
// a child process and is stopped (SIGSTOP) past its session timeout while
// a producer on another node sends to the pair: the metadata promotes its
// follower (epoch+1), the sends go on there; the old leader, resumed
// (SIGCONT) with sends still in its queue, acks none of them (its follower
// refuses its epoch), and every ack is in the partition at the offset it
// gave, once. The old leader then rejoins as the follower (the other
// follower's node closed, it is the one left) and is recorded in sync.
func TestDoubleWrite_PausedLeader(t *testing.T) {
	c := newCluster(t, 2)
	ch := startNodeChild(t, c, "n3", 3)
	ch.expect(30*time.Second, "OPENED")
	c.waitUp(3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// One pair per partition, spread by load: one is led by the child.
	if err := c.nodes["n1"].CreateMQ(ctx, r3, 3, mq.Options{Type: mq.DoubleWrite, PartitionsPerPair: 1}); err != nil {
		t.Fatal(err)
	}
	part := -1
	waitFor(t, 20*time.Second, "a pair led by n3", func() bool {
		for i := range 3 {
			if l, _, inSync, _ := mq.PairRecord(c.nodes["n1"], r3, i); l == "n3" && len(inSync) == 2 {
				part = i
				return true
			}
		}
		return false
	})
	_, replicas, _, epoch := mq.PairRecord(c.nodes["n1"], r3, part)
	follower := replicas[1]
	other := "n1"
	if follower == "n1" {
		other = "n2"
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()[r3] == 3 })
	}

	// The producer, on the node that is not in the pair, resends an ID
	// until acked and records where each was acked.
	type ack struct {
		id  string
		off int64
	}
	var mu sync.Mutex
	var acks []ack
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		p, err := c.nodes[other].NewProducer(r3)
		if err != nil {
			t.Error(err)
			return
		}
		defer p.Close()
		for k := 0; ; k++ {
			msg := (&mq.Message{ID: fmt.Sprintf("p-%d", k), Body: []byte("x")}).ToPartition(part)
			for {
				select {
				case <-stop:
					return
				default:
				}
				sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
				res, err := p.SendMessage(sctx, msg)
				scancel()
				if err == nil {
					mu.Lock()
					acks = append(acks, ack{msg.ID, res[0].Offset})
					mu.Unlock()
					break
				}
				if !errors.Is(err, mq.ErrUnknownOutcome) && !errors.Is(err, mq.ErrNoQuorum) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("send %s: %v", msg.ID, err)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acks) }
	waitFor(t, 20*time.Second, "sends acked by n3", func() bool { return count() >= 50 })

	if err := ch.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := count()
	waitFor(t, 30*time.Second, follower+" promoted", func() bool {
		l, _, _, e := mq.PairRecord(c.nodes[other], r3, part)
		return l == follower && e > epoch
	})
	waitFor(t, 30*time.Second, "sends acked by the new leader", func() bool { return count() >= paused+50 })
	if err := ch.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := count()
	waitFor(t, 30*time.Second, "sends acked after the resume", func() bool { return count() >= resumed+50 })

	close(stop)
	<-done
	// The old leader rejoins as the follower once it is the node left.
	c.kill(other)
	waitFor(t, 30*time.Second, "n3 the follower, in sync", func() bool {
		l, reps, inSync, _ := mq.PairRecord(c.nodes[follower], r3, part)
		return l == follower && slices.Equal(reps, []string{follower, "n3"}) && slices.Contains(inSync, "n3")
	})

	// Every ack at its offset, once.
	m := c.nodes[follower]
	stored := map[string]int64{}
	for off := int64(0); ; off++ {
		msg, err := m.ReadMessage(ctx, r3, part, off)
		if errors.Is(err, mq.ErrNoMessage) {
			break
		}
		if err != nil {
			t.Fatalf("read %d: %v", off, err)
		}
		if _, dup := stored[msg.ID]; dup {
			t.Errorf("%s stored twice", msg.ID)
		}
		stored[msg.ID] = off
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range acks {
		if off, ok := stored[a.id]; !ok || off != a.off {
			t.Errorf("%s acked at %d, stored at %d (%v)", a.id, a.off, off, ok)
		}
	}
	t.Logf("%d acks (%d before the pause, %d before the resume), %d stored", len(acks), paused, resumed, len(stored))
}
