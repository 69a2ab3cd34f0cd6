package mq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_ReadsEndWithTheirCtxWhenRepliesStall: a node whose requests
// reach the node serving a partition, but whose replies stall there (the
// link cut one way, as TCP holds what it cannot deliver), ends each call
// that reads the partition when the call's ctx ends, with the ctx's error,
// not after the RPC timeout (10 s); once the link is back, the same calls
// answer. One topic of each type: the Single partition's node, the Raft3
// group's leader and the DoubleWrite pair's leader serve.
func TestCluster_ReadsEndWithTheirCtxWhenRepliesStall(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withRaft3(1), withDoubleWrite(1, mq.Options{}), withTopic("s", 1, mq.Options{}))
	ctx := testCtx(t)
	n1 := c.nodes["n1"]
	for _, topic := range []string{r3, "d", "s"} {
		sendAll(ctx, t, n1, topic, 1, 3, topic)
	}
	pairLeader, _, _, _ := mq.PairRecord(n1, "d", 0)
	homes := map[string]string{r3: leaderOf(t, c, 0), "d": pairLeader, "s": mq.PartitionNode(n1, "s", 0)}

	calls := []struct {
		name string
		call func(ctx context.Context, via *mq.MQ, topic string) error
	}{
		{"Lag", func(ctx context.Context, via *mq.MQ, topic string) error {
			_, err := via.Lag(ctx, topic, "g")
			return err
		}},
		{"ReadMessage", func(ctx context.Context, via *mq.MQ, topic string) error {
			_, err := via.ReadMessage(ctx, topic, 0, 1)
			return err
		}},
		{"ResetOffset", func(ctx context.Context, via *mq.MQ, topic string) error {
			return via.ResetOffset(ctx, topic, "g", mq.SeekFirst())
		}},
		{"UnresolvedTxs", func(ctx context.Context, via *mq.MQ, _ string) error {
			_, err := via.UnresolvedTxs(ctx)
			return err
		}},
	}
	for _, topic := range []string{r3, "d", "s"} {
		home := homes[topic]
		for _, id := range othersThan(c, home) {
			via := c.nodes[id]
			mq.SetLinkMuted(c.nodes[home], id, true)
			for _, k := range calls {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				start := time.Now()
				err := k.call(cctx, via, topic)
				took := time.Since(start)
				cancel()
				what := fmt.Sprintf("%s of %s through %s, replies from %s stalled", k.name, topic, id, home)
				if took > 3*time.Second {
					t.Fatalf("%s: took %v with a 300ms ctx (%v)", what, took, err)
				}
				// UnresolvedTxs reads only the partitions this node holds a
				// replica of, and may not cross the stalled link.
				if !errors.Is(err, context.DeadlineExceeded) && (k.name != "UnresolvedTxs" || err != nil) {
					t.Fatalf("%s: %v, want the ctx's error", what, err)
				}
			}
			mq.SetLinkMuted(c.nodes[home], id, false)
			for _, k := range calls {
				waitFor(t, 20*time.Second, fmt.Sprintf("%s of %s through %s once the link is back", k.name, topic, id), func() bool {
					cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					defer cancel()
					return k.call(cctx, via, topic) == nil
				})
			}
		}
	}
}

// TestCluster_CloseEndsWhenItsLinksStall: a node whose links to the
// other nodes stall one way (what it writes to them, or what they write
// to it) while its consumers of several groups deliver closes within the
// bound of one last commit (10 s), not one per consumer nor one per
// connection's farewell (TLS's close_notify waits up to 5 s for a write
// under way, then 5 s for its own); its goroutines end.
func TestCluster_CloseEndsWhenItsLinksStall(t *testing.T) {
	parallelByDefault(t)
	for _, dir := range []string{"from it", "to it"} {
		t.Run(dir, func(t *testing.T) {
			c := newCluster(t, 3, withRaft3(2), withDoubleWrite(2, mq.Options{}), withTopic("s", 2, mq.Options{}))
			ctx := testCtx(t)
			lead := leaderOf(t, c, 0)
			var victim string
			for _, id := range othersThan(c, lead) {
				if id != "n1" { // n1 sends below
					victim = id
				}
			}
			v := c.nodes[victim]
			for _, topic := range []string{r3, "d", "s"} {
				sendAll(ctx, t, c.nodes["n1"], topic, 2, 20, topic)
				for g := range 3 {
					consume(t, v, topic, fmt.Sprintf("g%d", g), mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil }))
				}
			}
			time.Sleep(500 * time.Millisecond) // they claim and deliver
			for _, id := range othersThan(c, victim) {
				if dir == "from it" {
					mq.SetLinkMuted(v, id, true)
				} else {
					mq.SetLinkMuted(c.nodes[id], victim, true)
				}
			}
			start := time.Now()
			c.kill(victim)
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("Close took %v with its links stalled %s", took, dir)
			} else {
				t.Logf("Close took %v", took)
			}
		})
	}
}
