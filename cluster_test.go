package mq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/testlog"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestCluster_Basic: a topic created on a node that is not the metadata
// leader is placed over every node; every node sends to every partition and
// reads back what any sent; a consumer group on one node receives all.
func TestCluster_Basic(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var creator *mq.MQ
	for _, m := range c.nodes {
		if st := m.ClusterStatus(); st.Leader != st.NodeID {
			creator = m
		}
	}
	if err := creator.CreateMQ(ctx, "orders", 6, mq.Options{}); err != nil {
		t.Fatalf("create on a follower: %v", err)
	}
	if err := creator.CreateMQ(ctx, "orders", 6, mq.Options{}); !errors.Is(err, mq.ErrTopicExists) {
		t.Fatalf("second create: %v, want ErrTopicExists", err)
	}
	sent := map[string]bool{}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()["orders"] == 6 })
		p, err := m.NewProducer("orders")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			msg := (&mq.Message{ID: fmt.Sprintf("%s-%d", id, i), Body: []byte(id)}).ToPartition(i)
			if _, err := p.SendMessage(ctx, msg); err != nil {
				t.Fatalf("send from %s to partition %d: %v", id, i, err)
			}
			sent[msg.ID] = true
		}
	}
	for id, m := range c.nodes {
		for i := range 6 {
			got, err := m.ReadMessage(ctx, "orders", i, 0)
			if err != nil {
				t.Fatalf("read %d/0 on %s: %v", i, id, err)
			}
			if !sent[got.ID] {
				t.Fatalf("read %q on %s", got.ID, id)
			}
		}
	}
	col := collect(t, c.nodes["n2"], "orders", "billing")
	var ids []string
	for id := range sent {
		ids = append(ids, id)
	}
	waitSeen(t, col, ids...)
}

// TestCluster_LeaderKilled: AlterMQ on a node that is not the metadata
// leader is forwarded to it; the leader killed, the two left create a topic
// within a few election timeouts; the old leader, restarted on its data,
// rejoins and learns the topic made while it was down.
func TestCluster_LeaderKilled(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leader := c.nodes["n1"].ClusterStatus().Leader
	if c.nodes[leader] == nil {
		t.Fatalf("leader %q is none of the nodes", leader)
	}
	var follower *mq.MQ
	for id, m := range c.nodes {
		if id != leader {
			follower = m
		}
	}
	if err := follower.CreateMQ(ctx, "orders", 2, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := follower.AlterMQ(ctx, "orders", 5); err != nil {
		t.Fatalf("AlterMQ on a follower: %v", err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "5 partitions on "+id, func() bool { return m.Topics()["orders"] == 5 })
	}

	c.kill(leader)
	start := time.Now()
	if err := follower.CreateMQ(ctx, "after", 1, mq.Options{}); err != nil {
		t.Fatalf("create after the leader died: %v", err)
	}
	took := time.Since(start)
	t.Logf("created %v after the leader's death", took)
	// The nodes' election timeout is 200 ms; raft campaigns after one to
	// two of them. The bound leaves room for a loaded CI machine.
	if limit := 3 * time.Second; took > limit {
		t.Fatalf("a topic created %v after the leader's death, limit %v", took, limit)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the new topic on "+id, func() bool { return m.Topics()["after"] == 1 })
	}

	back := c.start(leader)
	c.waitUp(3)
	waitFor(t, 10*time.Second, "the new topic on the restarted node", func() bool { return back.Topics()["after"] == 1 })
}

// TestCluster_TLS: a cluster whose links are all mutual TLS (WithCluster's
// ServerTLS and ClientTLS, each node's certificate naming its id) forms,
// places a topic on both nodes, and carries sends and a group's
// deliveries across them.
func TestCluster_TLS(t *testing.T) {
	c := newCluster(t, 2, withTLS(testCerts(t)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n1, n2 := c.nodes["n1"], c.nodes["n2"]
	if err := n2.CreateMQ(ctx, "orders", 4, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the topic on n1", func() bool { return n1.Topics()["orders"] == 4 })
	placed := map[string]bool{}
	for i := range 4 {
		placed[mq.PartitionNode(n1, "orders", i)] = true
	}
	if !placed["n1"] || !placed["n2"] {
		t.Fatalf("partitions on %v, want both nodes", placed)
	}
	p, err := n1.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 4 {
		msg := (&mq.Message{ID: fmt.Sprintf("m-%d", i), Body: []byte("x")}).ToPartition(i)
		if _, err := p.SendMessage(ctx, msg); err != nil {
			t.Fatalf("send to partition %d (on %s): %v", i, mq.PartitionNode(n1, "orders", i), err)
		}
		ids = append(ids, msg.ID)
	}
	waitSeen(t, collect(t, n2, "orders", "billing"), ids...)
}

// TestCluster_GroupAcrossNodes: a group's consumers on three nodes share
// the partitions; one consumer's node killed (cut off, then closed: no
// LeaveGroup reaches the leader, which marks it down), its partitions go
// to the others with no message lost and each key's messages in order;
// the node restarted on its data rejoins. The topic is placed before the third node
// joins, so that node holds no partition (a Single partition is reachable
// only while its node lives) and every send succeeds while it is dead.
func TestCluster_GroupAcrossNodes(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "orders", 6, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	c.start("n3")
	var mu sync.Mutex
	seen := map[string]int{}      // id → deliveries
	lastOfKey := map[string]int{} // key → last sequence handled
	var disorder []string
	listener := func(node string) mq.Listener {
		return mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
			var seq int
			fmt.Sscanf(string(msg.Body), "%d", &seq)
			mu.Lock()
			defer mu.Unlock()
			if seen[msg.ID] == 0 && seq < lastOfKey[msg.Key] {
				disorder = append(disorder, fmt.Sprintf("%s: %s seq %d after %d", node, msg.Key, seq, lastOfKey[msg.Key]))
			}
			seen[msg.ID]++
			lastOfKey[msg.Key] = max(lastOfKey[msg.Key], seq)
			return nil
		})
	}
	consumers := map[string]*mq.Consumer{}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()["orders"] == 6 })
		cons, err := m.NewConsumer("orders", "billing", listener(id))
		if err != nil {
			t.Fatal(err)
		}
		consumers[id] = cons
	}
	waitFor(t, 20*time.Second, "the partitions divided over three consumers", func() bool {
		total := 0
		for _, cons := range consumers {
			n := len(cons.Assigned())
			if n == 0 {
				return false
			}
			total += n
		}
		return total == 6
	})
	p, err := c.nodes["n1"].NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	send := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			msg := &mq.Message{ID: fmt.Sprintf("m-%d", i), Key: fmt.Sprintf("k%d", i%12), Body: fmt.Appendf(nil, "%d", i)}
			if _, err := p.SendMessage(ctx, msg); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
		}
	}
	delivered := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for i := range n {
				if seen[fmt.Sprintf("m-%d", i)] == 0 {
					return false
				}
			}
			return true
		}
	}
	send(0, 300)
	waitFor(t, 20*time.Second, "the first 300 delivered", delivered(300))

	// The node of one consumer dies (not the producer's) without a word to
	// the others: cut from them first, its Close reaches no one, so the
	// metadata leader must mark it down when its session expires; its
	// partitions move to the two others.
	victim := "n3"
	c.isolate(victim, true)
	c.kill(victim)
	for _, m := range c.nodes {
		mq.SetLinkDown(m, victim, false) // for its restart below
	}
	delete(consumers, victim)
	send(300, 600)
	waitFor(t, 30*time.Second, "the partitions moved to the two left", func() bool {
		total := 0
		for _, cons := range consumers {
			total += len(cons.Assigned())
		}
		return total == 6
	})
	waitFor(t, 30*time.Second, "all 600 delivered", delivered(600))

	// It comes back on its data and takes a share again.
	back := c.start(victim)
	waitFor(t, 20*time.Second, "the topic on the restarted node", func() bool { return back.Topics()["orders"] == 6 })
	cons, err := back.NewConsumer("orders", "billing", listener(victim))
	if err != nil {
		t.Fatal(err)
	}
	consumers[victim] = cons
	waitFor(t, 30*time.Second, "the restarted node's consumer gets partitions", func() bool { return len(cons.Assigned()) > 0 })
	send(600, 900)
	waitFor(t, 30*time.Second, "all 900 delivered", delivered(900))
	mu.Lock()
	defer mu.Unlock()
	if len(disorder) > 0 {
		t.Fatalf("per-key order broken: %v", disorder)
	}
}

// TestCluster_BroadcastAcrossNodes: broadcasting consumers of one group on
// two nodes each get every message of every partition, wherever the
// partition lives, beside a clustering consumer of the same group that
// gets each once.
func TestCluster_BroadcastAcrossNodes(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n1, n2 := c.nodes["n1"], c.nodes["n2"]
	if err := n1.CreateMQ(ctx, "news", 4, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the topic on n2", func() bool { return n2.Topics()["news"] == 4 })
	nodes := map[string]bool{}
	for i := range 4 {
		nodes[mq.PartitionNode(n1, "news", i)] = true
	}
	if len(nodes) != 2 {
		t.Fatalf("partitions on %v, want both nodes", nodes)
	}
	a, b, cl := &sink{}, &sink{}, &sink{}
	consume(t, n1, "news", "g", a, mq.WithBroadcast("node-a"))
	consume(t, n2, "news", "g", b, mq.WithBroadcast("node-b"))
	consume(t, n2, "news", "g", cl)
	p, err := n1.NewProducer("news")
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		if _, err := p.SendMessage(ctx, &mq.Message{ID: fmt.Sprintf("m-%d", i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	distinct := func(s *sink) int {
		s.mu.Lock()
		defer s.mu.Unlock()
		ids := map[string]bool{}
		for _, m := range s.msgs {
			ids[m.ID] = true
		}
		return len(ids)
	}
	for name, s := range map[string]*sink{"broadcast on n1": a, "broadcast on n2": b, "clustering on n2": cl} {
		waitFor(t, 20*time.Second, name+": every message", func() bool { return distinct(s) == n })
	}
}

// TestCluster_TxCheckBack: half messages prepared by one node in partitions
// of two nodes, whose hooks never ran (the process "died"), are decided by
// the node that prepared them: committed where its host store holds the
// marker, rolled back where it does not, in the partitions of both nodes.
func TestCluster_TxCheckBack(t *testing.T) {
	host := txtest.Open(t, "bolt", filepath.Join(t.TempDir(), "host"))
	c := newCluster(t, 2, withNodeOptions(func(id string) []mq.Option {
		opts := []mq.Option{mq.WithTxCheckAfter(50 * time.Millisecond)}
		if id == "n1" {
			opts = append(opts, mq.WithLocalTx(host.Store))
		}
		return opts
	}))
	ctx := context.Background()
	n1, n2 := c.nodes["n1"], c.nodes["n2"]
	if err := n1.CreateMQ(ctx, "orders", 4, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the topic on n2", func() bool { return n2.Topics()["orders"] == 4 })
	p, err := n1.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	spread := func(prefix string) []*mq.Message {
		out := msgs(prefix, 4)
		for i, m := range out {
			m.ToPartition(i)
		}
		return out
	}
	var committedID string
	err = host.Run(ctx, func(ctx context.Context) error {
		real, _ := localtx.FromContext(ctx)
		committedID = real.ID()
		fctx := localtx.WithTx(ctx, &fakeTx{id: real.ID(), put: real.Put})
		if err := p.PrepareMessage(fctx, spread("cp")...); err != nil {
			return err
		}
		return p.CommitMessage(fctx, msgs("cc", 2)...)
	})
	if err != nil {
		t.Fatal(err)
	}
	const rolledBack = "0123456789abcdef-77"
	if err := p.PrepareMessage(localtx.WithTx(ctx, &fakeTx{id: rolledBack}), spread("rp")...); err != nil {
		t.Fatal(err)
	}
	col := collect(t, n2, "orders", "billing")
	waitSeen(t, col, "cp-0", "cp-1", "cp-2", "cp-3", "cc-0", "cc-1")
	waitFor(t, 10*time.Second, "the rollback of the uncommitted one", func() bool {
		return mq.TxDecided(n2, rolledBack) == mq.TxRollback && mq.TxDecided(n1, rolledBack) == mq.TxRollback
	})
	checkNone(t, &txEnv{m: n2, col: col}, []string{"rp-0", "rp-1", "rp-2", "rp-3"})
	if d := mq.TxDecided(n2, committedID); d != mq.TxCommit {
		t.Fatalf("decision of the committed one on n2: %v", d)
	}
}

// TestCluster_TxPreparerDown: a node holding half messages of another
// node's transaction never decides it alone: while the preparer is down
// the transaction waits, and is parked after TxMaxChecks, not rolled back.
func TestCluster_TxPreparerDown(t *testing.T) {
	// n2 has a host store of its own, which has never heard of the
	// transaction: asked, it would say rolled back.
	own := txtest.Open(t, "bolt", filepath.Join(t.TempDir(), "host"))
	c := newCluster(t, 2, withNodeOptions(func(id string) []mq.Option {
		opts := []mq.Option{mq.WithTxCheckAfter(50 * time.Millisecond), mq.WithTxMaxChecks(3)}
		if id == "n2" {
			opts = append(opts, mq.WithLocalTx(own.Store))
		}
		return opts
	}))
	ctx := context.Background()
	n1, n2 := c.nodes["n1"], c.nodes["n2"]
	if err := n1.CreateMQ(ctx, "orders", 4, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the topic on n2", func() bool { return n2.Topics()["orders"] == 4 })
	// The partitions on n2.
	var onN2 []int
	for i := range 4 {
		if mq.PartitionNode(n2, "orders", i) == "n2" {
			onN2 = append(onN2, i)
		}
	}
	if len(onN2) == 0 {
		t.Fatal("no partition placed on n2")
	}
	p, err := n1.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	const txid = "0123456789abcdef-88"
	var half []*mq.Message
	for _, i := range onN2 {
		half = append(half, (&mq.Message{ID: fmt.Sprintf("h-%d", i), Body: []byte("h")}).ToPartition(i))
	}
	if err := p.PrepareMessage(localtx.WithTx(ctx, &fakeTx{id: txid}), half...); err != nil {
		t.Fatal(err)
	}
	c.kill("n1")
	waitFor(t, 20*time.Second, "the transaction parked on n2", func() bool {
		u, err := n2.UnresolvedTxs(context.Background())
		return err == nil && len(u) == 1 && u[0].TxID == txid
	})
	if d := mq.TxDecided(n2, txid); d != mq.TxUndecided {
		t.Fatalf("n2 decided %v a transaction of a node it could not ask", d)
	}
}

// TestCluster_ACL: once rules exist, a node may do only what they allow:
// produce, consume and administer per topic pattern; each refusal is
// logged once with the identity.
func TestCluster_ACL(t *testing.T) {
	var logs testlog.Lines
	c := newCluster(t, 2, withNodeOptions(func(id string) []mq.Option {
		// Both nodes log here: a refused metadata change is logged by the
		// metadata leader, which may be either.
		return []mq.Option{mq.WithLogger(slog.New(&logs))}
	}))
	ctx := context.Background()
	n1, n2 := c.nodes["n1"], c.nodes["n2"]
	for _, topic := range []string{"orders", "audit"} {
		if err := n2.CreateMQ(ctx, topic, 2, mq.Options{}); err != nil {
			t.Fatalf("create %s before any rule: %v", topic, err)
		}
	}
	if err := n2.SetACL(ctx, []mq.ACLRule{
		{Identity: "n1", Topic: "*", Rights: mq.Produce | mq.Consume | mq.Admin},
		{Identity: "n2", Topic: "ord*", Rights: mq.Consume},
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the rules on both nodes", func() bool { return len(n1.ACL()) == 2 && len(n2.ACL()) == 2 })

	denied := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, mq.ErrDenied) {
			t.Errorf("%s: %v, want ErrDenied", what, err)
		}
	}
	p2, err := n2.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, err = p2.SendMessage(ctx, &mq.Message{Body: []byte("x")})
		denied("n2 sends to orders", err)
	}
	denied("n2 creates a topic", n2.CreateMQ(ctx, "new", 1, mq.Options{}))
	denied("n2 grows orders", n2.AlterMQ(ctx, "orders", 4))
	denied("n2 sets the rules", n2.SetACL(ctx, nil))
	denied("n2 resets orders", n2.ResetOffset(ctx, "orders", "g", mq.SeekFirst()))
	_, err = n2.ResolveTx(ctx, "0123456789abcdef-42", mq.TxRollback)
	denied("n2 resolves a transaction", err)
	_, err = n2.NewConsumer("audit", "g", mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil }))
	denied("n2 consumes audit", err)

	// The partition service of the node holding a partition checks too: n2
	// skipping its own check is refused by n1.
	direct := 0
	for i := range 2 {
		if mq.PartitionNode(n2, "orders", i) == "n1" {
			denied("n2 appends to a partition on n1 directly", mq.ApplyAt(ctx, n2, "orders", i, &mq.Message{ID: "sneak", Body: []byte("z")}))
			direct++
		}
	}
	if direct == 0 {
		t.Fatal("no partition of orders on n1")
	}

	// What the rules allow works.
	p1, err := n1.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	msg := &mq.Message{ID: "allowed", Body: []byte("y")}
	if _, err := p1.SendMessage(ctx, msg); err != nil {
		t.Fatalf("n1 sends to orders: %v", err)
	}
	col := collect(t, n2, "orders", "billing")
	waitSeen(t, col, "allowed")
	if err := n1.CreateMQ(ctx, "new", 1, mq.Options{}); err != nil {
		t.Fatalf("n1 creates a topic: %v", err)
	}
	// Each refusal once, with n2's identity: the three sends by n2 itself,
	// and the direct append by n1's partition service (the same words,
	// another node).
	for _, r := range []struct {
		what  string
		parts []string
		want  int
	}{
		{"the refused sends", []string{"topic=orders", "right=produce"}, 2},
		{"the refused create", []string{"CreateTopic", "new"}, 1},
		{"the refused alter", []string{"AlterTopic", "orders"}, 1},
		{"the refused SetACL", []string{"SetACL"}, 1},
		{"the refused reset", []string{"topic=orders", "right=admin"}, 1},
		{"the refused resolve", []string{"topic=*", "right=admin"}, 1},
		{"the refused consumer", []string{"topic=audit", "right=consume"}, 1},
	} {
		if n := len(logs.Matching(append([]string{"refused by the cluster's ACL", "identity=n2"}, r.parts...)...)); n != r.want {
			t.Errorf("%s logged %d times, want %d:\n%s", r.what, n, r.want, logs.String())
		}
	}
	// Rules off again: n2 may send.
	if err := n1.SetACL(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the rules gone on n2", func() bool { return len(n2.ACL()) == 0 })
	if _, err := p2.SendMessage(ctx, &mq.Message{Body: []byte("x")}); err != nil {
		t.Fatalf("n2 sends once the rules are gone: %v", err)
	}
}

// TestCluster_NoQuorumDataPathsGoOn: losing the metadata quorum stops
// changes, not the data paths that exist. Four voters, two of them killed:
// no quorum. The two left go on sending to the partitions they hold and
// delivering them to the consumers that had them, across the two nodes,
// long past their sessions' end; CreateMQ fails with ErrNoQuorum; once the
// dead come back, changes work again.
func TestCluster_NoQuorumDataPathsGoOn(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "t", 4, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == 4 })
	}
	col3, col4 := &collector{}, &collector{}
	c3, err := c.nodes["n3"].NewConsumer("t", "g", col3)
	if err != nil {
		t.Fatal(err)
	}
	c4, err := c.nodes["n4"].NewConsumer("t", "g", col4)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the partitions divided", func() bool {
		return len(c3.Assigned()) == 2 && len(c4.Assigned()) == 2
	})
	// The partitions on the nodes that stay, with a consumer there to read them.
	var live []int
	for i := range 4 {
		if n := mq.PartitionNode(c.nodes["n3"], "t", i); n == "n3" || n == "n4" {
			live = append(live, i)
		}
	}
	if len(live) != 2 {
		t.Fatalf("placement put %v on n3 and n4, want two partitions", live)
	}
	c.kill("n1")
	c.kill("n2")
	p, err := c.nodes["n3"].NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	// Ten rounds over five session timeouts: sent and delivered throughout.
	seen := func(id string) bool { return col3.count(id)+col4.count(id) > 0 }
	var ids []string
	for round := range 10 {
		for _, part := range live {
			msg := (&mq.Message{ID: fmt.Sprintf("r%d-p%d", round, part), Body: []byte("x")}).ToPartition(part)
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := p.SendMessage(sctx, msg)
			scancel()
			if err != nil {
				t.Fatalf("round %d: send to partition %d without a metadata quorum: %v", round, part, err)
			}
			ids = append(ids, msg.ID)
		}
		time.Sleep(500 * time.Millisecond)
	}
	waitFor(t, 10*time.Second, "every message delivered without a quorum", func() bool {
		for _, id := range ids {
			if !seen(id) {
				return false
			}
		}
		return true
	})
	for _, m := range []*mq.MQ{c.nodes["n3"], c.nodes["n4"]} {
		if st := m.ClusterStatus(); st.Leader != "" {
			t.Fatalf("%s sees leader %q with two of four voters", st.NodeID, st.Leader)
		}
	}
	cctx, ccancel := context.WithTimeout(ctx, time.Second)
	err = c.nodes["n3"].CreateMQ(cctx, "new", 1, mq.Options{})
	ccancel()
	if !errors.Is(err, mq.ErrNoQuorum) {
		t.Fatalf("CreateMQ without a quorum: %v, want ErrNoQuorum", err)
	}
	// The dead come back: changes work again and the flow goes on.
	c.start("n1")
	c.start("n2")
	if err := c.nodes["n3"].CreateMQ(ctx, "new", 1, mq.Options{}); err != nil {
		t.Fatalf("CreateMQ after the quorum came back: %v", err)
	}
	msg := (&mq.Message{ID: "after", Body: []byte("x")}).ToPartition(live[0])
	if _, err := p.SendMessage(ctx, msg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "delivery after the quorum came back", func() bool { return seen("after") })
}

// TestCluster_RestartWithoutQuorum: a node restarting while the metadata
// group has no quorum gets its topic table back from its state cache, so
// the data paths it holds work at once: sends to its partitions, reads of
// them. A damaged cache is ignored (the node then waits for a leader) and
// never a reason not to open.
func TestCluster_RestartWithoutQuorum(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "t", 3, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == 3 })
	}
	own := -1
	for i := range 3 {
		if mq.PartitionNode(c.nodes["n3"], "t", i) == "n3" {
			own = i
		}
	}
	if own < 0 {
		t.Fatal("no partition of t on n3")
	}
	time.Sleep(300 * time.Millisecond) // the cache is saved within 100 ms of a change
	for _, id := range []string{"n1", "n2", "n3"} {
		c.kill(id)
	}
	m := c.start("n3") // alone: one of three voters
	if got := m.Topics()["t"]; got != 3 {
		t.Fatalf("n3 restarted without a quorum: Topics()[t] = %d, want 3 from its state cache", got)
	}
	p, err := m.NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.SendMessage(ctx, (&mq.Message{ID: "alone", Body: []byte("x")}).ToPartition(own))
	if err != nil {
		t.Fatalf("send to n3's own partition without a quorum: %v", err)
	}
	got, err := m.ReadMessage(ctx, "t", own, res[0].Offset)
	if err != nil || got.ID != "alone" {
		t.Fatalf("ReadMessage: %+v, %v", got, err)
	}
	if st := m.ClusterStatus(); st.Leader != "" {
		t.Fatalf("n3 alone sees leader %q", st.Leader)
	}
	// A damaged cache is ignored: n3 opens, and has its table once a quorum
	// is back.
	c.kill("n3")
	path := filepath.Join(c.root, "n3", "cluster", "state")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	m = c.start("n3")
	if got := m.Topics()["t"]; got != 0 {
		t.Fatalf("n3 with a damaged cache: Topics()[t] = %d before any leader, want 0", got)
	}
	c.start("n1")
	waitFor(t, 20*time.Second, "n3's table once the quorum is back", func() bool { return m.Topics()["t"] == 3 })
	col := &collector{}
	if _, err := m.NewConsumer("t", "g", col); err != nil {
		t.Fatal(err)
	}
	waitSeen(t, col, "alone")
}

// TestCluster_RestartAllOnNewPorts: every node closed, then reopened one
// after the other on new ports, each with the ones already back as seeds.
// The first one back has no seed and only stale addresses; the others must
// find it through their seeds, or it never registers and the metadata
// group never learns where it is.
func TestCluster_RestartAllOnNewPorts(t *testing.T) {
	c := newCluster(t, 3)
	for _, id := range []string{"n3", "n1", "n2"} {
		c.kill(id)
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		c.start(id)
	}
	waitFor(t, 20*time.Second, "every node known at its new address by every node", func() bool {
		for _, m := range c.nodes {
			for _, nd := range m.ClusterStatus().Nodes {
				if !nd.Up || nd.Addr != c.nodes[nd.ID].ClusterStatus().Addr {
					return false
				}
			}
		}
		return true
	})
}

// TestCluster_CreateCtxEndsAfterCommit: a CreateMQ whose change the
// metadata group committed, but whose ctx ends while this node's table
// has not caught up, returns ctx's error, not ErrNoQuorum: the quorum was
// there. The same for AlterMQ.
func TestCluster_CreateCtxEndsAfterCommit(t *testing.T) {
	c := newCluster(t, 3)
	n := c.nodes["n2"]
	release := sync.OnceFunc(mq.HoldAdmin(n)) // n2's table does not follow the metadata
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := n.CreateMQ(ctx, "t", 2, mq.Options{})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, mq.ErrNoQuorum) {
		t.Fatalf("CreateMQ while the table is held: %v, want ctx's error alone", err)
	}
	if _, ok := c.nodes["n1"].Topics()["t"]; !ok {
		waitFor(t, 10*time.Second, "n1 has the topic", func() bool { _, ok := c.nodes["n1"].Topics()["t"]; return ok })
	}
	ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = n.AlterMQ(ctx, "t", 4)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, mq.ErrNoQuorum) {
		t.Fatalf("AlterMQ while the table is held: %v, want ctx's error alone", err)
	}
	release()
	waitFor(t, 10*time.Second, "n2 has 4 partitions", func() bool { return n.Topics()["t"] == 4 })
}
