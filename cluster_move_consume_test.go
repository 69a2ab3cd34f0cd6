package mq_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_MoveSingleOneConsumerAtATime: consumers of one group on two nodes
// consume s/0 while it moves: no message is in two listeners at once, and
// every acked message is delivered.
func TestCluster_MoveSingleOneConsumerAtATime(t *testing.T) {
	sm := newSingleMove(t, 1)
	c, from, to, via, ctx := sm.c, sm.from, sm.to, sm.via, sm.ctx
	viaNode := c.nodes[via]

	var mu sync.Mutex
	inFlight := map[string]string{}
	delivered := map[string]int{}
	var overlaps []string
	listener := func(name string) mq.Listener {
		return mq.ListenerFunc(func(ctx context.Context, _ string, m *mq.Message) error {
			mu.Lock()
			if o, ok := inFlight[m.ID]; ok {
				overlaps = append(overlaps, m.ID+" in "+o+" and "+name)
			}
			inFlight[m.ID] = name
			mu.Unlock()
			time.Sleep(3 * time.Millisecond)
			mu.Lock()
			delete(inFlight, m.ID)
			delivered[m.ID]++
			mu.Unlock()
			return nil
		})
	}
	for _, id := range []string{via, to, from} {
		g, err := c.nodes[id].NewConsumer("s", "g", listener(id))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
	}
	before := sendAll(ctx, t, viaNode, "s", 1, 100, "before")
	s := startSender(t, func() *mq.MQ { return viaNode }, "s", 1, "during")
	time.Sleep(300 * time.Millisecond)
	if err := viaNode.MoveReplica(ctx, "s", 0, from, to); err != nil {
		t.Fatal(err)
	}
	sm.waitOn(t, to, time.Minute)
	time.Sleep(500 * time.Millisecond)
	during := s.end()
	after := sendAll(ctx, t, viaNode, "s", 1, 50, "after")
	all := slices.Concat(before, during, after)
	waitFor(t, time.Minute, "all delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range all {
			if delivered[id] == 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, id := range all {
		if delivered[id] > 1 {
			dups++
		}
	}
	t.Logf("%d acked, %d delivered more than once", len(all), dups)
	if len(overlaps) > 0 {
		t.Fatalf("%d concurrent deliveries, e.g. %v", len(overlaps), overlaps[:min(5, len(overlaps))])
	}
	checkStoredOnce(t, c, "s", 1, all)
}
