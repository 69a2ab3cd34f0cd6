package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// gateFS is the OS file system whose segment syncs can be held: while held,
// every Sync of a .wal file waits until released.
type gateFS struct {
	store.OSFS
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (g *gateFS) OpenFile(name string, flag int, perm os.FileMode) (store.File, error) {
	f, err := g.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &gateFile{File: f, fs: g}, nil
}

func (g *gateFS) hold() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gateFS) release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

type gateFile struct {
	store.File
	fs *gateFS
}

func (f *gateFile) Sync() error {
	f.fs.mu.Lock()
	gate := f.fs.gate
	f.fs.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return f.File.Sync()
}

// gatedNode is a partition behind a WAL whose syncs a test can hold.
func gatedNode(t *testing.T, opts store.Options) (*gateFS, *store.WAL, *store.Partition) {
	t.Helper()
	dir := t.TempDir()
	g := &gateFS{}
	w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{FS: g})
	if err != nil {
		t.Fatal(err)
	}
	opts.WAL, opts.Stream = w, "s"
	p, err := store.Open(filepath.Join(dir, "0.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.FinishRecovery(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.release()
		p.Close()
		w.Close()
	})
	return g, w, p
}

// applyTimed runs Apply with a ctx ending after d and reports how long it
// took to return (capped: after limit the gate is released so the test
// can end).
func applyTimed(t *testing.T, g *gateFS, p *store.Partition, cmd *store.Command, d, limit time.Duration) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	type out struct {
		took time.Duration
		err  error
	}
	ch := make(chan out, 1)
	start := time.Now()
	go func() {
		_, err := p.Apply(ctx, cmd)
		ch <- out{time.Since(start), err}
	}()
	select {
	case o := <-ch:
		return o.took, o.err
	case <-time.After(limit):
		g.release()
		o := <-ch
		return o.took, o.err
	}
}

// TestApply_CtxEndsWithFullPending: Apply returns promptly when its ctx
// ends, never waiting for a disk, also when the logged gens fill
// MaxPendingBytes. This broke when the writer took the next command and
// then waited in room() for the WAL's sync and a bbolt commit before it
// signalled "applied": a caller whose ctx had ended waited for the disk.
func TestApply_CtxEndsWithFullPending(t *testing.T) {
	g, _, p := gatedNode(t, store.Options{MaxPendingBytes: 1})
	g.hold()
	first := make(chan error, 1)
	go func() {
		_, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}})
		first <- err
	}()
	time.Sleep(100 * time.Millisecond) // a is logged, its sync held
	took, err := applyTimed(t, g, p, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b")}},
		50*time.Millisecond, 3*time.Second)
	g.release()
	if e := <-first; e != nil {
		t.Fatalf("first send: %v", e)
	}
	if took > time.Second {
		t.Fatalf("Apply with a 50ms ctx returned after %v (%v): it waited for the held WAL sync", took, err)
	}
}

// TestApply_CtxEndsDuringTrim: the same for a command that scans (OpTrim,
// OpRelease), which the writer takes and then drains the materializer for
// (WAL sync, then a bbolt commit) before it signals applied.
func TestApply_CtxEndsDuringTrim(t *testing.T) {
	for _, op := range []store.Op{store.OpTrim, store.OpRelease} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			g, _, p := gatedNode(t, store.Options{})
			g.hold()
			first := make(chan error, 1)
			go func() {
				_, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}})
				first <- err
			}()
			time.Sleep(100 * time.Millisecond)
			took, err := applyTimed(t, g, p, &store.Command{Op: op, Now: t0, MaxAge: 1}, 50*time.Millisecond, 3*time.Second)
			g.release()
			if e := <-first; e != nil {
				t.Fatalf("first send: %v", e)
			}
			if took > time.Second {
				t.Fatalf("op %d with a 50ms ctx returned after %v (%v): it waited for the held WAL sync", op, took, err)
			}
		})
	}
}

// TestApply_CtxManySenders: senders whose ctx ends at random points
// (before enqueue, queued, applied, waiting for the sync) under a steady
// load: each returns promptly, each acked message is at its offset, and a
// message whose send failed is stored once or not at all.
func TestApply_CtxManySenders(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNode(t, dir)
	var mu sync.Mutex
	acked := map[string]uint64{}
	var slow atomic.Int64
	var wg sync.WaitGroup
	for s := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 1))
			for k := range 60 {
				id := fmt.Sprint(s, "-", k)
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
				if rng.IntN(8) == 0 {
					cancel() // ended before enqueue
				}
				start := time.Now()
				res, err := n.p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}})
				if err != nil && time.Since(start) > 200*time.Millisecond {
					slow.Add(1)
				}
				cancel()
				if err == nil {
					mu.Lock()
					acked["id-"+id] = res.Acks[0].Offset
					mu.Unlock()
				} else if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					t.Errorf("Apply: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if slow.Load() > 0 {
		t.Errorf("%d sends returned more than 200ms after their ctx", slow.Load())
	}
	check := func(p *store.Partition) {
		msgs, err := p.Read(0, 1<<20, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for i, m := range msgs {
			if m.Offset != uint64(i) {
				t.Fatalf("offset %d at %d", m.Offset, i)
			}
			if seen[m.ID] {
				t.Fatalf("%s stored twice", m.ID)
			}
			seen[m.ID] = true
			if off, ok := acked[m.ID]; ok && off != m.Offset {
				t.Fatalf("%s acked at %d, stored at %d", m.ID, off, m.Offset)
			}
		}
		for id := range acked {
			if !seen[id] {
				t.Fatalf("acked %s missing", id)
			}
		}
	}
	check(n.p)
	crash := t.TempDir()
	copyDir(t, dir, crash)
	r := mustWALNode(t, crash)
	check(r.p)
}
