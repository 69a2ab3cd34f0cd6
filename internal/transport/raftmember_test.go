//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Leader and Candidate, and the codec handle raft uses, which these tests forge

package transport

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// membersGroup starts group "g" on n1, n2 and n3, whose layers take
// streams from the nodes members names, and applies 5 commands.
func membersGroup(t *testing.T, b *book, members ...string) ([]*node, []*member) {
	t.Helper()
	nodes := threeNodes(t, b)
	ids := []string{"n1", "n2", "n3"}
	var g []*member
	for _, n := range nodes {
		g = append(g, startMemberOf(t, n, "g", newStores(), ids, only(members...)))
	}
	apply(t, g, "real", 5)
	waitCount(t, g, 5)
	return nodes, g
}

// checkUnharmed fails t if a forged command reached an FSM of g or the
// follower's term took the forged one, and checks that g still commits.
func checkUnharmed(t *testing.T, g []*member, follower *member, forgedTerm uint64) {
	t.Helper()
	if term := raftStat(t, follower.r, "term"); term >= forgedTerm {
		t.Errorf("the follower took the forged term: %d", term)
	}
	apply(t, g, "after", 5)
	waitCount(t, g, 10)
	for _, m := range g {
		if m.fsm.has("forged") {
			t.Errorf("%s applied the forged command", m.id)
		}
	}
}

// TestRaftMux_RefusesNonMembers: a node that passed the handshake but is
// no member of a group (x9) sends the group's follower, through raft's own
// NetworkTransport, an AppendEntries that would commit a command of its
// own, a heartbeat of a far higher term, a RequestVote and an
// InstallSnapshot: every stream is closed before raft reads it, nothing
// reaches the log or the FSM, and the term stays. (Before the mux checked
// membership, the forged command was applied and the term taken.)
func TestRaftMux_RefusesNonMembers(t *testing.T) {
	verifyNone(t)
	nodes, g := membersGroup(t, newBook(), "n1", "n2", "n3")
	leader := waitLeader(t, g)
	follower := without(g, leader)[0]
	term := raftStat(t, leader.r, "term")
	nt := forge(t, "x9", nodeByID(nodes, follower.id), "g")
	target := raft.ServerAddress(follower.id)

	var ae raft.AppendEntriesResponse
	if err := nt.AppendEntries("n", target, forgedAppend(t, follower, "x9", "forged"), &ae); err == nil {
		t.Errorf("the forged AppendEntries was answered: %+v", ae)
	}
	hb := &raft.AppendEntriesRequest{RPCHeader: header("x9"), Term: term + 100, Leader: []byte("x9")}
	if err := nt.AppendEntries("n", target, hb, &ae); err == nil {
		t.Errorf("the forged heartbeat was answered: %+v", ae)
	}
	var rv raft.RequestVoteResponse
	vote := &raft.RequestVoteRequest{RPCHeader: header("x9"), Term: term + 100, Candidate: []byte("x9"), LastLogIndex: 1 << 40, LastLogTerm: term + 100}
	if err := nt.RequestVote("n", target, vote, &rv); err == nil {
		t.Errorf("the forged RequestVote was answered: %+v", rv)
	}
	var is raft.InstallSnapshotResponse
	snap := &raft.InstallSnapshotRequest{RPCHeader: header("x9"), SnapshotVersion: 1, Term: term + 100, Leader: []byte("x9"),
		LastLogIndex: 1 << 40, LastLogTerm: term + 100, Size: 4}
	if err := nt.InstallSnapshot("n", target, snap, &is, bytes.NewReader([]byte("snap"))); err == nil {
		t.Errorf("the forged InstallSnapshot was answered: %+v", is)
	}
	checkUnharmed(t, g, follower, term+100)
}

// TestRaftMux_RefusesSpoofedSender: a member of the group's layer (n4)
// that sends requests naming another member (the leader) as their sender
// has its stream closed before raft decodes them. (Before the mux checked
// the sender fields, raft applied the command as the leader's.)
func TestRaftMux_RefusesSpoofedSender(t *testing.T) {
	verifyNone(t)
	nodes, g := membersGroup(t, newBook(), "n1", "n2", "n3", "n4")
	leader := waitLeader(t, g)
	follower := without(g, leader)[0]
	term := raftStat(t, leader.r, "term")
	nt := forge(t, "n4", nodeByID(nodes, follower.id), "g")
	target := raft.ServerAddress(follower.id)

	var ae raft.AppendEntriesResponse
	if err := nt.AppendEntries("n", target, forgedAppend(t, follower, leader.id, "forged"), &ae); err == nil {
		t.Errorf("the AppendEntries in the leader's name was answered: %+v", ae)
	}
	hb := &raft.AppendEntriesRequest{RPCHeader: header(leader.id), Term: term + 100, Leader: []byte(leader.id)}
	if err := nt.AppendEntries("n", target, hb, &ae); err == nil {
		t.Errorf("the heartbeat in the leader's name was answered: %+v", ae)
	}
	// n4's requests in its own name reach raft, which answers them.
	own := &raft.AppendEntriesRequest{RPCHeader: header("n4"), Term: 1, Leader: []byte("n4")}
	if err := nt.AppendEntries("n", target, own, &ae); err != nil {
		t.Errorf("n4's request in its own name: %v", err)
	} else if ae.Success || ae.Term < term {
		t.Errorf("raft answered n4's stale heartbeat %+v", ae)
	}
	checkUnharmed(t, g, follower, term+100)
}

// TestRaftMux_BoundsStreamsPerPeer: a member opening 1000 streams of one
// group gets MaxPeerStreams of them to raft; the others are closed, so
// raft's goroutine and 256 KiB read buffer per stream stay bounded.
// (Unbounded, the 1000 streams held about 1000 goroutines and 250 MiB.)
func TestRaftMux_BoundsStreamsPerPeer(t *testing.T) {
	verifyNone(t)
	a := newNode(t, newBook(), "a", RaftMuxConfig{})
	nt := raft.NewNetworkTransportWithConfig(RaftTransportConfig(layerOf(t, a, "g", only("evil"))))
	defer nt.Close()
	s := attacker(t, a)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()
	const streams = 1000
	var open []net.Conn
	for range streams {
		st, err := s.Open()
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, st)
		if _, err := st.Write(appendStreamHeader(nil, "g")); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, st := range open {
			st.Close()
		}
	}()
	// Every stream but those raft took is closed.
	refused := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		refused = 0
		for _, st := range open {
			_ = st.SetReadDeadline(time.Unix(1, 0))
			if _, err := st.Read(make([]byte, 1)); err == io.EOF {
				refused++
			}
		}
		if refused >= streams-MaxPeerStreams {
			break
		}
	}
	time.Sleep(time.Second) // stragglers
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := runtime.NumGoroutine() - goroutines
	heap := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("%d streams, %d closed: %+d goroutines, %+d KiB in use", streams, refused, grown, heap>>10)
	if grown > 4*MaxPeerStreams {
		t.Errorf("%d streams of one peer added %d goroutines", streams, grown)
	}
	if heap > 32<<20 {
		t.Errorf("%d streams of one peer hold %d MiB", streams, heap>>20)
	}
}

// TestRaftMux_ClosesIdleStreams: an inbound stream that carries no byte
// for IdleTimeout is closed. (Before, it was held for ever.)
func TestRaftMux_ClosesIdleStreams(t *testing.T) {
	verifyNone(t)
	a := newNode(t, newBook(), "a", RaftMuxConfig{IdleTimeout: 300 * time.Millisecond})
	nt := raft.NewNetworkTransportWithConfig(RaftTransportConfig(layerOf(t, a, "g", only("evil"))))
	defer nt.Close()
	s := attacker(t, a)
	st, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Write(appendStreamHeader(nil, "g")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitClosed(t, st, waitFor)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("closed after %v, before the idle timeout", d)
	}
}

// TestRaftLayer_ReplacesIdleDialedStream: a dialed stream written to after
// half the IdleTimeout without a byte is replaced by a new one, so a
// request raft sends on a pooled stream its peer closed as idle arrives
// whole on a new stream. (Before, it went into the closed stream and raft
// met an error.)
func TestRaftLayer_ReplacesIdleDialedStream(t *testing.T) {
	verifyNone(t)
	b := newBook()
	cfg := RaftMuxConfig{IdleTimeout: 400 * time.Millisecond}
	a, c := newNode(t, b, "a", cfg), newNode(t, b, "c", cfg)
	la, lc := layer(t, a, "g"), layer(t, c, "g")
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			s, err := lc.Accept()
			if err != nil {
				return
			}
			accepted <- s
		}
	}()
	next := func() net.Conn {
		t.Helper()
		select {
		case s := <-accepted:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no stream accepted")
			return nil
		}
	}
	req := encodeRPC(t, 3, &raft.TimeoutNowRequest{RPCHeader: header("a")}, nil)
	s, err := la.Dial("c", waitFor)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write(req); err != nil {
		t.Fatal(err)
	}
	in1 := next()
	buf := make([]byte, len(req))
	if _, err := io.ReadFull(in1, buf); err != nil || !bytes.Equal(buf, req) {
		t.Fatalf("first request: %q, %v", buf, err)
	}
	if _, err := in1.Read(buf); err == nil {
		t.Fatal("read from an idle stream")
	}
	in1.Close() // as raft does after a read error
	if _, err := s.Write(req); err != nil {
		t.Fatal(err)
	}
	in2 := next()
	defer in2.Close()
	if _, err := io.ReadFull(in2, buf); err != nil || !bytes.Equal(buf, req) {
		t.Fatalf("request after the idle time: %q, %v", buf, err)
	}
}
