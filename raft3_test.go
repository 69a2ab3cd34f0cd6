package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestRaft3_NeedsThreeNodes: a Raft3 topic on a cluster of two nodes is
// refused at once with ErrNoQuorum, and on a standalone node with
// ErrUnsupportedType; a name too long for its groups is ErrInvalidTopic.
func TestRaft3_NeedsThreeNodes(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err := c.nodes["n1"].CreateMQ(ctx, "r", 1, mq.Options{Type: mq.Raft3})
	if !errors.Is(err, mq.ErrNoQuorum) {
		t.Fatalf("Raft3 on two nodes: %v, want ErrNoQuorum", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("refused after %v: not at once", took)
	}
	long := make([]byte, 250)
	for i := range long {
		long[i] = 'a'
	}
	if err := c.nodes["n1"].CreateMQ(ctx, string(long), 1, mq.Options{Type: mq.Raft3}); !errors.Is(err, mq.ErrInvalidTopic) {
		t.Fatalf("a Raft3 topic of 250 bytes: %v, want ErrInvalidTopic", err)
	}
	m := openNode(t, t.TempDir())
	if err := m.CreateMQ(ctx, "r", 1, mq.Options{Type: mq.Raft3}); !errors.Is(err, mq.ErrUnsupportedType) {
		t.Fatalf("Raft3 standalone: %v, want ErrUnsupportedType", err)
	}
}

// TestRaft3_SendConsumeFailover: a Raft3 topic on three nodes takes sends
// from every node and a consumer group receives them all; closing any one
// node (a leader of some groups, which hands them over) loses nothing: the
// two left go on taking sends, the group goes on receiving, and the node,
// reopened on its data, rejoins its groups and reads everything back.
func TestRaft3_SendConsumeFailover(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const parts = 3
	if err := c.nodes["n2"].CreateMQ(ctx, "r", parts, mq.Options{Type: mq.Raft3}); err != nil {
		t.Fatalf("CreateMQ Raft3: %v", err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()["r"] == parts })
	}
	var mu sync.Mutex
	acked := map[string]int{} // id -> partition
	send := func(from string, n int, tag string) {
		t.Helper()
		p, err := c.nodes[from].NewProducer("r")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for i := range n {
			msg := (&mq.Message{ID: fmt.Sprintf("%s-%s-%d", tag, from, i), Body: []byte(from)}).ToPartition(i % parts)
			for {
				_, err := p.SendMessage(ctx, msg)
				if err == nil {
					break
				}
				if !errors.Is(err, mq.ErrUnknownOutcome) {
					t.Fatalf("send %s from %s: %v", msg.ID, from, err)
				}
				// Resent as is: the same ID and partition, deduplicated.
			}
			mu.Lock()
			acked[msg.ID] = i % parts
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for id := range c.nodes {
		wg.Go(func() { send(id, 30, "a") })
	}
	wg.Wait()
	col := collect(t, c.nodes["n3"], "r", "g")
	ids := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for id := range acked {
			out = append(out, id)
		}
		return out
	}
	waitSeen(t, col, ids()...)

	c.kill("n1")
	for _, id := range []string{"n2", "n3"} {
		wg.Go(func() { send(id, 30, "b") })
	}
	wg.Wait()
	waitSeen(t, col, ids()...)

	back := c.start("n1")
	for i := range parts {
		waitFor(t, 20*time.Second, fmt.Sprintf("partition %d readable on the reopened node", i), func() bool {
			_, err := back.ReadMessage(ctx, "r", i, 0)
			return err == nil
		})
	}
	// Every acked message is in its partition, read through the node that
	// was down, once.
	seen := map[string]int{}
	for i := range parts {
		for off := int64(0); ; off++ {
			m, err := back.ReadMessage(ctx, "r", i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				t.Fatalf("read %d/%d on the reopened node: %v", i, off, err)
			}
			seen[m.ID]++
			if want, ok := acked[m.ID]; ok && want != i {
				t.Fatalf("%s in partition %d, sent to %d", m.ID, i, want)
			}
		}
	}
	for id := range acked {
		if seen[id] != 1 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
	if len(seen) != len(acked) {
		t.Errorf("%d messages stored, %d acked", len(seen), len(acked))
	}
}

// TestRaft3_ClusterRestart: the whole cluster closed and reopened from its
// directories: every acked message is there, the group's committed offsets
// too (the consumer reopened receives nothing it had processed), and a
// message delayed before the restart is released after it by whichever
// replica leads then.
func TestRaft3_ClusterRestart(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "r", 2, mq.Options{Type: mq.Raft3}); err != nil {
		t.Fatal(err)
	}
	for id, m := range c.nodes {
		waitFor(t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()["r"] == 2 })
	}
	p, err := c.nodes["n2"].NewProducer("r")
	if err != nil {
		t.Fatal(err)
	}
	var first []string
	for i := range 20 {
		msg := (&mq.Message{ID: fmt.Sprintf("m%d", i)}).ToPartition(i % 2)
		resend(ctx, t, p, msg)
		first = append(first, msg.ID)
	}
	delayed := (&mq.Message{ID: "late", DeliverAt: time.Now().Add(3 * time.Second)}).ToPartition(1)
	if _, err := p.SendMessage(ctx, delayed); err != nil {
		t.Fatal(err)
	}
	p.Close()
	col := collect(t, c.nodes["n3"], "r", "g")
	waitSeen(t, col, first...)
	if col.count("late") != 0 {
		t.Fatal("the delayed message delivered early")
	}
	waitFor(t, 10*time.Second, "the offsets committed", func() bool {
		return committedAll(c.nodes["n3"], "r", "g", 2)
	})

	// The consumer's node first, while its last offset commit finds a
	// quorum (on the last node it would wait for one).
	for _, id := range []string{"n3", "n1", "n2"} {
		c.kill(id)
	}
	if col.count("late") != 0 {
		t.Fatal("the delayed message released before the restart: the test's delay is too short for this machine")
	}
	for _, id := range []string{"n1", "n2", "n3"} { // each joins through those already back
		c.start(id)
	}
	c.waitUp(3)
	col2 := collect(t, c.nodes["n1"], "r", "g")
	waitSeen(t, col2, "late")
	for _, id := range first {
		if col2.count(id) != 0 {
			t.Errorf("%s delivered again after the restart: its offset was lost", id)
		}
	}
	for i := range 20 {
		m, err := c.nodes["n2"].ReadMessage(ctx, "r", i%2, int64(i/2))
		if err != nil || m.ID != fmt.Sprintf("m%d", i) {
			t.Fatalf("offset %d of partition %d after the restart: %v, %v", i/2, i%2, m, err)
		}
	}
}

// TestRaft3_CloseWithoutQuorum: the last node of a Raft3 cluster closes
// promptly with a consumer open: its final offset commit finds no leader
// and is given up (the group redelivers from the last commit), instead of
// waiting out the commit's 10 s timeout.
func TestRaft3_CloseWithoutQuorum(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, "r", 2, mq.Options{Type: mq.Raft3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the topic on n3", func() bool { return c.nodes["n3"].Topics()["r"] == 2 })
	p, err := c.nodes["n3"].NewProducer("r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(ctx, &mq.Message{ID: "x"}); err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	if _, err := c.nodes["n3"].NewConsumer("r", "g", col); err != nil {
		t.Fatal(err)
	}
	waitSeen(t, col, "x")
	c.kill("n1")
	c.kill("n2")
	start := time.Now()
	c.kill("n3")
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the last node closed in %v", took)
	}
}

// TestRaft3_ReplicaOpenRetried: a node that fails to open its replica (its
// directory's path taken by a file) serves the partition through the other
// two and tries again at the metadata state's next change, which then
// succeeds once the path is free: the replica's log, retained on the first
// try, must not be lost to it.
func TestRaft3_ReplicaOpenRetried(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	blocker := filepath.Join(c.root, "n3", "raft3", "r", "0")
	if err := os.MkdirAll(filepath.Dir(blocker), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blocker, []byte("in the way"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes["n1"].CreateMQ(ctx, "r", 1, mq.Options{Type: mq.Raft3}); err != nil {
		t.Fatal(err)
	}
	// Sent once n1 knows the leader: with none known a call tries the
	// replicas in turn, and n3, which lacks the topic, answers ErrNoTopic.
	waitFor(t, 10*time.Second, "a leader known to n1", func() bool {
		l, _ := mq.Raft3Leader(c.nodes["n1"], "r", 0)
		return l != ""
	})
	p, err := c.nodes["n1"].NewProducer("r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(ctx, &mq.Message{ID: "a"}); err != nil {
		t.Fatalf("send with two of three replicas: %v", err)
	}
	// n3 serves the topic meanwhile, through the other two replicas.
	waitFor(t, 10*time.Second, "n3 to show the topic", func() bool { return c.nodes["n3"].Topics()["r"] == 1 })
	if _, holds := mq.Raft3Leader(c.nodes["n3"], "r", 0); holds {
		t.Fatal("n3 holds a replica whose directory is taken by a file")
	}
	p3, err := c.nodes["n3"].NewProducer("r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p3.SendMessage(ctx, &mq.Message{ID: "b"}); err != nil {
		t.Fatalf("send through n3, whose replica is not open: %v", err)
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes["n1"].CreateMQ(ctx, "other", 1, mq.Options{}); err != nil { // a change: n3 tries again
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "n3's replica opened on the next change", func() bool {
		_, holds := mq.Raft3Leader(c.nodes["n3"], "r", 0)
		return holds
	})
	c.kill("n1") // n3's replica is now needed for the quorum
	m, err := c.nodes["n3"].ReadMessage(ctx, "r", 0, 0)
	if err != nil || m.ID != "a" {
		t.Fatalf("read through n3 with n1 down: %v, %v", m, err)
	}
}

// TestRaft3_RetentionConsumed: on a Raft3 topic the consumed trim is a
// replicated command proposed by the leader's upkeep: once the group has
// committed past them the messages are gone on every replica (a new leader
// after the old one's kill holds none of them), and the next send goes on
// at the same offset.
func TestRaft3_RetentionConsumed(t *testing.T) {
	parallelByDefault(t)
	c := newCluster(t, 3, withNodeOptions(func(string) []mq.Option {
		return []mq.Option{mq.WithRetentionConsumed(), mq.WithDedupWindow(100 * time.Millisecond),
			mq.WithMaintenanceInterval(50 * time.Millisecond)}
	}), withRaft3(1))
	lead, others := leaderAndOthers(t, c)
	ctx := testCtx(t)
	p, err := c.nodes[others[0]].NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		if _, err := p.SendMessage(ctx, &mq.Message{ID: fmt.Sprint("m", i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	got := &arrivals{}
	cons := mustConsume(t, c.nodes[others[1]], r3, "g", got)
	waitFor(t, 20*time.Second, "the 30 messages consumed", func() bool { return got.len() == 30 })
	cons.Close() // commits 30
	gone := func(m *mq.MQ) bool {
		for _, off := range []int64{0, 29} {
			if _, err := m.ReadMessage(ctx, r3, 0, off); !errors.Is(err, mq.ErrNoMessage) {
				return false
			}
		}
		return true
	}
	waitFor(t, 20*time.Second, "the consumed head trimmed", func() bool { return gone(c.nodes[others[0]]) })
	c.kill(lead)
	waitFor(t, 20*time.Second, "a new leader", func() bool {
		l, _ := mq.Raft3Leader(c.nodes[others[0]], r3, 0)
		return l != "" && l != lead
	})
	if !gone(c.nodes[others[0]]) {
		t.Fatal("the new leader holds messages the old one trimmed: the trim was not replicated")
	}
	res, err := p.SendMessage(ctx, &mq.Message{ID: "after", Body: []byte("y")})
	if err != nil || len(res) != 1 || res[0].Offset != 30 {
		t.Fatalf("the next send: %+v, %v; want offset 30", res, err)
	}
}
