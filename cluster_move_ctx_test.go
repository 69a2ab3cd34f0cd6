package mq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_SendToMovingSingleEndsWithItsCtxOrClose: while s/0 is
// frozen for its move (held once the copy is made), a send to it waits,
// and ends when its ctx does, with the ctx's error and nothing stored, or
// when its node closes, with ErrClosed; reads of the frozen partition go
// on meanwhile.
func TestCluster_SendToMovingSingleEndsWithItsCtxOrClose(t *testing.T) {
	sm := newSingleMove(t, 1)
	via := sm.c.nodes[sm.via]
	before := sendAll(sm.ctx, t, via, "s", 1, 5, "before")
	h := holdMoves(t)
	if err := via.MoveReplica(sm.ctx, "s", 0, sm.from, sm.to); err != nil {
		t.Fatal(err)
	}
	h.wait(t, sm.ctx)
	p, err := via.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(sm.ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = p.SendMessage(ctx, (&mq.Message{ID: "refused", Body: []byte("x")}).ToPartition(0))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("a send to a frozen partition with a 300ms ctx: %v after %v", err, time.Since(start))
	}
	if m, err := via.ReadMessage(sm.ctx, "s", 0, 0); err != nil || m.ID != before[0] {
		t.Fatalf("read of the frozen partition: %v, %v", m, err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := p.SendMessage(sm.ctx, (&mq.Message{ID: "closed", Body: []byte("x")}).ToPartition(0))
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	sm.c.kill(sm.via)
	select {
	case err := <-done:
		if !errors.Is(err, mq.ErrClosed) {
			t.Fatalf("a send waiting for a move when its node closed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a send waiting for a move did not end with its node's Close")
	}
	h.free()
	sm.waitOn(t, sm.to, time.Minute)
	seen := readAll(sm.ctx, t, sm.c.nodes[sm.to], "s", 1)
	if seen["refused"] != 0 || seen["closed"] != 0 {
		t.Fatalf("a send that ended refused was stored: %v", seen)
	}
	checkStoredOnce(t, sm.c, "s", 1, before)
}
