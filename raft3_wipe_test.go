package mq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/node"
)

// sender sends single messages to the partitions of topic in turn
// through node via until stop, each resent with its ID until acked, and
// keeps the acked IDs.
type sender struct {
	mu    sync.Mutex
	via   func() *mq.MQ
	acked []string
	stop  chan struct{}
	done  chan struct{}
}

// startRaft3Sender starts a sender to r3/0.
func startRaft3Sender(t *testing.T, via func() *mq.MQ) *sender {
	return startSender(t, via, r3, 1, "w")
}

// startSender starts a sender to topic's parts partitions, its IDs tagged
// tag, ended when the test ends unless end was called before.
func startSender(t *testing.T, via func() *mq.MQ, topic string, parts int, tag string) *sender {
	s := &sender{via: via, stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-s.stop:
		default:
			s.end()
		}
	})
	go func() {
		defer close(s.done)
		for k := 0; ; k++ {
			msg := (&mq.Message{ID: fmt.Sprintf("%s-%d", tag, k), Body: []byte(tag)}).ToPartition(k % parts)
			for {
				select {
				case <-s.stop:
					return
				default:
				}
				p, err := s.via().NewProducer(topic)
				if err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					_, err = p.SendMessage(ctx, msg)
					cancel()
					p.Close()
				}
				if err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			s.mu.Lock()
			s.acked = append(s.acked, msg.ID)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sender) end() []string {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acked)
}

// wipe closes node id unless it is closed, empties its directory and
// opens it again: a new disk under the same node id.
func (c *testCluster) wipe(id string) *mq.MQ {
	c.t.Helper()
	if c.nodes[id] != nil {
		c.kill(id)
	}
	if err := os.RemoveAll(filepath.Join(c.root, id)); err != nil {
		c.t.Fatal(err)
	}
	return c.start(id)
}

// stopCutOff cuts nodes ids off every other node and closes them, so
// that none hands anything over as it closes, then restores the other
// nodes' ends of the links.
func (c *testCluster) stopCutOff(ids ...string) {
	c.t.Helper()
	for _, id := range ids {
		c.isolate(id, true)
	}
	for _, id := range ids {
		c.kill(id)
	}
	for _, id := range ids {
		c.isolate(id, false)
	}
}

// raft3Rejoined waits until no replica of r3/0 is lost and m's replica
// counts the three as voters.
func raft3Rejoined(t *testing.T, c *testCluster, d time.Duration) {
	t.Helper()
	waitFor(t, d, "every replica of r3/0 rejoined as a voter", func() bool {
		for _, m := range c.nodes {
			lost, voters := mq.Raft3Membership(m, r3, 0)
			if len(lost) > 0 || len(voters) != 3 {
				return false
			}
		}
		return true
	})
}

// TestRaft3_ReplicaBackEmpty: a Raft3 replica whose node comes back with
// an empty data directory (a replaced disk) while the group takes sends
// is a new server: it neither bootstraps the group nor votes, the leader
// removes it and adds it back as a nonvoter, and once it caught up it is
// a voter again. Two of the three wiped one after the other, each once
// the one before rejoined, rejoin alike: every acked message is read from
// every node, once. (Two lost at once leave no quorum that may vote: the
// group waits, see DESIGN.md.)
func TestRaft3_ReplicaBackEmpty(t *testing.T) {
	parallelByDefault(t)
	for _, wiped := range []int{1, 2} {
		t.Run(fmt.Sprintf("wiped-%d", wiped), func(t *testing.T) {
			parallelByDefault(t)
			var logs nodeLogs
			c := newCluster(t, 3, withNodeOptions(logs.opts), withSession(3*time.Second), withRaft3(1))
			defer func() {
				if t.Failed() {
					for id, m := range c.nodes {
						lost, voters := mq.Raft3Membership(m, r3, 0)
						t.Logf("%s: lost %q, voters %q", id, lost, voters)
					}
					t.Logf("log: %q", logs.matching("Raft3"))
					for _, l := range logs.matching("Raft3") {
						t.Log(l)
					}
				}
			}()
			var leader string
			waitFor(t, 20*time.Second, "a leader of r3/0", func() bool {
				leader, _ = mq.Raft3Leader(c.nodes["n1"], r3, 0)
				return leader != ""
			})
			via := c.nodes[leader] // never wiped
			s := startRaft3Sender(t, func() *mq.MQ { return via })
			time.Sleep(time.Second)
			others := othersThan(c, leader)
			for _, id := range others[:wiped] {
				c.wipe(id)
				raft3Rejoined(t, c, 60*time.Second) // the next disk is replaced once this one rejoined
			}
			time.Sleep(500 * time.Millisecond)
			acked := s.end()
			if len(acked) == 0 {
				t.Fatal("nothing acked")
			}
			raft3CheckStored(t, c, acked)
			t.Logf("%d acked", len(acked))
		})
	}
}

// raft3CheckStored fails t unless every acked ID is read once from r3/0
// through every open node.
func raft3CheckStored(t *testing.T, c *testCluster, acked []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range othersThan(c) {
		seen := readAll(ctx, t, c.nodes[id], r3, 1)
		missing := 0
		for _, a := range acked {
			if seen[a] != 1 {
				missing++
				if missing <= 3 {
					t.Errorf("read through %s: acked %s stored %d times", id, a, seen[a])
				}
			}
		}
		if missing > 0 {
			t.Errorf("read through %s: %d of %d acked messages not stored once", id, missing, len(acked))
		}
	}
}

// TestRaft3_WipedReplicaElectsNoLaggingReplica: r3/0's leader L commits
// entries with replica A while replica B, intact but cut off from L, lags.
// Then L stops (cut off, so it hands nothing over) and A comes back with an
// empty directory. A is lost; it votes only for replicas not lost, and B is
// not lost, so B asks A for its vote: A's empty log grants it, and B would
// lead without what L and A committed. raft's safety needs each of the
// quorum that held an entry to remember it: B, lacking the committed
// entries, must never lead; the acked messages must all be read once L is
// back.
func TestRaft3_WipedReplicaElectsNoLaggingReplica(t *testing.T) {
	c := newCluster(t, 3, withSession(3*time.Second), withRaft3(1))
	var lead string
	waitFor(t, 20*time.Second, "a leader of r3/0", func() bool {
		lead, _ = mq.Raft3Leader(c.nodes["n1"], r3, 0)
		return lead != ""
	})
	others := othersThan(c, lead)
	a, b := others[0], others[1]
	t.Logf("leader %s, A %s (to be wiped), B %s (lagging)", lead, a, b)

	// B lags: cut off from L, which commits with A.
	c.cut(lead, b, true)
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	acked := sendAll(ctx, t, c.nodes[lead], r3, 1, 200, "lag")
	_, committed := mq.Raft3Indexes(c.nodes[lead], r3, 0)
	bLast, _ := mq.Raft3Indexes(c.nodes[b], r3, 0)
	t.Logf("%d acked; L committed %d, B's log ends at %d", len(acked), committed, bLast)
	if bLast >= committed {
		t.Fatalf("B, cut off from the leader, caught up (%d >= %d)", bLast, committed)
	}

	// L and A stop, cut off so that neither hands its leadership to B;
	// A comes back with an empty directory, a new incarnation.
	c.stopCutOff(lead, a)
	c.wipe(a)

	// B must not lead r3/0 while its log lacks what was committed.
	var bad string
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && bad == ""; time.Sleep(20 * time.Millisecond) {
		ld, _ := mq.Raft3Leader(c.nodes[b], r3, 0)
		if last, _ := mq.Raft3Indexes(c.nodes[b], r3, 0); ld == b && last < committed {
			bad = "leads"
			t.Errorf("%s leads r3/0 with its log ending at %d, before the %d committed by %s and %s", b, last, committed, lead, a)
		}
	}
	lost, voters := mq.Raft3Membership(c.nodes[b], r3, 0)
	t.Logf("B sees lost %q, voters %q", lost, voters)

	// L comes back intact: every acked message must still be there.
	c.start(lead)
	waitFor(t, 60*time.Second, "a leader of r3/0 seen by all", func() bool {
		for _, m := range c.nodes {
			if ld, _ := mq.Raft3Leader(m, r3, 0); ld == "" {
				return false
			}
		}
		return true
	})
	time.Sleep(2 * time.Second)
	raft3CheckStored(t, c, acked)
}

// TestRaft3_LeaderBackEmpty: r3/0's leader loses its disk while taking
// sends (cut off and closed, so that it hands nothing over, emptied, back
// at once). The other two, intact, elect one of them; the wiped one
// rejoins as a new server and never leads with its log short of what was
// committed; every acked message is read once through every node.
func TestRaft3_LeaderBackEmpty(t *testing.T) {
	c := newCluster(t, 3, withSession(3*time.Second), withRaft3(1))
	var lead string
	waitFor(t, 20*time.Second, "a leader of r3/0", func() bool {
		lead, _ = mq.Raft3Leader(c.nodes["n1"], r3, 0)
		return lead != ""
	})
	via := c.nodes[othersThan(c, lead)[0]] // never wiped
	s := startRaft3Sender(t, func() *mq.MQ { return via })
	time.Sleep(time.Second)
	_, committed := mq.Raft3Indexes(c.nodes[lead], r3, 0)
	c.isolate(lead, true)
	c.kill(lead)
	c.isolate(lead, false)
	if err := os.RemoveAll(filepath.Join(c.root, lead)); err != nil {
		t.Fatal(err)
	}
	m := c.start(lead)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		ld, _ := mq.Raft3Leader(m, r3, 0)
		if last, _ := mq.Raft3Indexes(m, r3, 0); ld == lead && last < committed {
			t.Fatalf("the wiped %s leads r3/0 with its log ending at %d, before %d committed", lead, last, committed)
		}
	}
	raft3Rejoined(t, c, 60*time.Second)
	acked := s.end()
	if len(acked) == 0 {
		t.Fatal("nothing acked")
	}
	raft3CheckStored(t, c, acked)
	t.Logf("%d acked", len(acked))
}

// TestRaft3_LostReplicaFollowsOnlyALeaderThatVouched: a Raft3 replica back
// with an empty directory has forgotten its term, so it takes entries only
// from a leader that told it its committed configuration has it as a
// nonvoter: a deposed leader whose configuration still counts the old
// replica as a voter would otherwise count its acknowledgements toward a
// commit the group's newer leader never saw. Here the group's leader L is
// cut off from the wiped replica W, so it cannot vouch; an AppendEntries
// from the third replica A, as a deposed leader would send it, is
// refused, and W's term stays where it was. Once the link is back, L
// vouches and W rejoins.
func TestRaft3_LostReplicaFollowsOnlyALeaderThatVouched(t *testing.T) {
	c := newCluster(t, 3, withSession(3*time.Second), withRaft3(1))
	var meta, lead string
	waitFor(t, 20*time.Second, "a metadata leader and a leader of r3/0", func() bool {
		meta = c.nodes["n1"].ClusterStatus().Leader
		lead, _ = mq.Raft3Leader(c.nodes["n1"], r3, 0)
		return meta != "" && lead != ""
	})
	// A leads the metadata and W registers through it; L, r3/0's leader,
	// is another node.
	a := meta
	if lead == a {
		to := othersThan(c, a)[0]
		if err := mq.Raft3TransferTo(c.nodes[a], r3, 0, to); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "r3/0 led by "+to, func() bool {
			lead, _ = mq.Raft3Leader(c.nodes[to], r3, 0)
			return lead == to
		})
	}
	w := othersThan(c, a, lead)[0]
	t.Logf("metadata leader and A %s, r3/0's leader L %s, wiped W %s", a, lead, w)
	c.wipeCutFrom(w, lead)
	term := mq.Raft3Term(c.nodes[w], r3, 0)
	im := newImpostor(t, a)
	req := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(a), Addr: []byte(a)},
		Term:      term + 1,
	}
	var resp raft.AppendEntriesResponse
	err := im.raft(c.nodes[w].ClusterStatus().Addr, "raft3/"+r3+"/0").AppendEntries(raft.ServerID(w), raft.ServerAddress(w), req, &resp)
	if err == nil {
		t.Errorf("the lost replica took an AppendEntries from %s, which did not vouch: %+v", a, resp)
	}
	if got := mq.Raft3Term(c.nodes[w], r3, 0); got != term {
		t.Errorf("the lost replica's term went from %d to %d", term, got)
	}
	// Only another replica of the group may vouch: an identity of the
	// cluster's CA that no placement names is refused, and W still takes
	// nothing from it.
	x9 := newImpostor(t, "x9")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := x9.client(c.nodes[w].ClusterStatus().Addr).Call(ctx, node.OpRaft3Vouch, node.AppendRaft3Vouch(nil, r3, 0)); !errors.Is(err, cluster.ErrDenied) {
		t.Errorf("a vouch from x9: %v, want ErrDenied", err)
	}
	c.cut(lead, w, false)
	raft3Rejoined(t, c, 60*time.Second)
}

// TestRaft3_WipedReplicaMovedAwayStaysGated: a Raft3 replica W back with
// an empty directory has forgotten its term; while lost it takes entries
// only from a leader that vouched. Moved away before it rejoined (its
// group's MoveReplica from W takes it out of Lost), its replica, open
// until it leaves, still lacks its log and term: an AppendEntries from A,
// a replica that never vouched, as a deposed leader whose configuration
// still counts W as a voter would send it, is refused before and after
// the move. (Without the gate kept past the move, W took it at term 1.)
func TestRaft3_WipedReplicaMovedAwayStaysGated(t *testing.T) {
	c := newCluster(t, 4, withSession(3*time.Second), withRaft3(1))
	_, placed, _, _ := mq.PairRecord(c.nodes["n1"], r3, 0)
	placed = slices.Sorted(slices.Values(placed))
	spare := othersThan(c, placed...)[0]
	var meta, lead string
	waitFor(t, 20*time.Second, "a metadata leader and a leader of r3/0", func() bool {
		meta = c.nodes["n1"].ClusterStatus().Leader
		lead, _ = mq.Raft3Leader(c.nodes[placed[0]], r3, 0)
		return meta != "" && lead != ""
	})
	if lead == meta {
		to := placed[0]
		if to == lead {
			to = placed[1]
		}
		if err := mq.Raft3TransferTo(c.nodes[lead], r3, 0, to); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "r3/0 led by "+to, func() bool {
			lead, _ = mq.Raft3Leader(c.nodes[to], r3, 0)
			return lead == to
		})
	}
	var w, a string
	for _, id := range placed {
		switch {
		case id == lead:
		case w == "" && id != meta:
			w = id
		default:
			a = id
		}
	}
	t.Logf("placed %q, leader L %s, wiped W %s, other A %s, spare %s, metadata leader %s", placed, lead, w, a, spare, meta)
	c.wipeCutFrom(w, lead)
	term := mq.Raft3Term(c.nodes[w], r3, 0)
	im := newImpostor(t, a)
	tr := im.raft(c.nodes[w].ClusterStatus().Addr, "raft3/"+r3+"/0")

	forge := func() (raft.AppendEntriesResponse, error) {
		req := &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(a), Addr: []byte(a)},
			Term:      term + 1,
		}
		var resp raft.AppendEntriesResponse
		err := tr.AppendEntries(raft.ServerID(w), raft.ServerAddress(w), req, &resp)
		return resp, err
	}
	// The control: while W is lost, the gate refuses A.
	if resp, err := forge(); err == nil {
		t.Fatalf("lost W took A's AppendEntries before any move: %+v", resp)
	}
	if got := mq.Raft3Term(c.nodes[w], r3, 0); got != term {
		t.Fatalf("lost W's term went from %d to %d before any move", term, got)
	}

	if err := c.nodes[a].MoveReplica(testCtx(t), r3, 0, w, spare); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "W's state shows the move", func() bool {
		lost, _ := mq.Raft3Membership(c.nodes[w], r3, 0)
		_, reps, _, _ := mq.PairRecord(c.nodes[w], r3, 0)
		return !slices.Contains(lost, w) && !slices.Contains(reps, w)
	})
	if resp, err := forge(); err == nil {
		t.Errorf("W, its data gone and never caught up, took an AppendEntries from %s, which never vouched: %+v", a, resp)
	}
	if got := mq.Raft3Term(c.nodes[w], r3, 0); got != term && got != 0 { // 0: the replica closed since
		t.Errorf("W's forgotten term went from %d to %d on the word of a replica that never vouched", term, got)
	}
}

// wipeCutFrom wipes node w (c.wipe) with its link to node lead, r3/0's
// leader, cut, so that lead cannot vouch for it, and waits until w's
// replica of r3/0 is open and lost.
func (c *testCluster) wipeCutFrom(w, lead string) {
	c.t.Helper()
	c.cut(lead, w, true)
	c.wipe(w)
	c.cut(lead, w, true) // w's new transport too
	waitFor(c.t, 30*time.Second, w+"'s replica open and lost", func() bool {
		lost, _ := mq.Raft3Membership(c.nodes[w], r3, 0)
		_, holds := mq.Raft3Leader(c.nodes[w], r3, 0)
		return holds && slices.Contains(lost, w)
	})
}
