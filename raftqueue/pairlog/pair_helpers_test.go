package pairlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
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

func newGatedStore() *gatedStore {
	g := &gatedStore{InmemStore: raft.NewInmemStore(), open: make(chan struct{})}
	close(g.open)
	return g
}

// testPeer delivers Appends to a follower's Log in this process. It can
// fail them before delivery (the link down) or after (the reply lost).
type testPeer struct {
	f        *Log
	down     atomic.Bool
	loseRate atomic.Int64 // per mille of replies lost after delivery
	rng      *rand.Rand
	mu       sync.Mutex
}

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
	p.mu.Lock()
	f := p.f
	p.mu.Unlock()
	end, err := f.Append(a)
	p.mu.Lock()
	lost := p.rng != nil && p.rng.Int64N(1000) < p.loseRate.Load()
	p.mu.Unlock()
	if lost {
		return 0, errLink
	}
	return end, err
}

func (p *testPeer) Install(context.Context, Install) error { return errNoInstall }

var errLink = errors.New("test: link down")

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

// peerFunc is a Peer in a function.
type peerFunc func(ctx context.Context, a Append) (uint64, error)

func (f peerFunc) Append(ctx context.Context, a Append) (uint64, error) { return f(ctx, a) }

func (f peerFunc) Install(context.Context, Install) error { return errNoInstall }

// errNoInstall answers the installs of the peers of these tests, whose
// leaders have no Snapshot (they never send one).
var errNoInstall = errors.New("test peer: no snapshot install")

// waitFor polls cond for up to 5 s, failing the test if it never holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// closeWithin closes l, failing the test if Close takes longer than d.
func closeWithin(t *testing.T, l *Leader, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("Close did not return in %v", d)
	}
}

// openAt opens a Log over s (committed as given) serving epoch.
func openAt(t *testing.T, s *gatedStore, epoch, committed uint64) *Log {
	t.Helper()
	l, err := OpenLog(s, s, committed)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch(epoch); err != nil {
		t.Fatal(err)
	}
	return l
}

// entryAt returns "index@epoch:data" of s's entry at i ("" if none).
func entryAt(s raft.LogStore, i uint64) string {
	var e raft.Log
	if err := s.GetLog(i, &e); err != nil {
		return ""
	}
	return fmt.Sprintf("%d@%d:%s", e.Index, e.Term, e.Data)
}

// inChild runs the test named name in a child process (for a scenario that
// may panic in a leader goroutine, which would kill the whole test binary)
// and fails if the child fails or panics. It returns true in the child,
// which then runs the scenario itself.
func inChild(t *testing.T, name string) bool {
	t.Helper()
	if os.Getenv("PAIRLOG_TEST_CHILD") == name {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "PAIRLOG_TEST_CHILD="+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if i := bytes.Index(out, []byte("panic:")); i >= 0 {
			out = out[i:min(len(out), i+1500)]
		}
		t.Fatalf("the scenario failed in a child process (%v):\n%s", err, out)
	}
	return false
}
