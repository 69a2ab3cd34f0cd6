package delivery

import (
	"bytes"
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
)

// Calls from handlers. A handler may call any public method, and a call that
// waits must not wait for a handler that cannot return before the call
// does: its own, or one that is itself inside such a call. The goroutines
// that run handlers are registered with their worker; a call made from one,
// or with a handler's ctx, holds that worker for its duration, and its
// waits give up on a worker that is held, directly or through the worker it
// waits to take over from.
var (
	handlerGoroutines sync.Map // goroutine id → the *worker whose handlers it runs

	heldMu      sync.Mutex            // guards heldChanged
	heldChanged = make(chan struct{}) // closed and replaced whenever a worker's held count changes
)

// runsHandlers registers the calling goroutine as one that runs w's
// handlers; the returned func deregisters it.
func (w *worker) runsHandlers() func() {
	id := goid()
	handlerGoroutines.Store(id, w)
	return func() { handlerGoroutines.Delete(id) }
}

// goid is the calling goroutine's id, read from the first line of its stack
// trace, such as "goroutine 18 [running]:". Only registrations and public
// calls that wait pay for it.
func goid() uint64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}

// reentry is a public call in progress; in holds the workers whose handlers
// made it.
type reentry struct{ in []*worker }

// enter starts a call that may wait: made from a handler's goroutine, or
// with a handler's ctx, it holds that handler's worker until leave.
func enter(ctx context.Context) reentry {
	var r reentry
	if v, ok := handlerGoroutines.Load(goid()); ok {
		r.in = append(r.in, v.(*worker))
	}
	if w, _ := ctx.Value(workerKey{}).(*worker); w != nil && !slices.Contains(r.in, w) {
		r.in = append(r.in, w)
	}
	for _, w := range r.in {
		w.hold(1)
	}
	return r
}

func (r reentry) leave() {
	for _, w := range r.in {
		w.hold(-1)
	}
}

func (w *worker) hold(d int32) {
	w.held.Add(d)
	heldMu.Lock()
	close(heldChanged)
	heldChanged = make(chan struct{})
	heldMu.Unlock()
}

// blocked reports whether w cannot end, nor answer a reset, before a call
// made by a handler returns: w, or a worker w waits for, is held.
func (w *worker) blocked() bool {
	for x := w; x != nil; x = x.prev.Load() {
		select {
		case <-x.done:
			return false // and so are the ones before it
		default:
		}
		if x.held.Load() > 0 {
			return true
		}
	}
	return false
}

// await waits until ready, w's done or its answer to a reset, is closed and
// reports true, or until ctx ends, with its error. A call made from a
// handler stops waiting, reporting false, once w is blocked.
func (r reentry) await(ctx context.Context, w *worker, ready <-chan struct{}) (bool, error) {
	for {
		heldMu.Lock()
		changed := heldChanged
		heldMu.Unlock()
		if len(r.in) > 0 && w.blocked() {
			return false, nil
		}
		select {
		case <-ready:
			return true, nil
		case <-changed:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}
