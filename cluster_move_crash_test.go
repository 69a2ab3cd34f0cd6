package mq_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_MoveSingleCrashWhileCopying: a multi-piece partition moves while
// its target or its node is killed at various moments of the fetch, or
// both right after the move ends; the move completes and every acked
// message is stored once.
func TestCluster_MoveSingleCrashWhileCopying(t *testing.T) {
	for _, tc := range []struct {
		victim string
		delay  time.Duration
	}{
		{"to", 0}, {"to", 30 * time.Millisecond}, {"from", 0}, {"from", 30 * time.Millisecond}, {"both-after-done", 0}, {"to-after-done", 0},
	} {
		t.Run(fmt.Sprintf("%s-%v", tc.victim, tc.delay), func(t *testing.T) {
			sm := newSingleMove(t, 1)
			c, from, to, ctx := sm.c, sm.from, sm.to, sm.ctx
			viaNode := c.nodes[sm.via]
			p, err := viaNode.NewProducer("s")
			if err != nil {
				t.Fatal(err)
			}
			body := []byte(strings.Repeat("x", 32<<10))
			var before []string
			for i := range 200 {
				id := fmt.Sprintf("big-%d", i)
				if _, err := p.SendMessage(ctx, (&mq.Message{ID: id, Body: body}).ToPartition(0)); err != nil {
					t.Fatal(err)
				}
				before = append(before, id)
			}
			p.Close()
			s := startSender(t, func() *mq.MQ { return viaNode }, "s", 1, "during")
			time.Sleep(200 * time.Millisecond)
			if err := viaNode.MoveReplica(ctx, "s", 0, from, to); err != nil {
				t.Fatal(err)
			}
			switch tc.victim {
			case "to", "from":
				time.Sleep(tc.delay)
				v := map[string]string{"to": to, "from": from}[tc.victim]
				c.stopCutOff(v)
				time.Sleep(300 * time.Millisecond)
				c.start(v)
			case "both-after-done", "to-after-done":
				waitFor(t, time.Minute, "done seen by "+to, func() bool {
					o, m := singleOwner(c.nodes[to], "s", 0)
					return o == to && m == ""
				})
				time.Sleep(20 * time.Millisecond)
				if tc.victim == "both-after-done" {
					c.stopCutOff(from, to)
					c.start(from)
				} else {
					c.stopCutOff(to)
				}
				c.start(to)
			}
			sm.waitOn(t, to, 2*time.Minute)
			time.Sleep(500 * time.Millisecond)
			during := s.end()
			after := sendAll(ctx, t, viaNode, "s", 1, 10, "after")
			t.Logf("%d acked during", len(during))
			all := slices.Concat(before, during, after)
			checkStoredOnce(t, c, "s", 1, all)
			checkOrder(ctx, t, c.nodes[to], "s", 0, all)
		})
	}
}

// TestCluster_MoveSingleWithinTheSmallestFrame: nodes whose frames are
// the smallest their message limit allows (8-byte messages, 1 MiB and 8
// bytes a frame) move a partition of several MiB: each piece of its copy
// fits a frame.
func TestCluster_MoveSingleWithinTheSmallestFrame(t *testing.T) {
	sm := newSingleMove(t, 1, withFrame(1<<20+8), withNodeOptions(func(string) []mq.Option {
		return []mq.Option{mq.WithMaxMessageBytes(8)}
	}))
	via := sm.c.nodes[sm.via]
	p, err := via.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var acked []string
	body := []byte(strings.Repeat("x", 8))
	for b := range 20 {
		batch := make([]*mq.Message, 1000)
		for i := range batch {
			id := fmt.Sprintf("m-%d", b*1000+i)
			batch[i] = (&mq.Message{ID: id, Body: body}).ToPartition(0)
			acked = append(acked, id)
		}
		if _, err := p.SendMessage(sm.ctx, batch...); err != nil {
			t.Fatal(err)
		}
	}
	if err := via.MoveReplica(sm.ctx, "s", 0, sm.from, sm.to); err != nil {
		t.Fatal(err)
	}
	sm.waitOn(t, sm.to, time.Minute)
	checkStoredOnce(t, sm.c, "s", 1, acked)
}
