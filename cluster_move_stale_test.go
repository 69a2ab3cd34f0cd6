package mq_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_MovedSingleStaysFrozenUnderStaleState: the partition's node freezes s/0
// for a move and crashes before its state cache (saved at most every
// 100ms, cluster/cache.go) records the move: the cache on disk still shows
// s/0 on it alone at the version before. The move ends on the other nodes
// and the new node acks sends. The old node restarts without a quorum
// (or before the leader reaches it) and shows its cached state: it must not
// thaw a partition frozen by a move later than the record it sees
// (move.go's doc: "at a version past its freeze"), nor ack a send to it.
// The crash inside the 100ms window is simulated by putting back the cache
// file saved before the move (a Close saves it a last time).
func TestCluster_MovedSingleStaysFrozenUnderStaleState(t *testing.T) {
	c := newCluster(t, 3, withSession(3*time.Second), withTopic("s", 1, mq.Options{}))
	from, _ := singleOwner(c.nodes["n1"], "s", 0)
	to := othersThan(c, from)[0]
	via := othersThan(c, from, to)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before := sendAll(ctx, t, c.nodes[via], "s", 1, 20, "before")
	time.Sleep(300 * time.Millisecond) // the cache saved
	cache := filepath.Join(c.root, from, "cluster", "state")
	old, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}, 1), make(chan struct{})
	mq.HoldMoves(func(ctx context.Context, node string) {
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	t.Cleanup(func() { mq.HoldMoves(nil) })
	if err := c.nodes[via].MoveReplica(ctx, "s", 0, from, to); err != nil {
		t.Fatal(err)
	}
	<-held // from froze s/0 and handed it over
	c.stopCutOff(from)
	if err := os.WriteFile(cache, old, 0o600); err != nil { // the crash in the cache's window
		t.Fatal(err)
	}
	close(release)
	waitFor(t, time.Minute, "s/0 on "+to, func() bool {
		o, m := singleOwner(c.nodes[via], "s", 0)
		return o == to && m == ""
	})
	moved := sendAll(ctx, t, c.nodes[via], "s", 1, 20, "moved")

	// from restarts cut off from the others: it shows its cached state.
	c.isolate(from, true)
	m := c.start(from)
	c.isolate(from, true)
	var stale []string
	p, err := m.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		id := fmt.Sprintf("stale-%d", i)
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := p.SendMessage(sctx, (&mq.Message{ID: id, Body: []byte("x")}).ToPartition(0))
		scancel()
		if err == nil {
			stale = append(stale, id)
		}
	}
	p.Close()
	if len(stale) > 0 {
		t.Errorf("the old node, frozen at a later move than its cached record, acked %d sends to s/0 while it is not its node", len(stale))
	}
	c.isolate(from, false)
	waitFor(t, time.Minute, "s/0 on "+to+" as "+from+" sees it", func() bool {
		o, mv := singleOwner(c.nodes[from], "s", 0)
		return o == to && mv == ""
	})
	time.Sleep(time.Second)
	all := append(append(append([]string(nil), before...), moved...), stale...)
	checkStoredOnce(t, c, "s", 1, all)
}

// TestCluster_MovedAwaySingleNotRecreatedUnderStaleState: a move that takes less than
// the cache's 100ms ends, and the old node deletes its file; it crashes
// before its state cache records the move (simulated as above) and
// restarts cut off: its cached record, at version 0, places s/0 on it
// alone. It must not make a new empty partition file and ack sends to it.
func TestCluster_MovedAwaySingleNotRecreatedUnderStaleState(t *testing.T) {
	c := newCluster(t, 3, withSession(3*time.Second), withTopic("s", 1, mq.Options{}))
	from, _ := singleOwner(c.nodes["n1"], "s", 0)
	to := othersThan(c, from)[0]
	via := othersThan(c, from, to)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before := sendAll(ctx, t, c.nodes[via], "s", 1, 20, "before")
	time.Sleep(300 * time.Millisecond)
	cache := filepath.Join(c.root, from, "cluster", "state")
	old, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[via].MoveReplica(ctx, "s", 0, from, to); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "s/0 on "+to+" and "+from+"'s file deleted", func() bool {
		for _, id := range othersThan(c) {
			if o, m := singleOwner(c.nodes[id], "s", 0); o != to || m != "" {
				return false
			}
		}
		_, err := os.Stat(filepath.Join(c.root, from, "topics", "s", "0.db"))
		return os.IsNotExist(err)
	})
	time.Sleep(200 * time.Millisecond) // every table follows
	c.stopCutOff(from)
	if err := os.WriteFile(cache, old, 0o600); err != nil {
		t.Fatal(err)
	}
	moved := sendAll(ctx, t, c.nodes[via], "s", 1, 20, "moved")
	c.isolate(from, true)
	m := c.start(from)
	c.isolate(from, true)
	var stale []string
	p, err := m.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		id := fmt.Sprintf("stale-%d", i)
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := p.SendMessage(sctx, (&mq.Message{ID: id, Body: []byte("x")}).ToPartition(0))
		scancel()
		if err == nil {
			stale = append(stale, id)
		}
	}
	p.Close()
	if len(stale) > 0 {
		t.Errorf("the old node acked %d sends to s/0 after its file was deleted by a move", len(stale))
	}
	c.isolate(from, false)
	waitFor(t, time.Minute, "s/0 on "+to+" as "+from+" sees it", func() bool {
		o, mv := singleOwner(c.nodes[from], "s", 0)
		return o == to && mv == ""
	})
	time.Sleep(time.Second)
	all := append(append(append([]string(nil), before...), moved...), stale...)
	checkStoredOnce(t, c, "s", 1, all)
}

// TestCluster_MovedInSingleNotOverwrittenUnderStaleState: the old node crashes frozen
// before it deletes its file, the move ends, the new node acks sends and
// crashes before its cache records the end; both restart (the third cut
// off, so the metadata needs an election) and show their cached record,
// the move under way: the new node must not fetch the old copy again over
// its own file, which holds the sends it acked.
func TestCluster_MovedInSingleNotOverwrittenUnderStaleState(t *testing.T) {
	c := newCluster(t, 3, withSession(3*time.Second), withTopic("s", 1, mq.Options{}))
	from, _ := singleOwner(c.nodes["n1"], "s", 0)
	to := othersThan(c, from)[0]
	via := othersThan(c, from, to)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before := sendAll(ctx, t, c.nodes[via], "s", 1, 20, "before")
	held, release := make(chan struct{}, 1), make(chan struct{})
	var copies atomic.Int32 // copies made by the node moved to
	mq.HoldMoves(func(ctx context.Context, node string) {
		copies.Add(1)
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	t.Cleanup(func() { mq.HoldMoves(nil) })
	if err := c.nodes[via].MoveReplica(ctx, "s", 0, from, to); err != nil {
		t.Fatal(err)
	}
	<-held
	time.Sleep(300 * time.Millisecond) // caches record the move under way
	toCache := filepath.Join(c.root, to, "cluster", "state")
	old, err := os.ReadFile(toCache)
	if err != nil {
		t.Fatal(err)
	}
	c.stopCutOff(from) // frozen, its file kept
	close(release)
	waitFor(t, time.Minute, "s/0 on "+to, func() bool {
		for _, id := range othersThan(c) {
			if o, m := singleOwner(c.nodes[id], "s", 0); o != to || m != "" {
				return false
			}
		}
		return true
	})
	time.Sleep(200 * time.Millisecond)
	moved := sendAll(ctx, t, c.nodes[via], "s", 1, 20, "moved")
	c.stopCutOff(to)
	if err := os.WriteFile(toCache, old, 0o600); err != nil {
		t.Fatal(err)
	}
	c.isolate(via, true)
	c.start(from)
	c.start(to)
	c.isolate(via, true)
	time.Sleep(3 * time.Second)
	c.isolate(via, false)
	waitFor(t, time.Minute, "s/0 on "+to+" everywhere", func() bool {
		for _, id := range othersThan(c) {
			if o, m := singleOwner(c.nodes[id], "s", 0); o != to || m != "" {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second)
	if n := copies.Load(); n > 1 {
		t.Errorf("%s copied s/0 from %s again (%d copies) after it had taken it over", to, from, n)
	}
	checkStoredOnce(t, c, "s", 1, append(append([]string(nil), before...), moved...))
}
