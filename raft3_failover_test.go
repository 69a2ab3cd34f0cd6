package mq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// Raft3 topics through the public API: a partition's leader
// closed while sends and a consumer group run, every node closed at once,
// no quorum, delayed and transactional messages across failovers, calls
// through a follower replica or none, calls from a handler, and messages
// at the limits.

// TestRaft3_LeaderClosedWhileSending: the node leading a partition
// is closed while every node sends (the closed node's own sends end with
// ErrClosed): every acked message is stored once, at the partition and
// offset of its ack, each key's in order, and nothing never sent is
// stored. The node reopened on its data rejoins: with another node
// closed, the quorum needs it, and it takes sends and reads back all.
func TestRaft3_LeaderClosedWhileSending(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	c := newCluster(t, 3, withRaft3(parts))
	lead, others := leaderAndOthers(t, c)
	ctx := testCtx(t)
	l := newLedger()
	stop := l.sendFrom(ctx, t, c, parts, othersThan(c)...)
	waitFor(t, 20*time.Second, "acks before the close", l.atLeast(10, others...))
	bounded(t, 20*time.Second, "Close of the leader while it sends and serves sends", func() { c.kill(lead) })
	waitFor(t, 20*time.Second, "acks after the close", l.atLeast(l.count(others[0])+10, others...))
	stop()
	l.check(t, c.nodes[others[0]], parts)

	back := c.start(lead)
	waitReadable(t, back, parts)
	c.kill(others[0])
	p, err := c.nodes[others[1]].NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	for j := range 10 {
		msg := (&mq.Message{ID: fmt.Sprintf("again-%d", j), Key: fmt.Sprintf("again/%d", j%parts)}).ToPartition(j % parts)
		if err := l.sendOne(ctx, p, "again", msg); err != nil {
			t.Fatalf("send with the reopened node in the quorum: %v", err)
		}
	}
	l.check(t, back, parts)
}

// TestRaft3_GroupFailover: a group consumes on two nodes, one of
// them leading a partition, while the two nodes not leading it send; the
// leader's node is closed. The other consumer keeps its partitions
// through the new leader and takes the closed one's over from the offsets
// replicated in the groups: every acked message is delivered at least
// once, at its acked place, each partition from its start with no gap and
// each key's messages first in send order.
func TestRaft3_GroupFailover(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	c := newCluster(t, 3, withRaft3(parts))
	lead, others := leaderAndOthers(t, c)
	ctx := testCtx(t)
	o := newOrderly() // both consumers' deliveries
	doomed := o.consume(t, c, lead, others[0])[0]
	waitFor(t, 20*time.Second, "a partition for the consumer on "+lead, func() bool { return len(doomed.Assigned()) > 0 })
	l := newLedger()
	stop := l.sendFrom(ctx, t, c, parts, others...)
	waitFor(t, 20*time.Second, "deliveries in both partitions", func() bool {
		return o.count(others[1]+"-10") > 0 && o.count(others[1]+"-11") > 0
	})
	c.kill(lead)
	waitFor(t, 20*time.Second, "acks after the close", l.atLeast(l.count(others[1])+10, others[1]))
	stop()
	o.waitAll(t, l)
}

// TestRaft3_LeaderIsolated: the node leading a partition is cut off
// from the two others (every link, both ways) for longer than a session,
// while all three send and a group consumes on it and on another node;
// then healed. The two others go on taking sends; the cut node's sends
// wait, or fail with an unknown outcome and are sent again, and go on
// once healed; every acked message is stored once where it was acked and
// delivered, each partition with no gap.
func TestRaft3_LeaderIsolated(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	c := newCluster(t, 3, withRaft3(parts))
	lead, others := leaderAndOthers(t, c)
	ctx := testCtx(t)
	o := newOrderly()
	o.consume(t, c, lead, others[0])
	l := newLedger()
	stop := l.sendFrom(ctx, t, c, parts, othersThan(c)...)
	waitFor(t, 20*time.Second, "acks from every node", l.atLeast(10, othersThan(c)...))
	cut := func(down bool) {
		for _, id := range others {
			mq.SetLinkDown(c.nodes[lead], id, down)
			mq.SetLinkDown(c.nodes[id], lead, down)
		}
	}
	cut(true)
	waitFor(t, 20*time.Second, "acks from the two others while the leader is cut off", l.atLeast(l.count(others[1])+10, others...))
	time.Sleep(1500 * time.Millisecond) // past the cut node's session
	cut(false)
	waitFor(t, 30*time.Second, "acks from the healed node", l.atLeast(l.count(lead)+5, lead))
	stop()
	o.waitAll(t, l)
	l.check(t, c.nodes[lead], parts)
}

// TestRaft3_CloseAllWhileBusy: every node closed at once while each
// sends and consumes: every Close, send and handler returns (no hang), the
// sends end with ErrClosed, and the cluster reopened on its directories
// holds every acked message once, where it was acked.
func TestRaft3_CloseAllWhileBusy(t *testing.T) {
	parallelByDefault(t)
	const parts = 2
	c := newCluster(t, 3, withRaft3(parts))
	ctx := testCtx(t)
	ids := othersThan(c)
	l := newLedger()
	stop := l.sendFrom(ctx, t, c, parts, ids...)
	for _, id := range ids {
		m := c.nodes[id]
		// Its handler reads through the node, which closes under it.
		reader := mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
			_, err := m.ReadMessage(ctx, r3, msg.PartitionIndex, msg.Offset)
			return err
		})
		cons, err := m.NewConsumer(r3, "g", reader)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cons.Close() })
	}
	waitFor(t, 20*time.Second, "acks from every node", l.atLeast(10, ids...))
	bounded(t, 30*time.Second, "Close of every node at once, with the sends", func() {
		var closing sync.WaitGroup
		for _, id := range ids {
			m := c.nodes[id]
			closing.Go(func() { m.Close() })
		}
		closing.Wait()
		stop() // the sends ended with ErrClosed: a send that hangs holds this
	})
	for _, id := range ids {
		delete(c.nodes, id)
	}
	for _, id := range ids { // each joins through those already back
		c.start(id)
	}
	c.waitUp(3)
	l.check(t, c.nodes["n2"], parts)
}

// TestRaft3_NoQuorum: with two of three nodes closed, every call
// that waits for the group's leader, or for the metadata group's, returns
// ErrNoQuorum wrapping its ctx's error soon after its ctx ends; a send
// waiting without a deadline returns ErrClosed when the node closes, and
// Close returns.
func TestRaft3_NoQuorum(t *testing.T) {
	c := newCluster(t, 3, withRaft3(1))
	n1 := c.nodes["n1"]
	p, err := n1.NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(context.Background(), &mq.Message{ID: "x-0"}); err != nil {
		t.Fatal(err)
	}
	col := collect(t, n1, r3, "g")
	waitSeen(t, col, "x-0")
	cons, err := n1.NewConsumer(r3, "h", mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cons.Close() })
	c.kill("n2")
	c.kill("n3")
	waitFor(t, 20*time.Second, "n1 without a leader", func() bool {
		l, _ := mq.Raft3Leader(n1, r3, 0)
		return l == ""
	})
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"SendMessage", func(ctx context.Context) error {
			_, err := p.SendMessage(ctx, &mq.Message{ID: "x-1"})
			return err
		}},
		{"PrepareMessage", func(ctx context.Context) error {
			return p.PrepareMessage(localtx.WithTx(ctx, &fakeTx{id: "0123456789abcdef-1"}), &mq.Message{ID: "x-2"})
		}},
		{"ResetOffset", func(ctx context.Context) error { return n1.ResetOffset(ctx, r3, "g", mq.SeekFirst()) }},
		{"Seek", func(ctx context.Context) error { return cons.Seek(ctx, mq.SeekOffset(0, 0)) }},
		{"CreateMQ", func(ctx context.Context) error { return n1.CreateMQ(ctx, "other", 1, mq.Options{Type: mq.Raft3}) }},
		{"AlterMQ", func(ctx context.Context) error { return n1.AlterMQ(ctx, r3, 2) }},
	}
	const deadline = 300 * time.Millisecond
	var wg sync.WaitGroup
	for _, cl := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := cl.call(ctx)
			if took := time.Since(start); took > deadline+5*time.Second {
				t.Errorf("%s returned %v after its ctx ended: not promptly", cl.name, took-deadline)
			}
			// A metadata change proposed by a leader that then finds it
			// lost its quorum may still take effect: ErrUnknownOutcome
			// is as true as ErrNoQuorum there.
			metaChange := cl.name == "CreateMQ" || cl.name == "AlterMQ"
			if (!errors.Is(err, mq.ErrNoQuorum) || !errors.Is(err, context.DeadlineExceeded)) &&
				!(metaChange && errors.Is(err, mq.ErrUnknownOutcome)) {
				t.Errorf("%s without a quorum: %v, want ErrNoQuorum wrapping context.DeadlineExceeded", cl.name, err)
			}
		})
	}
	bounded(t, 30*time.Second, "the calls without a quorum", wg.Wait)

	waiting := make(chan error, 1)
	go func() {
		_, err := p.SendMessage(context.Background(), &mq.Message{ID: "x-3"})
		waiting <- err
	}()
	time.Sleep(100 * time.Millisecond)
	bounded(t, 20*time.Second, "Close without a quorum, a send waiting", func() { c.kill("n1") })
	select {
	case err := <-waiting:
		if !errors.Is(err, mq.ErrClosed) {
			t.Errorf("a send waiting for a leader when its node closed: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a send waiting for a leader did not return when its node closed")
	}
}

// TestRaft3_DelayedAcrossFailover: messages delayed through the
// partition's leader, which is then closed, are released by the new
// leader: each delivered no earlier than its time, and stored once.
func TestRaft3_DelayedAcrossFailover(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withRaft3(1))
	lead, others := leaderAndOthers(t, c)
	delayedAcrossFailover(t, c, lead, others, 1)
}

// TestRaft3_Transactions: transactions on a Raft3 topic. A
// committed one whose partition's leader is closed between prepare and
// commit is delivered; a rolled back one never; one whose preparer's
// hooks never ran is decided by check-back from the preparer's node
// (committed where its host holds the marker, rolled back where not);
// while the preparer is down, none is decided, nor delivered.
func TestRaft3_Transactions(t *testing.T) {
	// The first check-back comes checkAfter after a prepare: the preparer
	// is cut off within it, so that none reaches it while it closes.
	const checkAfter = 500 * time.Millisecond
	parallelByDefault(t)
	host := txtest.Open(t, "bolt", filepath.Join(t.TempDir(), "host"))
	const parts = 2
	c := newCluster(t, 3, withNodeOptions(func(id string) []mq.Option {
		opts := []mq.Option{mq.WithTxCheckAfter(checkAfter), mq.WithTxMaxChecks(10000)}
		if id == "n1" {
			opts = append(opts, mq.WithLocalTx(host.Store))
		}
		return opts
	}), withRaft3(parts))
	ctx := testCtx(t)
	spread := func(prefix string) []*mq.Message {
		out := msgs(prefix, parts)
		for i, m := range out {
			m.ToPartition(i)
		}
		return out
	}
	// n1 reopened: the groups' leaders are the two others.
	c.kill("n1")
	c.start("n1")
	p, err := c.nodes["n1"].NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	lead := leaderOf(t, c, 0)
	if lead == "n1" {
		t.Log("n1 leads again: its partition's leader is not closed under the transaction")
	}
	err = host.Run(ctx, func(ctx context.Context) error {
		if err := prepareAgain(ctx, p, spread("kp")...); err != nil {
			return err
		}
		if lead != "n1" {
			c.kill(lead)
		}
		return p.CommitMessage(ctx, msgs("ko", 1)...)
	})
	if err != nil {
		t.Fatalf("a transaction whose partition's leader closed before its commit: %v", err)
	}
	on := othersThan(c, "n1")[0]
	col := &collector{}
	cons, err := c.nodes[on].NewConsumer(r3, "g", col)
	if err != nil {
		t.Fatal(err)
	}
	// Closed while the group has a quorum: with none, its last commits
	// would wait 10 s each for a leader.
	defer cons.Close()
	waitSeen(t, col, "kp-0", "kp-1", "ko-0")

	if err := host.Run(ctx, func(ctx context.Context) error {
		if err := prepareAgain(ctx, p, spread("rb")...); err != nil {
			return err
		}
		return errAbort
	}); !errors.Is(err, errAbort) {
		t.Fatalf("rolled back: %v", err)
	}
	// Transactions whose hooks never ran (their process "died"), the host
	// holding the marker or not.
	orphan := func(prefix string, marked bool) string {
		t.Helper()
		var txid string
		if err := host.Run(ctx, func(ctx context.Context) error {
			real, _ := localtx.FromContext(ctx)
			txid = real.ID()
			tx := &fakeTx{id: txid}
			if marked {
				tx.put = real.Put
			}
			return prepareAgain(localtx.WithTx(ctx, tx), p, spread(prefix)...)
		}); err != nil {
			t.Fatal(err)
		}
		return txid
	}
	committed, rolledBack := orphan("cp", true), orphan("rp", false)
	waitSeen(t, col, "cp-0", "cp-1")
	waitFor(t, 20*time.Second, "the check-back's rollback", func() bool {
		return mq.TxDecided(c.nodes[on], rolledBack) == mq.TxRollback
	})
	if d := mq.TxDecided(c.nodes[on], committed); d != mq.TxCommit {
		t.Fatalf("the check-back decided %v a transaction its preparer committed", d)
	}

	// The preparer down: its transactions wait for it.
	if lead != "n1" {
		c.start(lead)
		c.waitUp(3)
	}
	prepared := time.Now()
	pending, undecided := orphan("dp", true), orphan("dq", false)
	c.isolate("n1", true) // no check-back reaches n1 while it closes
	if time.Since(prepared) >= checkAfter {
		t.Logf("n1 cut off %v after the prepare: a check-back may have reached it", time.Since(prepared))
	}
	c.kill("n1")
	c.isolate("n1", false)
	time.Sleep(3 * checkAfter) // check-backs find n1 down
	for _, id := range []string{pending, undecided} {
		if d := mq.TxDecided(c.nodes[on], id); d != mq.TxUndecided {
			t.Fatalf("%s decided %v while its preparer was down", id, d)
		}
	}
	c.start("n1")
	waitSeen(t, col, "dp-0", "dp-1")
	waitFor(t, 20*time.Second, "the rollback once the preparer is back", func() bool {
		return mq.TxDecided(c.nodes[on], undecided) == mq.TxRollback
	})
	fence(t, c.nodes[on], col, r3)
	for _, id := range []string{"rb-0", "rb-1", "rp-0", "rp-1", "dq-0", "dq-1"} {
		if n := col.count(id); n != 0 {
			t.Errorf("%s of a transaction rolled back delivered %d times", id, n)
		}
	}
}

// TestRaft3_ThroughFollowers: on four nodes, one holding no replica:
// sends, reads, Lag, ResetOffset and Seek through a follower replica and
// through the node without one act on the leader's partition; AlterMQ
// from the node without one grows the topic, and the group gets the new
// partitions' messages.
func TestRaft3_ThroughFollowers(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 4, withRaft3(1))
	ctx := testCtx(t)
	lead := leaderOf(t, c, 0)
	var none, follower string
	for _, id := range othersThan(c, lead) {
		if _, holds := mq.Raft3Leader(c.nodes[id], r3, 0); !holds {
			none = id
		} else {
			follower = id
		}
	}
	if none == "" || follower == "" {
		t.Fatalf("placement of %s/0 on four nodes: leader %s, no node without a replica or no follower", r3, lead)
	}
	l := newLedger()
	for _, id := range []string{none, follower} {
		p, err := c.nodes[id].NewProducer(r3)
		if err != nil {
			t.Fatal(err)
		}
		for j := range 10 {
			if err := l.sendOne(ctx, p, id, &mq.Message{ID: fmt.Sprintf("%s-%d", id, j), Key: id}); err != nil {
				t.Fatalf("send through %s: %v", id, err)
			}
		}
	}
	l.check(t, c.nodes[none], 1)
	l.check(t, c.nodes[follower], 1)

	o := newOrderly()
	cons := o.consume(t, c, follower)[0]
	ids := l.ids()
	deliveredAtLeast := func(n int, ids ...string) func() bool {
		return func() bool {
			for _, id := range ids {
				if o.count(id) < n {
					return false
				}
			}
			return true
		}
	}
	noLag := func() bool {
		for _, id := range othersThan(c) {
			if !committedAll(c.nodes[id], r3, "g", 1) {
				return false
			}
		}
		return true
	}
	waitFor(t, 20*time.Second, "every message", deliveredAtLeast(1, ids...))
	waitFor(t, 20*time.Second, "no lag, as every node sees it", noLag)
	o.check(t, l)

	if err := c.nodes[none].ResetOffset(ctx, r3, "g", mq.SeekFirst()); err != nil {
		t.Fatalf("ResetOffset through the node without a replica: %v", err)
	}
	waitFor(t, 20*time.Second, "every message again after ResetOffset", deliveredAtLeast(2, ids...))
	waitFor(t, 20*time.Second, "no lag after ResetOffset", noLag)
	if err := cons.Seek(ctx, mq.SeekOffset(0, 15)); err != nil {
		t.Fatalf("Seek through a follower: %v", err)
	}
	var tail, head []string
	for id, res := range l.acked {
		if res.Offset >= 15 {
			tail = append(tail, id)
		} else {
			head = append(head, id)
		}
	}
	waitFor(t, 20*time.Second, "the messages from offset 15 again after Seek", deliveredAtLeast(3, tail...))
	waitFor(t, 20*time.Second, "no lag after Seek", noLag)
	for _, id := range head {
		if n := o.count(id); n != 2 {
			t.Errorf("%s, before the offset sought, delivered %d times, want 2", id, n)
		}
	}

	if err := c.nodes[none].AlterMQ(ctx, r3, 3); err != nil {
		t.Fatalf("AlterMQ of a Raft3 topic through the node without a replica: %v", err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "three partitions on "+id, func() bool { return m.Topics()[r3] == 3 })
	}
	var grown []string
	for _, id := range othersThan(c) {
		p, err := c.nodes[id].NewProducer(r3)
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < 3; i++ {
			msg := (&mq.Message{ID: fmt.Sprintf("x-%s-%d", id, i)}).ToPartition(i)
			resend(ctx, t, p, msg) // to new partition i through id
			grown = append(grown, msg.ID)
		}
	}
	waitFor(t, 20*time.Second, "the new partitions' messages", deliveredAtLeast(1, grown...))
	lags, err := c.nodes[none].Lag(context.Background(), r3, "g")
	if err != nil || len(lags) != 3 {
		t.Fatalf("Lag after AlterMQ: %v, %v", lags, err)
	}
}

// TestRaft3_GrowWhileNodeDown: a Raft3 topic grown just after a
// node closed (still up in the metadata, so the new partition is placed
// on it too) takes sends on the two left; the node reopened opens its
// replica of the new partition late and joins its group: with another
// node closed, the group needs it, and it holds every acked message.
func TestRaft3_GrowWhileNodeDown(t *testing.T) {
	parallelByDefault(t)
	// Sessions long enough that the closed node is still up when the
	// topic grows, however slow its Close.
	c := newCluster(t, 3, withSession(time.Minute), withRaft3(1))
	ctx := testCtx(t)
	c.kill("n3")
	if err := c.nodes["n1"].AlterMQ(ctx, r3, 2); err != nil {
		t.Fatalf("AlterMQ of a Raft3 topic just after a node closed: %v", err)
	}
	l := newLedger()
	send := func(through, prefix string) {
		t.Helper()
		p, err := c.nodes[through].NewProducer(r3)
		if err != nil {
			t.Fatal(err)
		}
		for j := range 10 {
			msg := (&mq.Message{ID: fmt.Sprintf("%s-%d", prefix, j), Key: fmt.Sprintf("%s/%d", prefix, j%2)}).ToPartition(j % 2)
			if err := l.sendOne(ctx, p, prefix, msg); err != nil {
				t.Fatalf("send %s through %s: %v", msg.ID, through, err)
			}
		}
	}
	send("n2", "a")
	back := c.start("n3")
	waitFor(t, 20*time.Second, "the grown topic on the reopened node", func() bool { return back.Topics()[r3] == 2 })
	if _, holds := mq.Raft3Leader(back, r3, 1); !holds {
		t.Fatal("the new partition was not placed on the node closed just before")
	}
	c.kill("n1")
	send("n3", "b")
	l.check(t, back, 2)
	l.check(t, c.nodes["n2"], 2)
}

// TestRaft3_HandlerReentry: a handler on a follower's node sends to
// its own Raft3 topic (a chain), reads, asks Lag, seeks its own consumer
// once, and at the end of the chain closes its own consumer; a handler on
// the other follower's node closes its node: every call returns, and the
// chain is stored once.
func TestRaft3_HandlerReentry(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withRaft3(1))
	_, followers := leaderAndOthers(t, c)
	ctx := testCtx(t)
	m := c.nodes[followers[0]]
	p, err := m.NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	// The other follower's node is closed by a handler of its own.
	other := c.nodes[followers[1]]
	nodeClosed := make(chan error, 1)
	var closeOnce sync.Once
	closer, err := other.NewConsumer(r3, "h", mq.ListenerFunc(func(context.Context, string, *mq.Message) error {
		closeOnce.Do(func() { nodeClosed <- other.Close() })
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closer.Close() })
	const links = 6
	var (
		mu     sync.Mutex
		errs   []error
		seeked bool
		cons   *mq.Consumer
	)
	closed := make(chan struct{})
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	handler := mq.ListenerFunc(func(ctx context.Context, _ string, msg *mq.Message) error {
		var k int
		if _, err := fmt.Sscanf(msg.ID, "x-%d", &k); err != nil {
			fail(fmt.Errorf("delivered %s", msg.ID))
			return nil
		}
		if _, err := m.ReadMessage(ctx, r3, 0, msg.Offset); err != nil {
			fail(fmt.Errorf("ReadMessage from a handler: %w", err))
		}
		if _, err := m.Lag(context.Background(), r3, "g"); err != nil {
			fail(fmt.Errorf("Lag from a handler: %w", err))
		}
		if k < links-1 {
			if _, err := p.SendMessage(ctx, &mq.Message{ID: fmt.Sprintf("x-%d", k+1)}); err != nil {
				fail(fmt.Errorf("SendMessage from a handler: %w", err))
			}
			return nil
		}
		mu.Lock()
		first := !seeked
		seeked = true
		self := cons
		mu.Unlock()
		if first {
			if err := self.Seek(ctx, mq.SeekFirst()); err != nil {
				fail(fmt.Errorf("Seek from a handler: %w", err))
			}
			return nil
		}
		if err := self.Close(); err != nil {
			fail(fmt.Errorf("Close of its own consumer from a handler: %w", err))
		}
		close(closed)
		return nil
	})
	mu.Lock()
	cons, err = m.NewConsumer(r3, "g", handler)
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cons.Close() })
	resend(ctx, t, p, &mq.Message{ID: "x-0"})
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the chain did not end with the consumer closed from its handler")
	}
	bounded(t, 10*time.Second, "Close after a handler closed its consumer", func() { cons.Close() })
	select {
	case err := <-nodeClosed:
		if err != nil {
			t.Errorf("a node closed by its handler: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a node's Close called by its handler did not return")
	}
	mu.Lock()
	for _, err := range errs {
		t.Error(err)
	}
	mu.Unlock()
	for off := range int64(links) {
		msg, err := m.ReadMessage(ctx, r3, 0, off)
		if err != nil || msg.ID != fmt.Sprintf("x-%d", off) {
			t.Errorf("offset %d: %v, %v; want x-%d (a resend from the second pass stored again?)", off, msg, err, off)
		}
	}
	if _, err := m.ReadMessage(ctx, r3, 0, links); !errors.Is(err, mq.ErrNoMessage) {
		t.Errorf("offset %d: %v, want ErrNoMessage", links, err)
	}
}

// TestRaft3_Limits: messages at the limits through a follower's
// node: the largest message and ID, a batch of several large ones (an
// entry larger than raftqueue packs, 1 MiB), the earliest timestamp and
// the latest DeliverAt are stored, read back and delivered as sent; one
// byte over is refused before anything is written. The nodes' message
// limit is 256 KiB: with the tests' 200 ms election timeout under -race,
// an entry of several MiB takes longer to replicate than the leader's
// lease, and the group elects again and again.
func TestRaft3_Limits(t *testing.T) {
	const limit = 256 << 10
	c := newCluster(t, 3, withNodeOptions(func(string) []mq.Option { return []mq.Option{mq.WithMaxMessageBytes(limit)} }), withRaft3(1))
	lead, others := leaderAndOthers(t, c)
	ctx := testCtx(t)
	m := c.nodes[others[0]]
	p, err := m.NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	body := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	biggest := &mq.Message{ID: "x-" + strings.Repeat("i", mq.MaxIDBytes-2), Key: "k", Body: body(limit-1, 'a')}
	var batch []*mq.Message
	for i := range 6 {
		batch = append(batch, &mq.Message{ID: fmt.Sprintf("x-b%d", i), Body: body(limit-1, byte('b'+i))})
	}
	early := &mq.Message{ID: "x-early", Timestamp: time.Unix(0, -1<<63)}
	late := &mq.Message{ID: "x-late", DeliverAt: time.Unix(0, 1<<63-1)}
	if _, err := p.SendMessage(ctx, &mq.Message{ID: "x-over", Key: "k", Body: body(limit, 'z')}); !errors.Is(err, mq.ErrMessageTooLarge) {
		t.Fatalf("a message one byte over: %v, want ErrMessageTooLarge", err)
	}
	for _, send := range [][]*mq.Message{{biggest}, batch, {early}} {
		if _, err := sendAgain(ctx, p, send...); err != nil {
			t.Fatalf("%d messages of %d bytes: %v", len(send), len(send[0].Body), err)
		}
	}
	res, err := sendAgain(ctx, p, late)
	if err != nil || !res[0].Delayed {
		t.Fatalf("the latest DeliverAt: %v, %v", res, err)
	}
	col := collect(t, c.nodes[others[1]], r3, "g")
	want := append([]*mq.Message{biggest}, append(batch, early)...)
	for _, w := range want {
		waitSeen(t, col, w.ID)
		got := col.byID(w.ID)
		if !bytes.Equal(got.Body, w.Body) || got.Key != w.Key || !got.Timestamp.Equal(w.Timestamp) {
			t.Errorf("%.20s... delivered with %d bytes, key %q, at %v; sent %d bytes, key %q, at %v", w.ID,
				len(got.Body), got.Key, got.Timestamp, len(w.Body), w.Key, w.Timestamp)
		}
		read, err := c.nodes[lead].ReadMessage(ctx, r3, 0, w.Offset)
		if err != nil || read.ID != w.ID || !bytes.Equal(read.Body, w.Body) {
			t.Errorf("%.20s... read at %d through the leader's node: %v", w.ID, w.Offset, err)
		}
	}
	if _, err := c.nodes[lead].ReadMessage(ctx, r3, 0, int64(len(want))); !errors.Is(err, mq.ErrNoMessage) {
		t.Errorf("the message delayed to 2262 is in the log: %v", err)
	}
	if col.count("x-over") != 0 || col.count("x-late") != 0 {
		t.Error("a message refused, or delayed to 2262, delivered")
	}
}

// TestRaft3_NoQuorumReads: the calls that take a ctx but reach the
// partition through a read that takes none (ReadMessage: Get; ResetOffset
// to a time: SeekTime; ResolveTx: HalfTxs) return ErrNoQuorum wrapping
// their ctx's error soon after it ends, not after the partition's 10 s
// CallTimeout.
func TestRaft3_NoQuorumReads(t *testing.T) {
	c := newCluster(t, 3, withRaft3(1))
	n1 := c.nodes["n1"]
	p, err := n1.NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(context.Background(), &mq.Message{ID: "x-0"}); err != nil {
		t.Fatal(err)
	}
	c.kill("n2")
	c.kill("n3")
	waitFor(t, 20*time.Second, "n1 without a leader", func() bool {
		l, _ := mq.Raft3Leader(n1, r3, 0)
		return l == ""
	})
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"ReadMessage", func(ctx context.Context) error {
			_, err := n1.ReadMessage(ctx, r3, 0, 0)
			return err
		}},
		{"ResetOffsetToTime", func(ctx context.Context) error {
			return n1.ResetOffset(ctx, r3, "g", mq.SeekTime(time.Now()))
		}},
		{"ResolveTx", func(ctx context.Context) error {
			_, err := n1.ResolveTx(ctx, "0123456789abcdef-1", mq.TxRollback)
			return err
		}},
	}
	const deadline = 300 * time.Millisecond
	for _, cl := range calls {
		t.Run(cl.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := cl.call(ctx)
			if took := time.Since(start); took > deadline+5*time.Second {
				t.Errorf("returned %v after its ctx ended: not promptly", took-deadline)
			}
			if !errors.Is(err, mq.ErrNoQuorum) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("without a quorum: %v, want ErrNoQuorum wrapping context.DeadlineExceeded", err)
			}
		})
	}
}
