package mq_test

// The cluster mode's files: faults and damage on raft.db, the address
// book, the state cache and snapshots, reopening a directory in another
// mode or under another node id, and the extremes of ids and partition
// counts.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// clusterOpt is the cluster option of a one-node test cluster (or a node
// joining seeds).
func clusterOpt(id string, seeds ...string) mq.Option {
	return mq.WithCluster(mq.ClusterConfig{
		NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: clusterSecret, InsecurePlaintext: true,
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

// TestCluster_CrashKeepsWALOnlyMessages checks promise 1 (an acked
// message is on disk before the ack, so a crash loses none) in cluster
// mode. The crash is a copy of the running node's directory, taken while
// its partitions keep what they logged in the write-ahead log only
// (WithMaterializeAfter), as after a SIGKILL within 50 ms of the acks.
func TestCluster_CrashKeepsWALOnlyMessages(t *testing.T) {
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

// TestCluster_ReopenStandaloneDir checks "never acked messages lost
// or served from the wrong topic" when a standalone directory is reopened
// WithCluster. Before the fix it opened: its topics vanished from the
// table, and a cluster topic of the same name placed on it later served
// the standalone topic's messages (here at offset 0; with another
// partition count, some of them never). Want: ErrInvalidOption, and the
// directory still whole standalone.
func TestCluster_ReopenStandaloneDir(t *testing.T) {
	dir := t.TempDir()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "t", 1)
	acked := sendAcked(t, m, "t", "s", 5)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := mq.Open(dir, clusterOpt("n1")); !errors.Is(err, mq.ErrInvalidOption) {
		if err == nil {
			c.Close()
		}
		t.Fatalf("a standalone directory opened WithCluster: %v, want ErrInvalidOption", err)
	}
	checkAcked(t, openNode(t, dir), "t", acked)
}

// TestCluster_ReopenAsStandalone: a cluster node's directory opened
// without WithCluster. Before the fix it opened and adopted the partition
// files it held as standalone topics (a node holding t/1 but not t/0 got
// ErrCorrupt, "0.db is missing"; one holding t/0 a topic t of one
// partition, whose sends then went into the cluster's t/0). Want:
// ErrInvalidOption, and the node whole when reopened in its cluster.
func TestCluster_ReopenAsStandalone(t *testing.T) {
	reopenRefused(t, "standalone")
}

// TestCluster_ReopenUnderAnotherNodeID: a cluster node's directory opened
// with another NodeID. Before the fix it opened as n9 with n1's raft log:
// not in its own configuration, it never elected a leader (CreateMQ ended
// with ErrNoQuorum) and took its own partitions for n1's, remote and
// unreachable. Want: ErrInvalidOption, and the node whole as n1.
func TestCluster_ReopenUnderAnotherNodeID(t *testing.T) {
	reopenRefused(t, "as n9", clusterOpt("n9"))
}

// reopenRefused: n1's directory, holding acked messages, opened with opts
// is ErrInvalidOption, and the node is whole when reopened as n1.
func reopenRefused(t *testing.T, what string, opts ...mq.Option) {
	dir := t.TempDir()
	m, err := mq.Open(dir, clusterOpt("n1"))
	if err != nil {
		t.Fatal(err)
	}
	waitSelfUp(t, m)
	mustCreate(t, m, "t", 1)
	acked := sendAcked(t, m, "t", "a", 5)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if o, err := mq.Open(dir, opts...); !errors.Is(err, mq.ErrInvalidOption) {
		if err == nil {
			t.Logf("topics %v, status %+v", o.Topics(), o.ClusterStatus())
			o.Close()
		}
		t.Fatalf("n1's directory opened %s: %v, want ErrInvalidOption", what, err)
	}
	m = openNode(t, dir, clusterOpt("n1"))
	waitFor(t, 10*time.Second, "t", func() bool { return m.Topics()["t"] == 1 })
	checkAcked(t, m, "t", acked)
}

// TestCluster_OpenDamagedFiles checks "damage is an error: Open
// returns ErrCorrupt naming the file" for the cluster's own files, and
// "the cache and the address book are hints": damaged, they are ignored
// and the node opens with every acked message.
func TestCluster_OpenDamagedFiles(t *testing.T) {
	parallelByDefault(t)
	root := t.TempDir()
	src := filepath.Join(root, "src")
	m, err := mq.Open(src, clusterOpt("n1"))
	if err != nil {
		t.Fatal(err)
	}
	waitSelfUp(t, m)
	mustCreate(t, m, "t", 1)
	acked := sendAcked(t, m, "t", "a", 5)
	time.Sleep(300 * time.Millisecond) // the state cache saved
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		file    string
		corrupt bool // ErrCorrupt; else opens whole
	}{
		{"RaftDB", "raft.db", true},
		{"StateCache", "state", false},
		{"AddressBook", "peers", false},
		{"NodeFile", "node", true},
		{"IncarnationFile", "incarnation", true},
		{"ClusterFile", "cluster", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(root, tc.name)
			copyTree(t, src, dir)
			path := filepath.Join(dir, "cluster", tc.file)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(b); i += 512 { // a byte of every bbolt page header
				b[i+16%len(b[i:])] ^= 0xff
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			m, err := mq.Open(dir, clusterOpt("n1"))
			if tc.corrupt {
				if err == nil {
					m.Close()
				}
				if !errors.Is(err, mq.ErrCorrupt) || !strings.Contains(err.Error(), path) {
					t.Fatalf("Open with %s damaged: %v, want ErrCorrupt naming it", tc.file, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open with %s damaged: %v", tc.file, err)
			}
			defer m.Close()
			waitFor(t, 10*time.Second, "t", func() bool { return m.Topics()["t"] == 1 })
			checkAcked(t, m, "t", acked)
		})
	}
}

// TestCluster_NodeIDLimits checks "clear errors for bad input" on node
// ids: empty, 65 bytes, a character outside the rule; each is
// ErrInvalidOption from Open and leaves the directory usable.
func TestCluster_NodeIDLimits(t *testing.T) {
	parallelByDefault(t)
	for _, tc := range []struct{ name, id string }{
		{"Empty", ""},
		{"Long", strings.Repeat("n", 65)},
		{"Slash", "n/1"},
		{"Space", "n 1"},
		{"NonASCII", "nœud"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			m, err := mq.Open(dir, clusterOpt(tc.id))
			if err == nil {
				m.Close()
			}
			if !errors.Is(err, mq.ErrInvalidOption) {
				t.Fatalf("NodeID %q: %v, want ErrInvalidOption", tc.id, err)
			}
			m = openNode(t, dir, clusterOpt("n1")) // the refused id left nothing behind
			waitSelfUp(t, m)
		})
	}
}

// TestCluster_Maxima: two nodes with ids of the longest length, a
// topic of the longest name with MaxPartitions partitions placed over
// both; every node sends to a partition of each node and reads it back;
// one past each limit is a clear error.
func TestCluster_Maxima(t *testing.T) {
	parallelByDefault(t)
	root := t.TempDir()
	id1, id2 := strings.Repeat("a", 64), strings.Repeat("b", 64)
	n1 := openNode(t, filepath.Join(root, "1"), clusterOpt(id1))
	waitSelfUp(t, n1)
	n2 := openNode(t, filepath.Join(root, "2"), clusterOpt(id2, n1.ClusterStatus().Addr))
	waitFor(t, 30*time.Second, "both nodes up", func() bool {
		for _, m := range []*mq.MQ{n1, n2} {
			up := 0
			for _, nd := range m.ClusterStatus().Nodes {
				if nd.Up {
					up++
				}
			}
			if up != 2 {
				return false
			}
		}
		return true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	topic := strings.Repeat("t", 255)
	for _, tc := range []struct {
		name  string
		parts int
		want  error
	}{
		{strings.Repeat("t", 256), 1, mq.ErrInvalidTopic},
		{"", 1, mq.ErrInvalidTopic},
		{"x", mq.MaxPartitions + 1, mq.ErrInvalidPartition},
		{"x", 0, mq.ErrInvalidPartition},
	} {
		if err := n2.CreateMQ(ctx, tc.name, tc.parts, mq.Options{}); !errors.Is(err, tc.want) {
			t.Fatalf("CreateMQ(%d bytes, %d): %v, want %v", len(tc.name), tc.parts, err, tc.want)
		}
	}
	start := time.Now()
	if err := n2.CreateMQ(ctx, topic, mq.MaxPartitions, mq.Options{}); err != nil {
		t.Fatalf("CreateMQ(255 bytes, MaxPartitions): %v", err)
	}
	t.Logf("created %d partitions in %v", mq.MaxPartitions, time.Since(start))
	if err := n1.AlterMQ(ctx, topic, mq.MaxPartitions+1); !errors.Is(err, mq.ErrInvalidPartition) {
		t.Fatalf("AlterMQ past MaxPartitions: %v", err)
	}
	waitFor(t, 60*time.Second, "the topic on n1", func() bool { return n1.Topics()[topic] == mq.MaxPartitions })
	on := map[string]int{} // node → a partition placed there
	for i := range mq.MaxPartitions {
		on[mq.PartitionNode(n1, topic, i)] = i
	}
	if len(on) != 2 {
		t.Fatalf("placement over %d nodes: %v", len(on), on)
	}
	for _, from := range []*mq.MQ{n1, n2} {
		p, err := from.NewProducer(topic)
		if err != nil {
			t.Fatal(err)
		}
		for node, i := range on {
			id := fmt.Sprintf("from-%s-to-%.1s", from.ClusterStatus().NodeID[:1], node)
			res, err := p.SendMessage(ctx, (&mq.Message{ID: id, Body: []byte(id)}).ToPartition(i))
			if err != nil {
				t.Fatalf("send %s: %v", id, err)
			}
			for _, reader := range []*mq.MQ{n1, n2} {
				got, err := reader.ReadMessage(ctx, topic, i, res[0].Offset)
				if err != nil || got.ID != id {
					t.Fatalf("read %s at %d/%d: %v %v", id, i, res[0].Offset, got, err)
				}
			}
		}
	}
}

// TestConsumer_LongestGroupRetryTopic checks "clear errors for bad input"
// at the longest group name: a Concurrent consumer makes the group's retry
// topic, whose name is 7 bytes longer, at NewConsumer. Before the fix a
// 255-byte group (allowed, as topics) failed there with "file name too
// long" (standalone) or "cluster: invalid command: topic name of 262
// bytes"; groups are now at most 248 bytes (ErrInvalidGroup past it).
func TestConsumer_LongestGroupRetryTopic(t *testing.T) {
	for _, mode := range []string{"Standalone", "Cluster"} {
		t.Run(mode, func(t *testing.T) {
			var opts []mq.Option
			if mode == "Cluster" {
				opts = append(opts, clusterOpt("n1"))
			}
			m := openNode(t, "", opts...)
			if mode == "Cluster" {
				waitSelfUp(t, m)
			}
			mustCreate(t, m, "t", 1)
			h := mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil })
			for _, n := range []int{255, 249} {
				c, err := m.NewConsumer("t", strings.Repeat("g", n), h, mq.WithConsumeMode(mq.Concurrent))
				if err == nil {
					c.Close()
				}
				if !errors.Is(err, mq.ErrInvalidGroup) {
					t.Fatalf("NewConsumer with a %d-byte group: %v, want ErrInvalidGroup", n, err)
				}
			}
			c, err := m.NewConsumer("t", strings.Repeat("g", 248), h, mq.WithConsumeMode(mq.Concurrent))
			if err != nil {
				t.Fatalf("NewConsumer with a 248-byte group: %v", err)
			}
			c.Close()
		})
	}
}

// TestCluster_OpenFilesUnusable checks "an error, never a panic or
// a hang" at Open when a cluster file cannot be used: a directory where
// raft.db, the state cache, the address book or the snapshots' directory
// should be a file (EISDIR, ENOTDIR), in a new directory and in one that
// ran. Where Open succeeds (the hints are ignored), the node must take a
// topic and Close.
func TestCluster_OpenFilesUnusable(t *testing.T) {
	parallelByDefault(t)
	for _, used := range []bool{false, true} {
		for _, tc := range []struct {
			name string
			dir  bool // block with a directory (else a file)
			path string
		}{
			{"RaftDB", true, "raft.db"},
			{"StateCache", true, "state/x"},
			{"AddressBook", true, "peers/x"},
			{"Snapshots", false, "snapshots"},
		} {
			t.Run(fmt.Sprintf("%s/used=%v", tc.name, used), func(t *testing.T) {
				dir := t.TempDir()
				if used {
					m, err := mq.Open(dir, clusterOpt("n1"))
					if err != nil {
						t.Fatal(err)
					}
					waitSelfUp(t, m)
					if err := m.Close(); err != nil {
						t.Fatal(err)
					}
				}
				p := filepath.Join(dir, "cluster", tc.path)
				os.RemoveAll(filepath.Join(dir, "cluster", strings.Split(tc.path, "/")[0]))
				var err error
				if tc.dir {
					err = os.MkdirAll(p, 0o755)
				} else if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
					err = os.WriteFile(p, []byte("x"), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					m, err := mq.Open(dir, clusterOpt("n1"))
					if err != nil {
						t.Logf("Open: %v", err)
						return
					}
					defer func() {
						if err := m.Close(); err != nil {
							t.Errorf("Close: %v", err)
						}
					}()
					waitSelfUp(t, m)
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if err := m.CreateMQ(ctx, "t", 1, mq.Options{}); err != nil {
						t.Errorf("Open succeeded, CreateMQ: %v", err)
					}
				}()
				select {
				case <-done:
				case <-time.After(40 * time.Second):
					t.Fatal("Open, CreateMQ or Close hangs")
				}
			})
		}
	}
}
