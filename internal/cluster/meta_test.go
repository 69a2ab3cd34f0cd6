package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/testlog"
)

// waitFor is the deadline of every wait in these tests: generous, since the
// machine is small and shared and -race slows raft down; a healthy run
// takes a fraction of it.
const waitFor = 30 * time.Second

// testCluster is a metadata group on raft's in-memory transport; node i is
// "n<i>", its address is its id.
type testCluster struct {
	t       testing.TB
	session time.Duration
	mu      sync.Mutex // guards the maps: the heartbeat goroutine reads metas
	root    string     // made before the cleanup that stops the nodes, so removed after it
	dirs    map[string]string
	trans   map[string]*raft.InmemTransport
	metas   map[string]*Meta
	logs    map[string]*testlog.Lines
}

func newTestCluster(t testing.TB, session time.Duration) *testCluster {
	c := &testCluster{
		t:       t,
		session: session,
		root:    t.TempDir(),
		dirs:    map[string]string{},
		trans:   map[string]*raft.InmemTransport{},
		metas:   map[string]*Meta{},
		logs:    map[string]*testlog.Lines{},
	}
	t.Cleanup(func() {
		for _, id := range c.open() {
			c.stop(id)
		}
	})
	return c
}

// start opens node id (from its directory if it ran before) on a new
// transport connected both ways to every running node.
func (c *testCluster) start(id string, bootstrap bool) *Meta {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	dir, ok := c.dirs[id]
	if !ok {
		dir = filepath.Join(c.root, id)
		c.dirs[id] = dir
	}
	_, tr := raft.NewInmemTransport(raft.ServerAddress(id))
	for peer, ptr := range c.trans {
		tr.Connect(raft.ServerAddress(peer), ptr)
		ptr.Connect(raft.ServerAddress(id), tr)
	}
	c.trans[id] = tr
	h := &testlog.Lines{}
	c.logs[id] = h
	m, err := OpenMeta(MetaConfig{
		NodeID:             id,
		Dir:                dir,
		Transport:          tr,
		Logger:             slog.New(h),
		Bootstrap:          bootstrap,
		HeartbeatTimeout:   100 * time.Millisecond,
		ElectionTimeout:    100 * time.Millisecond,
		LeaderLeaseTimeout: 50 * time.Millisecond,
		CommitTimeout:      5 * time.Millisecond,
		TrailingLogs:       4,
		SessionTimeout:     c.session,
	})
	if err != nil {
		c.t.Fatalf("open %s: %v", id, err)
	}
	c.metas[id] = m
	return m
}

// stop closes node id and cuts it off the others' transports.
func (c *testCluster) stop(id string) {
	c.t.Helper()
	c.mu.Lock()
	m := c.metas[id]
	delete(c.metas, id)
	tr := c.trans[id]
	delete(c.trans, id)
	for _, ptr := range c.trans {
		ptr.Disconnect(raft.ServerAddress(id))
	}
	c.mu.Unlock()
	if err := m.Close(); err != nil {
		c.t.Errorf("close %s: %v", id, err)
	}
	_ = tr.Close()
}

func (c *testCluster) open() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id := range c.metas {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (c *testCluster) meta(id string) *Meta {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.metas[id]
}

// leader waits for a running node that is the leader and has applied its
// own registration.
func (c *testCluster) leader() *Meta {
	c.t.Helper()
	var m *Meta
	eventually(c.t, "a leader", func() bool {
		for _, id := range c.open() {
			if x := c.meta(id); x != nil && x.IsLeader() {
				if n, ok := x.State().Node(id); ok && n.Up {
					m = x
					return true
				}
			}
		}
		return false
	})
	return m
}

// propose applies cmd on whichever node leads, retrying while leadership
// moves. After an unknown outcome the retry may find cmd applied already:
// then the error says so (ErrTopicExists, ErrNotRevoking, …) and applied
// is true.
func (c *testCluster) propose(cmd metastate.Command) (res metastate.Result, applied bool, err error) {
	c.t.Helper()
	eventually(c.t, fmt.Sprintf("%T applied", cmd), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err = c.leader().Propose(ctx, cmd)
		if errors.Is(err, ErrUnknownOutcome) {
			applied = true
			return false
		}
		return !errors.Is(err, ErrNotLeader)
	})
	return res, applied, err
}

// mustPropose applies cmd, failing the test on an error other than one
// saying that an earlier attempt with an unknown outcome applied it.
func (c *testCluster) mustPropose(cmd metastate.Command) metastate.Result {
	c.t.Helper()
	res, applied, err := c.propose(cmd)
	if err != nil && !(applied && (errors.Is(err, metastate.ErrTopicExists) || errors.Is(err, metastate.ErrNotRevoking))) {
		c.t.Fatalf("%T %+v: %v", cmd, cmd, err)
	}
	return res
}

// addNode starts node id and adds it through the leader.
func (c *testCluster) addNode(id string) *Meta {
	c.t.Helper()
	m := c.start(id, false)
	eventually(c.t, "add "+id, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := c.leader().AddNode(ctx, metastate.RegisterNode{ID: id, Addr: id})
		return err == nil
	})
	return m
}

// synced waits until every running node's state encodes like want's.
func (c *testCluster) synced(want *Meta) {
	c.t.Helper()
	eventually(c.t, "states equal", func() bool {
		w, err := metastate.EncodeSnapshot(want.State())
		if err != nil {
			c.t.Fatal(err)
		}
		for _, id := range c.open() {
			g, err := metastate.EncodeSnapshot(c.meta(id).State())
			if err != nil {
				c.t.Fatal(err)
			}
			if !bytes.Equal(g, w) {
				return false
			}
		}
		return true
	})
}

// heartbeat sends the heartbeats of nodes ids every 100 ms to whichever
// open node leads, but for the ids made silent (their sessions expire),
// until the test ends.
func (c *testCluster) heartbeat(ids ...string) *beats {
	b := &beats{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			for _, id := range c.open() {
				m := c.meta(id)
				if m == nil || !m.IsLeader() {
					continue
				}
				for _, n := range ids {
					b.mu.Lock()
					if _, ok := b.silent.Load(n); !ok {
						_ = m.Heartbeat(n)
					}
					b.mu.Unlock()
				}
			}
		}
	}()
	c.t.Cleanup(func() { close(stop); wg.Wait() })
	return b
}

// beats are the silent nodes of heartbeat.
type beats struct {
	silent sync.Map
	mu     sync.Mutex // held by each heartbeat call
}

// Store makes node id silent, once any heartbeat of id under way ended: a
// heartbeat begun before, and slowed past the session, would otherwise
// bring id back up after its session expired.
func (b *beats) Store(id string, _ bool) {
	b.silent.Store(id, true)
	b.mu.Lock()
	defer b.mu.Unlock()
}

// Delete has node id heartbeat again.
func (b *beats) Delete(id string) { b.silent.Delete(id) }

// eventually polls cond until it holds or waitFor passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMeta_Cluster(t *testing.T) {
	c := newTestCluster(t, time.Hour)
	c.start("n1", true)
	l := c.leader()
	if id, addr := l.Leader(); id != "n1" || addr != "n1" {
		t.Fatalf("leader %s at %s", id, addr)
	}
	c.addNode("n2")
	c.addNode("n3")
	res, _, err := c.propose(metastate.CreateTopic{Name: "t", Partitions: 3, Type: metastate.TypeRaft3, Now: 7})
	if err != nil || len(res.Topic.Parts) != 3 {
		t.Fatalf("create: %+v, %v", res, err)
	}
	c.synced(l)
	for _, id := range []string{"n2", "n3"} {
		tp, ok := c.meta(id).State().Topic("t")
		if !ok || len(tp.Parts) != 3 || tp.Created != 7 {
			t.Fatalf("%s: topic %+v %t", id, tp, ok)
		}
	}
	if _, _, err := c.propose(metastate.CreateTopic{Name: "t", Partitions: 3, Type: metastate.TypeRaft3}); !errors.Is(err, metastate.ErrTopicExists) {
		t.Fatalf("second create: %v", err)
	}
	// raft's own logs go through the slog bridge.
	if len(c.logs["n1"].Matching("entering leader state")) == 0 {
		t.Error("raft's log did not reach the slog logger")
	}

	t.Run("ErrNotLeader", func(t *testing.T) {
		var f *Meta
		for _, id := range c.open() {
			if m := c.meta(id); !m.IsLeader() {
				f = m
			}
		}
		lid, laddr := c.leader().Leader()
		_, err := f.Propose(context.Background(), metastate.CreateTopic{Name: "u", Partitions: 1, Type: metastate.TypeSingle})
		var nl *NotLeaderError
		if !errors.Is(err, ErrNotLeader) || !errors.As(err, &nl) || nl.LeaderID != lid || nl.LeaderAddr != laddr {
			t.Fatalf("propose on a follower: %v", err)
		}
		if err := f.AddNode(context.Background(), metastate.RegisterNode{ID: "n9", Addr: "n9"}); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("AddNode on a follower: %v", err)
		}
		if err := f.Heartbeat("n1"); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("Heartbeat on a follower: %v", err)
		}
	})

	t.Run("LeaderKilled", func(t *testing.T) {
		old := c.leader()
		oldID, _ := old.Leader()
		c.stop(oldID)
		nl := c.leader()
		if id, _ := nl.Leader(); id == oldID {
			t.Fatalf("leader still %s", id)
		}
		c.mustPropose(metastate.CreateTopic{Name: "after-kill", Partitions: 1, Type: metastate.TypeSingle})

		// The old leader restarts from its directory and catches up.
		c.start(oldID, true) // has state: Bootstrap does nothing
		c.synced(c.leader())
		if _, ok := c.meta(oldID).State().Topic("after-kill"); !ok {
			t.Fatal("restarted node lacks the topic created while it was down")
		}
	})
}

// TestMeta_Restart stops a follower after it took a snapshot, moves the
// leader's log past a snapshot of its own (so the follower needs
// InstallSnapshot), restarts the follower and checks it reaches the same
// state.
func TestMeta_Restart(t *testing.T) {
	c := newTestCluster(t, time.Hour)
	c.start("n1", true)
	c.leader()
	c.addNode("n2")
	c.addNode("n3")
	c.mustPropose(metastate.CreateTopic{Name: "a", Partitions: 2, Type: metastate.TypeSingle})
	c.mustPropose(metastate.JoinGroup{Topic: "a", Group: "g", Member: "m1", Node: "n2"})
	c.synced(c.leader())

	f := "n3"
	if id, _ := c.leader().Leader(); id == f {
		f = "n2"
	}
	if err := c.meta(f).raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on %s: %v", f, err)
	}
	c.stop(f)
	for i := range 10 {
		c.mustPropose(metastate.CreateTopic{Name: fmt.Sprintf("b%d", i), Partitions: 1, Type: metastate.TypeSingle})
	}
	c.mustPropose(metastate.SetACL{Rules: []metastate.Rule{{Identity: "*", Topic: "*", Rights: metastate.RightConsume}}})
	if err := c.leader().raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on the leader: %v", err)
	}
	m := c.start(f, false)
	if len(c.logs[f].Matching("restored from snapshot")) == 0 {
		t.Errorf("%s did not restore its own snapshot at start", f)
	}
	c.synced(c.leader())
	if len(c.logs[f].Matching("copied to local snapshot")) == 0 {
		t.Errorf("%s caught up without installing the leader's snapshot", f)
	}
	if len(m.State().Topics()) != 11 || len(m.State().ACL()) != 1 {
		t.Fatalf("restarted %s: topics %v acl %v", f, m.State().Topics(), m.State().ACL())
	}
}

// TestMeta_SessionExpiry: nodes heartbeat the leader; when n3 stops, the
// leader marks it down, its group member leaves and its partitions go to
// the member on n2, while n3's placement stays. AddNode brings it back.
func TestMeta_SessionExpiry(t *testing.T) {
	c := newTestCluster(t, 2*time.Second)
	c.start("n1", true)
	c.leader()
	c.addNode("n2")
	c.addNode("n3")

	silent := c.heartbeat("n1", "n2", "n3")

	c.mustPropose(metastate.CreateTopic{Name: "t", Partitions: 4, Type: metastate.TypeSingle})
	c.mustPropose(metastate.JoinGroup{Topic: "t", Group: "g", Member: "m2", Node: "n2"})
	c.mustPropose(metastate.JoinGroup{Topic: "t", Group: "g", Member: "m3", Node: "n3"})
	// m2's node hands over what is revoked from it.
	s := c.leader().State()
	gen, rev := s.Revoking("t", "g", "m2")
	for _, p := range rev {
		c.mustPropose(metastate.Released{Topic: "t", Group: "g", Partition: p, Member: "m2", Generation: gen})
	}
	s = c.leader().State()
	if _, p := s.Assignment("t", "g", "m3"); len(p) != 2 {
		t.Fatalf("m3 owns %v", p)
	}
	before, _ := s.Topic("t")

	// Heartbeats (every 100 ms) keep n3 up well past the timeout. A sleep,
	// since what is checked is that nothing happens.
	time.Sleep(3 * time.Second)
	if n, _ := c.leader().State().Node("n3"); !n.Up {
		t.Fatal("n3 marked down while heartbeating")
	}

	silent.Store("n3", true)
	eventually(t, "n3 marked down", func() bool {
		n, _ := c.leader().State().Node("n3")
		return !n.Up
	})
	s = c.leader().State()
	if _, p := s.Assignment("t", "g", "m2"); !slices.Equal(p, []int{0, 1, 2, 3}) {
		t.Fatalf("m2 owns %v after n3 went down", p)
	}
	if g, _ := s.Group("t", "g"); len(g.Members) != 1 {
		t.Fatalf("members %v", g.Members)
	}
	after, _ := s.Topic("t")
	if !slices.EqualFunc(replicas(before), replicas(after), slices.Equal) {
		t.Fatalf("placement moved: %v → %v", replicas(before), replicas(after))
	}
	if err := c.leader().Heartbeat("n3"); !errors.Is(err, metastate.ErrNodeDown) {
		t.Fatalf("heartbeat of a down node: %v", err)
	}
	if err := c.leader().Heartbeat("n9"); !errors.Is(err, metastate.ErrNoNode) {
		t.Fatalf("heartbeat of an unknown node: %v", err)
	}

	// n3 registers again: up, with a new session.
	silent.Delete("n3")
	eventually(t, "n3 re-added", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.leader().AddNode(ctx, metastate.RegisterNode{ID: "n3", Addr: "n3"}) == nil
	})
	if n, _ := c.leader().State().Node("n3"); !n.Up || n.Session != 2 {
		t.Fatalf("n3 %+v", n)
	}
}

// TestMeta_RegistrationIsASignOfLife: a node registering again while its
// session is up (a process restarted within its session) keeps that
// session, and the leader counts the registration as a heartbeat: the
// session does not expire on the last heartbeat of the process before.
func TestMeta_RegistrationIsASignOfLife(t *testing.T) {
	const timeout = 2 * time.Second
	c := newTestCluster(t, timeout)
	c.start("n1", true)
	c.leader()
	c.addNode("n2") // n2 never heartbeats
	// Sleeps, since what is checked is that nothing happens in time.
	time.Sleep(timeout * 3 / 4)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.leader().AddNode(ctx, metastate.RegisterNode{ID: "n2", Addr: "n2"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(timeout * 3 / 4)
	if n, _ := c.leader().State().Node("n2"); !n.Up || n.Session != 1 {
		t.Fatalf("n2 registered again %v ago: %+v", timeout*3/4, n)
	}
	eventually(t, "n2 marked down a timeout after its registration", func() bool {
		n, _ := c.leader().State().Node("n2")
		return !n.Up
	})
}

// TestMeta_Voters: a sixth node joins as a nonvoter.
func TestMeta_Voters(t *testing.T) {
	c := newTestCluster(t, time.Hour)
	c.start("n1", true)
	c.leader()
	for i := 2; i <= 6; i++ {
		c.addNode(fmt.Sprintf("n%d", i))
	}
	eventually(t, "six servers", func() bool { // AddNode starts the change, and does not wait
		return len(c.leader().raft.GetConfiguration().Configuration().Servers) == 6
	})
	cf := c.leader().raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		t.Fatal(err)
	}
	var voters, nonvoters []string
	for _, srv := range cf.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters = append(voters, string(srv.ID))
		} else {
			nonvoters = append(nonvoters, string(srv.ID))
		}
	}
	slices.Sort(voters)
	if !slices.Equal(voters, []string{"n1", "n2", "n3", "n4", "n5"}) || !slices.Equal(nonvoters, []string{"n6"}) {
		t.Fatalf("voters %v nonvoters %v", voters, nonvoters)
	}
	c.synced(c.leader())
	for _, n := range c.leader().State().Nodes() {
		if n.Voter != (n.ID != "n6") || !n.Up {
			t.Fatalf("node %+v", n)
		}
	}
}

func TestMeta_Close(t *testing.T) {
	c := newTestCluster(t, time.Hour)
	m := c.start("n1", true)
	c.leader()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Propose(ctx, metastate.CreateTopic{Name: "t", Partitions: 1, Type: metastate.TypeSingle}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}()
	}
	wg.Wait()
	if _, err := m.Propose(context.Background(), metastate.CreateTopic{Name: "t", Partitions: 1, Type: metastate.TypeSingle}); !errors.Is(err, ErrClosed) {
		t.Fatalf("propose after close: %v", err)
	}
	if err := m.AddNode(context.Background(), metastate.RegisterNode{ID: "n2", Addr: "n2"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("AddNode after close: %v", err)
	}
	if err := m.Heartbeat("n1"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Heartbeat after close: %v", err)
	}
	if _, ok := m.State().Node("n1"); !ok {
		t.Fatal("State after close lost the last state")
	}
}

func TestOpenMeta_Invalid(t *testing.T) {
	_, tr := raft.NewInmemTransport("")
	defer tr.Close()
	for _, tc := range []struct {
		name string
		cfg  MetaConfig
	}{
		{"NoID", MetaConfig{Dir: t.TempDir(), Transport: tr}},
		{"BadID", MetaConfig{NodeID: "a/b", Dir: t.TempDir(), Transport: tr}},
		{"NoDir", MetaConfig{NodeID: "a", Transport: tr}},
		{"NoTransport", MetaConfig{NodeID: "a", Dir: t.TempDir()}},
		{"LeaseAboveHeartbeat", MetaConfig{NodeID: "a", Dir: t.TempDir(), Transport: tr,
			HeartbeatTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if m, err := OpenMeta(tc.cfg); !errors.Is(err, metastate.ErrInvalid) {
				if m != nil {
					m.Close()
				}
				t.Fatalf("err %v", err)
			}
		})
	}
}

// isolate cuts node id off every other node, both ways.
func (c *testCluster) isolate(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trans[id].DisconnectAll()
	for peer, ptr := range c.trans {
		if peer != id {
			ptr.Disconnect(raft.ServerAddress(id))
		}
	}
}

// heal connects every pair of running nodes.
func (c *testCluster) heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, ta := range c.trans {
		for b, tb := range c.trans {
			if a != b {
				ta.Connect(raft.ServerAddress(b), tb)
			}
		}
	}
}

// TestMeta_UnknownOutcome: a leader cut off from its followers takes a
// command it cannot commit; Propose reports the outcome unknown (leadership
// lost, or ctx ended), never a plain failure, and after healing every node
// agrees on whether it was applied.
func TestMeta_UnknownOutcome(t *testing.T) {
	c := newTestCluster(t, time.Hour)
	c.start("n1", true)
	c.leader()
	c.addNode("n2")
	c.addNode("n3")
	var err error
	for attempt := 0; ; attempt++ {
		l := c.leader()
		id, _ := l.Leader()
		c.isolate(id)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = l.Propose(ctx, metastate.CreateTopic{Name: fmt.Sprintf("cut%d", attempt), Partitions: 1, Type: metastate.TypeSingle})
		cancel()
		c.heal()
		if errors.Is(err, ErrUnknownOutcome) {
			break
		}
		// The leader stepped down before it took the command: try again.
		if !errors.Is(err, ErrNotLeader) || attempt == 20 {
			t.Fatalf("propose on an isolated leader: %v", err)
		}
	}
	c.mustPropose(metastate.CreateTopic{Name: "healed", Partitions: 1, Type: metastate.TypeSingle})
	c.synced(c.leader())
}

func TestMeta_Watch(t *testing.T) {
	c := newTestCluster(t, time.Hour)
	c.start("n1", true)
	c.leader()
	f := c.addNode("n2")
	c.synced(c.leader())
	s := f.State()
	ch := f.Watch()
	c.mustPropose(metastate.CreateTopic{Name: "w", Partitions: 1, Type: metastate.TypeSingle})
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatal("Watch not closed by an applied command")
	}
	select {
	case <-s.Changed():
	default:
		t.Fatal("the older State's Changed is not closed")
	}
	if _, ok := s.Topic("w"); ok {
		t.Fatal("an older State changed")
	}
	eventually(t, "topic on the follower", func() bool {
		_, ok := f.State().Topic("w")
		return ok
	})
}

func TestOpenMeta_Dir(t *testing.T) {
	open := func(dir string) (*Meta, *raft.InmemTransport, error) {
		_, tr := raft.NewInmemTransport("n1")
		m, err := OpenMeta(MetaConfig{NodeID: "n1", Dir: dir, Transport: tr, Bootstrap: true,
			HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond})
		if err != nil {
			_ = tr.Close()
		}
		return m, tr, err
	}
	t.Run("InUse", func(t *testing.T) {
		dir := t.TempDir()
		m, _, err := open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if m2, _, err := open(dir); err == nil {
			m2.Close()
			t.Fatal("a second Meta opened the same directory")
		}
	})
	t.Run("ErrCorrupt", func(t *testing.T) {
		dir := t.TempDir()
		m, _, err := open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "raft.db")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i := 4096; i < len(b); i++ { // keep meta page 0, damage the rest
			b[i] ^= 0x5a
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if m, _, err := open(dir); !errors.Is(err, metastate.ErrCorrupt) {
			if m != nil {
				m.Close()
			}
			t.Fatalf("damaged raft.db: %v", err)
		}
	})
}

// replicas is the placement of t: the replicas of each partition.
func replicas(t metastate.Topic) [][]string {
	var out [][]string
	for _, p := range t.Parts {
		out = append(out, p.Replicas)
	}
	return out
}
