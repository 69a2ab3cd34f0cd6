package mq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_CallsEndWithTheirCtxWhenALinkStalls: a node whose link to
// the node serving a partition stalls one way (its requests, or the
// replies to them, held as TCP holds what it cannot deliver) ends each
// call that reaches the partition when the call's ctx ends, not after the
// RPC timeout (10 s); a read ends with the ctx's error. Once the link is
// back, the reads answer. One topic of each type: the Single partition's
// node, the Raft3 group's leader and the DoubleWrite pair's leader serve.
func TestCluster_CallsEndWithTheirCtxWhenALinkStalls(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withRaft3(1), withDoubleWrite(1, mq.Options{}), withTopic("s", 1, mq.Options{}))
	ctx := testCtx(t)
	n1 := c.nodes["n1"]
	for _, topic := range []string{r3, "d", "s"} {
		sendAll(ctx, t, n1, topic, 1, 3, topic)
	}
	// Where each topic's partition is served, as node id sees it: a cut
	// link may move a leadership (a session expires, a follower that
	// hears nothing campaigns), and a call then reaches a leader whose
	// link is not stalled.
	homeAs := func(topic, id string) string {
		switch topic {
		case r3:
			l, _ := mq.Raft3Leader(c.nodes[id], r3, 0)
			return l
		case "d":
			l, _, _, _ := mq.PairRecord(c.nodes[id], "d", 0)
			return l
		}
		return mq.PartitionNode(c.nodes[id], topic, 0)
	}

	calls := []struct {
		name string
		read bool // ends with the ctx's error, and answers once the link is back
		call func(ctx context.Context, via *mq.MQ, topic string) error
	}{
		{"Lag", true, func(ctx context.Context, via *mq.MQ, topic string) error {
			_, err := via.Lag(ctx, topic, "g")
			return err
		}},
		{"ReadMessage", true, func(ctx context.Context, via *mq.MQ, topic string) error {
			_, err := via.ReadMessage(ctx, topic, 0, 1)
			return err
		}},
		{"ResetOffset first", true, func(ctx context.Context, via *mq.MQ, topic string) error {
			return via.ResetOffset(ctx, topic, "g", mq.SeekFirst())
		}},
		{"ResetOffset time", true, func(ctx context.Context, via *mq.MQ, topic string) error {
			return via.ResetOffset(ctx, topic, "g", mq.SeekTime(time.Now().Add(-time.Hour)))
		}},
		{"ResetOffset last", true, func(ctx context.Context, via *mq.MQ, topic string) error {
			return via.ResetOffset(ctx, topic, "g", mq.SeekLast())
		}},
		{"DeleteGroup", false, func(ctx context.Context, via *mq.MQ, topic string) error {
			return via.DeleteGroup(ctx, topic, "g2")
		}},
		{"SendMessage", false, func(ctx context.Context, via *mq.MQ, topic string) error {
			p, err := via.NewProducer(topic)
			if err != nil {
				return err
			}
			defer p.Close()
			_, err = p.SendMessage(ctx, (&mq.Message{Body: []byte("x")}).ToPartition(0))
			return err
		}},
		{"ResolveTx", false, func(ctx context.Context, via *mq.MQ, _ string) error {
			_, err := via.ResolveTx(ctx, "no-such-tx", mq.TxRollback)
			return err
		}},
		// It reads only the partitions this node holds a replica of.
		{"UnresolvedTxs", false, func(ctx context.Context, via *mq.MQ, _ string) error {
			_, err := via.UnresolvedTxs(ctx)
			return err
		}},
	}
	checked := map[string]int{} // the rounds of each topic whose server stayed
	for _, dir := range []string{"replies", "requests"} {
		for _, topic := range []string{r3, "d", "s"} {
			var home string
			waitFor(t, 20*time.Second, "one node serving "+topic, func() bool {
				home = homeAs(topic, "n1")
				return home != "" && homeAs(topic, "n2") == home && homeAs(topic, "n3") == home
			})
			for _, id := range othersThan(c, home) {
				via := c.nodes[id]
				mute := func(muted bool) {
					if dir == "replies" {
						mq.SetLinkMuted(c.nodes[home], id, muted)
					} else {
						mq.SetLinkMuted(via, home, muted)
					}
				}
				mute(true)
				served := homeAs(topic, home) == home && homeAs(topic, id) == home
				for _, k := range calls {
					cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					start := time.Now()
					err := k.call(cctx, via, topic)
					took := time.Since(start)
					cancel()
					what := fmt.Sprintf("%s of %s through %s, %s from %s stalled", k.name, topic, id, dir, home)
					if took > 2*time.Second {
						t.Errorf("%s: took %v with a 300ms ctx (%v)", what, took, err)
					}
					if stayed := served && homeAs(topic, home) == home && homeAs(topic, id) == home; !stayed {
						continue // it may have reached another leader
					}
					if k.read {
						checked[topic]++
					}
					if k.read && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("%s: %v, want the ctx's error", what, err)
					}
				}
				mute(false)
				for _, k := range calls {
					if !k.read {
						continue
					}
					waitFor(t, 20*time.Second, fmt.Sprintf("%s of %s through %s once the link is back", k.name, topic, id), func() bool {
						cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
						defer cancel()
						return k.call(cctx, via, topic) == nil
					})
				}
			}
		}
	}
	for _, topic := range []string{r3, "d", "s"} {
		if checked[topic] == 0 {
			t.Errorf("%s: its server moved in every round: no read was checked for the ctx's error", topic)
		}
	}
}

// TestCluster_CloseEndsWhenItsLinksStall: a node whose links to the other
// nodes stall one way or both (what it writes to them, what they write to
// it) closes within a bound: its consumers' commits under way and last
// ones end 5 s after Close began (lastCommits), its hand-offs of Raft3
// leaderships and DoubleWrite pairs within 3 s, a connection's farewell
// (TLS's close_notify, which waits for a write under way and then 5 s for
// its own) within 200 ms, and its raft groups' RPCs at their shutdown.
// The node leads the Raft3 groups; its consumers of three groups per topic
// deliver and its producers send while it closes.
func TestCluster_CloseEndsWhenItsLinksStall(t *testing.T) {
	parallelByDefault(t)
	for _, dir := range []string{"from it", "to it", "both ways"} {
		t.Run(dir, func(t *testing.T) {
			c := newCluster(t, 3, withRaft3(2), withDoubleWrite(2, mq.Options{}), withTopic("s", 2, mq.Options{}))
			ctx := testCtx(t)
			victim := leaderOf(t, c, 0)
			v := c.nodes[victim]
			for _, topic := range []string{r3, "d", "s"} {
				sendAll(ctx, t, v, topic, 2, 20, topic)
				for g := range 3 {
					consume(t, v, topic, fmt.Sprintf("g%d", g), mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil }))
				}
			}
			time.Sleep(500 * time.Millisecond) // they claim and deliver
			sctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for _, topic := range []string{r3, "d", "s"} {
				p, err := v.NewProducer(topic)
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					for i := 0; sctx.Err() == nil; i++ {
						_, err := p.SendMessage(sctx, (&mq.Message{Body: []byte("x")}).ToPartition(i%2))
						if errors.Is(err, mq.ErrClosed) {
							return
						}
					}
				})
			}
			time.Sleep(200 * time.Millisecond) // commits under way when the links stall
			for _, id := range othersThan(c, victim) {
				if dir != "to it" {
					mq.SetLinkMuted(v, id, true)
				}
				if dir != "from it" {
					mq.SetLinkMuted(c.nodes[id], victim, true)
				}
			}
			time.Sleep(300 * time.Millisecond)
			start := time.Now()
			c.kill(victim)
			took := time.Since(start)
			stop()
			wg.Wait()
			if took > 15*time.Second {
				t.Fatalf("Close took %v with its links stalled %s", took, dir)
			}
			t.Logf("Close took %v", took)
		})
	}
}
