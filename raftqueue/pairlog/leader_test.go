package pairlog

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"
)

// TestLeader_AckNeedsBothCopies: an entry is answered only once both the
// leader's and the follower's log hold it, whichever is slower, and the
// two writes run at the same time.
func TestLeader_AckNeedsBothCopies(t *testing.T) {
	for _, slow := range []string{"leader", "follower"} {
		t.Run(slow, func(t *testing.T) {
			p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{})
			gated, other := p.lstore, p.fstore
			if slow == "follower" {
				gated, other = p.fstore, p.lstore
			}
			release := gated.hold(t)
			f := p.leader.Propose([]byte("a"))
			deadline := time.Now().Add(5 * time.Second)
			for other.writes.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if other.writes.Load() == 0 {
				t.Fatal("the other copy was not written while the " + slow + "'s write waited")
			}
			time.Sleep(20 * time.Millisecond)
			if isDone(f) {
				t.Fatalf("answered while the %s's copy was not written", slow)
			}
			release()
			if err := f.Error(); err != nil || f.Response() != uint64(10) || f.Index() != 1 {
				t.Fatalf("answer %v, %v at %d", err, f.Response(), f.Index())
			}
			if got := p.sm.list(); !slices.Equal(got, []string{"1@1:a"}) {
				t.Fatalf("applied %v", got)
			}
			p.leader.Close()
		})
	}
}

// TestLeader_Deposed: once the follower serves a newer epoch, the
// leader's entries in flight fail with ErrDeposed, later ones at once, and
// every entry answered nil is in both logs.
func TestLeader_Deposed(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{})
	var acked []raft.ApplyFuture
	for i := range 20 {
		f := p.leader.Propose(fmt.Appendf(nil, "a%d", i))
		if err := f.Error(); err != nil {
			t.Fatal(err)
		}
		acked = append(acked, f)
	}
	release := p.fstore.hold(t)
	var inflight []raft.ApplyFuture
	for i := range 5 {
		inflight = append(inflight, p.leader.Propose(fmt.Appendf(nil, "b%d", i)))
	}
	// The follower is promoted: it persists epoch 2 before serving. An
	// append already writing holds the log until its write ends, so the
	// promotion waits for the release.
	promoted := make(chan error, 1)
	go func() { promoted <- p.flog.SetEpoch(2) }()
	time.Sleep(10 * time.Millisecond)
	release()
	if err := <-promoted; err != nil {
		t.Fatal(err)
	}
	for _, f := range inflight {
		if err := f.Error(); err != nil && !errors.Is(err, ErrDeposed) {
			t.Fatalf("in flight: %v", err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.leader.Err() == nil && time.Now().Before(deadline) {
		p.leader.Propose([]byte("probe")) // an append that reaches the follower
		time.Sleep(5 * time.Millisecond)
	}
	if !errors.Is(p.leader.Err(), ErrDeposed) {
		t.Fatalf("leader error %v, want ErrDeposed", p.leader.Err())
	}
	if err := p.leader.Propose([]byte("late")).Error(); !errors.Is(err, ErrDeposed) {
		t.Fatalf("a proposal after the deposition: %v", err)
	}
	fl := dump(t, p.fstore)
	for _, f := range append(acked, inflight...) {
		if f.Error() == nil && f.Index() > uint64(len(fl)) {
			t.Fatalf("entry %d answered nil, the follower holds %d", f.Index(), len(fl))
		}
	}
}

// TestLeader_CatchesUpFollower: a new leader whose log holds entries of
// earlier epochs (not yet applied) brings an empty follower to its log and
// a follower with a tail it never had to its log, then applies the old
// entries, in order, only once the follower holds them.
func TestLeader_CatchesUpFollower(t *testing.T) {
	for name, fepochs := range map[string][]uint64{
		"Empty":   nil,
		"Behind":  {1, 1},
		"OldTail": {1, 1, 1, 2, 2, 2, 2}, // 4-7 of epoch 2 never acked; the leader holds 4-5 of epoch 3
	} {
		t.Run(name, func(t *testing.T) {
			ls, fs := newGatedStore(), newGatedStore()
			if err := ls.StoreLogs(append(ents(1, 1, 1, 1), ents(4, 3, 3)...)); err != nil {
				t.Fatal(err)
			}
			if len(fepochs) > 0 {
				if err := fs.StoreLogs(ents(1, fepochs...)); err != nil {
					t.Fatal(err)
				}
			}
			down := &testPeer{}
			down.down.Store(true)
			p := newPair(t, 4, ls, fs, LeaderConfig{Applied: 1, Peer: down})
			f := p.leader.Propose([]byte("x"))
			time.Sleep(30 * time.Millisecond)
			if got := p.sm.list(); len(got) != 0 || isDone(f) {
				t.Fatalf("applied %v, answered %v with the follower unreachable", got, isDone(f))
			}
			p.leader.Close()

			p = newPair(t, 4, ls, fs, LeaderConfig{Applied: 1, MaxBatch: 2})
			// The closed leader had written its entry (6): the next leader
			// holds it as one of an earlier run, not answered.
			f = p.leader.Propose([]byte("y"))
			if err := answer(t, f); err != nil || f.Index() != 7 {
				t.Fatalf("proposal: %v at %d", err, f.Index())
			}
			want := []string{"2@1:2@1", "3@1:3@1", "4@3:4@3", "5@3:5@3", "6@4:x", "7@4:y"}
			if got := p.sm.list(); !slices.Equal(got, want) {
				t.Fatalf("applied %v, want %v", got, want)
			}
			if lg, fg := dump(t, ls), dump(t, fs); !slices.Equal(lg, fg) || len(fg) != 7 {
				t.Fatalf("leader %v, follower %v", lg, fg)
			}
		})
	}
}

// TestLeader_LossyLink: with Appends failing before delivery and replies
// lost after it, concurrent proposals are all answered, in index order
// and applied once each, and the two logs end alike.
func TestLeader_LossyLink(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{MaxBatch: 8, RetryAfter: time.Millisecond, MaxPending: 64})
	p.peer.lose(rand.New(rand.NewPCG(1, 2)), 300)
	stop := make(chan struct{})
	var flap sync.WaitGroup
	flap.Add(1)
	go func() {
		defer flap.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
				p.peer.down.Store(!p.peer.down.Load())
			}
		}
	}()
	var wg sync.WaitGroup
	var bad atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prev := uint64(0)
			for i := range 40 {
				f := p.leader.Propose(fmt.Appendf(nil, "w%d-%d", w, i))
				if err := f.Error(); err != nil || f.Response() != f.Index()*10 || f.Index() <= prev {
					bad.Add(1)
				}
				prev = f.Index()
			}
		}()
	}
	wg.Wait()
	close(stop)
	flap.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d proposals answered wrong", bad.Load())
	}
	got := p.sm.list()
	if len(got) != 320 {
		t.Fatalf("applied %d entries, want 320", len(got))
	}
	for i, s := range got {
		if want := fmt.Sprintf("%d@1:", i+1); len(s) < len(want) || s[:len(want)] != want {
			t.Fatalf("applied #%d is %s", i, s)
		}
	}
	p.peer.down.Store(false)
	p.peer.loseRate.Store(0)
	p.leader.Propose([]byte("last")).Error() // the follower learns the commit
	if lg, fg := dump(t, p.lstore), dump(t, p.fstore); !slices.Equal(lg, fg) {
		t.Fatalf("logs differ: %d and %d entries", len(lg), len(fg))
	}
}

// TestLeader_LocalWriteFails: a failed write of the leader's own log fails
// the leader; nothing after it is answered nil.
func TestLeader_LocalWriteFails(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{})
	if err := p.leader.Propose([]byte("ok")).Error(); err != nil {
		t.Fatal(err)
	}
	p.lstore.fail.Store(true)
	if err := p.leader.Propose([]byte("lost")).Error(); err == nil {
		t.Fatal("answered nil with the leader's write failing")
	}
	p.lstore.fail.Store(false)
	if err := p.leader.Propose([]byte("after")).Error(); err == nil {
		t.Fatal("a failed leader answered nil")
	}
	if got := p.sm.list(); !slices.Equal(got, []string{"1@1:ok"}) {
		t.Fatalf("applied %v", got)
	}
}

// TestLeader_Alone: without a follower an entry commits on the leader's
// own write (the risk stage).
func TestLeader_Alone(t *testing.T) {
	s := newGatedStore()
	lg, err := OpenLog(s, s, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.SetEpoch(3); err != nil {
		t.Fatal(err)
	}
	sm := &applied{}
	l, err := NewLeader(LeaderConfig{Log: lg, Apply: sm.apply})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Propose([]byte("a")).Error(); err != nil {
		t.Fatal(err)
	}
	if got := sm.list(); !slices.Equal(got, []string{"1@3:a"}) {
		t.Fatalf("applied %v", got)
	}
}

// TestLeader_CloseWhileWaiting: Close returns with the follower
// unreachable and a write held; what was pending is answered ErrClosed or
// with the write's result, never left waiting; Propose after Close fails.
func TestLeader_CloseWhileWaiting(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{})
	p.peer.down.Store(true)
	var fs []raft.ApplyFuture
	for i := range 10 {
		fs = append(fs, p.leader.Propose(fmt.Appendf(nil, "%d", i)))
	}
	release := p.lstore.hold(t)
	fs = append(fs, p.leader.Propose([]byte("held")))
	closed := make(chan struct{})
	go func() { p.leader.Close(); close(closed) }()
	time.Sleep(10 * time.Millisecond)
	release() // a disk write cannot be cancelled: Close waits for it
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	for _, f := range fs {
		if err := f.Error(); !errors.Is(err, ErrClosed) {
			t.Fatalf("pending entry %d: %v", f.Index(), err)
		}
	}
	if err := p.leader.Propose([]byte("late")).Error(); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestNewLeader_Invalid: a leader needs a log serving an epoch, an Apply,
// and an applied index within its log.
func TestNewLeader_Invalid(t *testing.T) {
	s := raft.NewInmemStore()
	lg, _ := OpenLog(s, s, 0)
	if _, err := NewLeader(LeaderConfig{Log: lg, Apply: (&applied{}).apply}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("no epoch: %v", err)
	}
	if _, err := NewLeader(LeaderConfig{Log: lg}); err == nil {
		t.Fatal("no Apply")
	}
	lg.SetEpoch(1)
	if _, err := NewLeader(LeaderConfig{Log: lg, Apply: (&applied{}).apply, Applied: 3}); err == nil {
		t.Fatal("applied past the log")
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLeader_RiskStage: async, entries commit on the leader's write while
// the follower is unreachable, and are still sent to it; InSync stays
// false until the leader is switched back to sync and the follower holds
// every entry committed alone; from then on an entry waits for it again.
func TestLeader_RiskStage(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{Async: true, RetryAfter: time.Millisecond})
	p.peer.down.Store(true)
	for i := range 5 {
		if err := answer(t, p.leader.Propose(fmt.Appendf(nil, "a%d", i))); err != nil {
			t.Fatalf("async, follower down: %v", err)
		}
	}
	if p.leader.InSync() {
		t.Fatal("in sync while async")
	}
	p.leader.SetSync(true)
	if p.leader.InSync() {
		t.Fatal("in sync with the follower holding nothing")
	}
	f := p.leader.Propose([]byte("b"))
	time.Sleep(20 * time.Millisecond)
	if isDone(f) {
		t.Fatal("sync again: answered without the follower")
	}
	p.peer.down.Store(false)
	if err := answer(t, f); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !p.leader.InSync() {
		if time.Now().After(deadline) {
			t.Fatal("never in sync")
		}
		time.Sleep(time.Millisecond)
	}
	if got := dump(t, p.fstore); len(got) != 6 {
		t.Fatalf("the follower holds %v", got)
	}
	p.leader.SetSync(false)
	if p.leader.InSync() {
		t.Fatal("in sync after the switch to async")
	}
}

// TestLeader_MaxBatchBytes: an Append carries at most MaxBatchBytes of
// entry data, but always one entry, however large.
func TestLeader_MaxBatchBytes(t *testing.T) {
	fs := newGatedStore()
	var sizes []int
	var mu sync.Mutex
	p := newPair(t, 1, newGatedStore(), fs, LeaderConfig{MaxBatchBytes: 100})
	p.leader.Close()
	// A leader whose peer records each batch's size.
	llog, err := OpenLog(p.lstore, p.lstore, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := peerFunc(func(ctx context.Context, a Append) (uint64, error) {
		n := 0
		for _, e := range a.Entries {
			n += len(e.Data)
		}
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
		return p.flog.Append(a)
	})
	l, err := NewLeader(LeaderConfig{Log: llog, Peer: peer, Apply: p.sm.apply, MaxBatchBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var fs2 []raft.ApplyFuture
	for i := range 20 {
		fs2 = append(fs2, l.Propose(make([]byte, 30+i%2*200)))
	}
	for _, f := range fs2 {
		if err := answer(t, f); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range sizes {
		if n > 100 && n != 230 {
			t.Fatalf("a batch of %d bytes (sizes %v)", n, sizes)
		}
	}
}

// lastPeer is a peer answering with the follower's last index rather than
// the batch's end (as raft's AppendEntries replies carry a last-log hint):
// a reply end past what was sent.
type lastPeer struct{ f *Log }

func (p *lastPeer) Append(ctx context.Context, a Append) (uint64, error) {
	if _, err := p.f.Append(a); err != nil {
		return 0, err
	}
	last, _, err := p.f.Last()
	return last, err
}

func (p *lastPeer) Install(context.Context, Install) error { return errNoInstall }

// skipPeer delivers its first batch with entries only once gate is closed,
// then answers it one past the batch's end (a reply meant for another
// request, or a follower's last index); later Appends are delivered as is.
type skipPeer struct {
	f     *Log
	gate  chan struct{}
	after func() // called once the first batch is delivered
	calls atomic.Int64
}

func (p *skipPeer) Append(ctx context.Context, a Append) (uint64, error) {
	if len(a.Entries) == 0 || p.calls.Add(1) > 1 {
		return p.f.Append(a)
	}
	select {
	case <-p.gate:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	end, err := p.f.Append(a)
	p.after()
	return end + 1, err
}

func (p *skipPeer) Install(context.Context, Install) error { return errNoInstall }

// TestLeader_SameEpochRestartConverges: the leader sends an entry to the
// follower before its own write is durable (the two writes run at the same
// time, by design); its own write then fails, so the follower holds 1@1:x
// and the leader's log does not. A new Leader of the same epoch over the
// same log (a node restarting with an unchanged pair record) proposes y at
// index 1, epoch 1: y is answered nil only once the follower holds y
// there, since a leader run's first Append resets the follower's tail
// (Append.Reset). This broke when the follower compared only (index,
// epoch), took 1@1 for "already held" and kept x under an acked y.
func TestLeader_SameEpochRestartConverges(t *testing.T) {
	ls, fs := newGatedStore(), newGatedStore()
	p := newPair(t, 1, ls, fs, LeaderConfig{})
	release := ls.hold(t)
	fx := p.leader.Propose([]byte("x"))
	waitFor(t, "the follower to hold x", func() bool { return fs.writes.Load() == 1 })
	ls.fail.Store(true) // the leader's own write fails (or the node crashes)
	release()
	if err := answer(t, fx); err == nil {
		t.Fatal("x answered nil with the leader's write failing")
	}
	closeWithin(t, p.leader, 5*time.Second)
	ls.fail.Store(false)

	// The node leads again, the pair record (epoch 1) unchanged.
	p2 := newPair(t, 1, ls, fs, LeaderConfig{})
	fy := p2.leader.Propose([]byte("y"))
	err := answer(t, fy)
	lg, fg := dump(t, ls), dump(t, fs)
	if err == nil && entryAt(fs, fy.Index()) != entryAt(ls, fy.Index()) {
		t.Errorf("entry %d (y) answered nil, but the follower holds %q there (the leader %q); leader log %v, follower log %v",
			fy.Index(), entryAt(fs, fy.Index()), entryAt(ls, fy.Index()), lg, fg)
	}
}

// TestLeader_CatchUpCutsStaleTail: after a full catch-up the follower's
// log equals the leader's. A leader of epoch 2 whose log is 1-3@1 and a
// follower (the old leader) holding 1-5@1, 4-5 never acked: the leader's
// first Append (a heartbeat at PrevIndex 3) matches. This broke when the
// follower left the tail after a batch's end in place and the idle leader
// sent nothing more: the follower kept 4@1 and 5@1, which it would apply
// if promoted.
func TestLeader_CatchUpCutsStaleTail(t *testing.T) {
	ls, fs := newGatedStore(), newGatedStore()
	if err := ls.StoreLogs(ents(1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := fs.StoreLogs(ents(1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	p := newPair(t, 2, ls, fs, LeaderConfig{RetryAfter: time.Millisecond})
	waitFor(t, "the old entries to be applied", func() bool { return len(p.sm.list()) == 3 })
	waitFor(t, "the follower to learn the commit", func() bool { return p.flog.Commit() == 3 })
	time.Sleep(50 * time.Millisecond) // the leader is idle: nothing more is sent
	if lg, fg := dump(t, ls), dump(t, fs); !slices.Equal(lg, fg) {
		fi, fe, _ := p.flog.Last()
		t.Errorf("caught up (applied 1-3, follower commit 3) but the logs differ: leader %v, follower %v (follower's last %d@%d)", lg, fg, fi, fe)
	}
}

// TestLeader_ReplyEndPastBatchIgnored: a peer whose reply claims an end
// past the batch it was sent (here the follower's last index, 5, for a
// heartbeat at 3: the follower holds an old tail 4-5@1); the leader trusts
// only the end of the batch it sent, so the next entry (4@2) is answered
// nil only once the follower holds it. This broke when the leader took the
// reply's end as is: the entry committed on the leader's write alone, and
// the next send read past its queue, a panic in the send goroutine (hence
// the child process).
func TestLeader_ReplyEndPastBatchIgnored(t *testing.T) {
	const name = "TestLeader_ReplyEndPastBatchIgnored"
	if !inChild(t, name) {
		return
	}
	ls, fs := newGatedStore(), newGatedStore()
	if err := ls.StoreLogs(ents(1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := fs.StoreLogs(ents(1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	flog := openAt(t, fs, 2, 0)
	p := newPair(t, 2, ls, newGatedStore(), LeaderConfig{Peer: &lastPeer{f: flog}, RetryAfter: time.Millisecond})
	time.Sleep(100 * time.Millisecond) // the heartbeat's reply arrives
	f := p.leader.Propose([]byte("a"))
	if err := answer(t, f); err == nil && entryAt(fs, f.Index()) != entryAt(ls, f.Index()) {
		t.Fatalf("entry %d answered nil; the follower holds %q there", f.Index(), entryAt(fs, f.Index()))
	}
}

// TestLeader_ReplyEndPastBatchNoFalseAck: the case of
// TestLeader_ReplyEndPastBatchIgnored without the panic. The first batch
// carries entry 1 only and its reply claims 2 while entry 2 is proposed;
// the follower's disk stalls after the first batch, so what it holds when
// entry 2 is answered is final: entry 2 is not answered nil unless the
// follower holds it. This broke when the leader raised matched and
// sendAfter to the reply's end, never sent entry 2 and answered it nil
// once its own write was done. (Run in a child process in case the send
// goroutine panics.)
func TestLeader_ReplyEndPastBatchNoFalseAck(t *testing.T) {
	const name = "TestLeader_ReplyEndPastBatchNoFalseAck"
	if !inChild(t, name) {
		return
	}
	fs := newGatedStore()
	// Once the first batch is delivered the follower's disk stalls, so
	// that whatever the follower holds when entry 2 is answered is final.
	peer := &skipPeer{f: openAt(t, fs, 1, 0), gate: make(chan struct{}), after: func() { fs.hold(t) }}
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{Peer: peer, MaxBatch: 1, RetryAfter: time.Millisecond})
	f1 := p.leader.Propose([]byte("a"))
	f2 := p.leader.Propose([]byte("b"))
	close(peer.gate)
	answer(t, f1)
	if err2 := answer(t, f2); err2 == nil && entryAt(fs, 2) != entryAt(p.lstore, 2) {
		t.Fatalf("entry 2 answered nil, the follower holding %q there (its log %v)", entryAt(fs, 2), dump(t, fs))
	}
}

// TestLeader_FollowerBehindCompactionFails: every future is eventually
// answered. The leader applied and compacted its log through 3 (entries
// 4-6 remain) and a new, empty follower joins: with no Snapshot to install,
// the leader fails (ErrCompacted, reported by Err) instead of waiting.
// This broke when the leader retried the read of its compacted log
// forever: proposals were never answered and Err stayed nil.
func TestLeader_FollowerBehindCompactionFails(t *testing.T) {
	ls := newGatedStore()
	if err := ls.StoreLogs(ents(1, 1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := ls.DeleteRange(1, 3); err != nil { // compacted: applied through 6
		t.Fatal(err)
	}
	p := newPair(t, 2, ls, newGatedStore(), LeaderConfig{Applied: 6, RetryAfter: time.Millisecond})
	f := p.leader.Propose([]byte("x"))
	deadline := time.Now().Add(2 * time.Second)
	for !isDone(f) && p.leader.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !isDone(f) && p.leader.Err() == nil {
		t.Errorf("2 s on: entry %d unanswered, the leader's Err() nil, the follower holding %d entries: the leader retries a read of its compacted log forever",
			f.Index(), len(dump(t, p.fstore)))
	}
	closeWithin(t, p.leader, 5*time.Second)
	if err := answer(t, f); !errors.Is(err, ErrClosed) && err == nil {
		t.Fatalf("answered nil: %v", err)
	}
}

// TestLeader_CloseStartsNoNewWrite: Close returns promptly, waiting for at
// most the one disk write in flight. With a write of entry 1 in flight and
// entries 2-3 proposed behind it, Close cancels and waits: no write of 2-3
// starts, and every future is answered ErrClosed. This broke when the
// write goroutine did not look at the cancelled context once the write in
// flight returned and started a new write of 2-3 that Close waited for
// too.
func TestLeader_CloseStartsNoNewWrite(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{})
	p.peer.down.Store(true)
	release := p.lstore.hold(t)
	fs := []raft.ApplyFuture{p.leader.Propose([]byte("1"))}
	time.Sleep(100 * time.Millisecond) // the write goroutine takes entry 1 and waits on the disk
	fs = append(fs, p.leader.Propose([]byte("2")), p.leader.Propose([]byte("3")))
	closed := make(chan struct{})
	go func() { p.leader.Close(); close(closed) }()
	time.Sleep(50 * time.Millisecond) // Close has cancelled and waits
	release()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	for _, f := range fs {
		if err := answer(t, f); !errors.Is(err, ErrClosed) {
			t.Fatalf("entry %d: %v", f.Index(), err)
		}
	}
	if n := p.lstore.writes.Load(); n != 1 {
		t.Errorf("Close waited for %d disk writes (log %v): one was in flight, the others started after Close cancelled", n, dump(t, p.lstore))
	}
}

// TestLeader_ProposeRacingClose: proposers racing Close over a lossy,
// flapping link: every future is answered, Close returns promptly, and
// every entry answered nil is on both logs, the same.
func TestLeader_ProposeRacingClose(t *testing.T) {
	for round := range 6 {
		p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{MaxBatch: 4, MaxPending: 16, RetryAfter: time.Millisecond})
		p.peer.lose(rand.New(rand.NewPCG(uint64(round), 3)), 200)
		var mu sync.Mutex
		var futures []raft.ApplyFuture
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					f := p.leader.Propose(fmt.Appendf(nil, "w%d-%d", w, i))
					mu.Lock()
					futures = append(futures, f)
					mu.Unlock()
					if i%3 == 0 {
						f.Error()
					}
				}
			}()
		}
		time.Sleep(time.Duration(5+round*7) * time.Millisecond)
		closeWithin(t, p.leader, 5*time.Second)
		close(stop)
		wg.Wait()
		acked := 0
		for _, f := range futures {
			err := answer(t, f)
			if err == nil {
				acked++
				if lg, fg := entryAt(p.lstore, f.Index()), entryAt(p.fstore, f.Index()); lg == "" || lg != fg {
					t.Fatalf("round %d: entry %d answered nil, leader %q follower %q", round, f.Index(), lg, fg)
				}
			} else if !errors.Is(err, ErrClosed) {
				t.Fatalf("round %d: entry %d: %v", round, f.Index(), err)
			}
		}
		if got := p.sm.list(); len(got) < acked {
			t.Fatalf("round %d: %d acked, %d applied", round, acked, len(got))
		}
	}
}

// TestLeader_LostRepliesThenNewEpoch: Appends delivered with their replies
// lost, then the follower serves epoch 2: nothing more is answered nil,
// the leader is deposed, every future answered.
func TestLeader_LostRepliesThenNewEpoch(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{RetryAfter: time.Millisecond})
	if err := answer(t, p.leader.Propose([]byte("ok"))); err != nil {
		t.Fatal(err)
	}
	p.peer.lose(rand.New(rand.NewPCG(1, 1)), 1000) // delivered, reply lost
	var fs []raft.ApplyFuture
	for i := range 5 {
		fs = append(fs, p.leader.Propose(fmt.Appendf(nil, "%d", i)))
	}
	waitFor(t, "the follower to hold them", func() bool { return len(dump(t, p.fstore)) == 6 })
	if err := p.flog.SetEpoch(2); err != nil {
		t.Fatal(err)
	}
	p.peer.loseRate.Store(0)
	for _, f := range fs {
		if err := answer(t, f); !errors.Is(err, ErrDeposed) {
			t.Fatalf("entry %d: %v, want ErrDeposed", f.Index(), err)
		}
	}
	if err := answer(t, p.leader.Propose([]byte("late"))); !errors.Is(err, ErrDeposed) {
		t.Fatalf("late: %v", err)
	}
}

// TestLeader_CloseWithFullPending: MaxPending reached with the follower
// down, more proposers blocked on room; Close answers all with ErrClosed
// promptly.
func TestLeader_CloseWithFullPending(t *testing.T) {
	p := newPair(t, 1, newGatedStore(), newGatedStore(), LeaderConfig{MaxPending: 4, RetryAfter: time.Millisecond})
	p.peer.down.Store(true)
	out := make(chan raft.ApplyFuture, 10)
	for i := range 10 {
		go func() { out <- p.leader.Propose(fmt.Appendf(nil, "%d", i)) }()
	}
	time.Sleep(50 * time.Millisecond)
	closeWithin(t, p.leader, 2*time.Second)
	for range 10 {
		select {
		case f := <-out:
			if err := answer(t, f); !errors.Is(err, ErrClosed) {
				t.Fatalf("entry %d: %v", f.Index(), err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a blocked Propose did not return after Close")
		}
	}
	if len(p.sm.list()) != 0 {
		t.Fatalf("applied %v with the follower down", p.sm.list())
	}
}

// TestLeader_WalksBackOverCompactedFollower: the follower compacted its
// committed prefix (1-3) and holds an old tail 4-6@1; the leader of epoch 3
// (4-6@2) walks back to it, the tail is replaced, the prefix untouched,
// and the new entry is answered only when both hold it.
func TestLeader_WalksBackOverCompactedFollower(t *testing.T) {
	ls, fs := newGatedStore(), newGatedStore()
	if err := ls.StoreLogs(append(ents(1, 1, 1, 1), ents(4, 2, 2, 2)...)); err != nil {
		t.Fatal(err)
	}
	if err := fs.StoreLogs(ents(1, 1, 1, 1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	fs.DeleteRange(1, 3)
	p := newPair(t, 3, ls, fs, LeaderConfig{Applied: 3, MaxBatch: 2, RetryAfter: time.Millisecond})
	f := p.leader.Propose([]byte("x"))
	if err := answer(t, f); err != nil || f.Index() != 7 {
		t.Fatalf("x: %v at %d", err, f.Index())
	}
	want := []string{"4@2:4@2", "5@2:5@2", "6@2:6@2", "7@3:x"}
	if got := dump(t, fs); !slices.Equal(got, want) {
		t.Fatalf("follower %v, want %v", got, want)
	}
	if got := p.sm.list(); !slices.Equal(got, want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
}
