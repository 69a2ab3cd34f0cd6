package mq_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/localtx/txtest"
	"github.com/zeze-go/mq/store"
)

// TestCluster_CheckBackCannotRollBackAnotherNodesTx (hostile review): the
// answering node checks only that SOME partition the request names holds
// a half message of the txid naming it as producer (preparedHere), then
// decides the transaction in EVERY partition named. A node H holding a
// partition P of its own and a replica of DoubleWrite partition d/0 (its
// follower) writes, in P, a half message of V's transaction T naming A
// as producer, and asks A to check T back in [P, d/0]. A's host store has
// never heard of T, so A rolls T back in d/0 too, with its own rights
// (the ACL is off, as by default; Admin on the topic does the same), and
// V's prepared transaction is gone from the partition its leader serves.
func TestCluster_CheckBackCannotRollBackAnotherNodesTx(t *testing.T) {
	c := newCluster(t, 3, withDoubleWrite(1, mq.Options{}), withNodeOptions(func(id string) []mq.Option {
		host := txtest.Open(t, "bolt", filepath.Join(t.TempDir(), "host-"+id))
		return []mq.Option{mq.WithLocalTx(host.Store), mq.WithTxCheckAfter(time.Hour)}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n1 := c.nodes["n1"]
	leader, replicas, _, _ := mq.PairRecord(n1, "d", 0)
	follower := ""
	for _, r := range replicas {
		if r != leader {
			follower = r
		}
	}
	asked := ""
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != leader && id != follower {
			asked = id
		}
	}
	if leader == "" || follower == "" || asked == "" {
		t.Fatalf("pair record: leader %q replicas %v", leader, replicas)
	}
	h, v := c.nodes[follower], c.nodes[leader]
	if err := n1.CreateMQ(ctx, "p", 3, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "p everywhere", func() bool {
		for _, m := range c.nodes {
			if m.Topics()["p"] != 3 {
				return false
			}
		}
		return true
	})
	onH := -1
	for i := range 3 {
		if mq.PartitionNode(h, "p", i) == follower {
			onH = i
		}
	}
	if onH < 0 {
		t.Fatalf("no partition of p on %s", follower)
	}
	const txid = "0123456789abcdef-99"
	half := []store.Message{{ID: "half", Body: []byte("x")}}
	// V, the pair's leader, prepares T in d/0: a transaction of its own.
	if _, err := mq.ApplyCmd(ctx, v, "d", 0, &store.Command{Op: store.OpPrepare, TxID: txid, Producer: leader, Msgs: half}); err != nil {
		t.Fatal(err)
	}
	// H forges, in its own partition, a half message of T naming A.
	if _, err := mq.ApplyCmd(ctx, h, "p", onH, &store.Command{Op: store.OpPrepare, TxID: txid, Producer: asked, Msgs: half}); err != nil {
		t.Fatal(err)
	}
	d, err := mq.CheckTxAs(ctx, h, asked, txid, []cluster.PartRef{{Topic: "p", Part: onH}, {Topic: "d", Part: 0}})
	t.Logf("%s's check-back of %s at %s: %v, %v", follower, txid, asked, d, err)
	got, err := mq.PartitionDecision(v, "d", 0, txid)
	if err != nil {
		t.Fatal(err)
	}
	if got != store.Undecided {
		t.Fatalf("%s's transaction %s in d/0 (led by %s) decided %v by %s at the request of %s",
			leader, txid, leader, got, asked, follower)
	}
}
