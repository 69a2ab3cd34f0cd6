package mq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_BalanceLeadersUnderLoad: six Raft3 groups, all led by n1,
// while a sender on each node sends to every partition; BalanceLeaders
// moves four of them, each node then leads two, and every acked message
// is stored once at the offset of its ack, each key in send order. A
// second call finds nothing to move, and one whose ctx ended moves nothing.
func TestCluster_BalanceLeadersUnderLoad(t *testing.T) {
	parallelByDefault(t)
	const parts = 6
	c := newCluster(t, 3)
	createR3With(t, c, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 1})
	for i := range parts {
		if lead := leaderOf(t, c, i); lead != "n1" {
			if err := mq.Raft3TransferTo(c.nodes[lead], r3, i, "n1"); err != nil {
				t.Fatalf("move r3/%d to n1: %v", i, err)
			}
		}
	}
	waitFor(t, 30*time.Second, "n1 leads every group", func() bool { return len(c.nodes["n1"].ClusterStatus().Leading) == parts })

	ctx := testCtx(t)
	// A call whose ctx has ended moves nothing, though n1 knows what it
	// leads without asking anyone.
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if moved, err := c.nodes["n1"].BalanceLeaders(ended); !errors.Is(err, context.Canceled) || moved != 0 {
		t.Fatalf("BalanceLeaders with its ctx ended: %d moved, %v", moved, err)
	}
	if n := len(c.nodes["n1"].ClusterStatus().Leading); n != parts {
		t.Fatalf("n1 leads %d groups after a call whose ctx had ended, %d before", n, parts)
	}
	l := newLedger()
	stop := l.sendFrom(ctx, t, c, parts, "n1", "n2", "n3")
	waitFor(t, 30*time.Second, "sends acked", l.atLeast(20, "n1", "n2", "n3"))
	moved, err := c.nodes["n2"].BalanceLeaders(ctx)
	if err != nil || moved != 4 {
		t.Fatalf("BalanceLeaders: %d moved, %v", moved, err)
	}
	waitFor(t, 30*time.Second, "two leaderships each", func() bool {
		for _, m := range c.nodes {
			if len(m.ClusterStatus().Leading) != 2 {
				return false
			}
		}
		return true
	})
	if uneven := leaderSpread(t, c, parts); uneven != "" {
		t.Error(uneven)
	}
	before := l.total()
	waitFor(t, 30*time.Second, "sends acked after the moves", func() bool { return l.total() >= before+60 })
	stop()
	if moved, err := c.nodes["n3"].BalanceLeaders(ctx); err != nil || moved != 0 {
		t.Errorf("a second BalanceLeaders: %d moved, %v", moved, err)
	}
	for _, id := range othersThan(c) {
		l.check(t, c.nodes[id], parts)
	}
	t.Logf("%d acked", l.total())
}

// TestCluster_BalanceLeadersMovesDoubleWritePairs: six DoubleWrite pairs,
// each of those n1 holds led by n1, while senders on every node send to
// every partition; BalanceLeaders swaps pairs' leaders with their
// followers in sync until no pair's leader leads two more than its
// follower, each pair keeping its two replicas, and every acked message
// is stored once. A node that does not lead a pair does not
// hand it over.
func TestCluster_BalanceLeadersMovesDoubleWritePairs(t *testing.T) {
	parallelByDefault(t)
	const parts = 6
	c := newCluster(t, 3, withDoubleWrite(parts, mq.Options{PartitionsPerPair: 1}))
	for i := range parts {
		c.waitInSync(i, 30*time.Second)
	}
	ctx := testCtx(t)
	for i := range parts {
		leader, replicas, _, _ := mq.PairRecord(c.nodes["n1"], "d", i)
		if leader != "n1" && slices.Contains(replicas, "n1") {
			if err := mq.PairHandOver(ctx, c.nodes[leader], "d", i, "n1"); err != nil {
				t.Fatalf("hand d/%d to n1: %v", i, err)
			}
		}
	}
	waitFor(t, 30*time.Second, "n1 leads every pair it holds, each in sync", func() bool {
		for i := range parts {
			leader, replicas, inSync, _ := mq.PairRecord(c.nodes["n1"], "d", i)
			if slices.Contains(replicas, "n1") && leader != "n1" || len(inSync) != 2 {
				return false
			}
		}
		return true
	})
	if err := mq.PairHandOver(ctx, c.nodes["n2"], "d", 0, "n3"); err == nil {
		t.Error("a node that does not lead d/0 handed it over")
	}
	replicasBefore := map[int][]string{}
	for i := range parts {
		_, replicas, _, _ := mq.PairRecord(c.nodes["n1"], "d", i)
		replicasBefore[i] = slices.Sorted(slices.Values(replicas))
	}
	senders := map[string]*sender{}
	for id, m := range c.nodes {
		senders[id] = startSender(t, func() *mq.MQ { return m }, "d", parts, "from-"+id)
	}
	time.Sleep(500 * time.Millisecond)
	moved, err := c.nodes["n2"].BalanceLeaders(ctx)
	if err != nil || moved == 0 {
		t.Fatalf("BalanceLeaders: %d moved, %v", moved, err)
	}
	t.Logf("%d pairs moved", moved)
	spread := func() string {
		count := map[string]int{"n1": 0, "n2": 0, "n3": 0}
		leaders := map[int]string{}
		for i := range parts {
			leader, _, _, _ := mq.PairRecord(c.nodes["n1"], "d", i)
			count[leader]++
			leaders[i] = leader
		}
		for i := range parts {
			_, replicas, _, _ := mq.PairRecord(c.nodes["n1"], "d", i)
			for _, r := range replicas {
				if count[leaders[i]]-count[r] >= 2 {
					return fmt.Sprintf("d/%d's leader %s leads %d pairs, its follower %s %d", i, leaders[i], count[leaders[i]], r, count[r])
				}
			}
		}
		return ""
	}
	if uneven := spread(); uneven != "" {
		t.Error(uneven)
	}
	for i := range parts { // swapped, not copied to a third node
		if _, replicas, _, _ := mq.PairRecord(c.nodes["n1"], "d", i); !slices.Equal(slices.Sorted(slices.Values(replicas)), replicasBefore[i]) {
			t.Errorf("d/%d's replicas %q after the balance, %q before", i, replicas, replicasBefore[i])
		}
	}
	for i := range parts {
		c.waitInSync(i, 30*time.Second)
	}
	time.Sleep(500 * time.Millisecond)
	var acked []string
	for _, s := range senders {
		acked = append(acked, s.end()...)
	}
	if moved, err := c.nodes["n3"].BalanceLeaders(ctx); err != nil || moved != 0 {
		t.Errorf("a second BalanceLeaders: %d moved, %v", moved, err)
	}
	checkStoredOnce(t, c, "d", parts, acked)
	t.Logf("%d acked", len(acked))
}

// TestCluster_BalanceLeadersEndsWhenAFollowerIsCutOff: BalanceLeaders,
// called without a deadline, returns, naming the pairs it could not move,
// when the follower of a pair it plans to swap is up but cut off from its
// leader (which waits for the follower's confirmation, bounded as a Raft3
// transfer is).
func TestCluster_BalanceLeadersEndsWhenAFollowerIsCutOff(t *testing.T) {
	parallelByDefault(t)
	const parts = 6
	c := newCluster(t, 3, withDoubleWrite(parts, mq.Options{PartitionsPerPair: 1}))
	meta := metaLeader(t, c, 20*time.Second)
	others := othersThan(c, meta)
	lead, cutoff := others[0], others[1]
	for i := range parts {
		c.waitInSync(i, 30*time.Second)
	}
	ctx := testCtx(t)
	// lead leads every pair it holds, cutoff none.
	want := func(replicas []string) string {
		if slices.Contains(replicas, lead) {
			return lead
		}
		return meta
	}
	for i := range parts {
		leader, replicas, _, _ := mq.PairRecord(c.nodes[meta], "d", i)
		if w := want(replicas); leader != w {
			if err := mq.PairHandOver(ctx, c.nodes[leader], "d", i, w); err != nil {
				t.Fatalf("hand d/%d to %s: %v", i, w, err)
			}
		}
	}
	waitFor(t, 30*time.Second, lead+" leads every pair it holds, "+cutoff+" none, each in sync", func() bool {
		for i := range parts {
			leader, replicas, inSync, _ := mq.PairRecord(c.nodes[meta], "d", i)
			if leader != want(replicas) || len(inSync) != 2 {
				return false
			}
		}
		return true
	})
	shared := 0
	for i := range parts {
		if _, replicas, _, _ := mq.PairRecord(c.nodes[meta], "d", i); slices.Contains(replicas, cutoff) && slices.Contains(replicas, lead) {
			shared++
		}
	}
	if shared == 0 {
		t.Fatalf("no pair of %s and %s: placement spreads six pairs over three nodes", lead, cutoff)
	}
	// The link between the leader and one follower breaks; both stay up
	// (their sessions go through the metadata leader).
	c.cut(lead, cutoff, true)
	defer c.cut(lead, cutoff, false)
	time.Sleep(2 * time.Second)
	for i := range parts {
		leader, replicas, inSync, _ := mq.PairRecord(c.nodes[meta], "d", i)
		t.Logf("d/%d: leader %s, replicas %q, in sync %q", i, leader, replicas, inSync)
	}
	type result struct {
		moved int
		err   error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		moved, err := c.nodes[meta].BalanceLeaders(context.Background())
		done <- result{moved, err}
	}()
	select {
	case r := <-done:
		t.Logf("BalanceLeaders returned after %v: %d moved, %v", time.Since(start), r.moved, r.err)
		if r.err == nil || !strings.Contains(r.err.Error(), "to "+cutoff) {
			t.Errorf("BalanceLeaders: %d moved, %v; want an error naming a pair it could not hand to %s", r.moved, r.err, cutoff)
		}
	case <-time.After(30 * time.Second):
		c.cut(lead, cutoff, false) // let it end
		r := <-done
		t.Fatalf("BalanceLeaders(context.Background()) hung for 30 s: a swap of a pair led by %s to its follower %s, up but cut off from it, "+
			"returned only once the link healed, after %v: %d moved, %v",
			lead, cutoff, time.Since(start).Round(time.Second), r.moved, fmt.Sprint(r.err))
	}
}

// TestDoubleWrite_SwapsUnderLoadKeepEveryAck: producers on every node send
// batches to a pair of two partitions while its leader and follower swap
// over and over (PairHandOver as soon as the last swap is recorded):
// every ack is stored once at its offset, in order per producer.
func TestDoubleWrite_SwapsUnderLoadKeepEveryAck(t *testing.T) {
	parallelByDefault(t)
	for _, alone := range []bool{false, true} {
		t.Run(fmt.Sprintf("AckAlone-%t", alone), func(t *testing.T) {
			parallelByDefault(t)
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
				to := replicas[0]
				if to == leader {
					to = replicas[1]
				}
				err := mq.PairHandOver(ctx, c.nodes[leader], "d", 0, to)
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

// TestCluster_BalanceNeedsAdmin: a node whose identity lacks the Admin
// right on "*" can balance neither leaders nor replicas, also when there
// is nothing to move; a standalone MQ or a closed one says why at once, as
// AcceptDataLoss does.
func TestCluster_BalanceNeedsAdmin(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx := testCtx(t)
	admin := []mq.ACLRule{{Identity: "n1", Topic: "*", Rights: mq.Admin}, {Identity: "*", Topic: "*", Rights: mq.Produce | mq.Consume}}
	if err := c.nodes["n1"].SetACL(ctx, admin); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the ACL on n2", func() bool {
		_, err := c.nodes["n2"].BalanceLeaders(ctx)
		return errors.Is(err, mq.ErrDenied)
	})
	standalone, err := mq.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	closed, err := mq.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer standalone.Close()
	closed.Close()
	calls := map[string]func(m *mq.MQ) error{
		"BalanceLeaders":  func(m *mq.MQ) error { _, err := m.BalanceLeaders(ctx); return err },
		"BalanceReplicas": func(m *mq.MQ) error { _, err := m.BalanceReplicas(ctx, 0); return err },
		"AcceptDataLoss":  func(m *mq.MQ) error { return m.AcceptDataLoss(ctx, "d", 0, "n1") },
	}
	for _, tc := range []struct {
		who  string
		m    *mq.MQ
		want error // nil: allowed
	}{
		{"n2, no admin", c.nodes["n2"], mq.ErrDenied},
		{"n1, an admin", c.nodes["n1"], nil},
		{"standalone", standalone, mq.ErrUnsupportedType},
		{"closed", closed, mq.ErrClosed},
	} {
		for name, call := range calls {
			err := call(tc.m)
			if name == "AcceptDataLoss" && tc.want == nil {
				if !errors.Is(err, mq.ErrNoTopic) { // n1 may: "d" does not exist
					t.Errorf("%s by %s: %v, want ErrNoTopic", name, tc.who, err)
				}
				continue
			}
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("%s by %s: %v, want %v", name, tc.who, err, tc.want)
			}
		}
	}
}

// TestCluster_AddNodeAndBalanceUnderLoad: a fourth node joins a cluster
// of three holding three Raft3 groups and nine Single partitions while
// senders send to both topics. BalanceReplicas moves groups and a Single
// partition to it until a call starts none (Raft3 groups first, whose
// moves cost no wait), and BalanceLeaders gives it a leadership; every
// acked message is stored once, at the offset of its ack, each key and
// each Single partition in send order.
func TestCluster_AddNodeAndBalanceUnderLoad(t *testing.T) {
	parallelByDefault(t)
	const parts, singles = 3, 9
	var logs nodeLogs
	c := newCluster(t, 3, withNodeOptions(logs.opts))
	defer func() {
		if t.Failed() {
			for id, m := range c.nodes {
				for i := range parts {
					lost, voters := mq.Raft3Membership(m, r3, i)
					leader, _ := mq.Raft3Leader(m, r3, i)
					t.Logf("%s: r/%d lost %q, voters %q, leader %q", id, i, lost, voters, leader)
				}
			}
			for _, l := range logs.matching("aft3") {
				t.Log(l)
			}
		}
	}()
	createR3With(t, c, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 1})
	c.createTopic("s", singles, mq.Options{})
	ctx := testCtx(t)
	l := newLedger()
	stop := l.sendFrom(ctx, t, c, parts, "n1", "n2", "n3")
	n2 := c.nodes["n2"]
	single := startSender(t, func() *mq.MQ { return n2 }, "s", singles, "s")
	waitFor(t, 30*time.Second, "sends acked", l.atLeast(10, "n1", "n2", "n3"))

	c.start("n4")
	c.waitUp(4)
	for round := 1; ; round++ {
		started, err := c.nodes["n2"].BalanceReplicas(ctx, 0)
		if err != nil {
			t.Fatalf("round %d: %d started, %v", round, started, err)
		}
		t.Logf("round %d: %d moves started", round, started)
		if started == 0 {
			break
		}
		if round == 3 {
			t.Fatal("still moving after three rounds")
		}
		waitFor(t, 60*time.Second, "the moves done", func() bool {
			for i := range parts {
				// Through the nodes placed in the group: one moved away
				// closes its replica once it left.
				_, placed, _, _ := mq.PairRecord(c.nodes["n1"], r3, i)
				placed = slices.Sorted(slices.Values(placed))
				for _, id := range placed {
					if lost, voters := mq.Raft3Membership(c.nodes[id], r3, i); len(lost) > 0 || !slices.Equal(voters, placed) {
						return false
					}
				}
			}
			for i := range singles {
				if owner, to := singleOwner(c.nodes["n1"], "s", i); owner == "" || to != "" {
					return false
				}
			}
			return true
		})
	}
	var holds []string
	for _, nd := range c.nodes["n1"].ClusterStatus().Nodes {
		if nd.ID == "n4" {
			holds = nd.Holds
		}
	}
	if len(holds) != 4 || !slices.ContainsFunc(holds, func(h string) bool { return strings.HasPrefix(h, "s/") }) {
		t.Fatalf("n4 holds %v after the balance, not 3 Raft3 groups and a Single partition", holds)
	}
	// A replica moved away that led hands its leadership to any placed
	// one as it leaves, which may come after a balance: the operator's
	// call again.
	for attempt := 1; ; attempt++ {
		if _, err := c.nodes["n2"].BalanceLeaders(ctx); err != nil {
			t.Fatal(err)
		}
		uneven := leaderSpread(t, c, parts)
		if uneven == "" {
			break
		}
		if attempt == 3 {
			t.Fatalf("after three balances: %s", uneven)
		}
		t.Logf("balance %d: %s", attempt, uneven)
		for _, l := range logs.matching("leadership") {
			t.Log(l)
		}
	}
	before := l.total()
	waitFor(t, 30*time.Second, "sends acked after the moves", func() bool { return l.total() >= before+30 })
	stop()
	acked := single.end()
	for _, id := range othersThan(c) {
		l.check(t, c.nodes[id], parts)
		checkSingleSends(ctx, t, c.nodes[id], "s", singles, acked)
	}
	t.Logf("n4 holds %v; %d Raft3 and %d Single sends acked", holds, l.total(), len(acked))
}

// checkSingleSends fails t unless every ID of acked (tag-k, sent to
// partition k%parts in order by one sender) is stored once in topic, read
// through m, each partition's in send order.
func checkSingleSends(ctx context.Context, t *testing.T, m *mq.MQ, topic string, parts int, acked []string) {
	t.Helper()
	seen := readAll(ctx, t, m, topic, parts)
	byPart := make([][]string, parts)
	for k, id := range acked {
		if seen[id] != 1 {
			t.Errorf("acked %s stored %d times", id, seen[id])
		}
		byPart[k%parts] = append(byPart[k%parts], id)
	}
	for i, want := range byPart {
		checkOrder(ctx, t, m, topic, i, want)
	}
}

// leaderSpread waits until every group of r3 (one partition each) has a
// leader, and returns "" if none leads two more of them than another
// voter of its group, as the nodes' ClusterStatus show them, or what is
// uneven.
func leaderSpread(t *testing.T, c *testCluster, parts int) string {
	t.Helper()
	var count map[string]int
	var leader map[string]string
	waitFor(t, 30*time.Second, "a leader of every group", func() bool {
		count, leader = map[string]int{}, map[string]string{}
		for id, m := range c.nodes {
			count[id] += 0
			for _, p := range m.ClusterStatus().Leading {
				if strings.HasPrefix(p, r3+"/") {
					count[id]++
					leader[p] = id
				}
			}
		}
		return len(leader) == parts
	})
	var uneven []string
	for i := range parts {
		p := fmt.Sprintf("%s/%d", r3, i)
		l := leader[p]
		_, voters := mq.Raft3Membership(c.nodes[l], r3, i)
		for _, v := range voters {
			if count[l]-count[v] >= 2 {
				uneven = append(uneven, fmt.Sprintf("%s's leader %s leads %d groups, its voter %s %d", p, l, count[l], v, count[v]))
			}
		}
	}
	if len(uneven) > 0 {
		return fmt.Sprintf("%s (leaders %v)", strings.Join(uneven, "; "), leader)
	}
	return ""
}
