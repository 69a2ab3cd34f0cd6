package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// An attack review of raftqueue.Pair. TestPairAttack_Break* tests show
// defects (they fail on the code they were written against); the others are
// regression tests of attacks that did not break anything.

// ---- helpers ----

// gatedLog wraps a replica's raft.LogStore: hook, when set, runs before each
// write and may fail it (a failing disk), writing nothing.
type gatedLog struct {
	raft.LogStore
	hook *atomic.Pointer[func([]*raft.Log) error]
}

func (g *gatedLog) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

func (g *gatedLog) StoreLogs(ls []*raft.Log) error {
	if h := g.hook.Load(); h != nil {
		if err := (*h)(ls); err != nil {
			return err
		}
	}
	return g.LogStore.StoreLogs(ls)
}

// diskHooks holds the write hooks of replicas a and b, kept across restarts.
type diskHooks struct {
	h [2]atomic.Pointer[func([]*raft.Log) error]
}

func (d *diskHooks) opts(cfg *PairConfig) {
	i := 0
	if filepath.Base(cfg.Dir) == "b" {
		i = 1
	}
	cfg.Log = &gatedLog{LogStore: cfg.Log, hook: &d.h[i]}
}

func (d *diskHooks) set(i int, f func([]*raft.Log) error) {
	if f == nil {
		d.h[i].Store(nil)
		return
	}
	d.h[i].Store(&f)
}

var errTestDisk = errors.New("test: disk write failed")

// lastIndex returns the last index of replica i's log.
func (ps *pairs) lastIndex(i int) uint64 {
	ps.mu.Lock()
	l := ps.logs[i]
	ps.mu.Unlock()
	if l == nil {
		return 0
	}
	last, err := l.LastIndex()
	if err != nil {
		ps.t.Errorf("%s: last index: %v", ps.id(i), err)
	}
	return last
}

// entryIDs returns the message IDs of entry idx of replica i's log (nil
// when it does not hold it).
func (ps *pairs) entryIDs(i int, idx uint64) []string {
	ps.mu.Lock()
	l := ps.logs[i]
	ps.mu.Unlock()
	var e raft.Log
	if l == nil || l.GetLog(idx, &e) != nil {
		return nil
	}
	cmds, _, err := decodeEntry(e.Data, 1, nil, nil)
	if err != nil {
		return []string{"<" + err.Error() + ">"}
	}
	var ids []string
	for _, c := range cmds {
		for _, m := range c.Msgs {
			ids = append(ids, m.ID)
		}
	}
	return ids
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

// atOffset returns the ID replica i's partition 0 holds at off ("" none).
func (ps *pairs) atOffset(i int, off uint64) string {
	for _, m := range ps.logOf(i) {
		if m.Offset == off {
			return m.ID
		}
	}
	return ""
}

// entryData encodes one entry of a single-partition pair appending msgs.
func entryData(msgs ...store.Message) []byte {
	body := appendEntryCommand(nil, entryOne, 0, &store.Command{Op: store.OpAppend, Now: t0, Msgs: msgs})
	return append(entryHeader(nil, entryOne, 1, 1), body...)
}

func logEntry(index, epoch uint64, data []byte) *raft.Log {
	return &raft.Log{Index: index, Term: epoch, Type: raft.LogCommand, Data: data}
}

// writeOnlyToFollower sends id through leader a, whose own write of it
// fails (its disk, or its process dying before the write) while the batch
// it sends at the same time reaches follower b: the send is of unknown
// outcome, and the entry (the exact one a tried to write) is in b's log
// only, at the returned index. (The leader writes and sends in parallel;
// the test delivers the batch itself, as the send goroutine would, to
// avoid a race with the failing write.)
func writeOnlyToFollower(t *testing.T, ps *pairs, d *diskHooks, id string) uint64 {
	t.Helper()
	want := ps.lastIndex(0) + 1
	var captured []*raft.Log
	var once sync.Once
	d.set(0, func(ls []*raft.Log) error {
		once.Do(func() {
			for _, l := range ls {
				c := *l
				captured = append(captured, &c)
			}
		})
		return errTestDisk
	})
	ps.cut[0].Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := ps.send(ctx, 0, msg(id))
	cancel()
	d.set(0, nil)
	ps.cut[0].Store(false)
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send %s with a's disk failing: %v, want ErrUnknownOutcome", id, err)
	}
	if len(captured) != 1 || captured[0].Index != want {
		t.Fatalf("setup: a tried to write %d entries", len(captured))
	}
	// The batch a's leader sent alongside its write.
	end, err := ps.rep(1).Append(context.Background(), pairlog.Append{Epoch: 1, PrevIndex: want - 1, PrevEpoch: 1,
		Entries: captured, Commit: want - 1})
	if err != nil || end != want {
		t.Fatalf("setup: deliver a's batch to b: %d %v", end, err)
	}
	if got := ps.entryIDs(1, want); !slices.Equal(got, []string{id}) || ps.lastIndex(0) != want-1 {
		t.Fatalf("setup: b's entry %d holds %v, a's log ends at %d", want, got, ps.lastIndex(0))
	}
	return want
}

// ---- breaks ----

// TestPairAttack_BreakSameEpochRestartThenPromotionDiverges: a leader whose
// batch reached the follower but not its own disk (entry 5 = X on b only),
// restarted in the SAME epoch while the link is down, writes another entry
// at index 5 and epoch 1 (Y). The follower is then promoted: its Reset
// append finds a's entry 5 "matching" (same index, same epoch) and both
// commit entry 5, b applying X and a applying Y. A retry of X through the
// new leader is acked as a duplicate at offset 4 — where replica a holds Y.
func TestPairAttack_BreakSameEpochRestartThenPromotionDiverges(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 4 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	idx := writeOnlyToFollower(t, ps, &d, "X")

	// a restarts and leads epoch 1 again (the metadata did not change), cut
	// off from b: its send of Y is written at index 5 of epoch 1 on a only.
	ps.stop(0)
	ps.cut[0].Store(true)
	ps.start(0)
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := ps.send(c, 0, msg("Y"))
	cc()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send Y with the link cut: %v", err)
	}
	if got := ps.entryIDs(0, idx); !slices.Equal(got, []string{"Y"}) {
		t.Fatalf("setup: a's entry %d holds %v", idx, got)
	}

	// b is promoted; a rejoins as its follower.
	ps.promote(false)
	ps.cut[0].Store(false)
	ps.rejoin()
	if !waitFor(patience, func() bool {
		c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cc()
		_, err := ps.rep(1).LeaderPartition(c, 0)
		return err == nil
	}) {
		t.Fatal("the new leader never became ready")
	}
	// X's client retries at the new leader.
	res, err := ps.send(ctx, 1, msg("X"))
	if err != nil || len(res.Acks) != 1 {
		t.Fatalf("retry X at b: %+v %v", res, err)
	}
	ack := res.Acks[0]
	waitFor(3*time.Second, func() bool { return len(ps.logOf(0)) >= len(ps.logOf(1)) })
	a, b := ps.logOf(0), ps.logOf(1)
	if got := ps.atOffset(0, ack.Offset); got != "X" {
		t.Fatalf("X acked by b at offset %d (duplicate %v), but replica a holds %q there: "+
			"both logs hold entry %d of epoch 1, a's with %v, b's with %v (matched by index and epoch only); "+
			"the replicas diverged: a %v, b %v",
			ack.Offset, ack.Duplicate, got, idx, ps.entryIDs(0, idx), ps.entryIDs(1, idx), ids(a), ids(b))
	}
	if !slices.EqualFunc(a, b, sameMessage) {
		t.Fatalf("the replicas differ once healed: a %v, b %v", ids(a), ids(b))
	}
}

// TestPairAttack_BreakSameEpochDoubleRestartDiverges: the same hole with no
// promotion: the leader restarted twice in epoch 1 (its second run wrote Y
// at index 5 while cut off, its third run's Reset append finds b's X at
// index 5 of epoch 1 "matching"). a acks a retry of Y as a duplicate at
// offset 4, where b holds X.
func TestPairAttack_BreakSameEpochDoubleRestartDiverges(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 4 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	idx := writeOnlyToFollower(t, ps, &d, "X")
	// Run 2, cut off: Y at index 5 of epoch 1 on a only.
	ps.stop(0)
	ps.cut[0].Store(true)
	ps.start(0)
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := ps.send(c, 0, msg("Y"))
	cc()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send Y with the link cut: %v", err)
	}
	// Run 3, the link healed.
	ps.stop(0)
	ps.cut[0].Store(false)
	ps.start(0)
	if err := ps.rep(0).Lead(2, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(2) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	res, err := ps.send(ctx, 0, msg("Y"))
	if err != nil || len(res.Acks) != 1 {
		t.Fatalf("retry Y at a: %+v %v", res, err)
	}
	ack := res.Acks[0]
	waitFor(3*time.Second, func() bool { return len(ps.logOf(1)) >= len(ps.logOf(0)) })
	a, b := ps.logOf(0), ps.logOf(1)
	if got := ps.atOffset(1, ack.Offset); got != "Y" {
		t.Fatalf("Y acked by a at offset %d (duplicate %v), but follower b holds %q there "+
			"(entry %d of epoch 1: a's %v, b's %v): a: %v, b: %v",
			ack.Offset, ack.Duplicate, got, idx, ps.entryIDs(0, idx), ps.entryIDs(1, idx), ids(a), ids(b))
	}
	if !slices.EqualFunc(a, b, sameMessage) {
		t.Fatalf("the replicas differ once healed: a %v, b %v", ids(a), ids(b))
	}
}

// promotedWithUnappliedTail leaves b leading epoch 2 with entry 5 (X) in its
// log, unapplied (a's commit never told it), and a down: b's reads wait
// for a to hold entry 5 too.
func promotedWithUnappliedTail(t *testing.T) (*pairs, *diskHooks) {
	t.Helper()
	d := &diskHooks{}
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 4 {
		if _, err := ps.send(ctx, 0, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	writeOnlyToFollower(t, ps, d, "X")
	ps.stop(0)
	ps.promote(false)
	c, cc := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cc()
	if _, err := ps.rep(1).LeaderPartition(c, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("setup: b's read with its tail unapplied: %v, want to wait", err)
	}
	return ps, d
}

// TestPairAttack_BreakLeaderPartitionOutlivesClose: a read waiting for the
// new leader's earlier entries is not released by Close (nor by Follow):
// it returns only when its ctx ends. Promise: every call returns once its
// ctx ends or Close is called.
func TestPairAttack_BreakLeaderPartitionOutlivesClose(t *testing.T) {
	ps, _ := promotedWithUnappliedTail(t)
	b := ps.rep(1)
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.LeaderPartition(rctx, 0)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	ps.stop(1)
	closed := time.Now()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("LeaderPartition of a closed replica returned a partition")
		}
	case <-time.After(2 * time.Second):
		rcancel()
		err := <-done
		t.Fatalf("LeaderPartition still waiting %v after Close; it returned only once its ctx was cancelled (%v)",
			time.Since(closed).Round(time.Millisecond), err)
	}
}

// TestPairAttack_BreakLeaderPartitionMissesReadiness: a read waiting for the
// promoted leader's earlier entries waits on the ready channel of that
// Lead; the metadata then moves the pair to the risk stage (Lead alone),
// which applies the entries at once but makes a new channel: the reader
// stays blocked until its ctx ends, though fresh reads succeed.
func TestPairAttack_BreakLeaderPartitionMissesReadiness(t *testing.T) {
	ps, _ := promotedWithUnappliedTail(t)
	b := ps.rep(1)
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.LeaderPartition(rctx, 0)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := b.Lead(3, nil, false); err != nil { // the risk stage: b alone
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool {
		c, cc := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cc()
		_, err := b.LeaderPartition(c, 0)
		return err == nil
	}) {
		t.Fatal("b alone never became ready")
	}
	ready := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiting read: %v", err)
		}
	case <-time.After(2 * time.Second):
		rcancel()
		err := <-done
		t.Fatalf("a read waiting since before Lead(3, nil) is still blocked %v after the replica became ready "+
			"(fresh reads succeed); it returned only when its ctx was cancelled: %v",
			time.Since(ready).Round(time.Millisecond), err)
	}
}

// TestPairAttack_BreakStaleReadinessBlocksReads: Lead keeps the previous
// ready channel when nothing is left to apply, even if that channel is
// still open (from an earlier Lead whose tail was since cut as a
// follower): the replica leads with everything applied and a confirming
// follower, but LeaderPartition blocks until a write happens to be
// applied.
func TestPairAttack_BreakStaleReadinessBlocksReads(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.cut[0].Store(true)
	c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := ps.send(c, 0, msg("orphan"))
	cc()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send cut off: %v", err)
	}
	// a leads a new epoch with entry 1 unapplied: its reads wait for it.
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew()        // the metadata gives the leader a new epoch
	ps.promote(false) // b leads epoch 2 (its log is empty)
	ps.cut[0].Store(false)
	ps.rejoin() // a follows epoch 2: b's Reset cuts a's entry 1
	if !waitFor(patience, func() bool { return ps.lastIndex(0) == 0 && ps.rep(1).Leading() }) {
		t.Fatalf("setup: a's log ends at %d", ps.lastIndex(0))
	}
	ps.promote(false) // a leads epoch 3: nothing to apply
	ps.rejoin()
	c, cc = context.WithTimeout(ctx, 2*time.Second)
	_, err = ps.rep(0).LeaderPartition(c, 0)
	cc()
	if err != nil {
		res, serr := ps.send(ctx, 0, msg("w"))
		c, cc = context.WithTimeout(ctx, 2*time.Second)
		_, err2 := ps.rep(0).LeaderPartition(c, 0)
		cc()
		t.Fatalf("leader a (epoch %d, log empty, nothing to apply, follower b confirming) refused a read for 2s: %v; "+
			"after a write (%v %v) the read gives %v", ps.rep(0).Epoch(), err, res.Acks, serr, err2)
	}
}

// TestPairAttack_BreakRefusedRoleCallStopsLeader: a stale (lower-epoch)
// Follow or Lead, e.g. a delayed metadata message, is refused with
// ErrStaleEpoch, but serve stops the leader before checking the epoch: the
// live leader of the current epoch stops leading, its in-flight sends
// become unknown and the partition has no leader.
func TestPairAttack_BreakRefusedRoleCallStopsLeader(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.promote(false)
	ps.rejoin()
	if _, err := ps.send(ctx, 1, msg("b0")); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		name string
		f    func() error
	}{
		{"Follow(1)", func() error { return ps.rep(1).Follow(1) }},
		{"Lead(1, peer)", func() error { return ps.rep(1).Lead(1, pairLink{ps, 1}, false) }},
	} {
		if err := call.f(); !errors.Is(err, pairlog.ErrStaleEpoch) {
			t.Fatalf("%s at epoch 2: %v, want ErrStaleEpoch", call.name, err)
		}
		c, cc := context.WithTimeout(ctx, time.Second)
		_, err := ps.send(c, 1, msg("after-"+call.name))
		cc()
		if !ps.rep(1).Leading() || err != nil {
			t.Errorf("after a refused %s, the leader of epoch 2 leads: %v, and a send gives %v", call.name, ps.rep(1).Leading(), err)
		}
		if !ps.rep(1).Leading() {
			if err := ps.rep(1).Lead(2, pairLink{ps, 1}, false); err != nil { // restore it
				t.Fatal(err)
			}
		}
	}
}

// TestPairAttack_BreakNilCommandPanics: Apply(ctx, nil) is bad input; it
// crashes the process (a nil dereference in the proposer's goroutine)
// instead of returning an error. Run in a child process.
func TestPairAttack_BreakNilCommandPanics(t *testing.T) {
	if os.Getenv("PAIR_ATTACK_NIL_CHILD") == "1" {
		ps := newPairs(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := ps.rep(0).Apply(ctx, nil)
		fmt.Printf("APPLY-RETURNED %v\n", err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPairAttack_BreakNilCommandPanics$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "PAIR_ATTACK_NIL_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "APPLY-RETURNED") {
		s := string(out)
		if i := strings.Index(s, "panic:"); i >= 0 {
			s = s[i:min(len(s), i+600)]
		}
		t.Fatalf("Pair.Apply(ctx, nil) crashed the process (%v):\n%s", err, s)
	}
}

// ---- attacks that held (regression tests) ----

// TestPairAttack_HostileAppends: a follower given malformed or hostile
// batches refuses them and changes nothing; a commit past the batch's end
// applies nothing past it; an undecodable entry does not kill the
// follower; a replica that leads, or is closed, refuses appends.
func TestPairAttack_HostileAppends(t *testing.T) {
	dir := t.TempDir()
	p, err := OpenPair(PairConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, Entries: []*raft.Log{logEntry(1, 1, entryData(msg("m0")))}}); !errors.Is(err, pairlog.ErrStaleEpoch) {
		t.Fatalf("append before any epoch: %v", err)
	}
	if err := p.Follow(1); err != nil {
		t.Fatal(err)
	}
	held := func() []string {
		p.waitApplied(t)
		part, err := p.Partition(0)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := part.Read(0, 100, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ids(msgs)
	}
	if end, err := p.Append(ctx, pairlog.Append{Epoch: 1, Entries: []*raft.Log{logEntry(1, 1, entryData(msg("m0")))}}); err != nil || end != 1 {
		t.Fatalf("append 1: %d %v", end, err)
	}
	if end, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 1, PrevEpoch: 1,
		Entries: []*raft.Log{logEntry(2, 1, entryData(msg("m1")))}}); err != nil || end != 2 {
		t.Fatalf("append 2: %d %v", end, err)
	}
	// A commit far past the batch's end commits up to its end only.
	if end, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 1, PrevEpoch: 1, Commit: math.MaxUint64}); err != nil || end != 1 {
		t.Fatalf("empty append with a huge commit: %d %v", end, err)
	}
	if got := held(); !slices.Equal(got, []string{"0:m0"}) {
		t.Fatalf("after a commit capped at 1 the follower holds %v", got)
	}
	e := func(i, ep uint64) *raft.Log { return logEntry(i, ep, entryData(msg(fmt.Sprintf("h%d", i)))) }
	for _, tc := range []struct {
		name string
		a    pairlog.Append
		want error
	}{
		{"other epoch", pairlog.Append{Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Commit: 2}, pairlog.ErrStaleEpoch},
		{"epoch 0", pairlog.Append{Epoch: 0, Commit: 2}, pairlog.ErrStaleEpoch},
		{"gap", pairlog.Append{Epoch: 1, PrevIndex: 9, PrevEpoch: 1, Entries: []*raft.Log{e(10, 1)}, Commit: 10}, pairlog.ErrMismatch},
		{"prev epoch past epoch", pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 7, Commit: 2}, pairlog.ErrBadAppend},
		{"prev epoch at 0", pairlog.Append{Epoch: 1, PrevEpoch: 1, Commit: 2}, pairlog.ErrBadAppend},
		{"prev max", pairlog.Append{Epoch: 1, PrevIndex: math.MaxUint64, PrevEpoch: 1}, pairlog.ErrBadAppend},
		{"not consecutive", pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: []*raft.Log{e(3, 1), e(5, 1)}, Commit: 5}, pairlog.ErrBadAppend},
		{"nil entry", pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: []*raft.Log{nil}, Commit: 3}, pairlog.ErrBadAppend},
		{"index 0", pairlog.Append{Epoch: 1, Entries: []*raft.Log{e(0, 1)}}, pairlog.ErrBadAppend},
		{"entry epoch past append's", pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1, Entries: []*raft.Log{e(3, 2)}, Commit: 3}, pairlog.ErrBadAppend},
		{"committed entry replaced", pairlog.Append{Epoch: 1, PrevIndex: 1, PrevEpoch: 0, Commit: 2}, pairlog.ErrCommitted},
	} {
		if _, err := p.Append(ctx, tc.a); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if got := held(); !slices.Equal(got, []string{"0:m0"}) {
			t.Fatalf("%s: the follower now holds %v", tc.name, got)
		}
	}
	// An undecodable entry is skipped, the follower goes on.
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 2, PrevEpoch: 1,
		Entries: []*raft.Log{logEntry(3, 1, []byte("junk"))}, Commit: 3}); err != nil {
		t.Fatalf("junk entry: %v", err)
	}
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 3, PrevEpoch: 1,
		Entries: []*raft.Log{logEntry(4, 1, entryData(msg("m2")))}, Commit: 4}); err != nil {
		t.Fatalf("after the junk entry: %v", err)
	}
	if got := held(); !slices.Equal(got, []string{"0:m0", "1:m1", "2:m2"}) {
		t.Fatalf("the follower holds %v", got)
	}
	// A leader refuses appends, even of its own epoch.
	if err := p.Lead(1, nil, false); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 4, PrevEpoch: 1,
		Entries: []*raft.Log{logEntry(5, 1, entryData(msg("intruder")))}, Commit: 5}); !errors.Is(err, pairlog.ErrStaleEpoch) {
		t.Fatalf("append to a leader: %v", err)
	}
	if res, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("m3")}}); err != nil || res.Acks[0].Offset != 3 {
		t.Fatalf("the leader's own send after the refused append: %+v %v", res, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Append(ctx, pairlog.Append{Epoch: 1, PrevIndex: 5, PrevEpoch: 1}); err == nil {
		t.Fatal("a closed replica took an append")
	}
}

// TestPairAttack_AfterClose: every call on a closed replica returns a clear
// error.
func TestPairAttack_AfterClose(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m")); err != nil {
		t.Fatal(err)
	}
	a := ps.rep(0)
	ps.stop(0)
	if _, err := a.Partition(0); !errors.Is(err, ErrClosed) {
		t.Errorf("Partition after Close: %v", err)
	}
	if _, err := a.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("x")}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Apply after Close: %v", err)
	}
	if err := a.Lead(5, nil, false); !errors.Is(err, ErrClosed) {
		t.Errorf("Lead after Close: %v", err)
	}
	if err := a.Follow(5); !errors.Is(err, ErrClosed) {
		t.Errorf("Follow after Close: %v", err)
	}
	if _, err := a.LeaderPartition(ctx, 0); err == nil {
		t.Errorf("LeaderPartition after Close: nil error")
	}
	if _, err := a.Append(ctx, pairlog.Append{Epoch: 1}); err == nil {
		t.Errorf("Append after Close: nil error")
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if a.Leading() || a.Epoch() != 1 {
		t.Errorf("after Close: leading %v, epoch %d", a.Leading(), a.Epoch())
	}
}

// TestPairAttack_BadInput: out-of-range partitions, an unknown op, an
// epoch 0, an empty Dir are errors, not panics; the pair goes on.
func TestPairAttack_BadInput(t *testing.T) {
	if _, err := OpenPair(PairConfig{}); err == nil {
		t.Fatal("OpenPair without a Dir")
	}
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	a := ps.rep(0)
	for _, part := range []int{-1, 1, math.MaxInt} {
		if _, err := a.ApplyTo(ctx, part, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("x")}}); !errors.Is(err, store.ErrBadCommand) {
			t.Errorf("ApplyTo(%d): %v", part, err)
		}
		if _, err := a.Partition(part); !errors.Is(err, store.ErrBadCommand) {
			t.Errorf("Partition(%d): %v", part, err)
		}
	}
	if _, err := a.Apply(ctx, &store.Command{Op: 250, Now: t0}); err == nil {
		t.Error("an unknown op: nil error")
	}
	if _, err := a.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0}); err == nil {
		t.Log("an append of no message: accepted")
	}
	fresh, err := OpenPair(PairConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := fresh.Lead(0, nil, false); err == nil {
		t.Error("Lead(0) accepted")
	}
	if res, err := ps.send(ctx, 0, msg("after")); err != nil || res.Acks[0].Offset != 0 {
		t.Fatalf("a send after the bad input: %+v %v", res, err)
	}
	if got := ps.settle(); len(got) != 1 {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPairAttack_ReopenWithOtherOptions: both replicas reopened with another
// partition count are refused (clearly) and keep their data; reopened with
// other tuning (one command an entry, one entry pending, batches of one)
// and a new epoch, every acked message stays at its offset.
func TestPairAttack_ReopenWithOtherOptions(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	acked := map[string]uint64{}
	sendAll := func(i int, prefix string, n int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for k := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("%s%d", prefix, k)
				res, err := ps.send(ctx, i, msg(id))
				if err != nil {
					t.Errorf("send %s: %v", id, err)
					return
				}
				mu.Lock()
				acked[id] = res.Acks[0].Offset
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	check := func(when string) {
		t.Helper()
		got := ps.settle()
		at := map[string]uint64{}
		for k, m := range got {
			if m.Offset != uint64(k) {
				t.Fatalf("%s: offset %d at position %d", when, m.Offset, k)
			}
			at[m.ID] = m.Offset
		}
		for id, off := range acked {
			if o, ok := at[id]; !ok || o != off {
				t.Fatalf("%s: %s acked at %d, held at %d (%v)", when, id, off, o, ok)
			}
		}
		if len(got) != len(acked) {
			t.Fatalf("%s: %d messages held, %d acked", when, len(got), len(acked))
		}
	}
	sendAll(0, "a", 40)
	ps.close()
	for i := range 2 {
		if p, err := OpenPair(PairConfig{Dir: ps.dirs[i], Partitions: 3}); err == nil {
			p.Close()
			t.Fatalf("%s reopened with 3 partitions", ps.id(i))
		} else if !strings.Contains(err.Error(), "partitions") {
			t.Fatalf("reopen with 3 partitions: unclear error %v", err)
		}
	}
	ps.opts = func(cfg *PairConfig) {
		cfg.MaxEntryCmds, cfg.InFlight, cfg.MaxBatch, cfg.MaxPending, cfg.QueueDepth = 1, 1, 1, 1, 1
	}
	ps.start(0)
	ps.start(1)
	ps.mu.Lock()
	ps.leader = 0
	ps.mu.Unlock()
	ps.promote(false) // b leads epoch 2
	ps.rejoin()
	if _, err := ps.rep(1).LeaderPartition(ctx, 0); err != nil {
		t.Fatal(err)
	}
	check("reopened with other tuning")
	sendAll(1, "b", 20)
	check("after sends with other tuning")
	ps.close()
	ps.opts = nil
	ps.start(0)
	ps.start(1)
	ps.promote(false) // a leads epoch 3
	ps.rejoin()
	if _, err := ps.rep(0).LeaderPartition(ctx, 0); err != nil {
		t.Fatal(err)
	}
	check("reopened with the defaults")
}

// TestPairAttack_FollowerDiskFails: while the follower cannot write, nothing
// is acked and the leader keeps leading; healed, the entry commits on both.
func TestPairAttack_FollowerDiskFails(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m0")); err != nil {
		t.Fatal(err)
	}
	d.set(1, func([]*raft.Log) error { return errTestDisk })
	c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := ps.send(c, 0, msg("m1"))
	cc()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send with the follower's disk failing: %v", err)
	}
	if got := ps.logOf(0); len(got) != 1 || !ps.rep(0).Leading() {
		t.Fatalf("the leader applied %v (leading %v) with its follower failing", ids(got), ps.rep(0).Leading())
	}
	d.set(1, nil)
	res, err := ps.send(ctx, 0, msg("m1"))
	if err != nil || res.Acks[0].Offset != 1 {
		t.Fatalf("retry: %+v %v", res, err)
	}
	if got := ps.settle(); len(got) != 2 {
		t.Fatalf("the replicas hold %v", ids(got))
	}
	if e := ps.entryEpochs(1); len(e["m1"]) == 0 {
		t.Fatal("the follower's log lacks m1")
	}
}

// TestPairAttack_LeaderDiskFailsThenRelead: a leader whose disk fails stops
// leading (unknown outcome, then ErrNotLeader); led again in the same epoch
// it acks the retry once, at one offset, on both replicas.
func TestPairAttack_LeaderDiskFailsThenRelead(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m0")); err != nil {
		t.Fatal(err)
	}
	d.set(0, func([]*raft.Log) error { return errTestDisk })
	if _, err := ps.send(ctx, 0, msg("m1")); !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send with the leader's disk failing: %v", err)
	}
	if _, err := ps.send(ctx, 0, msg("m2")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("send to the failed leader: %v", err)
	}
	d.set(0, nil)
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	for _, id := range []string{"m1", "m2", "m1"} {
		if _, err := ps.send(ctx, 0, msg(id)); err != nil {
			t.Fatalf("send %s after Lead again: %v", id, err)
		}
	}
	got := ps.settle()
	if len(got) != 3 || got[1].ID != "m1" || got[2].ID != "m2" {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPairAttack_RestartLeaderSameEpochFollowerTail: the leader restarted
// once in its epoch, its follower holding an entry it never wrote: the
// follower's tail is replaced, the replicas agree.
func TestPairAttack_RestartLeaderSameEpochFollowerTail(t *testing.T) {
	var d diskHooks
	ps := newPairs(t, d.opts)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m0")); err != nil {
		t.Fatal(err)
	}
	writeOnlyToFollower(t, ps, &d, "X")
	ps.stop(0)
	ps.start(0)
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); !errors.Is(err, pairlog.ErrEpochLed) {
		t.Fatalf("Lead(1) again: %v, want ErrEpochLed", err)
	}
	ps.renew() // the metadata gives the leader a new epoch
	res, err := ps.send(ctx, 0, msg("Y"))
	if err != nil || res.Acks[0].Offset != 1 {
		t.Fatalf("send Y: %+v %v", res, err)
	}
	got := ps.settle()
	if len(got) != 2 || got[1].ID != "Y" {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPairAttack_IsolatedOldLeader: the old leader cut off both ways while
// its follower is promoted alone (the risk stage) acks nothing and serves
// no read, before and after the link heals; the pair then agrees.
func TestPairAttack_IsolatedOldLeader(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("m0")); err != nil {
		t.Fatal(err)
	}
	ps.cut[0].Store(true)
	ps.cut[1].Store(true)
	ps.promote(true)
	if _, err := ps.send(ctx, 1, msg("new")); err != nil {
		t.Fatal(err)
	}
	c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
	if err := ps.rep(0).Verify(c); err == nil {
		t.Fatal("the isolated old leader verified its leadership")
	}
	if res, err := ps.send(c, 0, msg("stale")); err == nil {
		t.Fatalf("the isolated old leader acked: %+v", res)
	}
	cc()
	ps.cut[0].Store(false)
	ps.cut[1].Store(false)
	if !waitFor(patience, func() bool {
		c, cc := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cc()
		err := ps.rep(0).Verify(c)
		_, rerr := ps.rep(0).LeaderPartition(c, 0)
		return errors.Is(err, ErrNotLeader) && errors.Is(rerr, ErrNotLeader) && !ps.rep(0).Leading()
	}) {
		t.Fatal("the old leader was not deposed")
	}
	if res, err := ps.send(ctx, 0, msg("late")); err == nil {
		t.Fatalf("the deposed leader acked: %+v", res)
	}
	ps.rejoin()
	got := ps.settle()
	if len(got) != 2 || got[1].ID != "new" {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPairAttack_CtxAtWaitPoints: a cancelled ctx is honoured before the
// queue, while queued behind a full leader, and while waiting for the
// commit; each call returns promptly.
func TestPairAttack_CtxAtWaitPoints(t *testing.T) {
	ps := newPairs(t, func(cfg *PairConfig) { cfg.MaxPending, cfg.InFlight, cfg.QueueDepth = 1, 1, 1 })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	done, dc := context.WithCancel(ctx)
	dc()
	if _, err := ps.send(done, 0, msg("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("send with a cancelled ctx: %v", err)
	}
	ps.cut[0].Store(true)
	var wg sync.WaitGroup
	start := time.Now()
	for k := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cc()
			_, err := ps.send(c, 0, msg(fmt.Sprintf("w%d", k)))
			if err == nil || !(errors.Is(err, context.DeadlineExceeded)) {
				t.Errorf("send %d with the follower cut off: %v", k, err)
			}
		}()
	}
	wg.Wait()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("sends with a 200ms ctx returned after %v", d)
	}
	c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
	err := ps.rep(0).Verify(c)
	cc()
	if !errors.Is(err, ErrNotLeader) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Verify with the follower cut off: %v", err)
	}
	ps.cut[0].Store(false)
	if _, err := ps.send(ctx, 0, msg("after")); err != nil {
		t.Fatal(err)
	}
	got := ps.settle()
	if len(got) == 0 || got[len(got)-1].ID != "after" {
		t.Fatalf("the replicas hold %v", ids(got))
	}
}

// TestPairAttack_ConcurrentRoleChurn: sends, reads, Lead of the same epoch,
// Follow of the same epoch and direct empty appends race, then both
// replicas close mid-flight: no panic, no hang; reopened under a new
// epoch, every acked message is at its offset on both replicas.
func TestPairAttack_ConcurrentRoleChurn(t *testing.T) {
	ps := newPairs(t, nil)
	a, b := ps.rep(0), ps.rep(1)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var mu sync.Mutex
	acked := map[string]uint64{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	run := func(f func(k int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				f(k)
			}
		}()
	}
	for w := range 4 {
		run(func(k int) {
			id := fmt.Sprintf("w%d-%d", w, k)
			for try := 0; try < 3; try++ {
				c, cc := context.WithTimeout(ctx, 500*time.Millisecond)
				res, err := a.Apply(c, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}})
				cc()
				if err == nil {
					mu.Lock()
					acked[id] = res.Acks[0].Offset
					mu.Unlock()
					return
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	for _, p := range []*Pair{a, b} {
		run(func(int) {
			c, cc := context.WithTimeout(ctx, 100*time.Millisecond)
			_, _ = p.LeaderPartition(c, 0)
			_ = p.Verify(c)
			_, _, _ = p.InSync(), p.Lag(), p.Leading()
			cc()
			time.Sleep(time.Millisecond)
		})
	}
	run(func(int) {
		_ = a.Lead(1, pairLink{ps, 0}, false)
		time.Sleep(15 * time.Millisecond)
	})
	run(func(int) {
		_ = b.Follow(1)
		_, _ = b.Append(ctx, pairlog.Append{Epoch: 1})
		time.Sleep(5 * time.Millisecond)
	})
	time.Sleep(700 * time.Millisecond)
	closed := make(chan struct{})
	go func() {
		ps.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung under concurrent calls")
	}
	close(stop)
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("nothing acked")
	}
	ps.start(0)
	ps.start(1)
	ps.mu.Lock()
	ps.leader = 1
	ps.mu.Unlock()
	ps.promote(false) // a leads epoch 2
	ps.rejoin()
	if _, err := ps.rep(0).LeaderPartition(ctx, 0); err != nil {
		t.Fatal(err)
	}
	got := ps.settle()
	at := map[string]uint64{}
	for k, m := range got {
		if m.Offset != uint64(k) {
			t.Fatalf("offset %d at position %d", m.Offset, k)
		}
		if _, dup := at[m.ID]; dup {
			t.Fatalf("%s stored twice", m.ID)
		}
		at[m.ID] = m.Offset
	}
	for id, off := range acked {
		if o, ok := at[id]; !ok || o != off {
			t.Fatalf("%s acked at %d, held at %d (%v)", id, off, o, ok)
		}
	}
	t.Logf("%d acked, %d held", len(acked), len(got))
}

// TestPairAttack_AsyncThenSync: a leader in the risk stage (async) acks
// with its follower cut off; switched back to sync it is not InSync until
// the follower holds every ack; then the follower, promoted, holds each
// acked message at its offset.
func TestPairAttack_AsyncThenSync(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := ps.send(ctx, 0, msg("s0")); err != nil {
		t.Fatal(err)
	}
	a := ps.rep(0)
	a.SetSync(false) // the risk stage
	ps.cut[0].Store(true)
	acked := map[string]uint64{"s0": 0}
	for k := range 20 {
		id := fmt.Sprintf("r%d", k)
		res, err := ps.send(ctx, 0, msg(id))
		if err != nil {
			t.Fatalf("async send with the follower cut off: %v", err)
		}
		acked[id] = res.Acks[0].Offset
	}
	if err := a.Verify(ctx); err != nil {
		t.Fatalf("Verify in the risk stage: %v", err)
	}
	a.SetSync(true)
	if a.InSync() {
		t.Fatal("InSync with the follower cut off and 20 acks it lacks")
	}
	c, cc := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := ps.send(c, 0, msg("sync0"))
	cc()
	if err == nil {
		t.Fatal("a sync send acked with the follower cut off")
	}
	ps.cut[0].Store(false)
	if !waitFor(patience, a.InSync) {
		t.Fatalf("never InSync (lag %d)", a.Lag())
	}
	if e := ps.entryEpochs(1); len(e) < len(acked) {
		t.Fatalf("InSync, but the follower's log holds %d of %d acked messages", len(e), len(acked))
	}
	ps.stop(0)
	ps.promote(true)
	b := ps.rep(1)
	if _, err := b.LeaderPartition(ctx, 0); err != nil {
		t.Fatal(err)
	}
	held := map[string]uint64{}
	for _, m := range ps.logOf(1) {
		held[m.ID] = m.Offset
	}
	for id, off := range acked {
		if o, ok := held[id]; !ok || o != off {
			t.Fatalf("%s acked at %d, the promoted follower holds it at %d (%v)", id, off, o, ok)
		}
	}
}
