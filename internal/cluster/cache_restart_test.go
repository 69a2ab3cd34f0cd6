package cluster

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
)

// foreignCache writes, in dir, the state cache of another cluster: a
// topic "ghost" at log index 1000.
func foreignCache(t *testing.T, dir string) {
	t.Helper()
	s, _, err := metastate.New().Apply(999, metastate.RegisterNode{ID: "other", Addr: "10.9.9.9:1"})
	if err != nil {
		t.Fatal(err)
	}
	s, _, err = s.Apply(1000, metastate.CreateTopic{Name: "ghost", Partitions: 4, Type: 1, Replicas: 1, Now: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := encodeCache(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cachePath(dir), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCache_FreshClusterIgnoresOldCacheAfterQuickRestart checks "a fresh
// cluster in a reused directory is not confused by an old cache".
//
// OpenMeta ignores a cache left beside no raft state, but leaves the file
// in place; it is replaced only by cacheLoop, cacheEvery after the first
// applied change. A fresh node that stops (or crashes) before that has raft
// state (its bootstrap configuration) beside the old cache, so its next
// open seeds the old cluster's State, at index 1000, and shows it (topic
// "ghost", node "other") until its own log reaches index 1000.
// The restarted fresh node once showed the old cluster's topic.
func TestCache_FreshClusterIgnoresOldCacheAfterQuickRestart(t *testing.T) {
	c := newTestCluster(t, 2e9)
	dir := filepath.Join(t.TempDir(), "n1")
	c.dirs["n1"] = dir
	foreignCache(t, dir)
	c.start("n1", true) // fresh: the cache is ignored
	c.stop("n1")        // at once: before cacheLoop replaced the file
	m := c.start("n1", false)
	eventually(t, "n1 leads", m.IsLeader)
	if _, ok := m.State().Topic("ghost"); ok {
		t.Fatalf("the fresh cluster's node, restarted, shows topic %q of the old cache (state index %d, nodes %v)",
			"ghost", m.State().Index(), m.State().Nodes())
	}
}

// TestCache_CloseSavesLastChanges checks "a node restarting
// shows ... what it had" (the state cache's purpose) and "a stale cache
// never makes it act on wrong placement".
//
// cacheLoop saves a change only cacheEvery after it and returns on Close
// without saving: a node closed cleanly within 100 ms of a change (a
// rolling restart right after AlterMQ) restarts, without a quorum, on the
// state before it. Here the topic grew from 2 to 4 partitions, the leader
// applied it and closed; restarted alone it shows 2 partitions, so its
// keyed sends and its table map keys over the wrong partition count.
// The restarted node once showed 2 partitions.
func TestCache_CloseSavesLastChanges(t *testing.T) {
	c := newTestCluster(t, time.Hour)
	c.start("n1", true)
	c.leader()
	c.addNode("n2")
	c.addNode("n3")
	c.mustPropose(metastate.CreateTopic{Name: "t", Partitions: 2, Type: metastate.TypeRaft3, Now: 7})
	l := c.leader()
	c.synced(l)
	time.Sleep(3 * cacheEvery) // the cache holds t with 2 partitions
	c.mustPropose(metastate.AlterTopic{Name: "t", Partitions: 4})
	l = c.leader()
	if tp, _ := l.State().Topic("t"); len(tp.Parts) != 4 {
		t.Fatalf("the leader shows %d partitions after AlterTopic", len(tp.Parts))
	}
	id := l.id
	c.stop(id) // at once: within cacheEvery of the change
	for _, other := range c.open() {
		c.stop(other)
	}
	m := c.start(id, false) // alone: no quorum, it shows its cache
	time.Sleep(200 * time.Millisecond)
	if tp, ok := m.State().Topic("t"); !ok || len(tp.Parts) != 4 {
		t.Fatalf("%s applied AlterTopic to 4 partitions before it closed; restarted, it shows %d (state index %d)", id, len(tp.Parts), m.State().Index())
	}
}
