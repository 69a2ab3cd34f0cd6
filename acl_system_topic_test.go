package mq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/store"
)

// TestCluster_RetryTopicIsNoBackdoorToGroupOffsets (hostile review): the
// partition service lets every node do anything on a system topic
// (serve.go: IsSystemTopic → nil before any check). A node that the ACL
// gives nothing but Consume on t in group "mine" appends messages into
// group g's retry topic (which g's Concurrent consumers deliver to their
// handler as the original message), resets g's retry offsets and runs the
// upkeep's OpTrim, which only a partition's own node proposes. Each
// should be ErrDenied.
func TestCluster_RetryTopicIsNoBackdoorToGroupOffsets(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n1 := c.nodes["n1"]
	const rt = "%RETRY%g"
	if _, err := mq.Propose(ctx, n1, metastate.CreateTopic{Name: rt, Partitions: 1, Type: metastate.TypeSingle,
		Now: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	holder := ""
	waitFor(t, 10*time.Second, "the retry topic placed", func() bool {
		holder = mq.PartitionNode(n1, rt, 0)
		return holder != ""
	})
	attacker := "n1"
	if holder == "n1" {
		attacker = "n2"
	}
	h, a := c.nodes[holder], c.nodes[attacker]
	waitFor(t, 10*time.Second, "the retry topic on both", func() bool { return h.Topics()[rt] == 1 && a.Topics()[rt] == 1 })
	if err := h.SetACL(ctx, []mq.ACLRule{
		{Identity: holder, Topic: "*", Rights: mq.Produce | mq.Consume | mq.Admin},
		{Identity: attacker, Topic: "t", Rights: mq.Consume, Group: "mine"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "rules on the attacker", func() bool { return len(a.ACL()) == 2 })
	rp, err := mq.RemotePartition(a, holder, rt, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	for _, tc := range []struct {
		what string
		cmd  *store.Command
	}{
		{"append into g's retry topic", &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: "forged", Body: []byte("x")}}}},
		{"reset g's retry offset", &store.Command{Op: store.OpResetOffset, Group: "g%t", Offset: 1 << 40}},
		{"delete g's retry offsets", &store.Command{Op: store.OpDeleteGroup, Group: "g%t"}},
		{"the upkeep's trim", &store.Command{Op: store.OpTrim, MaxAge: 1, Now: time.Now().UnixNano()}},
	} {
		if _, err := rp.Apply(ctx, tc.cmd); !errors.Is(err, cluster.ErrDenied) {
			t.Errorf("%s, by %s with no right on g: %v, want ErrDenied", tc.what, attacker, err)
		}
	}
}

// TestCluster_ConcurrentConsumerUnderGroupACL (hostile review): SetACL says
// the retry and dead-letter topics are not controlled, but the metadata
// leader controls them: a node whose rule gives it Produce|Consume on t
// in group g cannot start a Concurrent consumer of t in g (creating
// %RETRY%g needs Admin on that name, joining its group "g%t" a rule on
// topic %RETRY%g whose group pattern matches "g%t").
func TestCluster_ConcurrentConsumerUnderGroupACL(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n1, n2 := c.nodes["n1"], c.nodes["n2"]
	if err := n1.CreateMQ(ctx, "t", 1, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "t on n2", func() bool { return n2.Topics()["t"] == 1 })
	if err := n1.SetACL(ctx, []mq.ACLRule{
		{Identity: "n1", Topic: "*", Rights: mq.Produce | mq.Consume | mq.Admin},
		{Identity: "n2", Topic: "t", Rights: mq.Produce | mq.Consume, Group: "g"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "rules on n2", func() bool { return len(n2.ACL()) == 2 })
	got := make(chan string, 4)
	h := mq.ListenerFunc(func(_ context.Context, _ string, m *mq.Message) error {
		select {
		case got <- m.ID:
		default:
		}
		return nil
	})
	cons, err := n2.NewConsumer("t", "g", h, mq.WithConsumeMode(mq.Concurrent))
	if err != nil {
		t.Fatalf("n2, allowed to consume t in g, starts a Concurrent consumer of g: %v", err)
	}
	defer cons.Close()
	if err := mq.ApplyAt(ctx, n1, "t", 0, &mq.Message{ID: "m0", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("nothing delivered")
	}
}
