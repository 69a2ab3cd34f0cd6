package mq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestAttack_HandOverStormUnderLoad: producers on every node send batches
// to a pair of two partitions while its leader and follower swap over and
// over (PairHandOver as soon as the last swap is recorded): every ack must
// be stored once at its offset, in order per producer.
func TestAttack_HandOverStormUnderLoad(t *testing.T) {
	for _, alone := range []bool{false, true} {
		t.Run(fmt.Sprintf("AckAlone-%t", alone), func(t *testing.T) {
			const parts = 2
			c := newCluster(t, 3, withSession(3*time.Second), withDoubleWrite(parts, mq.Options{AckAlone: alone, PartitionsPerPair: 2}))
			c.waitInSync(0, 30*time.Second)
			l := newLoad(c, parts)
			for id := range c.nodes {
				l.runBatches(id, "p"+id, parts, []int{0, 1})
			}
			defer l.stopAll()
			waitFor(t, 20*time.Second, "first acks", func() bool { return l.count() >= 50 })
			swaps, refused := 0, 0
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) {
				leader, replicas, inSync, epoch := mq.PairRecord(c.nodes["n1"], "d", 0)
				if len(inSync) != 2 || len(replicas) != 2 {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				err := mq.PairHandOver(ctx, c.nodes[leader], "d", 0, replicas[1])
				cancel()
				if err != nil {
					refused++
					time.Sleep(10 * time.Millisecond)
					continue
				}
				swaps++
				waitFor(t, 10*time.Second, "the swap seen", func() bool {
					_, _, _, e := mq.PairRecord(c.nodes[leader], "d", 0)
					return e > epoch
				})
			}
			t.Logf("%d swaps, %d refused, %d acks so far", swaps, refused, l.count())
			if swaps == 0 {
				t.Fatal("no swap went through")
			}
			c.waitInSync(0, 30*time.Second)
			time.Sleep(300 * time.Millisecond)
			acked := l.endedChecked(t, c.nodes["n1"], parts)
			t.Logf("%d acked", len(acked))
		})
	}
}
