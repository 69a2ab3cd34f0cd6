package localtx_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// The group commit of Bolt.Run: concurrent Runs share one bbolt commit and
// still behave, each, as a transaction of its own.

// batchHost is a bbolt host whose commits are counted.
type batchHost struct {
	*txtest.Host
	b       *localtx.Bolt
	commits atomic.Int64
	commit  atomic.Pointer[func(*bolt.Tx) error] // nil: (*bolt.Tx).Commit
}

func newBatchHost(t *testing.T) *batchHost {
	t.Helper()
	h := &batchHost{Host: txtest.Bolt(t, filepath.Join(t.TempDir(), "h.db"))}
	h.b = h.Store.(*localtx.Bolt)
	localtx.SetBoltCommit(h.b, func(tx *bolt.Tx) error {
		h.commits.Add(1)
		if c := h.commit.Load(); c != nil {
			return (*c)(tx)
		}
		return tx.Commit()
	})
	return h
}

func (h *batchHost) setCommit(c func(*bolt.Tx) error) { h.commit.Store(&c) }

// waitFor polls cond until it holds, failing the test after 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// runResult is how one Run ended.
type runResult struct {
	err      error
	panicked any  // the panic that came out of Run
	exited   bool // runtime.Goexit came out of Run
}

// goRun runs h.Run(ctx, fn) in a new goroutine and records how it ended;
// then it closes ended, when not nil.
func goRun(wg *sync.WaitGroup, h *batchHost, ctx context.Context, fn func(context.Context) error, res *runResult, ended chan struct{}) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		if ended != nil {
			defer close(ended)
		}
		returned := false
		defer func() {
			if !returned {
				res.panicked = recover()
				res.exited = res.panicked == nil
			}
		}()
		res.err = h.Run(ctx, fn)
		returned = true
	}()
}

// wait waits for wg, failing the test after 30 seconds (a hang).
func wait(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Runs hang")
	}
}

// batchOpts tune inBatch: ctxs[i], when there, is Run i's context; ended[i],
// when there, is closed once Run i returned.
type batchOpts struct {
	ctxs  []context.Context
	ended map[int]chan struct{}
}

// inBatch runs fns concurrently as one batch: the first one's function
// (its first run) holds the transaction until every other Run queued
// behind it, in order.
func inBatch(t *testing.T, h *batchHost, o batchOpts, fns ...func(context.Context) error) []runResult {
	t.Helper()
	res := make([]runResult, len(fns))
	ctx := func(i int) context.Context {
		if i >= len(o.ctxs) || o.ctxs[i] == nil {
			return context.Background()
		}
		return o.ctxs[i]
	}
	hold, holding := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	goRun(&wg, h, ctx(0), func(ctx context.Context) error {
		once.Do(func() { close(holding) })
		<-hold
		return fns[0](ctx)
	}, &res[0], o.ended[0])
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the first Run did not start")
	}
	for i := 1; i < len(fns); i++ {
		goRun(&wg, h, ctx(i), fns[i], &res[i], o.ended[i])
		waitFor(t, fmt.Sprintf("Run %d to queue", i), func() bool { return localtx.Waiting(h.b) == i })
	}
	close(hold)
	wait(t, &wg)
	return res
}

// recorder records, per member, the ids of its attempts and the hooks that
// ran. It is safe for concurrent use.
type recorder struct {
	mu    sync.Mutex // guards ids, hooks
	ids   map[int][]string
	hooks map[int][]string
}

func newRecorder() *recorder {
	return &recorder{ids: map[int][]string{}, hooks: map[int][]string{}}
}

func (r *recorder) hook(i int, s string) func() {
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.hooks[i] = append(r.hooks[i], s)
	}
}

func (r *recorder) attempt(i int, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids[i] = append(r.ids[i], id)
}

func (r *recorder) hooksOf(i int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.hooks[i]...)
}

func (r *recorder) idsOf(i int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ids[i]...)
}

// member returns the function of member i: it registers every hook kind,
// writes its marker and the business row "k<i>" (the attempt's id), then
// returns act(ctx, run), run counting its calls from 0 (nil act: nil).
func member(h *batchHost, r *recorder, i int, act func(ctx context.Context, run int) error) func(context.Context) error {
	runs := 0 // the member's goroutine only
	return func(ctx context.Context) error {
		tx, ok := localtx.FromContext(ctx)
		if !ok {
			return errors.New("no transaction in ctx")
		}
		u := tx.(unknownTx)
		id := tx.ID()
		r.attempt(i, id)
		u.WhileCommit(r.hook(i, "commit"))
		u.WhileRollback(r.hook(i, "rollback"))
		u.WhileUnknown(r.hook(i, "unknown"))
		if err := tx.Put(localtx.MarkerBucket, []byte(id), []byte("m")); err != nil {
			return err
		}
		if err := h.Put(ctx, fmt.Sprint("k", i), id); err != nil {
			return err
		}
		run := runs
		runs++
		if act != nil {
			return act(ctx, run)
		}
		return nil
	}
}

// check asserts the check-back's answer for id.
func check(t *testing.T, h *batchHost, id string, want localtx.State) {
	t.Helper()
	if st, _, err := h.Store.Check(context.Background(), id); err != nil || st != want {
		t.Errorf("Check(%s) = %v, %v; want %v", id, st, err, want)
	}
}

// row asserts business row "k<i>": held by the attempt id, or absent ("").
func row(t *testing.T, h *batchHost, i int, id string) {
	t.Helper()
	v, ok, err := h.Get(fmt.Sprint("k", i))
	if err != nil {
		t.Fatal(err)
	}
	if (id == "" && ok) || (id != "" && v != id) {
		t.Errorf("row k%d = %q, %v; want %q", i, v, ok, id)
	}
}

func TestBolt_RunBatch(t *testing.T) {
	t.Run("OneCommit", func(t *testing.T) {
		h, r := newBatchHost(t), newRecorder()
		// While the batch commits, every member is still running.
		var during []string
		h.setCommit(func(tx *bolt.Tx) error {
			for i := range 4 {
				for _, id := range r.idsOf(i) {
					st, _, err := h.Store.Check(context.Background(), id)
					during = append(during, fmt.Sprint(st, err, r.hooksOf(i)))
				}
			}
			return tx.Commit()
		})
		res := inBatch(t, h, batchOpts{}, member(h, r, 0, nil), member(h, r, 1, nil), member(h, r, 2, nil), member(h, r, 3, nil))
		if want := []string{"unknown <nil> []", "unknown <nil> []", "unknown <nil> []", "unknown <nil> []"}; !reflect.DeepEqual(during, want) {
			t.Errorf("during the commit: check and hooks %q, want %q", during, want)
		}
		seen := map[string]bool{}
		for i := range 4 {
			ids := r.idsOf(i)
			if len(ids) != 1 || seen[ids[0]] {
				t.Fatalf("member %d has attempts %v; want one id of its own", i, ids)
			}
			seen[ids[0]] = true
		}
		if n := h.commits.Load(); n != 1 {
			t.Errorf("%d commits for one batch, want 1", n)
		}
		for i := range 4 {
			id := r.idsOf(i)[0]
			if res[i] != (runResult{}) {
				t.Errorf("member %d: %+v", i, res[i])
			}
			if hk := r.hooksOf(i); !reflect.DeepEqual(hk, []string{"commit"}) {
				t.Errorf("member %d: hooks %v", i, hk)
			}
			check(t, h, id, localtx.Committed)
			row(t, h, i, id)
		}
	})

	// A failing member (an error, ErrRedo, a panic, runtime.Goexit) rolls
	// back alone: the members before it run again and commit with those
	// after it.
	fails := []struct {
		name string
		act  func(ctx context.Context, run int) error
		want func(t *testing.T, res runResult)
	}{
		{"Error", func(context.Context, int) error { return errBoom }, func(t *testing.T, res runResult) {
			if !errors.Is(res.err, errBoom) {
				t.Errorf("failing member: %+v, want %v", res, errBoom)
			}
		}},
		{"Panic", func(context.Context, int) error { panic("boom") }, func(t *testing.T, res runResult) {
			if res.panicked != "boom" {
				t.Errorf("failing member: %+v, want the panic to reach its caller", res)
			}
		}},
		{"Goexit", func(context.Context, int) error { runtime.Goexit(); return nil }, func(t *testing.T, res runResult) {
			if !res.exited {
				t.Errorf("failing member: %+v, want runtime.Goexit to reach its caller", res)
			}
		}},
	}
	for _, f := range fails {
		t.Run("Failing"+f.name, func(t *testing.T) {
			h, r := newBatchHost(t), newRecorder()
			res := inBatch(t, h, batchOpts{}, member(h, r, 0, nil), member(h, r, 1, nil), member(h, r, 2, f.act), member(h, r, 3, nil))
			f.want(t, res[2])
			if h.commits.Load() != 1 {
				t.Errorf("%d commits, want 1", h.commits.Load())
			}
			for _, i := range []int{0, 1, 3} {
				if res[i] != (runResult{}) {
					t.Errorf("member %d: %+v", i, res[i])
				}
			}
			// Members 0 and 1 ran again: their first attempts rolled back.
			for _, i := range []int{0, 1} {
				ids := r.idsOf(i)
				if len(ids) != 2 || ids[0] == ids[1] {
					t.Fatalf("member %d attempts %v, want 2", i, ids)
				}
				if hk := r.hooksOf(i); !reflect.DeepEqual(hk, []string{"rollback", "commit"}) {
					t.Errorf("member %d: hooks %v, want the rolled back attempt's rollback, then the commit", i, hk)
				}
				check(t, h, ids[0], localtx.RolledBack)
				check(t, h, ids[1], localtx.Committed)
				row(t, h, i, ids[1])
			}
			if hk := r.hooksOf(2); !reflect.DeepEqual(hk, []string{"rollback"}) {
				t.Errorf("failing member: hooks %v", hk)
			}
			check(t, h, r.idsOf(2)[0], localtx.RolledBack)
			row(t, h, 2, "")
			if ids := r.idsOf(3); len(ids) != 1 || !reflect.DeepEqual(r.hooksOf(3), []string{"commit"}) {
				t.Errorf("member 3: attempts %v hooks %v", ids, r.hooksOf(3))
			} else {
				check(t, h, ids[0], localtx.Committed)
				row(t, h, 3, ids[0])
			}
		})
	}

	t.Run("FailingTwice", func(t *testing.T) {
		// Every member but the last fails in turn, the first on its
		// second run.
		h, r := newBatchHost(t), newRecorder()
		res := inBatch(t, h, batchOpts{},
			member(h, r, 0, func(_ context.Context, run int) error {
				if run == 1 {
					return errBoom
				}
				return nil
			}),
			member(h, r, 1, func(context.Context, int) error { return errBoom }),
			member(h, r, 2, nil))
		if !errors.Is(res[0].err, errBoom) || !errors.Is(res[1].err, errBoom) || res[2] != (runResult{}) {
			t.Errorf("results %+v", res)
		}
		if hk := r.hooksOf(0); !reflect.DeepEqual(hk, []string{"rollback", "rollback"}) {
			t.Errorf("member 0: hooks %v", hk)
		}
		row(t, h, 0, "")
		row(t, h, 1, "")
		row(t, h, 2, r.idsOf(2)[0])
	})

	t.Run("Redo", func(t *testing.T) {
		// ErrRedo is a failure of its own attempt: Run redoes it, in this
		// batch or the next, and the members before it run again.
		h, r := newBatchHost(t), newRecorder()
		res := inBatch(t, h, batchOpts{},
			member(h, r, 0, nil),
			member(h, r, 1, func(_ context.Context, run int) error {
				if run == 0 {
					return fmt.Errorf("conflict: %w", localtx.ErrRedo)
				}
				return nil
			}),
			member(h, r, 2, nil))
		for i := range res {
			if res[i] != (runResult{}) {
				t.Errorf("member %d: %+v", i, res[i])
			}
		}
		if hk := r.hooksOf(1); !reflect.DeepEqual(hk, []string{"rollback", "commit"}) {
			t.Errorf("redoing member: hooks %v", hk)
		}
		if n := h.commits.Load(); n > 2 {
			t.Errorf("%d commits, want at most 2", n)
		}
		for i := range 3 {
			ids := r.idsOf(i)
			row(t, h, i, ids[len(ids)-1])
		}
	})

	t.Run("RedoLimit", func(t *testing.T) {
		h, r := newBatchHost(t), newRecorder()
		res := inBatch(t, h, batchOpts{},
			member(h, r, 0, nil),
			member(h, r, 1, func(context.Context, int) error { return localtx.ErrRedo }),
			member(h, r, 2, nil))
		if !errors.Is(res[1].err, localtx.ErrRedo) || len(r.idsOf(1)) != localtx.DefaultMaxAttempts {
			t.Errorf("redoing member: %+v after %d attempts; want ErrRedo after %d", res[1], len(r.idsOf(1)), localtx.DefaultMaxAttempts)
		}
		if res[0] != (runResult{}) || res[2] != (runResult{}) {
			t.Errorf("results %+v", res)
		}
	})

	t.Run("RerunNotCounted", func(t *testing.T) {
		// A run again for another member's failure is not an attempt of
		// MaxAttempts.
		db, err := bolt.Open(filepath.Join(t.TempDir(), "h.db"), 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		b, err := localtx.NewBolt(db, localtx.BoltOptions{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		h := &batchHost{Host: &txtest.Host{Store: b, Run: b.Run, Put: func(ctx context.Context, k, v string) error {
			bk, err := b.Tx(ctx).CreateBucketIfNotExists([]byte("business"))
			if err != nil {
				return err
			}
			return bk.Put([]byte(k), []byte(v))
		}}, b: b}
		r := newRecorder()
		res := inBatch(t, h, batchOpts{}, member(h, r, 0, nil), member(h, r, 1, func(context.Context, int) error { return errBoom }))
		if res[0] != (runResult{}) || len(r.idsOf(0)) != 2 {
			t.Errorf("member run again: %+v after %d runs; want nil after 2", res[0], len(r.idsOf(0)))
		}
	})

	t.Run("MaxBatch", func(t *testing.T) {
		// A batch stops taking members at MaxBatch; the rest commit in
		// the next one.
		h, r := newBatchHost(t), newRecorder()
		fns := make([]func(context.Context) error, localtx.MaxBatch+10)
		for i := range fns {
			fns[i] = member(h, r, i, nil)
		}
		res := inBatch(t, h, batchOpts{}, fns...)
		for i := range res {
			if res[i] != (runResult{}) {
				t.Fatalf("member %d: %+v", i, res[i])
			}
			row(t, h, i, r.idsOf(i)[0])
		}
		if n := h.commits.Load(); n != 2 {
			t.Errorf("%d commits for %d Runs, want 2", n, len(fns))
		}
	})

	t.Run("RunInHook", func(t *testing.T) {
		// A commit hook may run a transaction of its own.
		h, r := newBatchHost(t), newRecorder()
		var inner error
		res := inBatch(t, h, batchOpts{}, member(h, r, 0, nil), member(h, r, 1, func(ctx context.Context, _ int) error {
			tx, _ := localtx.FromContext(ctx)
			tx.WhileCommit(func() { inner = h.Run(context.Background(), member(h, r, 2, nil)) })
			return nil
		}))
		if res[0] != (runResult{}) || res[1] != (runResult{}) || inner != nil {
			t.Errorf("results %+v, Run in the hook %v", res, inner)
		}
		row(t, h, 2, r.idsOf(2)[0])
	})

	t.Run("Nested", func(t *testing.T) {
		h, r := newBatchHost(t), newRecorder()
		nested := func(i int) func(context.Context) error {
			return func(ctx context.Context) error {
				outer, _ := localtx.FromContext(ctx)
				return h.Run(ctx, func(ctx context.Context) error {
					if inner, _ := localtx.FromContext(ctx); inner != outer {
						return errors.New("nested Run began a transaction of its own")
					}
					return member(h, r, i, nil)(ctx)
				})
			}
		}
		res := inBatch(t, h, batchOpts{}, nested(0), nested(1))
		if res[0] != (runResult{}) || res[1] != (runResult{}) || h.commits.Load() != 1 {
			t.Errorf("results %+v, %d commits", res, h.commits.Load())
		}
	})
}

// TestBolt_RunBatchCtx: a ctx that ends while its Run waits for its turn
// ends the Run with ctx.Err() and runs nothing of its function; once the
// function ran, the Run waits for the commit.
func TestBolt_RunBatchCtx(t *testing.T) {
	t.Run("Done", func(t *testing.T) {
		h := newBatchHost(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		ran := false
		err := h.Run(ctx, func(context.Context) error { ran = true; return nil })
		if !errors.Is(err, context.Canceled) || ran {
			t.Errorf("Run(ended ctx) = %v, function ran %v; want ctx.Err() and no run", err, ran)
		}
	})

	t.Run("Queued", func(t *testing.T) {
		h, r := newBatchHost(t), newRecorder()
		hold, holding := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		var first, queued runResult
		goRun(&wg, h, context.Background(), func(ctx context.Context) error {
			close(holding)
			<-hold
			return member(h, r, 0, nil)(ctx)
		}, &first, nil)
		<-holding
		ctx, cancel := context.WithCancel(context.Background())
		goRun(&wg, h, ctx, member(h, r, 1, nil), &queued, nil)
		waitFor(t, "the Run to queue", func() bool { return localtx.Waiting(h.b) == 1 })
		cancel()
		waitFor(t, "the Run to leave the queue", func() bool { return localtx.Waiting(h.b) == 0 })
		close(hold)
		wait(t, &wg)
		if !errors.Is(queued.err, context.Canceled) || len(r.idsOf(1)) != 0 {
			t.Errorf("cancelled Run: %+v, %d runs; want ctx.Err() and none", queued, len(r.idsOf(1)))
		}
		if first != (runResult{}) || h.commits.Load() != 1 {
			t.Errorf("first Run: %+v, %d commits", first, h.commits.Load())
		}
	})

	t.Run("Taken", func(t *testing.T) {
		// Member 1 ends member 2's ctx after the batch took both: member
		// 2 either leaves before its turn or passes it.
		for range 20 {
			h, r := newBatchHost(t), newRecorder()
			ctx2, cancel2 := context.WithCancel(context.Background())
			defer cancel2()
			res := inBatch(t, h, batchOpts{ctxs: []context.Context{nil, nil, ctx2}},
				member(h, r, 0, nil),
				member(h, r, 1, func(context.Context, int) error { cancel2(); return nil }),
				member(h, r, 2, nil))
			if !errors.Is(res[2].err, context.Canceled) || len(r.idsOf(2)) != 0 {
				t.Fatalf("cancelled member: %+v after %d runs; want ctx.Err() and none", res[2], len(r.idsOf(2)))
			}
			if res[0] != (runResult{}) || res[1] != (runResult{}) {
				t.Fatalf("results %+v", res)
			}
			row(t, h, 1, r.idsOf(1)[0])
		}
	})

	t.Run("TakenBehindSlow", func(t *testing.T) {
		// Member 2, taken by the batch, leaves when its ctx ends, without
		// waiting for member 1's function, which waits for it.
		h, r := newBatchHost(t), newRecorder()
		ctx2, cancel2 := context.WithCancel(context.Background())
		defer cancel2()
		left := make(chan struct{})
		res := inBatch(t, h, batchOpts{ctxs: []context.Context{nil, nil, ctx2}, ended: map[int]chan struct{}{2: left}},
			member(h, r, 0, nil),
			member(h, r, 1, func(context.Context, int) error {
				cancel2()
				select {
				case <-left:
					return nil
				case <-time.After(5 * time.Second):
					return errors.New("the cancelled Run waited for its turn")
				}
			}),
			member(h, r, 2, nil))
		if res[0] != (runResult{}) || res[1] != (runResult{}) || !errors.Is(res[2].err, context.Canceled) {
			t.Errorf("results %+v", res)
		}
	})

	t.Run("RunAgain", func(t *testing.T) {
		// Member 0 ran; member 1 ends member 0's ctx and fails, so member
		// 0 would run again: it returns ctx.Err(), rolled back.
		h, r := newBatchHost(t), newRecorder()
		ctx0, cancel0 := context.WithCancel(context.Background())
		defer cancel0()
		res := inBatch(t, h, batchOpts{ctxs: []context.Context{ctx0}},
			member(h, r, 0, nil),
			member(h, r, 1, func(context.Context, int) error { cancel0(); return errBoom }),
			member(h, r, 2, nil))
		if !errors.Is(res[0].err, context.Canceled) || len(r.idsOf(0)) != 1 {
			t.Errorf("member 0: %+v after %d runs; want ctx.Err() after 1", res[0], len(r.idsOf(0)))
		}
		if hk := r.hooksOf(0); !reflect.DeepEqual(hk, []string{"rollback"}) {
			t.Errorf("member 0: hooks %v", hk)
		}
		check(t, h, r.idsOf(0)[0], localtx.RolledBack)
		row(t, h, 0, "")
		if res[2] != (runResult{}) {
			t.Errorf("member 2: %+v", res[2])
		}
		row(t, h, 2, r.idsOf(2)[0])
	})

	t.Run("AfterTurn", func(t *testing.T) {
		// A ctx that ends after the function ran does not abandon the
		// commit.
		h, r := newBatchHost(t), newRecorder()
		ctx1, cancel1 := context.WithCancel(context.Background())
		defer cancel1()
		res := inBatch(t, h, batchOpts{ctxs: []context.Context{nil, ctx1}},
			member(h, r, 0, nil),
			member(h, r, 1, func(context.Context, int) error { cancel1(); return nil }),
			member(h, r, 2, nil))
		for i := range res {
			if res[i] != (runResult{}) {
				t.Errorf("member %d: %+v", i, res[i])
			}
			row(t, h, i, r.idsOf(i)[0])
		}
		if hk := r.hooksOf(1); !reflect.DeepEqual(hk, []string{"commit"}) {
			t.Errorf("member 1: hooks %v", hk)
		}
	})
}

// TestBolt_RunBatchCommitFails: every member of a batch whose commit failed
// gets the read-back of a lone Run (see TestBolt_CommitUnknown), and the
// next batch commits.
func TestBolt_RunBatchCommitFails(t *testing.T) {
	for _, c := range []struct {
		name    string
		commit  func(*bolt.Tx) error
		hooks   []string
		unknown bool
	}{
		{"NotWritten", rollThenFail, []string{"rollback"}, false},
		{"WrittenNotSynced", commitThenFail, []string{"unknown"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, r := newBatchHost(t), newRecorder()
			h.setCommit(c.commit)
			noMarker := func(ctx context.Context) error { // member 1 writes no marker
				tx, _ := localtx.FromContext(ctx)
				u := tx.(unknownTx)
				r.attempt(1, tx.ID())
				u.WhileCommit(r.hook(1, "commit"))
				u.WhileRollback(r.hook(1, "rollback"))
				u.WhileUnknown(r.hook(1, "unknown"))
				return h.Put(ctx, "k1", tx.ID())
			}
			res := inBatch(t, h, batchOpts{}, member(h, r, 0, nil), noMarker, member(h, r, 2, nil))
			if h.commits.Load() != 1 {
				t.Errorf("%d commits, want 1", h.commits.Load())
			}
			for i := range 3 {
				if err := res[i].err; !errors.Is(err, errFsync) || errors.Is(err, localtx.ErrCommitUnknown) != c.unknown {
					t.Errorf("member %d: Run = %v; want the commit's error, ErrCommitUnknown %v", i, err, c.unknown)
				}
				if hk := r.hooksOf(i); !reflect.DeepEqual(hk, c.hooks) {
					t.Errorf("member %d: hooks %v, want %v", i, hk, c.hooks)
				}
				want := localtx.RolledBack
				if c.unknown && i != 1 { // what bbolt shows: the marker
					want = localtx.Committed
				}
				check(t, h, r.idsOf(i)[0], want)
			}
			h.setCommit((*bolt.Tx).Commit)
			res = inBatch(t, h, batchOpts{}, member(h, r, 3, nil), member(h, r, 4, nil))
			if res[0] != (runResult{}) || res[1] != (runResult{}) {
				t.Errorf("next batch: %+v", res)
			}
			row(t, h, 4, r.idsOf(4)[0])
		})
	}

	t.Run("Panics", func(t *testing.T) {
		// bbolt panics in its commit (a damaged file): the panic reaches
		// every member's caller, the outcome is unknown, and the adapter
		// still works.
		h, r := newBatchHost(t), newRecorder()
		h.setCommit(func(*bolt.Tx) error { panic("damaged") })
		res := inBatch(t, h, batchOpts{}, member(h, r, 0, nil), member(h, r, 1, nil))
		for i := range res {
			if res[i].panicked != "damaged" {
				t.Errorf("member %d: %+v, want bbolt's panic", i, res[i])
			}
			if hk := r.hooksOf(i); !reflect.DeepEqual(hk, []string{"unknown"}) {
				t.Errorf("member %d: hooks %v", i, hk)
			}
			check(t, h, r.idsOf(i)[0], localtx.RolledBack)
		}
		h.setCommit((*bolt.Tx).Commit)
		if err := h.Run(context.Background(), member(h, r, 2, nil)); err != nil {
			t.Fatalf("Run after the panic: %v", err)
		}
	})
}

// TestBolt_RunBatchClose: closing the DB while Runs queue ends every Run,
// with an error once the DB is closed, never a hang.
func TestBolt_RunBatchClose(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "h.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b, err := localtx.NewBolt(db, localtx.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	put := func(ctx context.Context) error {
		bk, err := b.Tx(ctx).CreateBucketIfNotExists([]byte("business"))
		if err != nil {
			return err
		}
		return bk.Put([]byte("k"), []byte("v"))
	}
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if err := b.Run(context.Background(), put); err != nil {
					if !errors.Is(err, berrors.ErrDatabaseNotOpen) {
						t.Errorf("Run = %v, want ErrDatabaseNotOpen", err)
					}
					failed.Add(1)
					return
				}
				ok.Add(1)
			}
		}()
	}
	waitFor(t, "Runs to commit", func() bool { return ok.Load() > 50 })
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	wait(t, &wg)
	if failed.Load() != 16 {
		t.Errorf("%d Runs failed, want 16", failed.Load())
	}
}

// TestBolt_RunBatchStress runs many concurrent Runs that commit, fail,
// panic, redo and give up on their ctx, over commits that sometimes fail,
// and checks every attempt: exactly one kind of hook ran, and it agrees
// with the DB and the check-back.
func TestBolt_RunBatchStress(t *testing.T) {
	h := newBatchHost(t)
	var nCommit atomic.Int64
	h.setCommit(func(tx *bolt.Tx) error {
		switch nCommit.Add(1) % 13 {
		case 5:
			return rollThenFail(tx)
		case 11:
			return commitThenFail(tx)
		}
		return tx.Commit()
	})
	type attemptLog struct {
		mu    sync.Mutex // guards hooks
		hooks []string
	}
	var (
		mu       sync.Mutex // guards attempts, byRun
		attempts = map[string]*attemptLog{}
		byRun    = map[string][]string{} // run name -> attempt ids
	)
	const workers, runs = 16, 40
	var wg sync.WaitGroup
	results := make([][]runResult, workers)
	for w := range workers {
		results[w] = make([]runResult, runs)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := range runs {
				name := fmt.Sprintf("w%d-%d", w, i)
				kind := rng.IntN(20)
				ctx, cancel := context.WithCancel(context.Background())
				if kind == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(500))*time.Microsecond)
				}
				n := 0
				fn := func(ctx context.Context) error {
					tx, _ := localtx.FromContext(ctx)
					u := tx.(unknownTx)
					id := tx.ID()
					al := &attemptLog{}
					mu.Lock()
					attempts[id] = al
					byRun[name] = append(byRun[name], id)
					mu.Unlock()
					rec := func(s string) func() {
						return func() { al.mu.Lock(); al.hooks = append(al.hooks, s); al.mu.Unlock() }
					}
					u.WhileCommit(rec("commit"))
					u.WhileRollback(rec("rollback"))
					u.WhileUnknown(rec("unknown"))
					if err := tx.Put(localtx.MarkerBucket, []byte(id), []byte("m")); err != nil {
						return err
					}
					if err := h.Put(ctx, id, name); err != nil {
						return err
					}
					n++
					switch {
					case kind == 1:
						return errBoom
					case kind == 2:
						panic("boom")
					case kind == 3 && n < 3:
						return localtx.ErrRedo
					case kind == 4:
						cancel() // ends ctx after the turn: no effect
					}
					return nil
				}
				var one sync.WaitGroup
				goRun(&one, h, ctx, fn, &results[w][i], nil)
				one.Wait()
				cancel()
			}
		}()
	}
	wait(t, &wg)
	ctx := context.Background()
	committed := 0
	for id, al := range attempts {
		if len(al.hooks) != 1 {
			t.Errorf("attempt %s: hooks %v, want exactly one", id, al.hooks)
			continue
		}
		_, present, err := h.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		st, _, err := h.Store.Check(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		switch al.hooks[0] {
		case "commit":
			committed++
			if !present || st != localtx.Committed {
				t.Errorf("attempt %s committed, but row %v, check %v", id, present, st)
			}
		case "rollback":
			if present || st != localtx.RolledBack {
				t.Errorf("attempt %s rolled back, but row %v, check %v", id, present, st)
			}
		case "unknown": // only a commit that wrote and failed to sync: it shows
			if !present || st != localtx.Committed {
				t.Errorf("attempt %s unknown, but row %v, check %v", id, present, st)
			}
		}
	}
	for w := range workers {
		for i, res := range results[w] {
			name := fmt.Sprintf("w%d-%d", w, i)
			ids := byRun[name]
			n := 0
			for _, id := range ids {
				if h := attempts[id].hooks; len(h) == 1 && h[0] == "commit" {
					n++
				}
			}
			switch {
			case res.panicked != nil && res.panicked != "boom":
				t.Errorf("%s: panicked %v", name, res.panicked)
			case res.err == nil && res.panicked == nil && n != 1:
				t.Errorf("%s: Run = nil with %d committed attempts of %v", name, n, ids)
			case (res.err != nil || res.panicked != nil) && n != 0:
				t.Errorf("%s: Run = %+v with %d committed attempts", name, res, n)
			}
		}
	}
	t.Logf("%d attempts of %d committed, in %d commits", committed, len(attempts), nCommit.Load())
}
