package mq_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// singleOwner returns the node holding Single partition topic/i as m's
// status shows, with the node it moves to, "" when it does not move.
func singleOwner(m *mq.MQ, topic string, i int) (owner, to string) {
	name := fmt.Sprintf("%s/%d", topic, i)
	var on []string
	for _, nd := range m.ClusterStatus().Nodes {
		if slices.Contains(nd.Holds, name) {
			on = append(on, nd.ID)
		}
	}
	switch len(on) {
	case 1:
		return on[0], ""
	case 2:
		_, replicas, _, _ := mq.PairRecord(m, topic, i)
		if len(replicas) == 2 {
			return replicas[0], replicas[1]
		}
	}
	return "", ""
}

// singleMove is how the tests of a Single partition's move start: three
// nodes and the Single topic "s" of parts partitions, the node holding s/0
// (from), the node it is to move to (to), the third (via), and a ctx for
// the test.
type singleMove struct {
	c             *testCluster
	from, to, via string
	ctx           context.Context
}

func newSingleMove(t *testing.T, parts int, opts ...clusterOption) *singleMove {
	t.Helper()
	opts = append([]clusterOption{withSession(3 * time.Second), withTopic("s", parts, mq.Options{})}, opts...)
	c := newCluster(t, 3, opts...)
	from, _ := singleOwner(c.nodes["n1"], "s", 0)
	to := othersThan(c, from)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return &singleMove{c: c, from: from, to: to, via: othersThan(c, from, to)[0], ctx: ctx}
}

// waitOn waits until every open node shows s/0 on node id alone.
func (sm *singleMove) waitOn(t *testing.T, id string, d time.Duration) {
	t.Helper()
	waitFor(t, d, "s/0 on "+id+" alone", func() bool {
		for _, other := range othersThan(sm.c) {
			if o, m := singleOwner(sm.c.nodes[other], "s", 0); o != id || m != "" {
				return false
			}
		}
		return true
	})
}

// cache returns node id's metadata state cache as it is on disk now;
// setCache puts one back: what a crash within the 100 ms the cache may
// lag leaves.
func (sm *singleMove) cache(t *testing.T, id string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sm.c.root, id, "cluster", "state"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (sm *singleMove) setCache(t *testing.T, id string, b []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(sm.c.root, id, "cluster", "state"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// fileGone reports whether node id's file of s/0 is gone.
func (sm *singleMove) fileGone(id string) bool {
	_, err := os.Stat(filepath.Join(sm.c.root, id, "topics", "s", "0.db"))
	return os.IsNotExist(err)
}

// restartBehind starts node id, shut down with a state cache from before
// the move, cut off from the others, so that it shows that cache: five
// sends to s/0 through it must not be acked. Then it is reconnected and
// waited for until it sees s/0 on sm.to. It returns the sends acked.
func (sm *singleMove) restartBehind(t *testing.T, id string) []string {
	t.Helper()
	sm.c.isolate(id, true)
	m := sm.c.start(id)
	sm.c.isolate(id, true)
	var acked []string
	p, err := m.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		msgID := fmt.Sprintf("stale-%d", i)
		ctx, cancel := context.WithTimeout(sm.ctx, 2*time.Second)
		_, err := p.SendMessage(ctx, (&mq.Message{ID: msgID, Body: []byte("x")}).ToPartition(0))
		cancel()
		if err == nil {
			acked = append(acked, msgID)
		}
	}
	p.Close()
	if len(acked) > 0 {
		t.Errorf("%s, behind the move of s/0 to %s, acked %d sends to it", id, sm.to, len(acked))
	}
	sm.c.isolate(id, false)
	waitFor(t, time.Minute, "s/0 on "+sm.to+" as "+id+" sees it", func() bool {
		o, mv := singleOwner(sm.c.nodes[id], "s", 0)
		return o == sm.to && mv == ""
	})
	return acked
}

// moveHold holds each node a Single partition moves to, once it holds the
// copy and before it ends the move (mq.HoldMoves), until free.
type moveHold struct {
	held    chan struct{} // receives when a node waits
	release chan struct{}
	once    sync.Once
	copies  atomic.Int32 // copies made
}

func holdMoves(t *testing.T) *moveHold {
	h := &moveHold{held: make(chan struct{}, 1), release: make(chan struct{})}
	mq.HoldMoves(func(ctx context.Context, node string) {
		h.copies.Add(1)
		select {
		case h.held <- struct{}{}:
		default:
		}
		select {
		case <-h.release:
		case <-ctx.Done():
		}
	})
	t.Cleanup(func() {
		h.free()
		mq.HoldMoves(nil)
	})
	return h
}

// wait waits until a node holds a copy.
func (h *moveHold) wait(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-h.held:
	case <-ctx.Done():
		t.Fatal("the move never copied the partition")
	}
}

// free lets the held moves, and later ones, end.
func (h *moveHold) free() { h.once.Do(func() { close(h.release) }) }
