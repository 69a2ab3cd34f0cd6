package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/store"
)

const t0 = int64(1_700_000_000_000_000_000)

// patience bounds every wait for something that must happen.
const patience = 20 * time.Second

// testRaftConfig has timeouts short enough for failover tests and long
// enough that a loaded machine (-race, parallel cases) keeps its leader.
func testRaftConfig() *raft.Config {
	return raftConfig(200 * time.Millisecond)
}

// stableConfig is for tests that need one leader throughout: under fsync
// load (CI beside) and -race, 200 ms leases were lost, which the proposer
// rightly reports as ErrUnknownOutcome.
func stableConfig() *raft.Config {
	return raftConfig(time.Second)
}

func raftConfig(timeout time.Duration) *raft.Config {
	c := raft.DefaultConfig()
	c.HeartbeatTimeout = timeout
	c.ElectionTimeout = timeout
	c.LeaderLeaseTimeout = timeout
	c.CommitTimeout = 5 * time.Millisecond
	c.MaxAppendEntries = 256
	return c
}

// cluster is a group of three replicas on raft's in-memory transport, each
// in a directory of its own.
type cluster struct {
	t      testing.TB
	conf   *raft.Config
	mu     sync.Mutex // guards groups and trans
	dirs   []string
	ids    []raft.ServerID
	addrs  []raft.ServerAddress
	trans  []*raft.InmemTransport
	groups []*Group // nil while a replica is down
	// wals are the replicas' write-ahead logs, which hold their raft logs
	// (WALLog) as a node's does; with boltLog set, raft.db holds them.
	wals    []*store.WAL
	boltLog bool
	parts   int // partitions of the group (Config.Partitions)
}

func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	return newClusterWith(t, n, testRaftConfig())
}

func newClusterWith(t testing.TB, n int, conf *raft.Config) *cluster {
	t.Helper()
	return newClusterIn(t, t.TempDir(), n, conf)
}

// newClusterIn opens (creating or reopening) the replicas kept in base.
func newClusterIn(t testing.TB, base string, n int, conf *raft.Config) *cluster {
	t.Helper()
	return newClusterOpts(t, base, n, conf, false, 1)
}

// newClusterOpts is newClusterIn with the raft logs in raft.db if boltLog,
// and parts partitions in the group.
func newClusterOpts(t testing.TB, base string, n int, conf *raft.Config, boltLog bool, parts int) *cluster {
	t.Helper()
	c := &cluster{t: t, conf: conf, boltLog: boltLog, parts: parts}
	for i := range n {
		c.dirs = append(c.dirs, filepath.Join(base, fmt.Sprintf("r%d", i)))
		c.ids = append(c.ids, raft.ServerID(fmt.Sprintf("r%d", i)))
		c.addrs = append(c.addrs, raft.ServerAddress(fmt.Sprintf("addr-r%d", i)))
	}
	c.trans = make([]*raft.InmemTransport, n)
	c.groups = make([]*Group, n)
	c.wals = make([]*store.WAL, n)
	t.Cleanup(c.close)
	for i := range n {
		c.start(i)
	}
	var servers []raft.Server
	for i := range n {
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: c.ids[i], Address: c.addrs[i]})
	}
	if err := c.groups[0].Bootstrap(servers); err != nil {
		t.Fatalf("Bootstrap: %v", err)
	}
	return c
}

// start opens replica i from its directory and connects it to the live ones.
func (c *cluster) start(i int) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	cfg := Config{ID: c.ids[i], Dir: c.dirs[i], Transport: c.inmem(i), Raft: c.conf, Partitions: c.parts}
	if !c.boltLog {
		w, l, err := openNodeLog(filepath.Join(c.dirs[i], "wal"))
		if err != nil {
			c.t.Fatalf("open the log of %s: %v", c.ids[i], err)
		}
		c.wals[i], cfg.LogStore = w, l
	}
	g, err := Open(cfg)
	if err != nil {
		c.t.Fatalf("Open %s: %v", c.ids[i], err)
	}
	c.groups[i] = g
}

// inmem makes replica i's in-memory transport, connected to the live
// replicas. c.mu is held.
func (c *cluster) inmem(i int) *raft.InmemTransport {
	_, tr := raft.NewInmemTransportWithTimeout(c.addrs[i], 500*time.Millisecond)
	for j, other := range c.trans {
		if j != i && other != nil && c.groups[j] != nil {
			tr.Connect(c.addrs[j], other)
			other.Connect(c.addrs[i], tr)
		}
	}
	c.trans[i] = tr
	return tr
}

// openNodeLog opens a WAL in dir holding one group's log, as a node opens
// its WAL and the logs of its groups before FinishRecovery.
func openNodeLog(dir string) (*store.WAL, *WALLog, error) {
	return openNodeLogWith(dir, store.WALOptions{}, "group")
}

// openNodeLogWith is openNodeLog with the WAL's options and the log's
// stream.
func openNodeLogWith(dir string, opts store.WALOptions, stream string) (*store.WAL, *WALLog, error) {
	w, err := store.OpenWAL(dir, opts)
	if err != nil {
		return nil, nil, err
	}
	l, err := OpenWALLog(w, stream)
	if err == nil {
		err = w.FinishRecovery()
	}
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	return w, l, nil
}

// stop closes replica i and cuts it from the others.
func (c *cluster) stop(i int) {
	c.t.Helper()
	c.mu.Lock()
	g, w := c.groups[i], c.wals[i]
	c.groups[i], c.wals[i] = nil, nil
	for j, other := range c.trans {
		if j != i && other != nil {
			other.Disconnect(c.addrs[i])
		}
	}
	c.mu.Unlock()
	if g != nil {
		if err := g.Close(); err != nil {
			c.t.Errorf("Close %s: %v", c.ids[i], err)
		}
	}
	if w != nil {
		if err := w.Close(); err != nil {
			c.t.Errorf("Close the WAL of %s: %v", c.ids[i], err)
		}
	}
}

func (c *cluster) close() {
	for i := range c.groups {
		c.stop(i)
	}
}

func (c *cluster) group(i int) *Group {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.groups[i]
}

// leader waits until exactly one live replica leads and returns it.
func (c *cluster) leader() int {
	c.t.Helper()
	deadline := time.Now().Add(patience)
	for time.Now().Before(deadline) {
		n, at := 0, -1
		for i := range c.groups {
			if g := c.group(i); g != nil && g.State() == raft.Leader {
				n, at = n+1, i
			}
		}
		if n == 1 {
			return at
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("no single leader within %v", patience)
	return -1
}

// apply runs cmd (stamped t0 if its Now is zero) through whoever leads,
// retrying as send does: cmd must be one that a second apply leaves as the
// first left it.
func (c *cluster) apply(ctx context.Context, cmd store.Command) (store.Result, error) {
	return c.applyTo(ctx, 0, cmd)
}

// applyTo is apply for the group's partition part.
func (c *cluster) applyTo(ctx context.Context, part int, cmd store.Command) (store.Result, error) {
	if cmd.Now == 0 {
		cmd.Now = t0
	}
	for {
		if err := ctx.Err(); err != nil {
			return store.Result{}, err
		}
		for i := range c.groups {
			g := c.group(i)
			if g == nil {
				continue
			}
			res, err := g.ApplyTo(ctx, part, &cmd)
			if err == nil {
				return res, nil
			}
			if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrUnknownOutcome) && !errors.Is(err, ErrClosed) {
				return res, err
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// send appends msgs through whoever leads, retrying on ErrNotLeader and
// ErrUnknownOutcome with the same message IDs (the store deduplicates them),
// and returns the result of the attempt that got one.
func (c *cluster) send(ctx context.Context, msgs ...store.Message) (store.Result, error) {
	return c.apply(ctx, store.Command{Op: store.OpAppend, Msgs: msgs})
}

// log returns replica i's whole log.
func (c *cluster) log(i int) []store.Message {
	c.t.Helper()
	return c.logOf(i, 0)
}

// logOf returns the whole log of replica i's partition part.
func (c *cluster) logOf(i, part int) []store.Message {
	c.t.Helper()
	p, err := c.group(i).Partition(part)
	if err != nil {
		c.t.Fatalf("Partition %s: %v", c.ids[i], err)
	}
	st := p.Stats()
	got, err := p.Read(st.Low, int(st.Next-st.Low)+1, 0, nil)
	if err != nil {
		c.t.Fatalf("Read %s: %v", c.ids[i], err)
	}
	return got
}

// waitNext waits until replica i's log ends at next.
func (c *cluster) waitNext(i int, next uint64) {
	c.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		p, err := c.group(i).Partition(0)
		if err == nil && p.Stats().Next == next {
			return
		}
		if time.Now().After(deadline) {
			var got uint64
			if p != nil {
				got = p.Stats().Next
			}
			c.t.Fatalf("%s: log ends at %d, want %d (err %v)", c.ids[i], got, next, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// identical checks that the live replicas hold the same log, once each
// holds next messages.
func (c *cluster) identical(next uint64) []store.Message {
	c.t.Helper()
	var want []store.Message
	first := -1
	for i := range c.groups {
		if c.group(i) == nil {
			continue
		}
		c.waitNext(i, next)
		got := c.log(i)
		if first < 0 {
			want, first = got, i
			continue
		}
		if !reflect.DeepEqual(got, want) {
			c.t.Fatalf("%s and %s hold different logs (%d and %d messages)", c.ids[first], c.ids[i], len(want), len(got))
		}
	}
	return want
}

func msg(id string) store.Message {
	return store.Message{ID: id, Key: "k", Body: []byte("body-" + id), Timestamp: t0}
}

// isolate cuts replica i from the others, both ways.
func (c *cluster) isolate(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for j, other := range c.trans {
		if j != i && other != nil {
			other.Disconnect(c.addrs[i])
			c.trans[i].Disconnect(c.addrs[j])
		}
	}
}

// heal connects replica i to the live others again.
func (c *cluster) heal(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for j, other := range c.trans {
		if j != i && other != nil && c.groups[j] != nil {
			other.Connect(c.addrs[i], c.trans[i])
			c.trans[i].Connect(c.addrs[j], other)
		}
	}
}

// sendFresh appends a message marked FreshID (its dedup lookup skipped):
// a second application of its entry would store it twice, so the tests
// that restart use it to see that nothing is applied again. A FreshID send
// must not simply be retried: after ErrUnknownOutcome it is resolved from
// the new leader's log (after its barrier every entry that can still commit
// has), and sent again only if absent. ErrNotLeader proposed nothing.
func (c *cluster) sendFresh(id string) store.Result {
	c.t.Helper()
	m := msg(id)
	m.FreshID = true
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for {
		g := c.group(c.leader())
		res, err := g.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{m}})
		switch {
		case err == nil:
			return res
		case errors.Is(err, ErrNotLeader):
			continue
		case !errors.Is(err, ErrUnknownOutcome):
			c.t.Fatalf("send %s: %v", id, err)
		}
		c.t.Logf("send %s: %v; resolving it from the log", id, err)
		for {
			p, err := c.group(c.leader()).LeaderPartition(ctx, 0)
			if errors.Is(err, ErrNotLeader) {
				continue
			}
			if err != nil {
				c.t.Fatalf("resolve %s: %v", id, err)
			}
			st := p.Stats()
			log, err := p.Read(st.Low, int(st.Next-st.Low)+1, 0, nil)
			if err != nil {
				c.t.Fatalf("resolve %s: %v", id, err)
			}
			for _, stored := range log {
				if stored.ID == id {
					return store.Result{Acks: []store.Ack{{Offset: stored.Offset}}}
				}
			}
			break // not committed, and never will be: send again
		}
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ids(msgs []store.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = fmt.Sprintf("%d:%s", m.Offset, m.ID)
	}
	return out
}

// copyDir copies the tree at src to dst.
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
