package mq_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// raft3Sender sends single messages to r3/0 through node via until stop,
// each resent with its ID until acked, and keeps the acked IDs.
type raft3Sender struct {
	mu    sync.Mutex
	via   func() *mq.MQ
	acked []string
	stop  chan struct{}
	done  chan struct{}
}

func startRaft3Sender(via func() *mq.MQ) *raft3Sender {
	s := &raft3Sender{via: via, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for k := 0; ; k++ {
			msg := (&mq.Message{ID: fmt.Sprintf("w-%d", k), Body: []byte("w")}).ToPartition(0)
			for {
				select {
				case <-s.stop:
					return
				default:
				}
				p, err := s.via().NewProducer(r3)
				if err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					_, err = p.SendMessage(ctx, msg)
					cancel()
					p.Close()
				}
				if err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			s.mu.Lock()
			s.acked = append(s.acked, msg.ID)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *raft3Sender) end() []string {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acked)
}

// wipe closes node id, empties its directory and opens it again: a new
// disk under the same node id.
func (c *testCluster) wipe(id string) *mq.MQ {
	c.t.Helper()
	c.kill(id)
	if err := os.RemoveAll(filepath.Join(c.root, id)); err != nil {
		c.t.Fatal(err)
	}
	return c.start(id)
}

// raft3Rejoined waits until no replica of r3/0 is lost and m's replica
// counts the three as voters.
func raft3Rejoined(t *testing.T, c *testCluster, d time.Duration) {
	t.Helper()
	waitFor(t, d, "every replica of r3/0 rejoined as a voter", func() bool {
		for _, m := range c.nodes {
			lost, voters := mq.Raft3Membership(m, r3, 0)
			if len(lost) > 0 || len(voters) != 3 {
				return false
			}
		}
		return true
	})
}

// TestRaft3_ReplicaBackEmpty: a Raft3 replica whose node comes back with
// an empty data directory (a replaced disk) while the group takes sends
// is a new server: it neither bootstraps the group nor votes, the leader
// removes it and adds it back as a nonvoter, and once it caught up it is
// a voter again. Wiped one after the other, two of the three vote only for
// replicas not lost, so even with the third, the one intact copy, cut off
// for a while, neither leads without every committed entry: every acked
// message is read from every node, once.
func TestRaft3_ReplicaBackEmpty(t *testing.T) {
	parallelByDefault(t)
	for _, wiped := range []int{1, 2} {
		t.Run(fmt.Sprintf("wiped-%d", wiped), func(t *testing.T) {
			parallelByDefault(t)
			var logs nodeLogs
			c := newCluster(t, 3, withNodeOptions(logs.opts), withSession(3*time.Second), withRaft3(1))
			defer func() {
				if t.Failed() {
					for id, m := range c.nodes {
						lost, voters := mq.Raft3Membership(m, r3, 0)
						t.Logf("%s: lost %q, voters %q", id, lost, voters)
					}
					t.Logf("log: %q", logs.matching("Raft3"))
					for _, l := range logs.matching("Raft3") {
						t.Log(l)
					}
				}
			}()
			var leader string
			waitFor(t, 20*time.Second, "a leader of r3/0", func() bool {
				leader, _ = mq.Raft3Leader(c.nodes["n1"], r3, 0)
				return leader != ""
			})
			via := c.nodes[leader] // never wiped
			s := startRaft3Sender(func() *mq.MQ { return via })
			defer func() {
				select {
				case <-s.done:
				default:
					s.end()
				}
			}()
			time.Sleep(time.Second)
			others := othersThan(c, leader)
			for _, id := range others[:wiped] {
				c.wipe(id)
				time.Sleep(500 * time.Millisecond)
			}
			if wiped == 2 {
				// The leader, the one intact copy, cut off: the wiped
				// two must not elect one of them.
				// A wiped one may lead only with every entry committed
				// before: never one that lost them and has not caught up.
				_, committed := mq.Raft3Indexes(c.nodes[leader], r3, 0)
				c.isolate(leader, true)
				for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					for _, id := range others {
						ld, _ := mq.Raft3Leader(c.nodes[id], r3, 0)
						if last, _ := mq.Raft3Indexes(c.nodes[id], r3, 0); ld == id && last < committed {
							t.Fatalf("with %s cut off, %s leads r3/0 with its log ending at %d, before %d committed", leader, id, last, committed)
						}
					}
				}
				c.isolate(leader, false)
			}
			raft3Rejoined(t, c, 60*time.Second)
			time.Sleep(500 * time.Millisecond)
			acked := s.end()
			if len(acked) == 0 {
				t.Fatal("nothing acked")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for id, m := range c.nodes {
				seen := readAll(ctx, t, m, r3, 1)
				lost := 0
				for _, a := range acked {
					if seen[a] != 1 {
						lost++
						if lost <= 3 {
							t.Errorf("read through %s: acked %s stored %d times", id, a, seen[a])
						}
					}
				}
				if lost > 0 {
					t.Errorf("read through %s: %d of %d acked messages not stored once", id, lost, len(acked))
				}
			}
			t.Logf("%d acked", len(acked))
		})
	}
}
