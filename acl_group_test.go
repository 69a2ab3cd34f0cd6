package mq_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/store"
)

// committedAt returns group's committed offset in partition part of topic,
// as node m reads it.
func committedAt(t testing.TB, m *mq.MQ, topic, group string, part int) uint64 {
	t.Helper()
	lag, err := m.Lag(context.Background(), topic, group)
	if err != nil {
		t.Fatal(err)
	}
	return lag[part].Committed
}

// TestCluster_GroupOffsetsNeedGroupRightAndOwnership: a node with Consume
// on a topic cannot claim, commit, renew or release the offsets of a group
// whose partition it does not own, whatever generation it tries, and the
// refusal names no generation; with a rule limited to group "mine" it may
// not consume group g at all; the node owning the partition in "mine"
// commits through the partition service. Before the service checked the
// group and its owner, n2's commit with generation 0 returned the current
// generation beside ErrStaleGeneration, and a retry with it moved g's
// offset back to 0.
func TestCluster_GroupOffsetsNeedGroupRightAndOwnership(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n1, n2 := c.nodes["n1"], c.nodes["n2"]
	if err := n1.CreateMQ(ctx, "t", 2, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	on1 := -1
	for i := range 2 {
		if mq.PartitionNode(n1, "t", i) == "n1" {
			on1 = i
		}
	}
	if on1 < 0 {
		t.Fatal("no partition of t on n1")
	}
	waitFor(t, 10*time.Second, "t on n2", func() bool { return n2.Topics()["t"] == 2 })
	for i := range 4 {
		if err := mq.ApplyAt(ctx, n1, "t", on1, &mq.Message{ID: fmt.Sprintf("m%d", i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	nop := mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil })
	cons, err := n1.NewConsumer("t", "g", nop)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	waitFor(t, 20*time.Second, "g committed on n1", func() bool { return committedAt(t, n1, "t", "g", on1) == 4 })

	all := mq.ACLRule{Identity: "n1", Topic: "*", Rights: mq.Produce | mq.Consume | mq.Admin}
	if err := n1.SetACL(ctx, []mq.ACLRule{all, {Identity: "n2", Topic: "t", Rights: mq.Consume}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "rules on n2", func() bool { return len(n2.ACL()) == 2 })
	rp, err := mq.RemotePartition(n2, "n1", "t", on1)
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	refused := func(what string, cmd *store.Command) {
		t.Helper()
		res, err := rp.Apply(ctx, cmd)
		if !errors.Is(err, cluster.ErrDenied) {
			t.Errorf("%s: %v, want ErrDenied", what, err)
		}
		if res.Generation != 0 || res.Offset != 0 {
			t.Errorf("%s: the refusal carries generation %d, offset %d", what, res.Generation, res.Offset)
		}
		if err != nil && strings.Contains(err.Error(), "generation") {
			t.Errorf("%s: the refusal names a generation: %v", what, err)
		}
	}
	refused("claim g", &store.Command{Op: store.OpClaim, Group: "g", Start: store.StartFirst})
	for gen := range uint64(4) {
		refused("commit g at generation "+strconv.FormatUint(gen, 10), &store.Command{Op: store.OpCommitOffset, Group: "g", Generation: gen})
	}
	refused("renew g", &store.Command{Op: store.OpRenew, Group: "g", Generation: 1})
	refused("release g", &store.Command{Op: store.OpUnclaim, Group: "g", Generation: 1})
	if got := committedAt(t, n1, "t", "g", on1); got != 4 {
		t.Fatalf("g's offset moved to %d", got)
	}

	// A rule limited to group "mine": n2 may not consume g, and consumes
	// "mine", whose partition on n1 it owns and commits over RPC.
	if err := n1.SetACL(ctx, []mq.ACLRule{all, {Identity: "n2", Topic: "t", Rights: mq.Consume, Group: "mine"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the group rule on n2", func() bool { return n2.ACL()[1].Group == "mine" })
	if _, err := n2.NewConsumer("t", "g", nop); !errors.Is(err, mq.ErrDenied) {
		t.Errorf("n2 consumes g: %v, want ErrDenied", err)
	}
	refused("claim g with a rule for mine", &store.Command{Op: store.OpClaim, Group: "g", Start: store.StartFirst})
	mine, err := n2.NewConsumer("t", "mine", nop)
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	waitFor(t, 20*time.Second, "mine committed by n2", func() bool { return committedAt(t, n1, "t", "mine", on1) == 4 })
	if m, err := n2.ReadMessage(ctx, "t", on1, 0); err != nil || m.ID != "m0" {
		t.Errorf("n2 reads t/%d: %v, %v", on1, m, err)
	}
	if got := committedAt(t, n1, "t", "g", on1); got != 4 {
		t.Fatalf("g's offset moved to %d", got)
	}
}
