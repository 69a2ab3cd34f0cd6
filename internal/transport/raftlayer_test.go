package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/yamux"
	"go.uber.org/goleak"

	"github.com/zeze-go/mq/internal/fuzzseed"
)

// waitFor is how long the raft tests wait for anything: generous, the
// machine is small and shared and the race detector is on.
const waitFor = 90 * time.Second

// book is an address book for RaftMuxConfig.Resolve.
type book struct {
	mu    sync.Mutex
	addrs map[string]string // guarded by mu
}

func newBook() *book { return &book{addrs: make(map[string]string)} }

func (b *book) set(id, addr string) {
	b.mu.Lock()
	b.addrs[id] = addr
	b.mu.Unlock()
}

func (b *book) resolve(id string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	addr, ok := b.addrs[id]
	return addr, ok
}

// node is a transport and its raft mux; Cleanup closes both.
type node struct {
	id string
	t  *Transport
	m  *RaftMux
}

func newNode(t testing.TB, b *book, id string, cfg RaftMuxConfig) *node {
	t.Helper()
	tr := listen(t, Config{NodeID: id})
	cfg.Resolve = b.resolve
	m, err := NewRaftMux(tr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	b.set(id, tr.Addr().String())
	return &node{id: id, t: tr, m: m}
}

// stop closes n's mux and transport, as a node that goes away.
func (n *node) stop(t testing.TB) {
	t.Helper()
	if err := n.m.Close(); err != nil {
		t.Error(err)
	}
	if err := n.t.Close(); err != nil {
		t.Error(err)
	}
}

func layer(t testing.TB, n *node, group string) *RaftLayer {
	t.Helper()
	return layerOf(t, n, group, anyone)
}

// layerOf is n's layer of group, taking streams from the nodes member
// names.
func layerOf(t testing.TB, n *node, group string, member func(string) bool) *RaftLayer {
	t.Helper()
	l, err := n.m.Layer(group, LayerConfig{Member: member})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// countFSM counts distinct commands, so an Apply retried after an unknown
// outcome counts once.
type countFSM struct {
	mu   sync.Mutex
	seen map[string]struct{} // guarded by mu
}

func newCountFSM() *countFSM { return &countFSM{seen: make(map[string]struct{})} }

func (f *countFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[string(l.Data)] = struct{}{}
	return len(f.seen)
}

func (f *countFSM) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b []byte
	for k := range f.seen {
		b = append(append(b, k...), '\n')
	}
	return countSnapshot(b), nil
}

func (f *countFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	seen := make(map[string]struct{})
	sc := bufio.NewScanner(rc)
	for sc.Scan() {
		seen[sc.Text()] = struct{}{}
	}
	f.mu.Lock()
	f.seen = seen
	f.mu.Unlock()
	return sc.Err()
}

type countSnapshot []byte

func (s countSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (countSnapshot) Release() {}

// stores are a member's raft state; they outlive a restart.
type stores struct {
	logs  *raft.InmemStore
	snaps *raft.InmemSnapshotStore
}

func newStores() stores { return stores{raft.NewInmemStore(), raft.NewInmemSnapshotStore()} }

// member is one node's raft of one group.
type member struct {
	id  string
	r   *raft.Raft
	fsm *countFSM
}

// startMember starts n's raft of group over a new layer of n's mux, on st;
// it bootstraps with ids if there are any. Cleanup shuts it down.
func startMember(t testing.TB, n *node, group string, st stores, ids []string) *member {
	t.Helper()
	return startMemberOf(t, n, group, st, ids, anyone)
}

// startMemberOf is startMember on a layer that takes streams from the
// nodes member names.
func startMemberOf(t testing.TB, n *node, group string, st stores, ids []string, isMember func(string) bool) *member {
	t.Helper()
	return runMember(t, n, raft.NewNetworkTransport(layerOf(t, n, group, isMember), 3, 2*time.Second, io.Discard), st, ids)
}

// runMember starts n's raft over trans, on st; it bootstraps with ids if
// there are any. Cleanup shuts it down.
func runMember(t testing.TB, n *node, trans raft.Transport, st stores, ids []string) *member {
	t.Helper()
	c := raft.DefaultConfig()
	c.LocalID = raft.ServerID(n.id)
	c.HeartbeatTimeout = 500 * time.Millisecond
	c.ElectionTimeout = 500 * time.Millisecond
	c.LeaderLeaseTimeout = 250 * time.Millisecond
	c.CommitTimeout = 20 * time.Millisecond
	c.LogOutput = io.Discard
	c.LogLevel = "ERROR"
	fsm := newCountFSM()
	r, err := raft.NewRaft(c, fsm, st.logs, st.logs, st.snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{id: n.id, r: r, fsm: fsm}
	t.Cleanup(m.shutdown(t))
	if len(ids) > 0 {
		var cfg raft.Configuration
		for _, id := range ids {
			cfg.Servers = append(cfg.Servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id)})
		}
		if err := r.BootstrapCluster(cfg).Error(); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func (m *member) shutdown(t testing.TB) func() {
	return func() {
		if err := m.r.Shutdown().Error(); err != nil {
			t.Error(err)
		}
	}
}

// group starts group's raft on every node, bootstrapped with all of them.
func group(t testing.TB, nodes []*node, name string) []*member {
	t.Helper()
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.id)
	}
	var ms []*member
	for _, n := range nodes {
		ms = append(ms, startMember(t, n, name, newStores(), ids))
	}
	return ms
}

// waitLeader waits until one of ms is leader and returns it.
func waitLeader(t testing.TB, ms []*member) *member {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		for _, m := range ms {
			if m.r.State() == raft.Leader {
				return m
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no leader among %d members within %v", len(ms), waitFor)
	return nil
}

// apply applies n commands named prefix-i through whichever of ms leads,
// retrying each until it succeeds (the FSM counts a retried one once).
func apply(t testing.TB, ms []*member, prefix string, n int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for i := 0; i < n; i++ {
		cmd := []byte(fmt.Sprintf("%s-%d", prefix, i))
		for {
			err := waitLeader(t, ms).r.Apply(cmd, 5*time.Second).Error()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("apply %s: %v", cmd, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// waitCount waits until every FSM of ms counts want.
func waitCount(t testing.TB, ms []*member, want int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		var got []int
		done := true
		for _, m := range ms {
			got = append(got, m.fsm.count())
			done = done && got[len(got)-1] == want
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("FSM counts %v, want %d each", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// isolate cuts (or restores) every link of x, on both ends.
func isolate(nodes []*node, x *node, down bool) {
	for _, o := range nodes {
		if o != x {
			x.t.SetLinkDown(o.id, down)
			o.t.SetLinkDown(x.id, down)
		}
	}
}

func without(ms []*member, x *member) []*member {
	var out []*member
	for _, m := range ms {
		if m != x {
			out = append(out, m)
		}
	}
	return out
}

func nodeByID(nodes []*node, id string) *node {
	for _, n := range nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

func threeNodes(t testing.TB, b *book) []*node {
	t.Helper()
	return []*node{newNode(t, b, "n1", RaftMuxConfig{}), newNode(t, b, "n2", RaftMuxConfig{}), newNode(t, b, "n3", RaftMuxConfig{})}
}

// verifyNone checks for leaked goroutines once every other Cleanup ran.
func verifyNone(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// TestRaftMux_Cluster: two raft groups share three nodes' ports; both
// elect and replicate, the leader of g1 is isolated and replaced, and after
// the heal it catches up.
func TestRaftMux_Cluster(t *testing.T) {
	verifyNone(t)
	nodes := threeNodes(t, newBook())
	g1, g2 := group(t, nodes, "g1"), group(t, nodes, "g2")
	for _, g := range [][]*member{g1, g2} {
		apply(t, g, "before", 200)
	}
	waitCount(t, g1, 200)
	waitCount(t, g2, 200)

	old := waitLeader(t, g1)
	isolated := nodeByID(nodes, old.id)
	isolate(nodes, isolated, true)
	rest := without(g1, old)
	apply(t, rest, "isolated", 50) // through a new leader among rest
	waitCount(t, rest, 250)
	if n := old.fsm.count(); n != 200 {
		t.Fatalf("the isolated old leader applied %d commands, want 200", n)
	}

	isolate(nodes, isolated, false)
	waitCount(t, g1, 250)
	apply(t, g2, "healed", 50)
	waitCount(t, g2, 250)
}

// TestRaftMux_Restart: a node comes back on a new port with its raft state,
// behind the others' log (so it cannot lead); the leader's raft reaches it
// at its new address.
func TestRaftMux_Restart(t *testing.T) {
	verifyNone(t)
	b := newBook()
	nodes := threeNodes(t, b)
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.id)
	}
	st := []stores{newStores(), newStores(), newStores()}
	var g []*member
	for i, n := range nodes {
		g = append(g, startMember(t, n, "g", st[i], ids))
	}
	apply(t, g, "before", 20)
	waitCount(t, g, 20)

	oldAddr := nodes[2].t.Addr().String()
	g[2].shutdown(t)()
	nodes[2].stop(t)
	apply(t, g[:2], "while-down", 20)
	nodes[2] = newNode(t, b, "n3", RaftMuxConfig{})
	t.Logf("n3 moved from %s to %s", oldAddr, nodes[2].t.Addr())
	g[2] = startMember(t, nodes[2], "g", st[2], nil)
	waitCount(t, g, 40)
	apply(t, g, "after", 20)
	waitCount(t, g, 60)
}

// attacker is node "evil" with a yamux client session to n's raft port,
// opening streams by hand.
func attacker(t *testing.T, n *node) *yamux.Session {
	t.Helper()
	tr := listen(t, Config{NodeID: "evil"})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := tr.Dial(ctx, n.t.Addr().String(), ProtoRaft)
	if err != nil {
		t.Fatal(err)
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	s, err := yamux.Client(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRaftMux_HostileStreams(t *testing.T) {
	verifyNone(t)
	a := newNode(t, newBook(), "a", RaftMuxConfig{HeaderTimeout: 500 * time.Millisecond})
	l := layer(t, a, "g1")
	s := attacker(t, a)
	open := func(t *testing.T, first []byte) net.Conn {
		t.Helper()
		st, err := s.Open()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if len(first) > 0 {
			if _, err := st.Write(first); err != nil {
				t.Fatal(err)
			}
		}
		return st
	}
	// Opened first and never written: the valid streams below pass it.
	stalled := open(t, nil)
	cases := []struct {
		name  string
		bytes []byte
	}{
		{"UnknownGroup", appendStreamHeader(nil, "nope")},
		{"EmptyGroup", []byte{0}},
		{"LongGroup", append([]byte{0x80, 0x02}, bytes.Repeat([]byte("x"), 256)...)},
		{"NonMinimalLength", []byte{0x82, 0x00, 'g', '1'}},
		{"HugeLength", []byte{0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"TruncatedThenStalled", []byte{0x05, 'g'}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			waitClosed(t, open(t, c.bytes), waitFor)
		})
	}
	t.Run("ValidStillWorks", func(t *testing.T) {
		ping := encodeRPC(t, 3, &raft.TimeoutNowRequest{RPCHeader: header("evil")}, nil)
		st := open(t, append(appendStreamHeader(nil, "g1"), ping...))
		got, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer got.Close()
		if got.RemoteAddr().String() != "evil" || got.LocalAddr().String() != "a" {
			t.Fatalf("stream from %s to %s, want evil to a", got.RemoteAddr(), got.LocalAddr())
		}
		buf := make([]byte, len(ping))
		if _, err := io.ReadFull(got, buf); err != nil || !bytes.Equal(buf, ping) {
			t.Fatalf("read %q, %v", buf, err)
		}
		buf = buf[:4]
		if _, err := got.Write([]byte("pong")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "pong" {
			t.Fatalf("read %q, %v", buf, err)
		}
	})
	t.Run("Stalled", func(t *testing.T) { waitClosed(t, stalled, waitFor) })
	if s.IsClosed() {
		t.Fatal("hostile streams closed the session")
	}
}

func TestRaftMux_WrongPeer(t *testing.T) {
	verifyNone(t)
	b := newBook()
	a, c := newNode(t, b, "a", RaftMuxConfig{}), newNode(t, b, "c", RaftMuxConfig{})
	b.set("b", c.t.Addr().String()) // stale: c now listens where b was
	la, lc := layer(t, a, "g"), layer(t, c, "g")
	if _, err := la.Dial("b", waitFor); !errors.Is(err, ErrWrongPeer) {
		t.Fatalf("dial b at c's address: %v, want ErrWrongPeer", err)
	}
	if _, err := la.Dial("nobody", waitFor); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("dial an unknown node: %v, want ErrUnknownNode", err)
	}
	// The right id at that address works.
	s, err := la.Dial("c", waitFor)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := lc.Accept()
	if err != nil {
		t.Fatal(err)
	}
	got.Close()
}

func TestRaftMux_Layer(t *testing.T) {
	verifyNone(t)
	n := newNode(t, newBook(), "a", RaftMuxConfig{})
	l := layer(t, n, "g")
	t.Run("Addr", func(t *testing.T) {
		if got := l.Addr().String(); got != "a" {
			t.Fatalf("Addr %q, want the node id", got)
		}
	})
	t.Run("ErrGroupTaken", func(t *testing.T) {
		if _, err := n.m.Layer("g", LayerConfig{Member: anyone}); !errors.Is(err, ErrGroupTaken) {
			t.Fatalf("second layer: %v", err)
		}
	})
	t.Run("BadGroup", func(t *testing.T) {
		for _, g := range []string{"", strings.Repeat("x", MaxGroupIDLen+1)} {
			if _, err := n.m.Layer(g, LayerConfig{Member: anyone}); err == nil {
				t.Fatalf("group of %d bytes accepted", len(g))
			}
		}
		if l, err := n.m.Layer(strings.Repeat("x", MaxGroupIDLen), LayerConfig{Member: anyone}); err != nil {
			t.Fatal(err)
		} else {
			l.Close()
		}
	})
	t.Run("CloseEndsAccept", func(t *testing.T) {
		l2 := layer(t, n, "h")
		errc := make(chan error, 1)
		go func() {
			_, err := l2.Accept()
			errc <- err
		}()
		l2.Close()
		if err := <-errc; !errors.Is(err, ErrClosed) || !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v", err)
		}
		if _, err := l2.Dial("a", time.Second); !errors.Is(err, ErrClosed) {
			t.Fatalf("Dial after Close: %v", err)
		}
		again := layer(t, n, "h") // a closed layer gives its group back
		again.Close()
	})
	t.Run("ErrClosed", func(t *testing.T) {
		n.m.Close()
		if _, err := n.m.Layer("k", LayerConfig{Member: anyone}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Layer after Close: %v", err)
		}
		if _, err := l.Accept(); !errors.Is(err, ErrClosed) {
			t.Fatalf("Accept after the mux's Close: %v", err)
		}
		if _, err := l.Dial("a", time.Second); !errors.Is(err, ErrClosed) {
			t.Fatalf("Dial after the mux's Close: %v", err)
		}
		m2, err := NewRaftMux(n.t, RaftMuxConfig{Resolve: newBook().resolve})
		if err != nil {
			t.Fatalf("the closed mux did not give back the raft listener: %v", err)
		}
		m2.Close()
	})
}

// TestRaftLayer_Queue: streams beyond MaxQueuedStreams waiting for Accept
// are closed; Close closes the queued ones.
func TestRaftLayer_Queue(t *testing.T) {
	verifyNone(t)
	b := newBook()
	a, c := newNode(t, b, "a", RaftMuxConfig{}), newNode(t, b, "c", RaftMuxConfig{})
	la, lc := layer(t, a, "g"), layer(t, c, "g")
	const extra = 3
	var wg sync.WaitGroup
	ended := make(chan struct{}, MaxQueuedStreams+extra)
	for i := 0; i < MaxQueuedStreams+extra; i++ {
		s, err := lc.Dial("a", waitFor)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			_, _ = io.Copy(io.Discard, s)
			ended <- struct{}{}
		}()
	}
	for i := 0; i < extra; i++ {
		<-ended
	}
	deadline := time.Now().Add(waitFor)
	for len(la.queue) != MaxQueuedStreams {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams queued, want %d", len(la.queue), MaxQueuedStreams)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-ended:
		t.Fatal("a queued stream was closed")
	default:
	}
	la.Close()
	wg.Wait()
}

// TestRaftLayer_Close: closing a layer ends reads on its streams at both
// ends, accepted and dialed, while the mux and its sessions live on.
func TestRaftLayer_Close(t *testing.T) {
	verifyNone(t)
	b := newBook()
	a, c := newNode(t, b, "a", RaftMuxConfig{}), newNode(t, b, "c", RaftMuxConfig{})
	la, lc := layer(t, a, "g"), layer(t, c, "g")
	other, otherC := layer(t, a, "other"), layer(t, c, "other")
	dialed, err := lc.Dial("a", waitFor)
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	accepted, err := la.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	out, err := la.Dial("c", waitFor)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	in, err := lc.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	errc := make(chan error, 4)
	for _, s := range []net.Conn{dialed, accepted, out, in} {
		go func() {
			_, err := s.Read(make([]byte, 1))
			errc <- err
		}()
	}
	la.Close()
	for range 4 {
		if err := <-errc; err == nil {
			t.Fatal("read a byte from a closed layer's stream")
		}
	}
	// The sessions carry the other group still.
	s, err := otherC.Dial("a", waitFor)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := other.Accept()
	if err != nil {
		t.Fatal(err)
	}
	got.Close()
}

// TestRaftMux_CloseRace: both muxes close while streams are dialed and
// accepted in both directions.
func TestRaftMux_CloseRace(t *testing.T) {
	verifyNone(t)
	b := newBook()
	a, c := newNode(t, b, "a", RaftMuxConfig{}), newNode(t, b, "c", RaftMuxConfig{})
	la, lc := layer(t, a, "g"), layer(t, c, "g")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := 0 // guarded by mu
	for _, p := range []struct {
		l    *RaftLayer
		peer string
	}{{la, "c"}, {lc, "a"}} {
		for range 3 {
			wg.Add(1)
			go func() { // dialer
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					s, err := p.l.Dial(raft.ServerAddress(p.peer), time.Second)
					if err != nil {
						continue
					}
					_, _ = s.Write([]byte("x"))
					s.Close()
				}
			}()
		}
		wg.Add(1)
		go func() { // acceptor
			defer wg.Done()
			for {
				s, err := p.l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				accepted++
				mu.Unlock()
				s.Close()
			}
		}()
	}
	deadline := time.Now().Add(waitFor)
	for {
		mu.Lock()
		n := accepted
		mu.Unlock()
		if n >= 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d streams accepted", n)
		}
		time.Sleep(time.Millisecond)
	}
	var closers sync.WaitGroup
	for _, n := range []*node{a, c} {
		closers.Add(2)
		go func() { defer closers.Done(); n.m.Close() }()
		go func() { defer closers.Done(); n.m.Close() }()
	}
	closers.Wait()
	close(stop)
	wg.Wait()
}

// FuzzStreamHeader: the header decoder never panics, allocates little,
// reads exactly the header (what it accepts encodes back to the bytes it
// consumed), and gives the same answer one byte at a time.
func FuzzStreamHeader(f *testing.F) {
	for _, s := range [][]byte{
		appendStreamHeader(nil, "g1"),
		appendStreamHeader(nil, "x"),
		appendStreamHeader(nil, strings.Repeat("x", 127)),
		appendStreamHeader(nil, strings.Repeat("x", 128)),
		appendStreamHeader(nil, strings.Repeat("x", MaxGroupIDLen)),
		append(appendStreamHeader(nil, "g1"), "raft bytes after the header"...),
		{}, {0}, {0x80}, {0x80, 0x00}, {0x81, 0x00, 'g'}, {0x80, 0x02}, {0xff, 0x01},
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		append([]byte{0x80, 0x02}, bytes.Repeat([]byte("x"), 256)...),
		// The hostile msgpack prefixes every wire decoder is seeded with.
		[]byte("\xdd\xff\xff\xff\xff"), []byte("\xdf\xff\xff\xff\xff"), []byte("\xdb\xff\xff\xff\xff"), []byte("\xc6\xff\xff\xff\xff"),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		var g string
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { g, err = readStreamHeader(r) })
		g2, err2 := readStreamHeader(iotest.OneByteReader(bytes.NewReader(b)))
		if g2 != g || (err == nil) != (err2 == nil) {
			t.Fatalf("%x: %q, %v whole but %q, %v a byte at a time", b, g, err, g2, err2)
		}
		if err != nil {
			if !errors.Is(err, errBadHeader) {
				t.Fatalf("%x: error %v is not errBadHeader", b, err)
			}
			return
		}
		if len(g) == 0 || len(g) > MaxGroupIDLen {
			t.Fatalf("%x: group id of %d bytes accepted", b, len(g))
		}
		used := b[:len(b)-r.Len()]
		if enc := appendStreamHeader(nil, g); !bytes.Equal(enc, used) {
			t.Fatalf("%x: consumed %x for %q, which encodes to %x", b, used, g, enc)
		}
	})
}
