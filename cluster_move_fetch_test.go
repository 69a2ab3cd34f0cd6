package mq_test

import (
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_MoveFetchOnlyToTheMovesTarget: while s/0 moves from one node to
// another, the third node (and the owner itself) cannot fetch it, and
// the target's malformed requests get errors.
func TestCluster_MoveFetchOnlyToTheMovesTarget(t *testing.T) {
	sm := newSingleMove(t, 1)
	c, from, to, third, ctx := sm.c, sm.from, sm.to, sm.via, sm.ctx
	sendAll(ctx, t, c.nodes[third], "s", 1, 30, "before")

	// No move: nobody fetches.
	v0 := mq.PartitionVersion(c.nodes[third], "s", 0)
	for _, v := range []uint64{v0, v0 + 1} {
		if resp, err := mq.CallMoveFetch(ctx, c.nodes[third], from, mq.MoveFetchRequest("s", 0, v, 0)); err == nil {
			t.Errorf("third node fetched s/0 at version %d with no move: %d bytes", v, len(resp))
		}
	}
	h := holdMoves(t)
	if err := c.nodes[third].MoveReplica(ctx, "s", 0, from, to); err != nil {
		t.Fatal(err)
	}
	h.wait(t, ctx)
	v := mq.PartitionVersion(c.nodes[from], "s", 0)
	for _, vv := range []uint64{v, v - 1, v + 1} {
		if resp, err := mq.CallMoveFetch(ctx, c.nodes[third], from, mq.MoveFetchRequest("s", 0, vv, 0)); err == nil {
			t.Errorf("third node fetched s/0 at version %d (move at %d): %d bytes", vv, v, len(resp))
		}
		if resp, err := mq.CallMoveFetch(ctx, c.nodes[from], from, mq.MoveFetchRequest("s", 0, vv, 0)); err == nil {
			t.Errorf("owner fetched from itself at %d: %d bytes", vv, len(resp))
		}
	}
	for name, req := range map[string][]byte{
		"offset past": mq.MoveFetchRequest("s", 0, v, 1<<62),
		"max offset":  mq.MoveFetchRequest("s", 0, v, ^uint64(0)),
		"bad part":    mq.MoveFetchRequest("s", 1<<20, v, 0),
		"bad topic":   mq.MoveFetchRequest("nope", 0, v, 0),
		"trailing":    append(mq.MoveFetchRequest("s", 0, v, 0), 7),
	} {
		if resp, err := mq.CallMoveFetch(ctx, c.nodes[to], from, req); err == nil {
			t.Errorf("%s: target got %d bytes", name, len(resp))
		}
	}
	// The real target may fetch.
	if resp, err := mq.CallMoveFetch(ctx, c.nodes[to], from, mq.MoveFetchRequest("s", 0, v, 0)); err != nil || len(resp) == 0 {
		t.Errorf("target fetch: %v", err)
	}
	h.free()
	sm.waitOn(t, to, time.Minute)
	// After the move, nobody fetches from the old owner or the new.
	for _, p := range []string{from, to} {
		for _, who := range othersThan(c, p) {
			if resp, err := mq.CallMoveFetch(ctx, c.nodes[who], p, mq.MoveFetchRequest("s", 0, v, 0)); err == nil {
				t.Errorf("%s fetched from %s after the move: %d bytes", who, p, len(resp))
			}
		}
	}
}
