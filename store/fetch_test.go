package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// fetched is what a Fetch running in its own goroutine returned.
type fetched struct {
	msgs []store.Message
	err  error
}

// fetchAsync runs Fetch in a goroutine; the test receives from the channel.
func fetchAsync(ctx context.Context, p *store.Partition, from uint64, max, maxBytes int) <-chan fetched {
	out := make(chan fetched, 1)
	go func() {
		msgs, err := p.Fetch(ctx, from, max, maxBytes, nil)
		out <- fetched{msgs, err}
	}()
	return out
}

// waitFetch returns what the Fetch of ch returned, failing the test after a
// minute.
func waitFetch(t *testing.T, ch <-chan fetched) fetched {
	t.Helper()
	select {
	case f := <-ch:
		return f
	case <-time.After(time.Minute):
		t.Fatal("Fetch did not return")
		return fetched{}
	}
}

// stillWaiting fails the test if the Fetch of ch returned within a moment.
// (A Fetch that has not started waiting yet gives the same result.)
func stillWaiting(t *testing.T, ch <-chan fetched) {
	t.Helper()
	select {
	case f := <-ch:
		t.Fatalf("Fetch returned %v, %v; want it waiting", f.msgs, f.err)
	case <-time.After(20 * time.Millisecond):
	}
}

func bodiesOf(msgs []store.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = fmt.Sprintf("%d:%s", m.Offset, m.Body)
	}
	return out
}

func TestPartition_Fetch(t *testing.T) {
	t.Run("Ready", func(t *testing.T) {
		p, _ := open(t)
		appendAt(t, p, t0, msg("a"), msg("b"))
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // data is there: no wait, so ctx is never looked at
		msgs, err := p.Fetch(ctx, 1, 10, 0, nil)
		equal(t, "fetch", fmt.Sprint(bodiesOf(msgs), err), fmt.Sprint([]string{"1:body-b"}, nil))
	})
	t.Run("WakesOnAppend", func(t *testing.T) {
		p, _ := open(t)
		appendAt(t, p, t0, msg("a"))
		ch := fetchAsync(context.Background(), p, 1, 10, 0)
		stillWaiting(t, ch)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b"), msg("c")}})
		}()
		f := waitFetch(t, ch)
		<-done
		if f.err != nil || len(f.msgs) == 0 || f.msgs[0].Offset != 1 {
			t.Fatalf("Fetch = %v, %v; want from offset 1", bodiesOf(f.msgs), f.err)
		}
	})
	t.Run("DelayedIsNotStored", func(t *testing.T) {
		// A delayed message wakes nothing it is visible to; its release
		// moves it into the log and wakes the Fetch.
		p, _ := open(t)
		m := msg("later")
		m.DeliverAt = t0 + 10*sec
		appendAt(t, p, t0, m)
		ch := fetchAsync(context.Background(), p, 0, 10, 0)
		stillWaiting(t, ch)
		appendAt(t, p, t0+sec, func() store.Message { m := msg("later2"); m.DeliverAt = t0 + 20*sec; return m }())
		stillWaiting(t, ch)
		res := apply(t, p, &store.Command{Op: store.OpRelease, Now: t0 + 10*sec})
		equal(t, "released", res.Count, 1)
		f := waitFetch(t, ch)
		equal(t, "fetch after release", fmt.Sprint(bodiesOf(f.msgs), f.err), fmt.Sprint([]string{"0:body-later"}, nil))
	})
	t.Run("Canceled", func(t *testing.T) {
		p, _ := open(t)
		ctx, cancel := context.WithCancel(context.Background())
		ch := fetchAsync(ctx, p, 0, 10, 0)
		stillWaiting(t, ch)
		cancel()
		if f := waitFetch(t, ch); !errors.Is(f.err, context.Canceled) || len(f.msgs) != 0 {
			t.Fatalf("Fetch after cancel = %v, %v; want context.Canceled", f.msgs, f.err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if _, err := p.Fetch(ctx, 0, 10, 0, nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Fetch past its deadline = %v", err)
		}
	})
	t.Run("ErrClosed", func(t *testing.T) {
		p, err := store.Open(filepath.Join(t.TempDir(), "0.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		chs := make([]<-chan fetched, 5)
		for i := range chs {
			chs[i] = fetchAsync(context.Background(), p, 0, 10, 0)
		}
		stillWaiting(t, chs[0])
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		for _, ch := range chs {
			if f := waitFetch(t, ch); !errors.Is(f.err, store.ErrClosed) {
				t.Fatalf("Fetch during Close = %v, %v; want ErrClosed", f.msgs, f.err)
			}
		}
		if _, err := p.Fetch(context.Background(), 0, 10, 0, nil); !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Fetch after Close = %v; want ErrClosed", err)
		}
	})
	t.Run("ErrFailed", func(t *testing.T) {
		// A failed partition appends nothing until reopened: a waiting
		// Fetch returns the failure, and so does a new one.
		p, err := store.Open(filepath.Join(t.TempDir(), "0.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		appendAt(t, p, t0, msg("a"))
		ch := fetchAsync(context.Background(), p, 1, 10, 0)
		stillWaiting(t, ch)
		restore := store.BreakFile(p)
		defer restore()
		if _, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b")}}); !errors.Is(err, store.ErrFailed) {
			t.Fatalf("append to a broken file: %v, want ErrFailed", err)
		}
		if f := waitFetch(t, ch); !errors.Is(f.err, store.ErrFailed) || len(f.msgs) != 0 {
			t.Fatalf("waiting Fetch = %v, %v; want ErrFailed", f.msgs, f.err)
		}
		if _, err := p.Fetch(context.Background(), 1, 10, 0, nil); !errors.Is(err, store.ErrFailed) {
			t.Fatalf("Fetch of a failed partition = %v; want ErrFailed", err)
		}
		if msgs, err := p.Fetch(context.Background(), 0, 10, 0, nil); err != nil || len(msgs) != 1 {
			t.Fatalf("Fetch of what is stored = %v, %v", msgs, err)
		}
		restore()
		if err := p.Close(); !errors.Is(err, store.ErrFailed) {
			t.Fatalf("Close = %v, want the failure", err)
		}
	})
	t.Run("Limits", func(t *testing.T) {
		// max and maxBytes as Read has them, and dst appended to.
		p, _ := open(t)
		for i := range 5 {
			appendAt(t, p, t0, msg(fmt.Sprint(i)))
		}
		for _, c := range [][2]int{{2, 0}, {10, 1}, {10, 0}, {10, 150}, {3, 1 << 20}} {
			want, err1 := p.Read(1, c[0], c[1], nil)
			got, err2 := p.Fetch(context.Background(), 1, c[0], c[1], nil)
			equal(t, fmt.Sprint("fetch ", c), fmt.Sprint(bodiesOf(got), err2), fmt.Sprint(bodiesOf(want), err1))
		}
		dst := []store.Message{{Body: []byte("kept")}}
		got, err := p.Fetch(context.Background(), 4, 10, 0, dst)
		equal(t, "dst", fmt.Sprint(bodiesOf(got), err), fmt.Sprint([]string{"0:kept", "4:body-4"}, nil))
		got, err = p.Fetch(context.Background(), 0, 0, 0, nil)
		if len(got) != 0 || err != nil {
			t.Fatalf("Fetch of at most 0 = %v, %v; want nothing at once", got, err)
		}
	})
	t.Run("BelowLow", func(t *testing.T) {
		// A trimmed offset reads from the first stored; an empty log
		// after the trim waits for the next append.
		p, _ := open(t)
		appendAt(t, p, t0, msg("a"), msg("b"))
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + sec, MaxAge: 1})
		ch := fetchAsync(context.Background(), p, 0, 10, 0)
		stillWaiting(t, ch)
		appendAt(t, p, t0+sec, msg("c"))
		f := waitFetch(t, ch)
		equal(t, "fetch", fmt.Sprint(bodiesOf(f.msgs), f.err), fmt.Sprint([]string{"2:body-c"}, nil))
	})
}
