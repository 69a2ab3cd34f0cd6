package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/zeze-go/mq"
)

// TestDoubleWrite_FollowerBackEmpty: a DoubleWrite follower comes back
// within its session with an empty data directory (a replaced disk), then
// the leader is killed (cut off and closed, so that nothing is handed
// over), paused (cut off, kept open) or closed cleanly, 0.1 s or 2 s
// later, with the pair idle or taking sends. The follower's new directory
// is a new incarnation: it is out of sync until caught up, so it is never
// promoted with what it lacks (the pair waits for its leader instead), and
// once the leader is back, every acked message is there once, in order.
func TestDoubleWrite_FollowerBackEmpty(t *testing.T) {
	parallelByDefault(t)
	type variant struct {
		fate  string // what happens to the leader: killed, paused, closed
		after time.Duration
		busy  bool
	}
	var vs []variant
	for _, fate := range []string{"killed", "paused", "closed"} {
		for _, after := range []time.Duration{100 * time.Millisecond, 2 * time.Second} {
			for _, busy := range []bool{false, true} {
				// The short run keeps one idle and one busy case of each fate.
				if fullRun() || (after < time.Second) != busy {
					vs = append(vs, variant{fate, after, busy})
				}
			}
		}
	}
	for _, v := range vs {
		name := fmt.Sprintf("%s-after-%v-busy-%t", v.fate, v.after, v.busy)
		t.Run(name, func(t *testing.T) {
			parallelByDefault(t)
			testFollowerBackEmpty(t, v.fate, v.after, v.busy)
		})
	}
}

func testFollowerBackEmpty(t *testing.T, fate string, after time.Duration, busy bool) {
	var logs nodeLogs
	const parts = 1
	c := newCluster(t, 3, withNodeOptions(logs.opts), withSession(3*time.Second), withDoubleWrite(parts, mq.Options{}))
	leader := c.leaderOf("d", 0)
	follower := dwFollower(c, leader, 0)
	c.waitInSync(0, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	acked := sendAll(ctx, t, c.nodes[leader], "d", parts, 300, "before")
	l := newLoad(c, parts)
	if busy {
		for id := range c.nodes {
			l.run(id)
		}
	}
	defer l.finish()

	// The follower's disk is replaced: closed, emptied, back at once.
	l.set(follower, nil)
	c.kill(follower)
	if err := os.RemoveAll(filepath.Join(c.root, follower)); err != nil {
		t.Fatal(err)
	}
	l.set(follower, c.start(follower))
	time.Sleep(after)

	l.set(leader, nil)
	switch fate {
	case "killed":
		c.isolate(leader, true)
		c.kill(leader)
	case "paused":
		c.isolate(leader, true)
	case "closed":
		c.kill(leader)
	}
	time.Sleep(5 * time.Second) // past the session: a failover would have happened
	// The follower leads now only if it caught up before: the reads
	// below find every acked message either way.
	ld, _, inSync := c.record("d", 0)
	t.Logf("with %s %s: %s leads, in sync %q", fate, leader, ld, inSync)
	switch fate {
	case "paused":
		c.isolate(leader, false)
		l.set(leader, c.nodes[leader])
	case "killed":
		c.isolate(leader, false) // the others' ends of its links
		l.set(leader, c.start(leader))
	default:
		l.set(leader, c.start(leader))
	}
	c.waitUp(3)
	c.waitInSync(0, 30*time.Second)
	if busy {
		time.Sleep(time.Second)
	}
	acked = append(acked, l.endedIDs(t)...)
	// A ctx of its own: the one above may be spent by a slow healing.
	check, cancelCheck := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelCheck()
	for _, id := range othersThan(c) {
		dwCheckStored(check, t, c.nodes[id], parts, acked)
	}
	t.Logf("%d acked; failover log: %q", len(acked), logs.matching("DoubleWrite"))
}

// setPairPartitions rewrites the partition count recorded in node id's
// replica of d/first (closed), as a replica of another pair's would have.
func setPairPartitions(t *testing.T, c *testCluster, id string, first, n int) {
	t.Helper()
	path := filepath.Join(c.root, id, "dw", "d", fmt.Sprint(first), "pair.db")
	s, err := raftboltdb.New(raftboltdb.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetUint64([]byte("raftqueue-partitions"), uint64(n)); err != nil {
		t.Fatal(err)
	}
}

// restartBroken closes node id without a hand-off (cut off first), makes
// its replica of d/0 record another partition count, and opens it again
// within its session: the record still makes it the leader.
func restartBroken(t *testing.T, c *testCluster, id string) *mq.MQ {
	t.Helper()
	c.isolate(id, true)
	c.kill(id)
	c.isolate(id, false)
	setPairPartitions(t, c, id, 0, 2)
	return c.start(id)
}

// TestDoubleWrite_LeaderReplicaCannotOpen: the leader's node comes back
// and its replica cannot open (its pair.db records another partition
// count). With the follower in sync, the pair is handed to it and every
// acked message is still read; with none in sync (the risk stage, the
// follower cut off), a send fails at once with ErrNoQuorum naming the
// cause rather than waiting out its ctx, and the node's ClusterStatus
// shows the partition failed.
func TestDoubleWrite_LeaderReplicaCannotOpen(t *testing.T) {
	parallelByDefault(t)
	t.Run("FollowerInSync", func(t *testing.T) {
		parallelByDefault(t)
		c := newCluster(t, 3, withSession(4*time.Second), withDoubleWrite(1, mq.Options{}))
		leader := c.leaderOf("d", 0)
		follower := dwFollower(c, leader, 0)
		c.waitInSync(0, 10*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		acked := sendAll(ctx, t, c.nodes[leader], "d", 1, 200, "before")
		m := restartBroken(t, c, leader)
		waitFor(t, 20*time.Second, "the pair handed to "+follower, func() bool {
			ld, _, _ := c.record("d", 0)
			return ld == follower
		})
		acked = append(acked, sendAll(ctx, t, m, "d", 1, 50, "after")...)
		dwCheckStored(ctx, t, c.nodes[follower], 1, acked)
	})
	t.Run("NoneInSync", func(t *testing.T) {
		parallelByDefault(t)
		c := newCluster(t, 3, withSession(4*time.Second), withDoubleWrite(1, mq.Options{AckAlone: true}))
		leader := c.leaderOf("d", 0)
		follower := dwFollower(c, leader, 0)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		sendAll(ctx, t, c.nodes[leader], "d", 1, 20, "before")
		c.cut(leader, follower, true)
		acked := sendAll(ctx, t, c.nodes[leader], "d", 1, 20, "alone") // acked alone once recorded so
		waitFor(t, 20*time.Second, "the leader alone in sync", func() bool {
			_, _, inSync := c.record("d", 0)
			return len(inSync) == 1
		})
		_ = acked
		m := restartBroken(t, c, leader)
		c.cut(leader, follower, true)
		p, err := m.NewProducer("d")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var last error
		defer func() { t.Logf("the last send: %v; status %v", last, m.ClusterStatus().Failed) }()
		waitFor(t, 20*time.Second, "a send refused at once", func() bool {
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			defer scancel()
			start := time.Now()
			_, last = p.SendMessage(sctx, (&mq.Message{Body: []byte("x")}).ToPartition(0))
			return errors.Is(last, mq.ErrNoQuorum) && time.Since(start) < 2*time.Second && sctx.Err() == nil &&
				strings.Contains(last.Error(), "partitions")
		})
		t.Logf("refused: %v", last)
		if cause := m.ClusterStatus().Failed["d/0"]; !strings.Contains(cause, "partitions") {
			t.Fatalf("ClusterStatus().Failed: %q, want d/0 with the partition count", m.ClusterStatus().Failed)
		}
	})
}

// waitInSync waits up to d until d/part's record has its follower in sync.
func (c *testCluster) waitInSync(part int, d time.Duration) {
	c.t.Helper()
	waitFor(c.t, d, fmt.Sprintf("the follower of d/%d in sync", part), func() bool {
		_, _, inSync := c.record("d", part)
		return len(inSync) == 2
	})
}

// TestDoubleWrite_LeaderBackEmptyHandsOver: the leader of a pair whose
// follower is in sync (and not the metadata leader) loses its disk: cut
// off and closed, so nothing is handed over, emptied, and back within its
// session. Its new incarnation hands the pair to the follower, which
// holds every acked message; the wiped node never leads what it lacks.
// Sends through the third node go on; every acked message, before and
// after, is read once through every node. With and without AckAlone.
func TestDoubleWrite_LeaderBackEmptyHandsOver(t *testing.T) {
	for _, alone := range []bool{false, true} {
		t.Run(fmt.Sprintf("AckAlone-%t", alone), func(t *testing.T) {
			const parts = 3
			c := newCluster(t, 3, withSession(8*time.Second), withDoubleWrite(parts, mq.Options{AckAlone: alone, PartitionsPerPair: 1}))
			part, leader, follower := dwPairOff(t, c, parts)
			c.waitInSync(part, 10*time.Second)
			third := othersThan(c, leader, follower)[0]
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			acked, err := dwSend(c.nodes[third], parts, part, 200, "before", 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			c.waitInSync(part, 10*time.Second)

			c.isolate(leader, true)
			start := time.Now()
			c.kill(leader)
			t.Logf("%s closed in %v", leader, time.Since(start))
			c.isolate(leader, false)
			if err := os.RemoveAll(filepath.Join(c.root, leader)); err != nil {
				t.Fatal(err)
			}
			m := c.start(leader)
			// The wiped node must never lead the pair while the record
			// does not count it in sync.
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				ld, _, _, _ := mq.PairRecord(c.nodes[third], "d", part)
				if ld == follower {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			ld, replicas, inSync, epoch := mq.PairRecord(c.nodes[third], "d", part)
			t.Logf("after the wipe: leader %s, replicas %q, in sync %q, epoch %d", ld, replicas, inSync, epoch)
			if ld != follower {
				t.Fatalf("the pair not handed to the intact follower %s: leader %s", follower, ld)
			}
			after, err := dwSend(c.nodes[third], parts, part, 100, "after", 60*time.Second)
			if err != nil {
				t.Fatalf("sends after the wipe: %v", err)
			}
			acked = append(acked, after...)
			c.waitInSync(part, 30*time.Second)
			ld, replicas, _, _ = mq.PairRecord(c.nodes[third], "d", part)
			if !slices.Contains(replicas, leader) {
				t.Logf("the wiped %s no longer in the pair %q", leader, replicas)
				for _, id := range othersThan(c) {
					dwCheckStored(ctx, t, c.nodes[id], parts, acked)
				}
				return
			}
			// The intact copy is lost now: only the wiped node, caught
			// up, may hold what was acked.
			c.isolate(ld, true)
			c.kill(ld)
			c.isolate(ld, false)
			waitFor(t, 30*time.Second, "the pair on "+leader, func() bool {
				ld, _, _, _ := mq.PairRecord(m, "d", part)
				return ld == leader
			})
			got := map[string]int{}
			var readErr error
			waitFor(t, 30*time.Second, "a read of d/"+fmt.Sprint(part)+" through "+leader, func() bool {
				got, readErr = readPart(ctx, m, part)
				return readErr == nil
			})
			missing := 0
			for _, id := range acked {
				if got[id] != 1 {
					missing++
				}
			}
			if missing > 0 {
				t.Fatalf("with only the wiped-and-caught-up %s: %d of %d acked messages not stored once", leader, missing, len(acked))
			}
		})
	}
}

// readPart returns how many times each ID is stored in d/part, read
// through m.
func readPart(ctx context.Context, m *mq.MQ, part int) (map[string]int, error) {
	seen := map[string]int{}
	for off := int64(0); ; off++ {
		msg, err := m.ReadMessage(ctx, "d", part, off)
		if errors.Is(err, mq.ErrNoMessage) {
			return seen, nil
		}
		if err != nil {
			return nil, err
		}
		seen[msg.ID]++
	}
}
