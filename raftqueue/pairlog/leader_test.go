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

// gatedStore is a log store whose writes wait while gate is closed (a
// slow disk) and fail while fail is set (a disk error).
type gatedStore struct {
	*raft.InmemStore
	mu     sync.Mutex
	open   chan struct{} // closed: writes pass
	fail   atomic.Bool
	writes atomic.Int64
}

func newGatedStore() *gatedStore {
	g := &gatedStore{InmemStore: raft.NewInmemStore(), open: make(chan struct{})}
	close(g.open)
	return g
}

// hold makes writes wait until the returned release is called, at the
// latest when the test ends (before the leader's Close, which waits for
// the write).
func (g *gatedStore) hold(t *testing.T) (release func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.open = ch
	g.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return release
}

func (g *gatedStore) StoreLogs(es []*raft.Log) error {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	<-ch
	if g.fail.Load() {
		return errors.New("write: input/output error")
	}
	g.writes.Add(1)
	// Copies, as a store on disk holds its own bytes.
	cp := make([]*raft.Log, len(es))
	for i, e := range es {
		c := *e
		cp[i] = &c
	}
	return g.InmemStore.StoreLogs(cp)
}

func (g *gatedStore) StoreLog(e *raft.Log) error { return g.StoreLogs([]*raft.Log{e}) }

// testPeer delivers Appends to a follower's Log in this process. It can
// fail them before delivery (the link down) or after (the reply lost).
type testPeer struct {
	f        *Log
	down     atomic.Bool
	loseRate atomic.Int64 // per mille of replies lost after delivery
	rng      *rand.Rand
	mu       sync.Mutex
}

var errLink = errors.New("test: link down")

// lose makes the peer lose rate per mille of its replies, drawn from rng.
func (p *testPeer) lose(rng *rand.Rand, rate int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rng = rng
	p.loseRate.Store(rate)
}

func (p *testPeer) Append(ctx context.Context, a Append) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if p.down.Load() {
		return 0, errLink
	}
	end, err := p.f.Append(a)
	p.mu.Lock()
	lost := p.rng != nil && p.rng.Int64N(1000) < p.loseRate.Load()
	p.mu.Unlock()
	if lost {
		return 0, errLink
	}
	return end, err
}

// applied is a state machine recording the entries it applied, in order.
type applied struct {
	mu   sync.Mutex
	logs []string
}

func (s *applied) apply(logs []*raft.Log) []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]any, len(logs))
	for i, l := range logs {
		s.logs = append(s.logs, fmt.Sprintf("%d@%d:%s", l.Index, l.Term, l.Data))
		out[i] = l.Index * 10
	}
	return out
}

func (s *applied) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.logs)
}

// pair is a leader and its follower in one process.
type pair struct {
	lstore, fstore *gatedStore
	flog           *Log
	peer           *testPeer
	sm             *applied
	leader         *Leader
}

// newPair starts a leader of epoch over stores holding what they hold.
func newPair(t *testing.T, epoch uint64, lstore, fstore *gatedStore, cfg LeaderConfig) *pair {
	t.Helper()
	p := &pair{lstore: lstore, fstore: fstore, sm: &applied{}}
	llog, err := OpenLog(lstore, lstore, cfg.Applied)
	if err != nil {
		t.Fatal(err)
	}
	if p.flog, err = OpenLog(fstore, fstore, 0); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Log{llog, p.flog} {
		if err := l.SetEpoch(epoch); err != nil {
			t.Fatal(err)
		}
	}
	p.peer = &testPeer{f: p.flog}
	cfg.Log, cfg.Apply = llog, p.sm.apply
	if cfg.Peer == nil {
		cfg.Peer = p.peer
	}
	if p.leader, err = NewLeader(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.leader.Close() })
	return p
}

// dump returns "index@epoch:data" of every entry in s.
func dump(t *testing.T, s raft.LogStore) []string {
	t.Helper()
	var out []string
	for _, e := range entriesOf(t, s) {
		out = append(out, fmt.Sprintf("%d@%d:%s", e.Index, e.Term, e.Data))
	}
	return out
}

// answer waits for f's answer, failing the test after 10 s.
func answer(t *testing.T, f raft.ApplyFuture) error {
	t.Helper()
	select {
	case <-f.(*entry).done:
		return f.Error()
	case <-time.After(10 * time.Second):
		t.Fatalf("entry %d not answered in 10 s", f.Index())
		return nil
	}
}

func isDone(f raft.ApplyFuture) bool {
	select {
	case <-f.(*entry).done:
		return true
	default:
		return false
	}
}

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
	// The follower is promoted: it persists epoch 2 before serving.
	if err := p.flog.SetEpoch(2); err != nil {
		t.Fatal(err)
	}
	release()
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

// peerFunc is a Peer in a function.
type peerFunc func(ctx context.Context, a Append) (uint64, error)

func (f peerFunc) Append(ctx context.Context, a Append) (uint64, error) { return f(ctx, a) }

// errNoInstall answers the installs of the peers of these tests, whose
// leaders have no Snapshot (they never send one).
var errNoInstall = errors.New("test peer: no snapshot install")

func (f peerFunc) Install(context.Context, Install) error  { return errNoInstall }
func (p *testPeer) Install(context.Context, Install) error { return errNoInstall }
func (p *lastPeer) Install(context.Context, Install) error { return errNoInstall }
func (p *skipPeer) Install(context.Context, Install) error { return errNoInstall }
