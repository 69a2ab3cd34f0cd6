package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// Raft3 partitions that share a raft group
// (Options.PartitionsPerRaftGroup): load on every partition of a group
// while its leader's node closes or is killed, topics grown while a node
// is down, a node restarted from its state cache without a quorum, four
// nodes, transactions across groups, a node closed while its groups open,
// one damaged partition file of a group, the limits.

// TestRaft3Group_SharedLeaderClosedTwice: eight partitions in one
// raft group (the default), nine senders (three per node) on all of them
// and a consumer group on every node; the group's leader is closed, then
// reopened, then the new leader is closed and reopened, all under load.
// Every ack is stored once, at its acked place, each key in order;
// every acked message is delivered, each partition without a gap. The
// default run closes one leader; ZEZE_FULL=1 both.
func TestRaft3Group_SharedLeaderClosedTwice(t *testing.T) {
	parallelByDefault(t)
	const parts = 8
	c := newCluster(t, 3, withRaft3(parts))
	ctx := testCtx(t)
	sameGroupLeaders(t, c, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}})
	o := newOrderly()
	o.consume(t, c, othersThan(c)...)
	l := newLedger()
	var stops []func()
	stops = append(stops, senders(ctx, t, l, c, parts, 3, "", othersThan(c)...))
	waitFor(t, 20*time.Second, "acks before the first close", func() bool { return l.total() >= 60 })
	for round := range sized(1, 2) { // the second close with ZEZE_FULL=1 only
		lead := leaderOf(t, c, round*5%parts)
		bounded(t, 20*time.Second, "Close of the shared group's leader under load", func() { c.kill(lead) })
		n := l.total()
		waitFor(t, 20*time.Second, "acks with the leader closed", func() bool { return l.total() >= n+60 })
		c.start(lead)
		waitReadable(t, c.nodes[lead], parts)
		sameGroupLeaders(t, c, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}})
		// The reopened node sends too (names of its own: a second round's
		// senders must not reuse the first's IDs).
		stops = append(stops, senders(ctx, t, l, c, parts, 1, strconv.Itoa(round), lead))
		n = l.total()
		waitFor(t, 20*time.Second, "acks after the reopen", func() bool { return l.total() >= n+60 })
	}
	for _, s := range stops {
		s()
	}
	t.Logf("%d acks", l.total())
	for _, id := range othersThan(c) {
		l.check(t, c.nodes[id], parts)
	}
	o.waitAll(t, l)
}

// TestRaft3Group_GrowOddWhileNodeDown: a Raft3 topic of 3
// partitions, 2 per group ({0,1}, {2}), grown three times (to 6, 7 and
// 10: groups {3,4}, {5}, {6}, {7,8}, {9}) while n3 is closed (still up in
// the metadata). n3 reopened opens a replica of each new group with its
// partition count (raft.db records it) in the directory of its first
// partition, and serves in the quorum with n1 closed: every ack read back
// at its place through n3 and n2.
func TestRaft3Group_GrowOddWhileNodeDown(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withSession(time.Minute), withTopic(r3, 3, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 2}))
	ctx := testCtx(t)
	l := newLedger()
	sendN(t, l, c.nodes["n1"], "a", 12, 3)
	c.kill("n3")
	for k, n := range []int{6, 7, 10} {
		via := []string{"n1", "n2", "n1"}[k]
		if err := c.nodes[via].AlterMQ(ctx, r3, n); err != nil {
			t.Fatalf("AlterMQ to %d with n3 closed: %v", n, err)
		}
	}
	const parts = 10
	groups := [][]int{{0, 1}, {2}, {3, 4}, {5}, {6}, {7, 8}, {9}}
	sendN(t, l, c.nodes["n2"], "b", 40, parts)
	back := c.start("n3")
	waitFor(t, 20*time.Second, "the grown topic on n3", func() bool { return back.Topics()[r3] == parts })
	for i := range parts {
		if _, holds := mq.Raft3Leader(back, r3, i); !holds {
			t.Errorf("n3 holds no replica of %s/%d", r3, i)
		}
	}
	sameGroupLeaders(t, c, groups)
	for _, g := range groups {
		dir := filepath.Join(c.root, "n3", "raft3", r3, strconv.Itoa(g[0]))
		want := []string{"partition.db"}
		for k := 1; k < len(g); k++ {
			want = append(want, fmt.Sprintf("partition-%d.db", k))
		}
		for _, f := range want {
			if !fileExists(filepath.Join(dir, f)) {
				t.Errorf("n3: no %s in the directory of group %v", f, g)
			}
		}
		if len(g) == 1 && fileExists(filepath.Join(dir, "partition-1.db")) {
			t.Errorf("n3: a partition-1.db in the directory of the one-partition group %v", g)
		}
		for _, i := range g[1:] {
			if fileExists(filepath.Join(c.root, "n3", "raft3", r3, strconv.Itoa(i))) {
				t.Errorf("n3: a directory of its own for %s/%d, which shares group %v", r3, i, g)
			}
		}
	}
	c.kill("n1")
	sendN(t, l, back, "c", 30, parts)
	l.check(t, back, parts)
	l.check(t, c.nodes["n2"], parts)
}

// TestRaft3Group_RestartFromStateCache: a topic of 5 partitions, 2
// per group, grown to 8 (groups {0,1}, {2,3}, {4}, {5,6}, {7}); every
// node closed; n3 reopened alone (no metadata quorum) takes its table
// from its state cache (an encoded snapshot of version 2, with the
// groups): every partition, each with its replica attached. With n1 back
// the groups have a quorum: every ack read back through both, and new
// sends to every partition acked.
func TestRaft3Group_RestartFromStateCache(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	createR3With(t, c, 5, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 2})
	ctx := testCtx(t)
	if err := alterAgain(ctx, c.nodes["n2"], r3, 8); err != nil {
		t.Fatal(err)
	}
	const parts = 8
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "8 partitions on "+id, func() bool { return m.Topics()[r3] == parts })
	}
	groups := [][]int{{0, 1}, {2, 3}, {4}, {5, 6}, {7}}
	sameGroupLeaders(t, c, groups)
	l := newLedger()
	sendN(t, l, c.nodes["n1"], "a", 32, parts)
	time.Sleep(500 * time.Millisecond) // the cache is saved within 100 ms of a change
	for _, id := range []string{"n1", "n2", "n3"} {
		c.kill(id)
	}
	m3 := c.start("n3")
	if got := m3.Topics()[r3]; got != parts {
		t.Fatalf("n3 reopened without a quorum: Topics()[%s] = %d, want %d from its state cache", r3, got, parts)
	}
	for i := range parts {
		if _, holds := mq.Raft3Leader(m3, r3, i); !holds {
			t.Errorf("n3 reopened from its cache holds no replica of %s/%d", r3, i)
		}
	}
	m1 := c.start("n1")
	sameGroupLeaders(t, c, groups)
	waitReadable(t, m3, parts)
	l.check(t, m3, parts)
	sendN(t, l, m3, "b", 16, parts)
	l.check(t, m1, parts)
}

// TestRaft3Group_FourNodes: on four nodes, 12 partitions 3 per
// group: each group on three nodes (the same for its partitions), one
// leader each, and the groups spread (each node holds 9 replicas). Every
// node sends while the leader of group 0 is closed: every ack stored once
// at its place, each key in order, as every node reads it.
func TestRaft3Group_FourNodes(t *testing.T) {
	parallelByDefault(t)
	const parts = 12
	c := newCluster(t, 4)
	createR3With(t, c, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 3})
	ctx := testCtx(t)
	groups := [][]int{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}}
	r3Leaders(t, c, parts)
	sameGroupLeaders(t, c, groups)
	load := map[string]int{}
	for _, g := range groups {
		h := holders(c, g[0])
		if len(h) != 3 {
			t.Errorf("group %v on %v, want three nodes", g, h)
		}
		for _, i := range g {
			if hi := holders(c, i); !slices.Equal(hi, h) {
				t.Errorf("%s/%d on %v, its group's first on %v", r3, i, hi, h)
			}
		}
		for _, id := range h {
			load[id] += len(g)
		}
	}
	for _, id := range othersThan(c) {
		if load[id] != 9 {
			t.Errorf("placement: %s holds %d replicas (%v), want 9 each", id, load[id], load)
		}
	}
	l := newLedger()
	stop := senders(ctx, t, l, c, parts, 1, "", othersThan(c)...)
	waitFor(t, 20*time.Second, "acks before the close", func() bool { return l.total() >= 60 })
	lead := leaderOf(t, c, 0)
	bounded(t, 20*time.Second, "Close of group 0's leader", func() { c.kill(lead) })
	n := l.total()
	waitFor(t, 20*time.Second, "acks after the close", func() bool { return l.total() >= n+60 })
	stop()
	for _, id := range othersThan(c) {
		l.check(t, c.nodes[id], parts)
	}
}

// TestRaft3Group_TxAcrossGroups: transactions whose half messages
// are in four partitions of two groups ({0,1}, {2,3}). A committed one
// whose second group's leader is closed between prepare and commit is
// delivered, each message once; a rolled-back one never; an uncommitted
// one is never visible to a consumer while it waits.
func TestRaft3Group_TxAcrossGroups(t *testing.T) {
	parallelByDefault(t)
	host := txtest.Open(t, "bolt", filepath.Join(t.TempDir(), "host"))
	const parts = 4
	c := newCluster(t, 3, withNodeOptions(func(id string) []mq.Option {
		opts := []mq.Option{mq.WithTxCheckAfter(time.Hour)}
		if id == "n1" {
			opts = append(opts, mq.WithLocalTx(host.Store))
		}
		return opts
	}))
	createR3With(t, c, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 2})
	ctx := testCtx(t)
	sameGroupLeaders(t, c, [][]int{{0, 1}, {2, 3}})
	spread := func(prefix string) []*mq.Message {
		out := msgs(prefix, parts)
		for i, m := range out {
			m.ToPartition(i)
		}
		return out
	}
	// n1 prepares: the leader of group {2,3} must be another node, to be
	// closed under the transaction.
	for range 10 {
		if leaderOf(t, c, 2) != "n1" {
			break
		}
		c.kill("n1")
		c.start("n1")
		sameGroupLeaders(t, c, [][]int{{0, 1}, {2, 3}})
	}
	lead2 := leaderOf(t, c, 2)
	if lead2 == "n1" {
		t.Fatal("n1 leads group {2,3} still after ten reopens")
	}
	p, err := c.nodes["n1"].NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	on := othersThan(c, "n1", lead2)[0]
	col := &collector{}
	cons, err := c.nodes[on].NewConsumer(r3, "g", col)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()

	// A transaction prepared whose hooks never run (its process "died"),
	// not checked back within the test: undecided, never visible.
	if err := host.Run(ctx, func(ctx context.Context) error {
		real, _ := localtx.FromContext(ctx)
		return prepareAgain(localtx.WithTx(ctx, &fakeTx{id: real.ID()}), p, spread("held")...)
	}); err != nil {
		t.Fatal(err)
	}

	killed := lead2
	err = host.Run(ctx, func(ctx context.Context) error {
		if err := prepareAgain(ctx, p, spread("kp")...); err != nil {
			return err
		}
		c.kill(killed)
		return nil
	})
	if err != nil {
		t.Fatalf("a transaction across two groups, one's leader closed before its commit: %v", err)
	}
	waitSeen(t, col, "kp-0", "kp-1", "kp-2", "kp-3")
	for _, id := range []string{"held-0", "held-1", "held-2", "held-3"} {
		if n := col.count(id); n != 0 {
			t.Errorf("%s of a transaction not committed delivered %d times", id, n)
		}
	}
	c.start(killed)
	if err := host.Run(ctx, func(ctx context.Context) error {
		return prepareAgain(ctx, p, spread("ok")...)
	}); err != nil {
		t.Fatal(err)
	}
	if err := host.Run(ctx, func(ctx context.Context) error {
		if err := prepareAgain(ctx, p, spread("rb")...); err != nil {
			return err
		}
		return errAbort
	}); !errors.Is(err, errAbort) {
		t.Fatalf("rolled back: %v", err)
	}
	waitSeen(t, col, "ok-0", "ok-1", "ok-2", "ok-3")
	fence(t, c.nodes[on], col, r3)
	for _, prefix := range []string{"kp", "ok"} {
		for i := range parts {
			id := fmt.Sprintf("%s-%d", prefix, i)
			if n := col.count(id); n != 1 {
				t.Errorf("%s delivered %d times, want once", id, n)
			}
			if m := col.byID(id); m != nil && m.PartitionIndex != i {
				t.Errorf("%s delivered from partition %d, sent to %d", id, m.PartitionIndex, i)
			}
		}
	}
	for _, prefix := range []string{"held", "rb"} {
		for i := range parts {
			if id := fmt.Sprintf("%s-%d", prefix, i); col.count(id) != 0 {
				t.Errorf("%s of a transaction not committed delivered %d times", id, col.count(id))
			}
		}
	}
}

// TestRaft3Group_CloseWhileGroupsOpen: n3 closed and reopened while
// its four shared groups (32 partitions) open, closed at once after its
// Open, and closed while another node creates a topic of 32 partitions
// more (n3's sync opening its groups): every Close returns promptly
// (goleak checks what is left at the end); n3 reopened serves in the
// quorum with n1 closed, every ack read back.
func TestRaft3Group_CloseWhileGroupsOpen(t *testing.T) {
	parallelByDefault(t)
	const parts = 32
	c := newCluster(t, 3)
	createR3With(t, c, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 8})
	ctx := testCtx(t)
	l := newLedger()
	sendN(t, l, c.nodes["n1"], "a", parts, parts)
	c.kill("n3")
	for round := range 3 {
		c.start("n3")
		time.Sleep(time.Duration(round) * 40 * time.Millisecond)
		bounded(t, 20*time.Second, "Close of n3 just after its Open", func() { c.kill("n3") })
	}
	c.start("n3")
	// CreateMQ places on the nodes the metadata sees up: until n3's new
	// session is seen, Raft3 has two live nodes and ErrNoQuorum is right.
	c.waitUp(3)
	created := make(chan error, 1)
	go func() {
		created <- c.nodes["n1"].CreateMQ(ctx, "r2", parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 8})
	}()
	// n3 closes once its copy of the metadata places r2, so the placement
	// counted it and its sync is opening the new groups. Closed before
	// that, the placement sees two live nodes, and ErrNoQuorum is right.
	waitFor(t, 20*time.Second, "r2 placed in n3's metadata", func() bool {
		select {
		case err := <-created:
			if err != nil {
				t.Fatalf("CreateMQ with n3 up: %v", err)
			}
			created <- nil
		default:
		}
		return mq.PartitionNode(c.nodes["n3"], "r2", 0) != ""
	})
	bounded(t, 20*time.Second, "Close of n3 while a topic is created", func() { c.kill("n3") })
	if err := <-created; err != nil {
		t.Fatalf("CreateMQ with n3 closing: %v", err)
	}
	back := c.start("n3")
	waitFor(t, 20*time.Second, "r2 on n3", func() bool { return back.Topics()["r2"] == parts })
	waitReadable(t, back, parts)
	c.kill("n1")
	sendN(t, l, back, "b", parts, parts)
	l.check(t, back, parts)
	l.check(t, c.nodes["n2"], parts)
	p, err := back.NewProducer("r2")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range parts {
		if _, err := sendAgain(ctx, p, (&mq.Message{ID: fmt.Sprintf("x-%d", i)}).ToPartition(i)); err != nil {
			t.Fatalf("send to r2/%d with n1 closed: %v", i, err)
		}
	}
}

// TestRaft3Group_DamagedOneSharer: one partition's file (of eight
// in one group) damaged on n3 while it is down (the records of partition
// 5 fail their CRC; the other seven files intact): n3 opens or fails
// clearly, the two others serve every partition, and with n3 in the
// quorum every ack is read back unchanged at its place.
func TestRaft3Group_DamagedOneSharer(t *testing.T) {
	parallelByDefault(t)
	const parts = 8
	damagedReplica(t, parts, func(c *testCluster) {
		var ids []string
		for j := range 60 {
			if j%parts == 5 {
				ids = append(ids, fmt.Sprintf("a-%d", j))
			}
		}
		if n := flipMarkers(t, partitionFile(c, "n3", 5), ids...); n == 0 {
			t.Fatal("no record of n3's partition-5.db found to damage")
		}
	})
}

// TestRaft3Group_Limits: PartitionsPerRaftGroup on a standalone
// node and out of range is a clear error; on a cluster, 1024 partitions
// in groups of 64 (16 groups) take a send to every partition and read it
// back through a node, and AlterMQ past MaxPartitions is refused.
func TestRaft3Group_Limits(t *testing.T) {
	parallelByDefault(t)
	t.Run("Standalone", func(t *testing.T) {
		m := openNode(t, "")
		ctx := testCtx(t)
		for _, tc := range []struct {
			opts mq.Options
			want []error
		}{
			{mq.Options{Type: mq.Single, PartitionsPerRaftGroup: 1}, []error{mq.ErrInvalidOption}},
			{mq.Options{PartitionsPerRaftGroup: -5}, []error{mq.ErrInvalidOption}},
			{mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 65}, []error{mq.ErrInvalidOption, mq.ErrUnsupportedType}},
			{mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 1}, []error{mq.ErrUnsupportedType}},
			{mq.Options{Type: mq.DoubleWrite, PartitionsPerRaftGroup: 2}, []error{mq.ErrInvalidOption, mq.ErrUnsupportedType}},
		} {
			err := m.CreateMQ(ctx, "t", 2, tc.opts)
			ok := false
			for _, w := range tc.want {
				ok = ok || errors.Is(err, w)
			}
			if !ok {
				t.Errorf("CreateMQ %+v on a standalone node: %v, want one of %v", tc.opts, err, tc.want)
			}
		}
		if len(m.Topics()) != 0 {
			t.Errorf("refused CreateMQs made topics: %v", m.Topics())
		}
	})
	t.Run("MaxPartitions", func(t *testing.T) {
		// Four groups of the most partitions a group takes (1024
		// partitions, MaxPartitions, with ZEZE_RAFT_SOAK=1: a minute
		// under -race).
		parts := 4 * mq.MaxPartitionsPerRaftGroup
		if os.Getenv("ZEZE_RAFT_SOAK") == "1" {
			parts = mq.MaxPartitions
		}
		c := newCluster(t, 3)
		ctx := testCtx(t)
		start := time.Now()
		if err := c.nodes["n1"].CreateMQ(ctx, r3, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: mq.MaxPartitionsPerRaftGroup}); err != nil {
			t.Fatal(err)
		}
		for id, m := range c.nodes {
			waitFor(t, 30*time.Second, "the topic on "+id, func() bool { return m.Topics()[r3] == parts })
		}
		t.Logf("created in %v", time.Since(start))
		// Idle, the three nodes' 48 replicas and 3072 partitions cost
		// this much CPU (logged: the race detector multiplies it, and a
		// starved node's groups churn through elections).
		var before, after syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &before)
		time.Sleep(2 * time.Second)
		syscall.Getrusage(syscall.RUSAGE_SELF, &after)
		cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) / 2
		t.Logf("idle CPU: %v per second of wall time", cpu)
		stable := func() bool {
			for i := 0; i < parts; i += mq.MaxPartitionsPerRaftGroup {
				lead := ""
				for _, m := range c.nodes {
					l, _ := mq.Raft3Leader(m, r3, i)
					if l == "" || lead != "" && l != lead {
						return false
					}
					lead = l
				}
			}
			return true
		}
		deadline := time.Now().Add(40 * time.Second)
		for !stable() {
			if time.Now().After(deadline) {
				t.Fatalf("no leader agreed on for every group within 40 s (idle CPU %v per second)", cpu)
			}
			time.Sleep(100 * time.Millisecond)
		}
		l := newLedger()
		// The first, a middle and the last partition of each group, and
		// every partition of the last group.
		p, err := c.nodes["n2"].NewProducer(r3)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var to []int
		for i := range parts {
			if k := i % mq.MaxPartitionsPerRaftGroup; k == 0 || k == 37 || k == mq.MaxPartitionsPerRaftGroup-1 || i >= parts-mq.MaxPartitionsPerRaftGroup {
				to = append(to, i)
			}
		}
		for _, i := range to {
			msg := (&mq.Message{ID: fmt.Sprintf("a-%d", i), Key: strconv.Itoa(i)}).ToPartition(i)
			if err := l.sendOne(ctx, p, "a", msg); err != nil {
				t.Fatalf("send to %s/%d: %v", r3, i, err)
			}
		}
		t.Logf("sent %d in %v", len(to), time.Since(start))
		l.check(t, c.nodes["n3"], parts)
		if err := c.nodes["n1"].AlterMQ(ctx, r3, mq.MaxPartitions+1); !errors.Is(err, mq.ErrInvalidPartition) {
			t.Errorf("AlterMQ past MaxPartitions: %v", err)
		}
		t.Logf("done in %v", time.Since(start))
	})
}

// TestRaft3Group_LeaderKilledMidLoad: n3, in a child process,
// leads one raft group of eight partitions while six senders on n1 and n2
// send to all of them through it; it is killed (SIGKILL), its files and
// WAL left as they were. The two others hold every ack. n3 reopened on
// its directory replays its group into its eight partition files (each
// materialized to its own point) and serves in the quorum with n1, then
// n2, closed: every ack read back unchanged at its place.
func TestRaft3Group_LeaderKilledMidLoad(t *testing.T) {
	parallelByDefault(t)
	const parts = 8
	c := newCluster(t, 2)
	ch := startNodeChild(t, c, "n3", parts)
	ch.expect(30*time.Second, "OPENED")
	c.waitUp(3)
	createR3(t, c, parts)
	ctx := testCtx(t)
	leaderSeen := func() string {
		var l string
		waitFor(t, 20*time.Second, "a leader of the group seen by n1 and n2", func() bool {
			a, _ := mq.Raft3Leader(c.nodes["n1"], r3, 0)
			b, _ := mq.Raft3Leader(c.nodes["n2"], r3, 7)
			l = a
			return a != "" && a == b
		})
		return l
	}
	for range 12 {
		lead := leaderSeen()
		if lead == "n3" {
			break
		}
		c.kill(lead) // hands its leadership over: to n3 at times
		c.start(lead)
	}
	if lead := leaderSeen(); lead != "n3" {
		t.Fatalf("n3 never led the group in 12 hand-offs (%s does)", lead)
	}
	l := newLedger()
	stop := senders(ctx, t, l, c, parts, 3, "", "n1", "n2")
	waitFor(t, 20*time.Second, "acks through n3", func() bool { return l.total() >= 150 })
	ch.kill()
	n := l.total()
	waitFor(t, 20*time.Second, "acks after n3's kill", func() bool { return l.total() >= n+150 })
	stop()
	t.Logf("%d acks, %d before the kill", l.total(), n)
	l.check(t, c.nodes["n1"], parts)
	l.check(t, c.nodes["n2"], parts)
	if t.Failed() {
		return
	}
	c.start("n3")
	waitReadable(t, c.nodes["n3"], parts)
	time.Sleep(time.Second) // n3 catches up
	needN3(t, c, parts, func(what string, m *mq.MQ) {
		l.check(t, m, parts)
		sendN(t, l, m, fmt.Sprintf("c%d", l.total()), 16, parts)
	})
	l.check(t, c.nodes["n3"], parts)
}

// TestRaft3Group_DelayedAcrossSharers: delayed messages to each of
// eight partitions of one group, due around the close of the group's
// leader: the new leader's upkeep of each partition releases that
// partition's own, each once, in its own partition, never early.
func TestRaft3Group_DelayedAcrossSharers(t *testing.T) {
	parallelByDefault(t)
	const parts = 8
	c := newCluster(t, 3, withRaft3(parts))
	lead, others := leaderAndOthers(t, c)
	sameGroupLeaders(t, c, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}})
	delayedAcrossFailover(t, c, lead, others, parts)
}

// TestRaft3Group_RacingCreateAndAlter: three nodes create the same
// topic at once, each with another PartitionsPerRaftGroup (1, 3, 8): one
// wins, the others get ErrTopicExists, and every node lays the topic out
// as the winner's (the partitions of each group on one leader, one
// directory per group). Then the three grow it at once to other sizes
// while sends run: the topic ends at the largest, every group with one
// leader, every ack read back at its place.
func TestRaft3Group_RacingCreateAndAlter(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx := testCtx(t)
	sizes := map[string]int{"n1": 1, "n2": 3, "n3": 8}
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, m := range c.nodes {
		wg.Go(func() {
			err := m.CreateMQ(ctx, r3, 8, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: sizes[id]})
			mu.Lock()
			errs[id] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	winner := ""
	for id, err := range errs {
		switch {
		case err == nil && winner == "":
			winner = id
		case err == nil:
			t.Errorf("CreateMQ succeeded on %s and %s", winner, id)
		case !errors.Is(err, mq.ErrTopicExists):
			t.Errorf("CreateMQ on %s: %v, want nil or ErrTopicExists", id, err)
		}
	}
	if winner == "" {
		t.Fatalf("no CreateMQ succeeded: %v", errs)
	}
	size := sizes[winner]
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()[r3] == 8 })
	}
	var groups [][]int
	for first := 0; first < 8; first += size {
		var g []int
		for i := first; i < min(first+size, 8); i++ {
			g = append(g, i)
		}
		groups = append(groups, g)
	}
	sameGroupLeaders(t, c, groups)
	for id := range c.nodes {
		for i := range 8 {
			_, isFirst := slices.BinarySearchFunc(groups, i, func(g []int, i int) int { return g[0] - i })
			if got := fileExists(filepath.Join(c.root, id, "raft3", r3, strconv.Itoa(i))); got != isFirst {
				t.Errorf("%s: directory of %s/%d exists %v, want %v (the winner %s's groups of %d)", id, r3, i, got, isFirst, winner, size)
			}
		}
	}

	l := newLedger()
	stop := senders(ctx, t, l, c, 8, 1, "", othersThan(c)...)
	waitFor(t, 20*time.Second, "acks before the alters", func() bool { return l.total() >= 30 })
	targets := map[string]int{"n1": 9, "n2": 13, "n3": 11}
	for id, m := range c.nodes {
		wg.Go(func() {
			if err := m.AlterMQ(ctx, r3, targets[id]); err != nil && !errors.Is(err, mq.ErrPartitionDecrease) {
				t.Errorf("AlterMQ to %d on %s: %v", targets[id], id, err)
			}
		})
	}
	wg.Wait()
	n := l.total()
	waitFor(t, 20*time.Second, "acks after the alters", func() bool { return l.total() >= n+30 })
	stop()
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "13 partitions on "+id, func() bool { return m.Topics()[r3] == 13 })
	}
	// Each new partition: one leader shared with the others of its group
	// (not knowable here: which alter came first), on every node alike.
	waitFor(t, 20*time.Second, "the new partitions led", func() bool {
		for i := 8; i < 13; i++ {
			if leaderOf(t, c, i) == "" {
				return false
			}
		}
		return true
	})
	sendN(t, l, c.nodes["n2"], "b", 26, 13)
	for _, id := range othersThan(c) {
		l.check(t, c.nodes[id], 13)
	}
}

// TestRaft3Group_CloseAllWhileBusy: twelve partitions in groups of
// five ({0-4}, {5-9}, {10,11}); every node closed at once while each
// sends to all of them and consumes: every Close and send returns, and
// the cluster reopened holds every ack once at its place.
func TestRaft3Group_CloseAllWhileBusy(t *testing.T) {
	parallelByDefault(t)
	const parts = 12
	c := newCluster(t, 3)
	createR3With(t, c, parts, mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: 5})
	sameGroupLeaders(t, c, [][]int{{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}, {10, 11}})
	ctx := testCtx(t)
	ids := othersThan(c)
	l := newLedger()
	stop := senders(ctx, t, l, c, parts, 2, "", ids...)
	o := newOrderly()
	o.consume(t, c, ids...)
	waitFor(t, 20*time.Second, "acks from every node", func() bool { return l.total() >= 90 })
	bounded(t, 30*time.Second, "Close of every node at once, with the sends", func() {
		var closing sync.WaitGroup
		for _, id := range ids {
			m := c.nodes[id]
			closing.Go(func() { m.Close() })
		}
		closing.Wait()
		stop()
	})
	for _, id := range ids {
		delete(c.nodes, id)
	}
	for _, id := range ids {
		c.start(id)
	}
	c.waitUp(3)
	sameGroupLeaders(t, c, [][]int{{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}, {10, 11}})
	for _, id := range ids {
		l.check(t, c.nodes[id], parts)
	}
}
