package replica

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// fakeReplica is a leaderReplica whose calls the test decides.
type fakeReplica struct {
	applies atomic.Int32
	apply   func(n int32) (store.Result, error) // the nth ApplyTo, from 1
	part    *store.Partition                    // Partition's answer; nil: an error
}

func (r *fakeReplica) ApplyTo(_ context.Context, _ int, _ *store.Command) (store.Result, error) {
	return r.apply(r.applies.Add(1))
}

func (r *fakeReplica) Partition(int) (*store.Partition, error) {
	if r.part == nil {
		return nil, errors.New("test: no partition")
	}
	return r.part, nil
}

func (r *fakeReplica) LeaderPartition(context.Context, int) (*store.Partition, error) {
	return r.Partition(0)
}

func (r *fakeReplica) LeaderSince() time.Time { return time.Time{} }

// fakeKind leads through rep while it is set; setLeader changes that and
// signals the change.
type fakeKind struct {
	mu      sync.Mutex
	rep     leaderReplica // nil: not leading, no leader known
	changed chan struct{}
	refuse  error
}

func newFakeKind(rep leaderReplica) *fakeKind {
	return &fakeKind{rep: rep, changed: make(chan struct{})}
}

func (k *fakeKind) setLeader(rep leaderReplica) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rep = rep
	close(k.changed)
	k.changed = make(chan struct{})
}

func (k *fakeKind) next() route {
	k.mu.Lock()
	defer k.mu.Unlock()
	return route{local: k.rep, refuse: k.refuse, changed: k.changed}
}

func (k *fakeKind) sent(string, error)          {}
func (k *fakeKind) candidates() int             { return 1 }
func (k *fakeKind) checkDamage(err error) error { return err }
func (k *fakeKind) replica() leaderReplica {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rep
}
func (k *fakeKind) leading() (leaderReplica, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rep, k.changed
}
func (k *fakeKind) notLeading()    {}
func (k *fakeKind) release() error { return nil }

func newFakePartition(k kind) *Partition {
	return newPartition(Config{Topic: "t", Index: 0, Self: "a", CallTimeout: time.Second}, k)
}

func appendCmd() *store.Command {
	return &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: "m", Body: []byte("x")}}}
}

// TestPartition_LocalUnknownOutcomeIsReturned: a command this node's
// replica proposed and whose outcome it cannot tell (raftqueue's
// ErrUnknownOutcome, here beside ErrClosed, as raft answers an entry in
// flight when it shuts down) is returned as unknown, once, while the
// partition is open: proposing it again, here or at another leader, may
// apply it twice. The old Raft3 loop returned every local error but
// ErrNotLeader as it came.
func TestPartition_LocalUnknownOutcomeIsReturned(t *testing.T) {
	rep := &fakeReplica{apply: func(int32) (store.Result, error) {
		return store.Result{}, fmt.Errorf("%w: %w", raftqueue.ErrUnknownOutcome, raftqueue.ErrClosed)
	}}
	p := newFakePartition(newFakeKind(rep))
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := p.Apply(ctx, appendCmd())
	if !errors.Is(err, raftqueue.ErrUnknownOutcome) {
		t.Fatalf("Apply: %v, want ErrUnknownOutcome", err)
	}
	if n := rep.applies.Load(); n != 1 {
		t.Fatalf("the command was proposed %d times, want once", n)
	}
}

// TestPartition_LocalErrClosedTriedAgain: a local call refused because the
// replica's partition closed under it (a restore replaced it), with
// nothing proposed, is tried again while the partition is open.
func TestPartition_LocalErrClosedTriedAgain(t *testing.T) {
	rep := &fakeReplica{apply: func(n int32) (store.Result, error) {
		if n == 1 {
			return store.Result{}, raftqueue.ErrClosed
		}
		return store.Result{Offset: 7}, nil
	}}
	p := newFakePartition(newFakeKind(rep))
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := p.Apply(ctx, appendCmd())
	if err != nil || res.Offset != 7 || rep.applies.Load() != 2 {
		t.Fatalf("Apply: %+v, %v after %d tries, want offset 7 on the second", res, err, rep.applies.Load())
	}
}

// TestPartition_RefusedSend: a route that refuses sends refuses appends
// and prepares, without proposing them, and lets other commands through.
func TestPartition_RefusedSend(t *testing.T) {
	rep := &fakeReplica{apply: func(int32) (store.Result, error) { return store.Result{}, nil }}
	k := newFakeKind(rep)
	k.refuse = fmt.Errorf("%w: test", ErrNoInSync)
	p := newFakePartition(k)
	defer p.Close()
	ctx := context.Background()
	if _, err := p.Apply(ctx, appendCmd()); !errors.Is(err, ErrNoInSync) {
		t.Fatalf("append: %v, want ErrNoInSync", err)
	}
	if _, err := p.Apply(ctx, &store.Command{Op: store.OpPrepare, TxID: "tx", Producer: "a"}); !errors.Is(err, ErrNoInSync) {
		t.Fatalf("prepare: %v, want ErrNoInSync", err)
	}
	if n := rep.applies.Load(); n != 0 {
		t.Fatalf("%d refused sends proposed", n)
	}
	if _, err := p.Apply(ctx, &store.Command{Op: store.OpCommitOffset, Group: "g", Offset: 1}); err != nil {
		t.Fatalf("commit offset: %v", err)
	}
	if n := rep.applies.Load(); n != 1 {
		t.Fatalf("commit offset proposed %d times", n)
	}
}

// TestPartition_WaitEnds: a call with no leader waits until its ctx ends
// (ErrNoLeader wrapping ctx's error), until the partition's Close
// (store.ErrClosed), or, once the node is closing, tries once and returns
// store.ErrClosed without waiting for its ctx; a leader that comes while it
// waits answers it at once.
func TestPartition_WaitEnds(t *testing.T) {
	t.Run("Ctx", func(t *testing.T) {
		p := newFakePartition(newFakeKind(nil))
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := p.Apply(ctx, appendCmd())
		if !errors.Is(err, ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Apply: %v, want ErrNoLeader and DeadlineExceeded", err)
		}
	})
	t.Run("Close", func(t *testing.T) {
		p := newFakePartition(newFakeKind(nil))
		done := make(chan error, 1)
		go func() {
			_, err := p.Apply(context.Background(), appendCmd())
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		p.Close()
		select {
		case err := <-done:
			if !errors.Is(err, store.ErrClosed) {
				t.Fatalf("Apply: %v, want store.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Apply waits past Close")
		}
	})
	t.Run("Closing", func(t *testing.T) {
		p := newFakePartition(newFakeKind(nil))
		defer p.Close()
		p.Closing()
		start := time.Now()
		_, err := p.Apply(context.Background(), appendCmd())
		if !errors.Is(err, store.ErrClosed) || time.Since(start) > time.Second {
			t.Fatalf("Apply on a closing node: %v after %v, want store.ErrClosed at once", err, time.Since(start))
		}
	})
	t.Run("LeaderComes", func(t *testing.T) {
		k := newFakeKind(nil)
		p := newFakePartition(k)
		defer p.Close()
		rep := &fakeReplica{apply: func(int32) (store.Result, error) { return store.Result{Offset: 3}, nil }}
		time.AfterFunc(300*time.Millisecond, func() { k.setLeader(rep) })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		res, err := p.Apply(ctx, appendCmd())
		if err != nil || res.Offset != 3 {
			t.Fatalf("Apply: %+v, %v", res, err)
		}
		if d := time.Since(start); d > 600*time.Millisecond {
			t.Fatalf("answered %v after the leader came at 300ms: the change did not wake the wait", d)
		}
	})
}

// TestPartition_WhileLeading: the upkeep runs while this node's replica
// leads, one at a time, its ctx ending when the leadership moves; it runs
// again when the replica leads again, and WhileLeading returns, with no
// upkeep left, once its ctx ends.
func TestPartition_WhileLeading(t *testing.T) {
	sp, err := store.Open(filepath.Join(t.TempDir(), "p.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	rep := &fakeReplica{part: sp}
	k := newFakeKind(rep)
	p := newFakePartition(k)
	defer p.Close()
	var running, most, runs atomic.Int32
	started := make(chan struct{}, 10)
	ended := make(chan struct{}, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.WhileLeading(ctx, func(ctx context.Context, u Upkeep) {
			n := running.Add(1)
			defer running.Add(-1)
			if n > most.Load() {
				most.Store(n)
			}
			runs.Add(1)
			started <- struct{}{}
			<-ctx.Done()
			ended <- struct{}{}
		})
	}()
	wait := func(c chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(3 * time.Second):
			t.Fatalf("no %s", what)
		}
	}
	wait(started, "upkeep while leading")
	k.setLeader(nil)
	wait(ended, "end of the upkeep once the leadership moved")
	k.setLeader(rep)
	wait(started, "upkeep when leading again")
	cancel()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("WhileLeading does not return once its ctx ended")
	}
	if running.Load() != 0 || most.Load() != 1 || runs.Load() != 2 {
		t.Fatalf("upkeeps: %d running after return, %d at most at once, %d runs; want 0, 1, 2", running.Load(), most.Load(), runs.Load())
	}
}

// unreachable is an RPC client whose every call is not sent.
func unreachable(t *testing.T, dials *atomic.Int32) *remote.Client {
	c := remote.NewClient(func(context.Context) (*transport.Conn, error) {
		dials.Add(1)
		return nil, errors.New("test: unreachable")
	}, remote.ClientConfig{})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestPartition_Raft3NoReplicaReached: a Raft3 partition whose other
// replicas cannot be reached tries them again (nothing was sent: no
// unknown outcome) until ctx ends, ErrNoLeader; on a closing node it tries
// each once and returns store.ErrClosed.
func TestPartition_Raft3NoReplicaReached(t *testing.T) {
	var dials atomic.Int32
	c := unreachable(t, &dials)
	var asked sync.Map
	newP := func() *Partition {
		return NewRaft3(Raft3Config{Config: Config{Topic: "t", Index: 0, Self: "a", CallTimeout: time.Second,
			Peer: func(node string) (*remote.Client, error) {
				asked.Store(node, true)
				return c, nil
			}}, Partitions: 1, Replicas: []string{"a", "b", "c"}})
	}
	p := newP()
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := p.Apply(ctx, appendCmd())
	if !errors.Is(err, ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, raftqueue.ErrUnknownOutcome) {
		t.Fatalf("Apply: %v, want ErrNoLeader with DeadlineExceeded, not an unknown outcome", err)
	}
	for _, node := range []string{"b", "c"} {
		if _, ok := asked.Load(node); !ok {
			t.Errorf("replica %s never asked", node)
		}
	}
	if _, ok := asked.Load("a"); ok {
		t.Error("this node asked over RPC")
	}

	q := newP()
	defer q.Close()
	q.Closing()
	before := dials.Load()
	start := time.Now()
	_, err = q.Apply(context.Background(), appendCmd())
	if !errors.Is(err, store.ErrClosed) || time.Since(start) > time.Second {
		t.Fatalf("Apply on a closing node: %v after %v, want store.ErrClosed at once", err, time.Since(start))
	}
	if n := dials.Load() - before; n > 3 {
		t.Fatalf("a closing node's call dialled %d times, want each replica once", n)
	}
}

// TestPartition_DoubleWriteReportsLeader: a DoubleWrite partition whose
// leader's node cannot be reached reports it to the metadata group, at
// most once every reportEvery, and waits for the record to change until
// ctx ends (ErrNoLeader); nothing was sent, so no unknown outcome.
func TestPartition_DoubleWriteReportsLeader(t *testing.T) {
	var dials atomic.Int32
	c := unreachable(t, &dials)
	var ps Pairs
	pair := ps.Attach(PairConfig{Topic: "d", First: 0, Self: "a", Peer: func(string) (*remote.Client, error) { return c, nil },
		Open:       func() (*raftqueue.Pair, error) { return nil, errors.New("test: no replica here") },
		SetInSync:  func(context.Context, PairRecord, []string) error { return nil },
		RenewEpoch: func(context.Context, PairRecord) error { return nil }},
		PairRecord{Replicas: []string{"b", "c"}, Epoch: 1, Version: 1, InSync: []string{"b", "c"}, FollowerUp: true})
	var mu sync.Mutex
	var reports []string
	p := NewDoubleWrite(DoubleWriteConfig{Config: Config{Topic: "d", Index: 0, First: 0, Self: "a", CallTimeout: time.Second,
		Peer: func(string) (*remote.Client, error) { return c, nil }},
		Report: func(node string) {
			mu.Lock()
			reports = append(reports, node)
			mu.Unlock()
		}}, pair)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	_, err := p.Apply(ctx, appendCmd())
	if !errors.Is(err, ErrNoLeader) || errors.Is(err, raftqueue.ErrUnknownOutcome) {
		t.Fatalf("Apply: %v, want ErrNoLeader, not an unknown outcome", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 1 || reports[0] != "b" || dials.Load() < 2 {
		t.Fatalf("reports %q after %d dials, want one report of b and the leader tried again", reports, dials.Load())
	}
}
