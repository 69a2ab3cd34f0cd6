package mq_test

import (
	"slices"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_MoveSingleRetargetedAndRenewed: a move held once its target has
// the copy is then retargeted to the third node ("retarget": the old
// target's late MoveDone must be refused, the third node takes over), or
// cancelled and started again to the same target after the partition
// acked more sends thawed ("cancel-again": the old copy must not win).
func TestCluster_MoveSingleRetargetedAndRenewed(t *testing.T) {
	for _, mode := range []string{"retarget", "cancel-again"} {
		t.Run(mode, func(t *testing.T) {
			sm := newSingleMove(t, 1)
			c, from, to, third, ctx := sm.c, sm.from, sm.to, sm.via, sm.ctx
			viaNode := c.nodes[third]
			before := sendAll(ctx, t, viaNode, "s", 1, 30, "before")

			h := holdMoves(t)
			s := startSender(t, func() *mq.MQ { return viaNode }, "s", 1, "during")
			time.Sleep(200 * time.Millisecond)
			if err := viaNode.MoveReplica(ctx, "s", 0, from, to); err != nil {
				t.Fatal(err)
			}
			h.wait(t, ctx)
			want := third
			var mid []string
			switch mode {
			case "retarget":
				if err := viaNode.MoveReplica(ctx, "s", 0, to, third); err != nil {
					t.Fatal(err)
				}
			case "cancel-again":
				if err := viaNode.MoveReplica(ctx, "s", 0, to, from); err != nil {
					t.Fatal(err)
				}
				waitFor(t, time.Minute, "s/0 back on "+from, func() bool {
					o, m := singleOwner(viaNode, "s", 0)
					return o == from && m == ""
				})
				mid = sendAll(ctx, t, viaNode, "s", 1, 20, "mid")
				if err := viaNode.MoveReplica(ctx, "s", 0, from, to); err != nil {
					t.Fatal(err)
				}
				want = to
			}
			h.free()
			sm.waitOn(t, want, 2*time.Minute)
			time.Sleep(500 * time.Millisecond)
			during := s.end()
			after := sendAll(ctx, t, viaNode, "s", 1, 10, "after")
			all := slices.Concat(before, mid, during, after)
			checkStoredOnce(t, c, "s", 1, all)
			checkOrder(ctx, t, c.nodes[want], "s", 0, slices.Concat(before, after))
			for _, id := range othersThan(c, want) {
				waitFor(t, 20*time.Second, "file on "+id+" deleted", func() bool { return sm.fileGone(id) })
			}
		})
	}
}
