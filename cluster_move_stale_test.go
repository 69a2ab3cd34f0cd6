package mq_test

import (
	"slices"
	"testing"
	"time"
)

// The tests below restart a node whose metadata state is behind its
// partition files, as after a crash within the 100 ms its state cache may
// lag (cluster/cache.go): they put back the cache saved before the move,
// since a Close saves it a last time.

// TestCluster_MovedSingleStaysFrozenUnderStaleState: the partition's node
// freezes s/0 for a move and crashes before its state cache records the
// move. The move ends on the others, and the new node acks sends. The old
// node restarts cut off, showing s/0 on it alone at the version before the
// move: it must not thaw a partition frozen by a later move, nor ack a
// send to it.
func TestCluster_MovedSingleStaysFrozenUnderStaleState(t *testing.T) {
	sm := newSingleMove(t, 1)
	before := sendAll(sm.ctx, t, sm.c.nodes[sm.via], "s", 1, 20, "before")
	time.Sleep(300 * time.Millisecond) // the cache saved
	old := sm.cache(t, sm.from)
	h := holdMoves(t)
	if err := sm.c.nodes[sm.via].MoveReplica(sm.ctx, "s", 0, sm.from, sm.to); err != nil {
		t.Fatal(err)
	}
	h.wait(t, sm.ctx) // from froze s/0 and handed it over
	sm.c.stopCutOff(sm.from)
	sm.setCache(t, sm.from, old)
	h.free()
	sm.waitOn(t, sm.to, time.Minute)
	moved := sendAll(sm.ctx, t, sm.c.nodes[sm.via], "s", 1, 20, "moved")
	stale := sm.restartBehind(t, sm.from)
	time.Sleep(time.Second)
	checkStoredOnce(t, sm.c, "s", 1, slices.Concat(before, moved, stale))
}

// TestCluster_MovedAwaySingleNotRecreatedUnderStaleState: a move ends,
// and the old node deletes its file; it crashes before its state cache
// records the move and restarts cut off: its cached record, at version 0,
// places s/0 on it alone. It must not make a new empty partition file
// and ack sends to it.
func TestCluster_MovedAwaySingleNotRecreatedUnderStaleState(t *testing.T) {
	sm := newSingleMove(t, 1)
	before := sendAll(sm.ctx, t, sm.c.nodes[sm.via], "s", 1, 20, "before")
	time.Sleep(300 * time.Millisecond)
	old := sm.cache(t, sm.from)
	if err := sm.c.nodes[sm.via].MoveReplica(sm.ctx, "s", 0, sm.from, sm.to); err != nil {
		t.Fatal(err)
	}
	sm.waitOn(t, sm.to, time.Minute)
	waitFor(t, time.Minute, sm.from+"'s file deleted", func() bool { return sm.fileGone(sm.from) })
	time.Sleep(200 * time.Millisecond) // every table follows
	sm.c.stopCutOff(sm.from)
	sm.setCache(t, sm.from, old)
	moved := sendAll(sm.ctx, t, sm.c.nodes[sm.via], "s", 1, 20, "moved")
	stale := sm.restartBehind(t, sm.from)
	time.Sleep(time.Second)
	checkStoredOnce(t, sm.c, "s", 1, slices.Concat(before, moved, stale))
}

// TestCluster_MovedInSingleNotOverwrittenUnderStaleState: the old node
// crashes frozen before it deletes its file, the move ends, the new node
// acks sends and crashes before its cache records the end; both restart
// (the third cut off, so the metadata needs an election) and show their
// cached record, the move under way: the new node must not fetch the old
// copy again over its own file, which holds the sends it acked.
func TestCluster_MovedInSingleNotOverwrittenUnderStaleState(t *testing.T) {
	sm := newSingleMove(t, 1)
	before := sendAll(sm.ctx, t, sm.c.nodes[sm.via], "s", 1, 20, "before")
	h := holdMoves(t)
	if err := sm.c.nodes[sm.via].MoveReplica(sm.ctx, "s", 0, sm.from, sm.to); err != nil {
		t.Fatal(err)
	}
	h.wait(t, sm.ctx)
	time.Sleep(300 * time.Millisecond) // caches record the move under way
	old := sm.cache(t, sm.to)
	sm.c.stopCutOff(sm.from) // frozen, its file kept
	h.free()
	sm.waitOn(t, sm.to, time.Minute)
	time.Sleep(200 * time.Millisecond)
	moved := sendAll(sm.ctx, t, sm.c.nodes[sm.via], "s", 1, 20, "moved")
	sm.c.stopCutOff(sm.to)
	sm.setCache(t, sm.to, old)
	sm.c.isolate(sm.via, true)
	sm.c.start(sm.from)
	sm.c.start(sm.to)
	sm.c.isolate(sm.via, true)
	time.Sleep(3 * time.Second)
	sm.c.isolate(sm.via, false)
	sm.waitOn(t, sm.to, time.Minute)
	time.Sleep(time.Second)
	if n := h.copies.Load(); n > 1 {
		t.Errorf("%s copied s/0 from %s again (%d copies) after it had taken it over", sm.to, sm.from, n)
	}
	// The node cut off learns the restarted nodes' new addresses from the
	// metadata once it is back: until then its reads of s/0 are refused.
	for id, m := range sm.c.nodes {
		waitFor(t, 30*time.Second, id+" reads s/0", func() bool {
			_, err := m.ReadMessage(sm.ctx, "s", 0, 0)
			return err == nil
		})
	}
	checkStoredOnce(t, sm.c, "s", 1, slices.Concat(before, moved))
}
