package delivery

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/zeze-go/mq/store"
)

// Key-parallel delivery: the worker reads messages into a window and hands
// each to the lane of its key, one goroutine per key in flight; the
// committed offset follows the first message of the window not yet done.

// slot is one message of the window: read, not yet below the committed offset.
type slot struct {
	off  uint64
	size int
	done bool
}

// lane delivers the messages of one key in order. The worker alone sends
// to and closes ch, and counts pending.
type lane struct {
	ch      chan *store.Message
	pending int
}

type laneDone struct {
	off uint64
	key string
}

func laneKey(sm *store.Message) string {
	if sm.Key == "" {
		return "\x00" + strconv.FormatUint(sm.Offset, 10)
	}
	return sm.Key
}

// fetchReq asks the window's reader for messages from from on.
type fetchReq struct {
	from          uint64
	max, maxBytes int
}

type fetchResp struct {
	msgs []store.Message
	err  error
}

// reader runs the fetches of a key-parallel worker, one at a time, so the
// worker can wait for messages and for its lanes together. It ends when
// reqs is closed.
func (w *worker) reader(reqs <-chan fetchReq, resps chan<- fetchResp) {
	var buf []store.Message
	for r := range reqs {
		var err error
		buf, err = w.fetch(r.from, r.max, r.maxBytes, buf[:0], false)
		resps <- fetchResp{msgs: append([]store.Message(nil), buf...), err: err}
		clear(buf)
	}
}

// runParallel is run for WithKeyParallel: *offset follows the first message
// not yet done.
func (w *worker) runParallel(ctx context.Context, offset *uint64) {
	cfg := &w.c.cfg
	w.sem = make(chan struct{}, cfg.KeyParallel)
	var (
		window   []slot
		winBytes int
		next     = *offset
		lanes    = map[string]*lane{}
		done     = make(chan laneDone, cfg.Batch) // never blocks: one per window slot
		wg       sync.WaitGroup
		reqs     = make(chan fetchReq)
		resps    = make(chan fetchResp, 1)
		fetching bool // a request is with the reader
	)
	w.c.e.spawn(func() { w.reader(reqs, resps) })
	lanesStop := newStopper(ctx)
	markDone := func(d laneDone) {
		i := sort.Search(len(window), func(i int) bool { return window[i].off >= d.off })
		if i < len(window) && window[i].off == d.off {
			window[i].done = true
		}
		if l := lanes[d.key]; l != nil {
			if l.pending--; l.pending == 0 {
				close(l.ch)
				delete(lanes, d.key)
			}
		}
	}
	drain := func() {
		for {
			select {
			case d := <-done:
				markDone(d)
			default:
				return
			}
		}
	}
	// stopLanes interrupts the lanes' retry waits, waits for the handlers in
	// progress and keeps what they finished.
	stopLanes := func() {
		lanesStop.cancel()
		wg.Wait()
		drain()
		for k, l := range lanes {
			close(l.ch)
			delete(lanes, k)
		}
	}
	advance := func() {
		n := 0
		for n < len(window) && window[n].done {
			winBytes -= window[n].size
			n++
		}
		window = window[n:]
		if len(window) > 0 {
			*offset = window[0].off
		} else {
			*offset = next
		}
	}
	// settleFetch waits for the reader's answer to a request the worker no
	// longer wants, its fetch cut short by the claim that replaced it.
	settleFetch := func() {
		if fetching {
			<-resps
			fetching = false
		}
	}
	defer func() {
		stopLanes()
		advance()
		w.disarmFetch()
		settleFetch()
		close(reqs)
	}()
	room := func() bool {
		return len(window) < cfg.Batch && (len(window) == 0 || winBytes < cfg.BatchBytes)
	}
	dispatch := func(msgs []store.Message) {
		if first := msgs[0].Offset; first > next {
			next = w.skipGap(next, first)
			if len(window) == 0 {
				*offset = next
			}
		}
		for i := range msgs {
			sm := &msgs[i]
			window = append(window, slot{off: sm.Offset, size: sm.Size()})
			winBytes += window[len(window)-1].size
			next = sm.Offset + 1
			if !w.accept(sm) {
				window[len(window)-1].done = true
				continue
			}
			key := laneKey(sm)
			l := lanes[key]
			if l == nil {
				l = &lane{ch: make(chan *store.Message, cfg.Batch)}
				lanes[key] = l
				wg.Add(1)
				stop := lanesStop.ctx
				w.c.e.spawn(func() { w.lane(ctx, stop, key, l.ch, done, &wg) })
			}
			l.pending++
			l.ch <- sm
		}
	}
	tick := time.NewTicker(commitEvery)
	defer tick.Stop()
	var errWait <-chan time.Time
	suspect := false // a read failed since the claim was last known to hold (claimHolds)
	for ctx.Err() == nil {
		if w.moved.Load() {
			// A reset: drop the window once the handlers in progress have
			// returned, claim again and go on from the offset stored.
			stopLanes()
			w.disarmFetch()
			settleFetch()
			window, winBytes = window[:0], 0
			off, ok := w.claim(ctx)
			if !ok {
				*offset = w.committed
				return
			}
			*offset, next, suspect = off, off, false
			lanesStop = newStopper(ctx)
			continue
		}
		if !fetching && errWait == nil && room() {
			maxBytes := cfg.BatchBytes
			if len(window) > 0 {
				maxBytes -= winBytes
			}
			reqs <- fetchReq{from: next, max: cfg.Batch - len(window), maxBytes: maxBytes}
			fetching = true
		}
		drain()
		advance()
		if len(window) == 0 || time.Since(w.lastCommit) > commitEvery {
			w.commit(*offset)
		}
		if r := cfg.Refresh; r > 0 && time.Since(w.lastCommit) > r {
			w.store(*offset) // idle: keep the record fresh, as fetch does
		}
		select {
		case r := <-resps:
			fetching = false
			switch {
			case w.pastEnd(r.err):
			case r.err != nil:
				suspect = true
				if ctx.Err() == nil && !w.moved.Load() {
					w.logger().Error("read failed; retrying", "offset", next, "err", r.err)
					errWait = w.c.e.clock.After(errorPause)
				}
			case len(r.msgs) > 0 && suspect && !w.claimHolds(ctx):
				if ctx.Err() == nil && !w.moved.Load() {
					errWait = w.c.e.clock.After(errorPause)
				}
			case len(r.msgs) > 0:
				suspect = false
				dispatch(r.msgs)
			}
		case d := <-done:
			markDone(d)
		case <-errWait:
			errWait = nil
		case <-tick.C:
		case <-w.wake:
			w.moved.Store(true)
		case <-ctx.Done():
		}
	}
}

// disarmFetch cuts short the wait of the current fetch.
func (w *worker) disarmFetch() {
	w.fetchMu.Lock()
	defer w.fetchMu.Unlock()
	if w.unfetch != nil {
		w.unfetch()
	}
}

// stopper is a context to cancel, kept together so it can be replaced.
type stopper struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newStopper(parent context.Context) *stopper {
	s := &stopper{}
	s.ctx, s.cancel = context.WithCancel(parent)
	return s
}

// lane hands the messages of one key to the handler in order until ch is
// closed or stop ends; each message handled is reported on done.
func (w *worker) lane(ctx, stop context.Context, key string, ch <-chan *store.Message, done chan<- laneDone, wg *sync.WaitGroup) {
	defer wg.Done()
	defer w.runsHandlers()()
	for {
		var sm *store.Message
		select {
		case sm = <-ch:
		case <-stop.Done():
			return
		}
		if sm == nil || stop.Err() != nil || w.moved.Load() { // closed, stopped, or about to be
			return
		}
		if !w.handle(ctx, sm, stop.Done()) {
			return
		}
		done <- laneDone{off: sm.Offset, key: key}
	}
}
