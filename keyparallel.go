package mq

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/zeze-go/mq/store"
)

// WithKeyParallel lets one partition hand messages with different keys to
// the listener in parallel, at most n at a time; messages with the same key
// stay one by one, in offset order, and each message without a key is a key
// of its own. The committed offset advances past a message only once every
// earlier message of the partition is done (a sliding window, bounded by
// WithFlowControl), so a restart redelivers at most the window. In Orderly
// mode a failing message blocks only its own key while it is retried; the
// other keys go on until the window is full. Default: off (one message of a
// partition at a time).
func WithKeyParallel(n int) ConsumerOption {
	return func(c *consumerConfig) error {
		if n < 1 {
			return fmt.Errorf("%w: key parallelism %d", ErrInvalidOption, n)
		}
		c.keyParallel = n
		return nil
	}
}

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

// runParallel is run for WithKeyParallel: the worker reads and dispatches
// messages to one lane goroutine per key in flight, and *offset follows the
// first message not yet done.
func (w *worker) runParallel(ctx context.Context, offset *uint64) {
	c := w.c
	w.sem = make(chan struct{}, c.cfg.keyParallel)
	var (
		window   []slot
		winBytes int
		next     = *offset
		lanes    = map[string]*lane{}
		done     = make(chan laneDone, c.cfg.batch) // never blocks: one per window slot
		wg       sync.WaitGroup
		buf      []store.Message
	)
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
	defer func() {
		stopLanes()
		advance()
	}()
	room := func() bool {
		return len(window) < c.cfg.batch && (len(window) == 0 || winBytes < c.cfg.batchBytes)
	}
	// reset applies the resets queued: it drops the window, once the
	// handlers in progress have returned, and goes on from the new offset.
	reset := func() {
		stopLanes()
		reqs := w.claimSeeks()
		advance()
		window, winBytes = window[:0], 0
		*offset = w.applySeek(reqs, *offset)
		next = *offset
		lanesStop = newStopper(ctx)
	}
	tick := time.NewTicker(commitEvery)
	defer tick.Stop()
	for ctx.Err() == nil {
		if len(w.wake) > 0 {
			reset()
			continue
		}
		var (
			wake    <-chan struct{}
			errWait <-chan time.Time
			read    int
		)
		if room() {
			changed := w.log.Changed()
			maxBytes := c.cfg.batchBytes
			if len(window) > 0 {
				maxBytes -= winBytes
			}
			var err error
			buf, err = w.log.Read(next, c.cfg.batch-len(window), maxBytes, buf[:0])
			switch {
			case err != nil:
				w.logger().Error("read failed; retrying", "offset", next, "err", err)
				errWait = c.m.cfg.clock.After(errorPause)
			case len(buf) == 0:
				wake = changed
			default:
				read = len(buf)
				if first := buf[0].Offset; first > next {
					next = w.skipGap(next, first)
					if len(window) == 0 {
						*offset = next
					}
				}
				for i := range buf {
					sm := new(store.Message)
					*sm = buf[i]
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
						l = &lane{ch: make(chan *store.Message, c.cfg.batch)}
						lanes[key] = l
						wg.Add(1)
						go w.lane(ctx, lanesStop.ctx, key, l.ch, done, &wg)
					}
					l.pending++
					l.ch <- sm
				}
				clear(buf)
			}
		}
		drain()
		advance()
		if len(window) == 0 || time.Since(w.lastCommit) > commitEvery {
			w.commit(*offset)
		}
		if read > 0 && room() {
			continue
		}
		select {
		case d := <-done:
			markDone(d)
		case <-wake:
		case <-errWait:
		case <-tick.C:
		case <-w.wake:
			reset()
		case <-ctx.Done():
		}
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

// lane hands the messages of one key to the listener in order until ch is
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
		if sm == nil || stop.Err() != nil || w.resetting.Load() { // closed, stopped, or about to be
			return
		}
		if ok, _ := w.handle(ctx, sm, nil, stop.Done()); !ok {
			return
		}
		done <- laneDone{off: sm.Offset, key: key}
	}
}
