package mq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestRaft3_NeedsThreeNodes: a Raft3 topic on a cluster of two nodes is
// refused at once with ErrNoQuorum, and on a standalone node with
// ErrUnsupportedType; a name too long for its groups is ErrInvalidTopic.
func TestRaft3_NeedsThreeNodes(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err := c.nodes["n1"].CreateMQ(ctx, "r", 1, mq.Options{Type: mq.Raft3})
	if !errors.Is(err, mq.ErrNoQuorum) {
		t.Fatalf("Raft3 on two nodes: %v, want ErrNoQuorum", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("refused after %v: not at once", took)
	}
	long := make([]byte, 250)
	for i := range long {
		long[i] = 'a'
	}
	if err := c.nodes["n1"].CreateMQ(ctx, string(long), 1, mq.Options{Type: mq.Raft3}); !errors.Is(err, mq.ErrInvalidTopic) {
		t.Fatalf("a Raft3 topic of 250 bytes: %v, want ErrInvalidTopic", err)
	}
	m := openNode(t, t.TempDir())
	if err := m.CreateMQ(ctx, "r", 1, mq.Options{Type: mq.Raft3}); !errors.Is(err, mq.ErrUnsupportedType) {
		t.Fatalf("Raft3 standalone: %v, want ErrUnsupportedType", err)
	}
}

// TestRaft3_SendConsumeFailover: a Raft3 topic on three nodes takes sends
// from every node and a consumer group receives them all; closing any one
// node (a leader of some groups, which hands them over) loses nothing: the
// two left go on taking sends, the group goes on receiving, and the node,
// reopened on its data, rejoins its groups and reads everything back.
func TestRaft3_SendConsumeFailover(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const parts = 3
	if err := c.nodes["n2"].CreateMQ(ctx, "r", parts, mq.Options{Type: mq.Raft3}); err != nil {
		t.Fatalf("CreateMQ Raft3: %v", err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()["r"] == parts })
	}
	var mu sync.Mutex
	acked := map[string]int{} // id -> partition
	send := func(from string, n int, tag string) {
		t.Helper()
		p, err := c.nodes[from].NewProducer("r")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for i := range n {
			msg := (&mq.Message{ID: fmt.Sprintf("%s-%s-%d", tag, from, i), Body: []byte(from)}).ToPartition(i % parts)
			for {
				_, err := p.SendMessage(ctx, msg)
				if err == nil {
					break
				}
				if !errors.Is(err, mq.ErrUnknownOutcome) {
					t.Fatalf("send %s from %s: %v", msg.ID, from, err)
				}
				// Resent as is: the same ID and partition, deduplicated.
			}
			mu.Lock()
			acked[msg.ID] = i % parts
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for id := range c.nodes {
		wg.Go(func() { send(id, 30, "a") })
	}
	wg.Wait()
	col := collect(t, c.nodes["n3"], "r", "g")
	ids := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for id := range acked {
			out = append(out, id)
		}
		return out
	}
	waitSeen(t, col, ids()...)

	c.kill("n1")
	for _, id := range []string{"n2", "n3"} {
		wg.Go(func() { send(id, 30, "b") })
	}
	wg.Wait()
	waitSeen(t, col, ids()...)

	back := c.start("n1")
	for i := range parts {
		waitFor(t, 20*time.Second, fmt.Sprintf("partition %d readable on the reopened node", i), func() bool {
			_, err := back.ReadMessage(ctx, "r", i, 0)
			return err == nil
		})
	}
	// Every acked message is in its partition, read through the node that
	// was down, once.
	seen := map[string]int{}
	for i := range parts {
		for off := int64(0); ; off++ {
			m, err := back.ReadMessage(ctx, "r", i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				t.Fatalf("read %d/%d on the reopened node: %v", i, off, err)
			}
			seen[m.ID]++
			if want, ok := acked[m.ID]; ok && want != i {
				t.Fatalf("%s in partition %d, sent to %d", m.ID, i, want)
			}
		}
	}
	for id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
	if len(seen) != len(acked) {
		t.Errorf("%d messages stored, %d acked", len(seen), len(acked))
	}
}
