package mq_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestCluster_StartsOnlyWhenTold: a node without state, seeds or
// Bootstrap is refused at Open (ErrInvalidOption), and leaves no cluster
// state behind; with Bootstrap it starts a cluster that has an id.
func TestCluster_StartsOnlyWhenTold(t *testing.T) {
	parallelByDefault(t)
	dir := t.TempDir()
	cc := mq.ClusterConfig{NodeID: "n1", Bind: "127.0.0.1:0", Secret: clusterSecret, InsecurePlaintext: true,
		SessionTimeout: time.Second, ElectionTimeout: 200 * time.Millisecond}
	if m, err := mq.Open(dir, mq.WithCluster(cc)); !errors.Is(err, mq.ErrInvalidOption) {
		if err == nil {
			m.Close()
		}
		t.Fatalf("Open without seeds or Bootstrap: %v, want ErrInvalidOption", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cluster", "raft.db")); err == nil {
		t.Fatal("a refused Open left a metadata raft state")
	}
	cc.Bootstrap = true
	m, err := mq.Open(dir, mq.WithCluster(cc))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	waitFor(t, 20*time.Second, "the cluster's id", func() bool { return m.ClusterStatus().ClusterID != "" })
}

// TestCluster_ReprovisionedBootstrapNodeJoins: the node that started the
// cluster, its disk replaced, comes back with its first configuration
// (Bootstrap, its seeds the other nodes): it joins the cluster it was a
// member of, with the same cluster id and the topics, rather than
// starting a second cluster.
func TestCluster_ReprovisionedBootstrapNodeJoins(t *testing.T) {
	parallelByDefault(t)
	var logs nodeLogs
	c := newCluster(t, 3, withNodeOptions(logs.opts), withDoubleWrite(1, mq.Options{}))
	id := c.nodes["n2"].ClusterStatus().ClusterID
	waitFor(t, 20*time.Second, "every node knows the cluster's id", func() bool {
		for _, m := range c.nodes {
			if m.ClusterStatus().ClusterID != id || id == "" {
				return false
			}
		}
		return true
	})
	seeds := []string{c.nodes["n2"].ClusterStatus().Addr, c.nodes["n3"].ClusterStatus().Addr}
	c.kill("n1")
	if err := os.RemoveAll(filepath.Join(c.root, "n1")); err != nil {
		t.Fatal(err)
	}
	server, client := nodeTLS(t, "n1")
	m, err := mq.Open(filepath.Join(c.root, "n1"), append(logs.opts("n1"), mq.WithCluster(mq.ClusterConfig{
		NodeID: "n1", Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: true, Secret: clusterSecret,
		ServerTLS: server, ClientTLS: client, SessionTimeout: time.Second, ElectionTimeout: 200 * time.Millisecond,
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes["n1"] = m
	t.Cleanup(func() { closeNode("n1", m) })
	defer func() {
		if t.Failed() {
			t.Logf("n1: %+v, topics %v; log %q", m.ClusterStatus(), m.Topics(), logs.matching(""))
		}
	}()
	c.waitUp(3)
	waitFor(t, 20*time.Second, "n1 back in its cluster, with the topic", func() bool {
		return m.ClusterStatus().ClusterID == id && m.Topics()["d"] == 1
	})
}

// TestCluster_NodeOfAnotherClusterRefused: a node whose directory holds
// another cluster's data, pointed at this cluster's seeds, is never made
// a member: the leader refuses its join, naming the cause, and this
// cluster's state never records it.
func TestCluster_NodeOfAnotherClusterRefused(t *testing.T) {
	parallelByDefault(t)
	var logs nodeLogs
	c := newCluster(t, 2, withNodeOptions(logs.opts))
	// A cluster of its own: x1 starts it, and closes.
	other := filepath.Join(t.TempDir(), "x1")
	server, client := nodeTLS(t, "x1")
	cc := mq.ClusterConfig{NodeID: "x1", Bind: "127.0.0.1:0", Bootstrap: true, Secret: clusterSecret,
		ServerTLS: server, ClientTLS: client, SessionTimeout: time.Second, ElectionTimeout: 200 * time.Millisecond}
	x, err := mq.Open(other, mq.WithCluster(cc))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "x1's cluster id", func() bool { return x.ClusterStatus().ClusterID != "" })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := x.CreateMQ(ctx, "mine", 1, mq.Options{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the state cache and the cluster file written
	x.Close()
	// x1, with its data, now given this cluster's seeds.
	cc.Bootstrap, cc.Seeds = false, []string{c.nodes["n1"].ClusterStatus().Addr}
	x, err = mq.Open(other, mq.WithCluster(cc))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	waitFor(t, 20*time.Second, "the join refused", func() bool {
		return len(logs.matching("another cluster")) > 0
	})
	time.Sleep(time.Second)
	for id, m := range c.nodes {
		for _, nd := range m.ClusterStatus().Nodes {
			if nd.ID == "x1" {
				t.Fatalf("%s's state records x1, a node of another cluster", id)
			}
		}
	}
}
