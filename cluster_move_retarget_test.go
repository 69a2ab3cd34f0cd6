package mq_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
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
			c := newCluster(t, 3, withSession(3*time.Second), withTopic("s", 1, mq.Options{}))
			from, _ := singleOwner(c.nodes["n1"], "s", 0)
			to := othersThan(c, from)[0]
			third := othersThan(c, from, to)[0]
			viaNode := c.nodes[third]
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			before := sendAll(ctx, t, viaNode, "s", 1, 30, "before")

			var calls atomic.Int32
			held, release := make(chan struct{}, 1), make(chan struct{})
			mq.HoldMoves(func(ctx context.Context, node string) {
				if calls.Add(1) > 1 {
					return // later copies pass
				}
				held <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
				}
			})
			t.Cleanup(func() { mq.HoldMoves(nil) })
			s := startSender(t, func() *mq.MQ { return viaNode }, "s", 1, "during")
			time.Sleep(200 * time.Millisecond)
			if err := viaNode.MoveReplica(ctx, "s", 0, from, to); err != nil {
				t.Fatal(err)
			}
			select {
			case <-held:
			case <-ctx.Done():
				t.Fatal("never copied")
			}
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
			close(release)
			waitFor(t, 2*time.Minute, "s/0 on "+want+" alone", func() bool {
				for _, id := range othersThan(c) {
					if o, m := singleOwner(c.nodes[id], "s", 0); o != want || m != "" {
						return false
					}
				}
				return true
			})
			time.Sleep(500 * time.Millisecond)
			during := s.end()
			after := sendAll(ctx, t, viaNode, "s", 1, 10, "after")
			all := append(append(append(append([]string(nil), before...), mid...), during...), after...)
			checkStoredOnce(t, c, "s", 1, all)
			checkOrder(ctx, t, c.nodes[want], "s", 0, append(append([]string(nil), before...), after...))
			for _, id := range othersThan(c, want) {
				waitFor(t, 20*time.Second, "file on "+id+" deleted", func() bool {
					_, err := os.Stat(filepath.Join(c.root, id, "topics", "s", "0.db"))
					return errors.Is(err, os.ErrNotExist)
				})
			}
		})
	}
}
