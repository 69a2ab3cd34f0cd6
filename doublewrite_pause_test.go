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
	parallelByDefault(t)
	c, ch, part, follower, other, epoch := childLedPair(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	l := startAckLog(ctx, t, c.nodes[other], part)
	waitFor(t, 20*time.Second, "sends acked by n3", func() bool { return l.count() >= 50 })

	if err := ch.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := l.count()
	waitFor(t, 30*time.Second, follower+" promoted", func() bool {
		l, _, _, e := mq.PairRecord(c.nodes[other], r3, part)
		return l == follower && e > epoch
	})
	waitFor(t, 30*time.Second, "sends acked by the new leader", func() bool { return l.count() >= paused+50 })
	if err := ch.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := l.count()
	waitFor(t, 30*time.Second, "sends acked after the resume", func() bool { return l.count() >= resumed+50 })
	l.halt()
	// The old leader rejoins as the follower once it is the node left.
	c.kill(other)
	waitFor(t, 30*time.Second, "n3 the follower, in sync", func() bool {
		l, reps, inSync, _ := mq.PairRecord(c.nodes[follower], r3, part)
		return l == follower && slices.Equal(reps, []string{follower, "n3"}) && slices.Contains(inSync, "n3")
	})
	l.check(ctx, t, c.nodes[follower])
	t.Logf("%d acks (%d before the pause, %d before the resume)", l.count(), paused, resumed)
}

// TestDoubleWrite_ReportedLeaderDown: the process of the node leading a
// pair is killed (SIGKILL) while the sessions last 30 s: the producer's
// node, which can no longer reach it, reports it; the metadata leader's
// probe finds no answer either, marks it down and promotes the follower
// within seconds, not at the session's end; every ack is stored once at
// its offset.
func TestDoubleWrite_ReportedLeaderDown(t *testing.T) {
	parallelByDefault(t)
	c, ch, part, follower, other, epoch := childLedPair(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	l := startAckLog(ctx, t, c.nodes[other], part)
	waitFor(t, 20*time.Second, "sends acked by n3", func() bool { return l.count() >= 50 })
	ch.kill()
	start := time.Now()
	waitFor(t, 15*time.Second, follower+" promoted", func() bool {
		l, _, _, e := mq.PairRecord(c.nodes[other], r3, part)
		return l == follower && e > epoch
	})
	t.Logf("%s promoted %v after n3 was killed (sessions of 30 s)", follower, time.Since(start))
	killed := l.count()
	waitFor(t, 30*time.Second, "sends acked by the new leader", func() bool { return l.count() >= killed+50 })
	l.halt()
	l.check(ctx, t, c.nodes[follower])
}

// childLedPair starts nodes n1 and n2 here and n3 in a child process, with
// sessions of sess (a second if zero), and a DoubleWrite topic r3 of three
// pairs of one partition, spread by load: it returns the partition led by
// n3, its follower, the node out of that pair and the pair's epoch.
func childLedPair(t *testing.T, sess time.Duration) (c *testCluster, ch *nodeChild, part int, follower, other string, epoch uint64) {
	t.Helper()
	c = newCluster(t, 2, withSession(sess))
	ch = startNodeChild(t, c, "n3", 3)
	ch.expect(30*time.Second, "OPENED")
	c.waitUp(3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, r3, 3, mq.Options{Type: mq.DoubleWrite, PartitionsPerPair: 1}); err != nil {
		t.Fatal(err)
	}
	part = -1
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
	follower = replicas[1]
	other = "n1"
	if follower == "n1" {
		other = "n2"
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()[r3] == 3 })
	}
	return c, ch, part, follower, other, epoch
}

// ackLog is a producer on one node sending to one partition of r3, each ID
// resent until acked, and where each was acked.
type ackLog struct {
	mu   sync.Mutex
	acks []pauseAck
	stop chan struct{}
	done chan struct{}
	part int
}

type pauseAck struct {
	id  string
	off int64
}

func (l *ackLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acks)
}

// halt stops the producer and waits for it.
func (l *ackLog) halt() {
	close(l.stop)
	<-l.done
}

// startAckLog starts the producer through m.
func startAckLog(ctx context.Context, t *testing.T, m *mq.MQ, part int) *ackLog {
	l := &ackLog{stop: make(chan struct{}), done: make(chan struct{}), part: part}
	go func() {
		defer close(l.done)
		p, err := m.NewProducer(r3)
		if err != nil {
			t.Error(err)
			return
		}
		defer p.Close()
		for k := 0; ; k++ {
			msg := (&mq.Message{ID: fmt.Sprintf("p-%d", k), Body: []byte("x")}).ToPartition(part)
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
				res, err := p.SendMessage(sctx, msg)
				scancel()
				if err == nil {
					l.mu.Lock()
					l.acks = append(l.acks, pauseAck{msg.ID, res[0].Offset})
					l.mu.Unlock()
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
	return l
}

// check reads the partition through m: every ack at its offset, once.
func (l *ackLog) check(ctx context.Context, t *testing.T, m *mq.MQ) {
	t.Helper()
	stored := map[string]int64{}
	for off := int64(0); ; off++ {
		msg, err := m.ReadMessage(ctx, r3, l.part, off)
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
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.acks {
		if off, ok := stored[a.id]; !ok || off != a.off {
			t.Errorf("%s acked at %d, stored at %d (%v)", a.id, a.off, off, ok)
		}
	}
}
