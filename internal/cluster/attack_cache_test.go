package cluster

import (
	"os"
	"path/filepath"
	"testing"
)

// foreignCache writes, in dir, the state cache of another cluster: a
// topic "ghost" at log index 1000.
func foreignCache(t *testing.T, dir string) {
	t.Helper()
	s, _, err := newState().apply(999, RegisterNode{ID: "other", Addr: "10.9.9.9:1"})
	if err != nil {
		t.Fatal(err)
	}
	s, _, err = s.apply(1000, CreateTopic{Name: "ghost", Partitions: 4, Type: 1, Replicas: 1, Now: 1})
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

// TestAttack_FreshClusterAdoptsOldCacheAfterQuickRestart attacks "a fresh
// cluster in a reused directory is not confused by an old cache".
//
// OpenMeta ignores a cache left beside no raft state, but leaves the file
// in place; it is replaced only by cacheLoop, cacheEvery after the first
// applied change. A fresh node that stops (or crashes) before that has raft
// state (its bootstrap configuration) beside the old cache, so its next
// open seeds the old cluster's State, at index 1000, and shows it (topic
// "ghost", node "other") until its own log reaches index 1000.
// FAILS: the restarted fresh node shows the old cluster's topic.
func TestAttack_FreshClusterAdoptsOldCacheAfterQuickRestart(t *testing.T) {
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
