package mq_test

// Hostile review of the cluster mode (issue 11). Each test says which
// promise it attacks; those marked FAILS break it (see the report).

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/cluster"
)

// startReview is testCluster.start with session timeout sess.
func (c *testCluster) startReview(id string, sess time.Duration) *mq.MQ {
	c.t.Helper()
	var seeds []string
	if c.seed != "" {
		for other, m := range c.nodes {
			if other != id {
				seeds = append(seeds, m.ClusterStatus().Addr)
			}
		}
	}
	m, err := mq.Open(filepath.Join(c.root, id), mq.WithCluster(mq.ClusterConfig{
		NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Secret: clusterSecret,
		SessionTimeout: sess, ElectionTimeout: 200 * time.Millisecond,
	}))
	if err != nil {
		c.t.Fatalf("open %s: %v", id, err)
	}
	c.nodes[id] = m
	c.t.Cleanup(func() { m.Close() })
	return m
}

// newReviewCluster starts n nodes with session timeout sess.
func newReviewCluster(t *testing.T, n int, sess time.Duration) *testCluster {
	t.Helper()
	c := &testCluster{t: t, root: t.TempDir(), nodes: map[string]*mq.MQ{}}
	c.startReview("n1", sess)
	c.seed = c.nodes["n1"].ClusterStatus().Addr
	for i := 2; i <= n; i++ {
		c.startReview(fmt.Sprintf("n%d", i), sess)
	}
	waitUp(t, c, n)
	return c
}

func waitUp(t *testing.T, c *testCluster, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, "every node up", func() bool {
		for _, m := range c.nodes {
			up := 0
			for _, nd := range m.ClusterStatus().Nodes {
				if nd.Up {
					up++
				}
			}
			if up != n {
				return false
			}
		}
		return true
	})
}

// isolate cuts (or restores) every link of node id, on both ends.
func (c *testCluster) isolate(id string, down bool) {
	for other, m := range c.nodes {
		if other == id {
			continue
		}
		mq.ReviewSetLinkDown(m, id, down)
		if x := c.nodes[id]; x != nil {
			mq.ReviewSetLinkDown(x, other, down)
		}
	}
}

// TestReview_IsolatedHandlerOverlaps attacks promise 3 (TaskOneByOne across
// the cluster: at most one node delivers a partition of a group at a time).
//
// FAILS. A node cut off from the others stops *starting* deliveries when its
// session may have expired (SessionValid), but a handler already running
// keeps running: the worker is only cancelled. The leader marks the node down
// SessionTimeout after its last heartbeat and gives the partition to a
// consumer on another node, which delivers the same partition (the very
// message in flight) while the isolated node's handler still runs.
func TestReview_IsolatedHandlerOverlaps(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	leader := c.nodes["n1"].ClusterStatus().Leader
	// One partition; placement puts it on n1 (fewest replicas, ties by id).
	if err := c.nodes["n1"].CreateMQ(ctx, "one", 1, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	owner := mq.PartitionNode(c.nodes["n1"], "one", 0)
	var x, y string // x: the consumer's node to isolate (neither leader nor partition owner); y: the other
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != leader && id != owner && x == "" {
			x = id
		}
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != x && y == "" {
			y = id
		}
	}
	if x == "" {
		t.Skipf("leader %s and owner %s leave no node to isolate", leader, owner)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["one"] == 1 })
	}
	var inHandler atomic.Int32
	var overlap atomic.Bool
	var mu sync.Mutex
	var log []string
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	handler := func(node string, block bool) mq.Listener {
		return mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
			if n := inHandler.Add(1); n > 1 {
				overlap.Store(true)
			}
			defer inHandler.Add(-1)
			mu.Lock()
			log = append(log, node+":"+msg.ID)
			mu.Unlock()
			select {
			case started <- struct{}{}:
			default:
			}
			if block { // a handler doing slow work that does not watch its ctx
				select {
				case <-release:
				case <-time.After(8 * time.Second):
				}
			}
			return nil
		})
	}
	cx, err := c.nodes[x].NewConsumer("one", "g", handler(x, true))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the partition on "+x, func() bool { return len(cx.Assigned()) == 1 })
	p, err := c.nodes[owner].NewProducer("one")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(ctx, &mq.Message{ID: "m0", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("m0 never delivered on " + x)
	}
	cy, err := c.nodes[y].NewConsumer("one", "g", handler(y, false))
	if err != nil {
		t.Fatal(err)
	}
	// x is cut off mid-handler.
	cut := time.Now()
	c.isolate(x, true)
	defer func() {
		close(release)
		c.isolate(x, false)
	}()
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) && !overlap.Load() {
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if overlap.Load() {
		t.Fatalf("partition one/0 of group g delivered on %s while %s's handler still ran, %v after the cut (deliveries %v, %s assigned %v)",
			y, x, time.Since(cut).Round(time.Millisecond), log, y, cy.Assigned())
	}
	t.Logf("deliveries %v", log)
}

// TestReview_QuickRestartLeavesStaleMember attacks promise 3 (a partition
// of a group is always owned by a live consumer, never unowned forever).
//
// FAILS. A node that dies without proposing LeaveGroup (a crash; here: its
// links cut, then Close) and comes back under the same id before its
// session expired re-registers with the *same* session (registerNode raises
// Session only when the node was down), so its dead members are never
// removed by NodeDown. The coordinator of the restarted node removes only
// members of groups it has local consumers of: with no consumer of the group
// on that node, the stale member keeps its partitions forever and no one
// delivers them.
func TestReview_QuickRestartLeavesStaleMember(t *testing.T) {
	const sess = 4 * time.Second
	c := newReviewCluster(t, 3, sess)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "t", 2, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == 2 })
	}
	col2 := &collector{}
	c2, err := c.nodes["n2"].NewConsumer("t", "g", col2)
	if err != nil {
		t.Fatal(err)
	}
	c3, err := c.nodes["n3"].NewConsumer("t", "g", &collector{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the partitions divided", func() bool {
		return len(c2.Assigned()) == 1 && len(c3.Assigned()) == 1
	})
	// n3 "crashes": no LeaveGroup reaches the leader.
	c.isolate("n3", true)
	c.kill("n3")
	for _, m := range c.nodes {
		mq.ReviewSetLinkDown(m, "n3", false)
	}
	start := time.Now()
	back := c.startReview("n3", sess) // the same id, well within the session
	waitFor(t, 20*time.Second, "n3 back", func() bool { return back.Topics()["t"] == 2 })
	t.Logf("n3 back after %v", time.Since(start))
	p, err := c.nodes["n1"].NewProducer("t")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 2 {
		msg := (&mq.Message{ID: fmt.Sprintf("s-%d", i), Body: []byte("x")}).ToPartition(i)
		if _, err := p.SendMessage(ctx, msg); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, msg.ID)
	}
	// Well past the session timeout: the only live consumer must own both.
	limit := time.Now().Add(4 * sess)
	for time.Now().Before(limit) && len(c2.Assigned()) < 2 {
		time.Sleep(50 * time.Millisecond)
	}
	if len(c2.Assigned()) < 2 {
		g, _ := mq.ReviewGroup(c.nodes["n1"], "t", "g")
		t.Fatalf("after %v the only live consumer (n2) has %v; the group's owners %v, members %v: a dead member keeps a partition",
			4*sess, c2.Assigned(), g.Owners, g.Members)
	}
	waitSeen(t, col2, ids...)
}

// TestReview_JoinGroupSquatsOtherNodesMember attacks promise 5 (identity =
// the node id proven by the handshake: a node cannot act as another).
//
// FAILS (the first check). authorize checks that JoinGroup.Node is the
// caller, not that the member name is the caller's (MemberName(node, id)):
// node n2 may join the member "n3/1", recorded on n2. n3's own consumer 1
// then cannot join (ErrMemberExists) yet is given the squatted member's
// partitions by Share (it looks up assignments by name only); NodeDown of n3
// would not remove that member (it is "on" n2), and n3 may LeaveGroup or
// Released it (ownMember looks only at the name) though the state says it is
// n2's. The rest of the test (n3's consumer gets the partitions) passes.
func TestReview_JoinGroupSquatsOtherNodesMember(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "t", 2, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "topic on "+id, func() bool { return m.Topics()["t"] == 2 })
	}
	_, err := mq.ReviewPropose(ctx, c.nodes["n2"], cluster.JoinGroup{Topic: "t", Group: "g", Member: "n3/1", Node: "n2"})
	if !errors.Is(err, cluster.ErrDenied) {
		t.Errorf("n2 joins the member n3/1: %v, want ErrDenied", err)
	}
	col := &collector{}
	c3, err := c.nodes["n3"].NewConsumer("t", "g", col)
	if err != nil {
		t.Fatal(err)
	}
	limit := time.Now().Add(8 * time.Second)
	for time.Now().Before(limit) && len(c3.Assigned()) < 2 {
		time.Sleep(50 * time.Millisecond)
	}
	if len(c3.Assigned()) < 2 {
		g, _ := mq.ReviewGroup(c.nodes["n1"], "t", "g")
		t.Fatalf("n3's only consumer of g has %v; members %v owners %v", c3.Assigned(), g.Members, g.Owners)
	}
}
