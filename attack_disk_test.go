package mq_test

// Hostile review of the cluster mode's files (issue 11, "left" point 4):
// faults and damage on raft.db, the address book, the state cache and
// snapshots, reopening a directory in another mode or under another node
// id, and the extremes of ids and partition counts.

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// clusterOpt is the cluster option of a one-node test cluster (or a node
// joining seeds).
func clusterOpt(id string, seeds ...string) mq.Option {
	return mq.WithCluster(mq.ClusterConfig{
		NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Secret: clusterSecret,
		SessionTimeout: time.Second, ElectionTimeout: 200 * time.Millisecond,
	})
}

// waitSelfUp waits until m sees itself up in its cluster.
func waitSelfUp(t *testing.T, m *mq.MQ) {
	t.Helper()
	waitFor(t, 20*time.Second, "the node up", func() bool {
		st := m.ClusterStatus()
		for _, nd := range st.Nodes {
			if nd.ID == st.NodeID && nd.Up {
				return true
			}
		}
		return false
	})
}

// sendAcked sends n messages to partition 0 of topic and returns their
// acked offsets by ID.
func sendAcked(t *testing.T, m *mq.MQ, topic, prefix string, n int) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := m.NewProducer(topic)
	if err != nil {
		t.Fatal(err)
	}
	acked := map[string]int64{}
	for i := range n {
		msg := (&mq.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Body: []byte(prefix)}).ToPartition(0)
		res, err := p.SendMessage(ctx, msg)
		if err != nil {
			t.Fatalf("send %s: %v", msg.ID, err)
		}
		acked[msg.ID] = res[0].Offset
	}
	return acked
}

// checkAcked reads back every acked message of partition 0 of topic.
func checkAcked(t *testing.T, m *mq.MQ, topic string, acked map[string]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lost := 0
	var first error
	for id, off := range acked {
		got, err := m.ReadMessage(ctx, topic, 0, off)
		if err != nil || got.ID != id {
			lost++
			if first == nil {
				first = fmt.Errorf("acked %s at %d: got %v, %v", id, off, got, err)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acked messages of %s not read back; first: %v", lost, len(acked), topic, first)
	}
}

// TestAttack_ClusterCrashLosesWALOnlyMessages attacks promise 1 (an acked
// message is on disk before the ack, so a crash loses none) in cluster
// mode. The crash is a copy of the running node's directory, taken while
// its partitions keep what they logged in the write-ahead log only
// (WithMaterializeAfter), as after a SIGKILL within 50 ms of the acks.
func TestAttack_ClusterCrashLosesWALOnlyMessages(t *testing.T) {
	root := t.TempDir()
	src, dst := filepath.Join(root, "live"), filepath.Join(root, "crashed")
	m := openNode(t, src, clusterOpt("n1"), mq.WithMaterializeAfter(time.Hour))
	waitSelfUp(t, m)
	mustCreate(t, m, "t", 1)
	acked := sendAcked(t, m, "t", "a", 20)
	time.Sleep(300 * time.Millisecond) // the state cache and peers saved
	copyTree(t, src, dst)
	m2 := openNode(t, dst, clusterOpt("n1"))
	waitFor(t, 10*time.Second, "the topic after the crash", func() bool { return m2.Topics()["t"] == 1 })
	checkAcked(t, m2, "t", acked)
}
