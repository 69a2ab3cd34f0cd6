package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/store"
)

// TestRaft3_PartitionsPerRaftGroup: the option's limits, checked before
// anything is proposed.
func TestRaft3_PartitionsPerRaftGroup(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := c.nodes["n1"]
	for _, tc := range []struct {
		name string
		opts mq.Options
	}{
		{"Negative", mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: -1}},
		{"OnePast", mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: mq.MaxPartitionsPerRaftGroup + 1}},
		{"Huge", mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 1 << 62}},
		{"Single", mq.Options{Type: mq.Single, PartitionsPerRaftGroup: 2}},
		{"DefaultType", mq.Options{PartitionsPerRaftGroup: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := m.CreateMQ(ctx, "bad", 2, tc.opts); !errors.Is(err, mq.ErrInvalidOption) {
				t.Fatalf("CreateMQ %+v: %v, want ErrInvalidOption", tc.opts, err)
			}
		})
	}
	if _, ok := m.Topics()["bad"]; ok {
		t.Fatal("a refused CreateMQ made the topic")
	}
	// At the limit: one group of MaxPartitionsPerRaftGroup partitions.
	if err := m.CreateMQ(ctx, "max", mq.MaxPartitionsPerRaftGroup, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: mq.MaxPartitionsPerRaftGroup}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "one leader for the 64 partitions", func() bool {
		leaders := map[string]bool{}
		for i := range mq.MaxPartitionsPerRaftGroup {
			l, _ := mq.Raft3Leader(m, "max", i)
			if l == "" {
				return false
			}
			leaders[l] = true
		}
		return len(leaders) == 1
	})
	p, err := m.NewProducer("max")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.SendMessage(ctx, (&mq.Message{Body: []byte("last")}).ToPartition(mq.MaxPartitionsPerRaftGroup-1)); err != nil {
		t.Fatal(err)
	}
}

// TestRaft3_SharedGroups: a Raft3 topic of 5 partitions, 2 per raft group,
// makes the groups {0,1}, {2,3}, {4}, each with one leader for its
// partitions and one directory on each node; AlterMQ to 8 adds the groups
// {5,6} and {7}. Sends to every partition survive the kill of the leader
// of the first group (twice: each time a node that leads it) and the
// restart of the whole cluster: each acked message once, at its acked
// offset.
func TestRaft3_SharedGroups(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "r", 5, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 2}); err != nil {
		t.Fatal(err)
	}
	groups := [][]int{{0, 1}, {2, 3}, {4}}
	sameLeaders := func(m *mq.MQ) func() bool {
		return func() bool {
			for _, g := range groups {
				first, _ := mq.Raft3Leader(m, "r", g[0])
				for _, i := range g {
					if l, _ := mq.Raft3Leader(m, "r", i); l == "" || l != first {
						return false
					}
				}
			}
			return true
		}
	}
	for id, m := range c.nodes {
		waitFor(t, 20*time.Second, "one leader per group on "+id, sameLeaders(m))
	}
	for id := range c.nodes {
		for _, g := range groups {
			dir := filepath.Join(c.root, id, "raft3", "r", fmt.Sprint(g[0]))
			files := []string{"partition.db"}
			if len(g) > 1 {
				files = []string{"partition.db", "partition-1.db"}
			}
			for _, f := range files {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Errorf("%s: %v", id, err)
				}
			}
		}
	}

	type ack struct {
		part int
		off  int64
	}
	acked := map[string]ack{}
	parts := 5
	send := func(from *mq.MQ, tag string, n int) {
		t.Helper()
		p, err := from.NewProducer("r")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for j := range n {
			msg := (&mq.Message{ID: fmt.Sprintf("%s-%d", tag, j), Body: []byte(tag)}).ToPartition(j % parts)
			for {
				res, err := p.SendMessage(ctx, msg)
				if err == nil {
					acked[msg.ID] = ack{res[0].Partition, res[0].Offset}
					break
				}
				if !errors.Is(err, mq.ErrUnknownOutcome) && !errors.Is(err, mq.ErrNoQuorum) {
					t.Fatalf("send %s: %v", msg.ID, err)
				}
			}
		}
	}
	verify := func(m *mq.MQ, what string) {
		t.Helper()
		seen := map[string]int{}
		for i := range parts {
			for off := int64(0); ; off++ {
				got, err := m.ReadMessage(ctx, "r", i, off)
				if errors.Is(err, mq.ErrNoMessage) {
					break
				}
				if err != nil {
					t.Fatalf("%s: read %d/%d: %v", what, i, off, err)
				}
				seen[got.ID]++
				if a, ok := acked[got.ID]; ok && (a.part != i || a.off != off) {
					t.Errorf("%s: %s at %d/%d, acked at %d/%d", what, got.ID, i, off, a.part, a.off)
				}
			}
		}
		for id := range acked {
			if seen[id] != 1 {
				t.Errorf("%s: %s stored %d times", what, id, seen[id])
			}
		}
	}

	send(c.nodes["n1"], "a", 40)
	for round := range 2 {
		lead, _ := mq.Raft3Leader(c.nodes["n1"], "r", 0)
		c.kill(lead)
		var from *mq.MQ
		for id, m := range c.nodes {
			if id != lead {
				from = m
			}
		}
		send(from, fmt.Sprintf("b%d", round), 20)
		c.start(lead)
		for id, m := range c.nodes {
			waitFor(t, 20*time.Second, "one leader per group on "+id, sameLeaders(m))
		}
	}

	if err := c.nodes["n2"].AlterMQ(ctx, "r", 8); err != nil {
		t.Fatal(err)
	}
	groups = append(groups, []int{5, 6}, []int{7})
	parts = 8
	for id, m := range c.nodes {
		waitFor(t, 20*time.Second, "the new groups on "+id, func() bool { return m.Topics()["r"] == 8 && sameLeaders(m)() })
	}
	send(c.nodes["n3"], "c", 40)
	verify(c.nodes["n2"], "before the restart")

	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range c.nodes {
			if !yield(id) {
				return
			}
		}
	})
	for _, id := range ids {
		c.kill(id)
	}
	for _, id := range ids {
		c.start(id)
	}
	for id, m := range c.nodes {
		waitFor(t, 30*time.Second, "one leader per group after the restart on "+id, sameLeaders(m))
	}
	verify(c.nodes["n3"], "after the restart")
	send(c.nodes["n1"], "d", 16)
	verify(c.nodes["n1"], "after the restart and more sends")
}

// TestRaft3_ReplicaNotOpenYet: a node whose table has not yet caught up
// with a new Raft3 topic (its sync held) refuses a call for it at once
// with store.ErrClosed, which sends the caller to another replica, instead of
// holding it for 5 s and answering ErrNoTopic. The
// topic is served meanwhile by the two other replicas.
func TestRaft3_ReplicaNotOpenYet(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := sync.OnceFunc(mq.HoldAdmin(c.nodes["n2"]))
	defer release()
	if err := c.nodes["n1"].CreateMQ(ctx, "r", 2, mq.Options{Type: mq.Raft3}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := mq.Served(c.nodes["n2"], "r", 1)
	if !errors.Is(err, store.ErrClosed) || time.Since(start) > 4*time.Second {
		t.Fatalf("a call for a partition not open yet: %v after %v, want ErrClosed at once", err, time.Since(start))
	}
	p, err := c.nodes["n1"].NewProducer("r")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.SendMessage(ctx, (&mq.Message{Body: []byte("x")}).ToPartition(1)); err != nil {
		t.Fatalf("send while n2 has not opened the topic: %v", err)
	}
	// A topic the node's metadata does not show either is still waited
	// for, then ErrNoTopic.
	if err := mq.Served(c.nodes["n2"], "nothing", 0); !errors.Is(err, mq.ErrNoTopic) {
		t.Fatalf("a call for an unknown topic: %v", err)
	}
	release()
	waitFor(t, 20*time.Second, "n2 serves r once its table caught up", func() bool {
		_, holds := mq.Raft3Leader(c.nodes["n2"], "r", 1)
		return holds
	})
}
