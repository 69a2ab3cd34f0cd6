package mq_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_NoQuorumLeaseBlip checks "losing the metadata
// quorum stops changes, not the data paths that exist (consumption of held
// partitions)" and "a partition is never left undelivered forever while a
// live consumer of its group exists".
//
// Without a quorum, n3's consumer goes on delivering the partition held on
// n4. The link n3–n4 then drops for a little longer than 4/5 of the lease:
// the worker stops (lease lost), its group rebalances to claim again, but
// Share gives a node whose session may have expired only the partitions
// still running, and this one just stopped: the partition, reachable again
// and held by no one, is not delivered until a quorum comes back. The
// partition's lease is what makes a new claim safe here (a claim refused
// while someone else holds it), so nothing forbids claiming it again.
// It failed before the fix: a message sent after the link came back is not delivered.
func TestCluster_NoQuorumLeaseBlip(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 4) // session timeout 1 s: lease 500 ms
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "t", 4, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == 4 })
	}
	q := -1
	for i := range 4 {
		if mq.PartitionNode(c.nodes["n3"], "t", i) == "n4" {
			q = i
		}
	}
	if q < 0 {
		t.Fatal("no partition placed on n4")
	}
	col := &collector{}
	cons, err := c.nodes["n3"].NewConsumer("t", "g", col)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "every partition on n3's consumer", func() bool { return len(cons.Assigned()) == 4 })
	p, err := c.nodes["n4"].NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	send := func(id string) {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		defer scancel()
		if _, err := p.SendMessage(sctx, (&mq.Message{ID: id, Body: []byte("x")}).ToPartition(q)); err != nil {
			t.Fatalf("send %s: %v", id, err)
		}
	}
	send("m0")
	waitFor(t, 10*time.Second, "m0 delivered", func() bool { return col.count("m0") > 0 })

	c.kill("n1")
	c.kill("n2")
	waitFor(t, 20*time.Second, "no leader on n3 and n4", func() bool {
		return c.nodes["n3"].ClusterStatus().Leader == "" && c.nodes["n4"].ClusterStatus().Leader == ""
	})
	time.Sleep(2 * time.Second) // n3's session has expired
	send("m1")
	waitFor(t, 10*time.Second, "m1 delivered without a quorum", func() bool { return col.count("m1") > 0 })

	// A blip on the link n3–n4, longer than 4/5 of the lease.
	c.cut("n3", "n4", true)
	time.Sleep(1500 * time.Millisecond)
	c.cut("n3", "n4", false)

	send("m2")
	deadline := time.Now().Add(10 * time.Second)
	for col.count("m2") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("partition %d (on n4) not delivered 10 s after the link n3–n4 came back, without a quorum: n3's consumer holds %v",
				q, cons.Assigned())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCluster_MixedSessionTimeouts checks "at most one node delivers
// a partition of a group at a time".
//
// The lease a claim respects is the claimer's own (its node's
// SessionTimeout / 2), not the holder's: nothing makes the nodes agree on
// SessionTimeout (its doc does not ask for one value, unlike Secret's).
// n2 (session 20 s, 5 s by default: lease 10 s, renewed every 2.5 s)
// delivers partition q,
// on n2 itself, and is cut from the metadata leader n1 (session 1 s); the
// leader marks n2 down after a second and gives q to n3's consumer, whose
// claim respects a lease of 500 ms only: it takes q between two of n2's
// renewals, while n2's handler still runs and n2 goes on believing it
// holds q for 4/5 of its own lease.
// It failed before the fix: n3 delivers q's message while n2's handler of it still runs.
func TestCluster_MixedSessionTimeouts(t *testing.T) {
	// n2's session: 5 s by default (lease 2.5 s: n2 believes it holds q
	// for 2 s after its last renewal), 20 s with ZEZE_FULL=1.
	n2Session := sized(5*time.Second, 20*time.Second)
	c := newCluster(t, 0, withSession(time.Second))
	c.opts = func(id string) []mq.Option {
		if id != "n2" {
			return nil
		}
		var seeds []string
		for _, m := range c.nodes {
			seeds = append(seeds, m.ClusterStatus().Addr)
		}
		server, client := nodeTLS(t, id)
		return []mq.Option{mq.WithCluster(mq.ClusterConfig{
			NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: clusterSecret, ServerTLS: server, ClientTLS: client,
			SessionTimeout: n2Session, ElectionTimeout: 200 * time.Millisecond,
		})}
	}
	c.startAll(3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if l := c.nodes["n1"].ClusterStatus().Leader; l != "n1" {
		t.Skipf("leader %s, not n1", l)
	}
	if err := c.nodes["n1"].CreateMQ(ctx, "t", 3, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == 3 })
	}
	q := -1
	for i := range 3 {
		if mq.PartitionNode(c.nodes["n1"], "t", i) == "n2" {
			q = i
		}
	}
	if q < 0 {
		t.Fatal("no partition on n2")
	}
	var inA atomic.Int32
	started := make(chan struct{}, 1)
	a, err := c.nodes["n2"].NewConsumer("t", "g", mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
		inA.Add(1)
		defer inA.Add(-1)
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done() // slow work that ends with its ctx
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "every partition on n2's consumer", func() bool { return len(a.Assigned()) == 3 })
	p, err := c.nodes["n2"].NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(ctx, (&mq.Message{ID: "m0", Body: []byte("x")}).ToPartition(q)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("m0 never delivered on n2")
	}
	c.cut("n2", "n1", true)
	defer func() {
		c.cut("n2", "n1", false)
	}()
	cut := time.Now()
	var overlap atomic.Value
	_, err = c.nodes["n3"].NewConsumer("t", "g", mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
		if msg.ID == "m0" && inA.Load() > 0 {
			overlap.CompareAndSwap(nil, time.Since(cut).Round(time.Millisecond).String())
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	// Watched for 4 s by default (10 s with ZEZE_FULL=1): the leader
	// gives q to n3 a second after the cut.
	deadline := time.Now().Add(sized(4*time.Second, 10*time.Second))
	for time.Now().Before(deadline) && inA.Load() > 0 {
		if v := overlap.Load(); v != nil {
			t.Fatalf("n3 delivered m0 of partition %d %s after n2 was cut from the leader, while n2's handler of it still ran", q, v)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := overlap.Load(); v != nil {
		t.Fatalf("n3 delivered m0 of partition %d %s after n2 was cut from the leader, while n2's handler of it still ran", q, v)
	}
}

// TestCluster_NoQuorumDeadLetterClose checks "losing the metadata
// quorum stops changes (→ ErrNoQuorum), not the data paths" and "Close
// waits for every goroutine ... every call returns".
//
// Consumption now goes on without a quorum, so a handler can fail there
// until its message is dead-lettered. The dead-letter topic does not exist
// yet: the worker creates it (ensureSystemTopic → createTopic with
// context.Background()), a metadata proposal that retries until a leader
// appears. The worker is stuck in it, its partition stops, and
// Consumer.Close, which waits for the worker, never returns.
// It failed before the fix: Consumer.Close has not returned 10 s after it was called.
func TestCluster_NoQuorumDeadLetterClose(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "t", 3, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == 3 })
	}
	q := -1
	for i := range 3 {
		if mq.PartitionNode(c.nodes["n3"], "t", i) == "n3" {
			q = i
		}
	}
	if q < 0 {
		t.Fatal("no partition on n3")
	}
	var failures atomic.Int32
	cons, err := c.nodes["n3"].NewConsumer("t", "g", mq.ListenerFunc(func(context.Context, string, *mq.Message) error {
		failures.Add(1)
		return errors.New("cannot handle it")
	}), mq.WithRetryLadder(0), mq.WithMaxReconsumeTimes(1))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "every partition on n3's consumer", func() bool { return len(cons.Assigned()) == 3 })
	c.kill("n1")
	c.kill("n2")
	waitFor(t, 20*time.Second, "no leader on n3", func() bool { return c.nodes["n3"].ClusterStatus().Leader == "" })
	p, err := c.nodes["n3"].NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(ctx, (&mq.Message{ID: "bad", Body: []byte("x")}).ToPartition(q)); err != nil {
		t.Fatalf("send without a quorum: %v", err)
	}
	waitFor(t, 10*time.Second, "the message failed twice", func() bool { return failures.Load() >= 2 })
	closed := make(chan struct{})
	go func() {
		cons.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		c.start("n1") // a quorum again: the proposal, and Close, can end
		<-closed
		t.Fatal("Consumer.Close did not return within 10 s without a quorum: its worker waits to create the dead-letter topic")
	}
}

// TestCluster_NoQuorumConsumerCloseHandsOverLater checks "quorum lost then a node's consumer closes (it cannot
// LeaveGroup)": Close returns at once, and once the quorum is back the
// closed consumer's partitions go to the group's other consumer, with the
// message sent meanwhile delivered.
func TestCluster_NoQuorumConsumerCloseHandsOverLater(t *testing.T) {
	c := newCluster(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "t", 4, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == 4 })
	}
	col2, col3 := &collector{}, &collector{}
	c2, err := c.nodes["n2"].NewConsumer("t", "g", col2)
	if err != nil {
		t.Fatal(err)
	}
	c3, err := c.nodes["n3"].NewConsumer("t", "g", col3)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the partitions divided", func() bool {
		return len(c2.Assigned()) == 2 && len(c3.Assigned()) == 2
	})
	// A partition of n2's consumer that lives on n2 or n3, which stay.
	q := -1
	for _, i := range c2.Assigned() {
		if n := mq.PartitionNode(c.nodes["n3"], "t", i); n == "n2" || n == "n3" {
			q = i
		}
	}
	if q < 0 {
		t.Skipf("n2's consumer holds %v, none on n2 or n3", c2.Assigned())
	}
	c.kill("n1")
	c.kill("n4")
	waitFor(t, 20*time.Second, "no leader", func() bool { return c.nodes["n3"].ClusterStatus().Leader == "" })
	start := time.Now()
	c2.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Consumer.Close without a quorum took %v", d)
	}
	p, err := c.nodes["n3"].NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(ctx, (&mq.Message{ID: "m", Body: []byte("x")}).ToPartition(q)); err != nil {
		t.Fatal(err)
	}
	c.start("n1")
	c.start("n4")
	waitFor(t, 30*time.Second, "the closed consumer's partition delivered on n3 once the quorum is back", func() bool { return col3.count("m") > 0 })
}
