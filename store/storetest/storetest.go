// Package storetest is the conformance suite for anything that serves a
// partition: the local store, the in-memory fake, and the remote and raft
// partitions. Each case runs on a fresh partition and checks one rule of
// store's commands and reads; store.Partition is the reference, so a rule
// here is what store/apply.go and store/read.go do.
//
// Commands carry Now, the proposer's clock, explicitly, so ages and times to
// live are exact and no case waits for the wall clock. Cases that wait for a
// long poll bound the wait, and check that a call still blocks by giving it
// a short quiet period.
package storetest

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// Partition is what the suite tests: the commands and reads of one
// partition. Implementations are safe for concurrent use.
type Partition interface {
	// Apply applies cmd and returns its result, or ctx's error, or
	// store.ErrClosed after Close.
	Apply(ctx context.Context, cmd *store.Command) (store.Result, error)
	// Fetch is Read that waits until a message at or after from is in the
	// log, ctx ends, with ctx.Err(), or the partition closes, with
	// store.ErrClosed.
	Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []store.Message) ([]store.Message, error)
	// Get returns the message at offset; ok false when it is not in the log.
	Get(offset uint64) (store.Message, bool, error)
	// Stats returns the acknowledged state.
	Stats() store.Stats
	// Group returns a consumer group's record; ok false when it has none.
	Group(name string) (store.GroupState, bool, error)
	// SeekTime returns the first offset stored at or after t, or Next.
	SeekTime(t int64) (uint64, error)
	// NextDue returns the earliest DeliverAt of a delayed message.
	NextDue() (int64, bool, error)
	// HalfTxs calls fn for each undecided transaction, in txid order,
	// until fn returns false; fn may call the partition.
	HalfTxs(fn func(store.HalfTx) bool) error
	// Decision returns the recorded decision of txid.
	Decision(txid string) (store.Decision, error)
	// Close is idempotent; afterwards every call returns store.ErrClosed.
	Close() error
}

// A test is one case of the suite, run on a fresh partition.
type test struct {
	name string
	run  func(t *testing.T, p Partition)
}

// suite is the cases by subject; each file of the package holds some.
var suite = []struct {
	name  string
	tests []test
}{
	{"Append", appendTests},
	{"Delay", delayTests},
	{"Fetch", fetchTests},
	{"Read", readTests},
	{"Offsets", offsetTests},
	{"Tx", txTests},
	{"Trim", trimTests},
	{"Command", commandTests},
}

// Run runs the suite, each case in parallel on a fresh partition from open,
// which registers with t.Cleanup whatever else it must release. Run closes
// the partitions, checking Close's error, before those cleanups run.
func Run(t *testing.T, open func(t *testing.T) Partition) {
	for _, g := range suite {
		t.Run(g.name, func(t *testing.T) {
			for _, tt := range g.tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					tt.run(t, fresh(t, open))
				})
			}
		})
	}
}

// RunDurable runs, as Run does, the cases that close a partition and open
// its data again: open opens the partition kept in dir, creating it on
// first use.
func RunDurable(t *testing.T, open func(t *testing.T, dir string) Partition) {
	for _, tt := range durableTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			tt.run(t, func() Partition { return fresh(t, func(t *testing.T) Partition { return open(t, dir) }) })
		})
	}
}

// fresh opens a partition and closes it when the test ends, before the
// opener's own cleanups. Close is idempotent: a case may close it first.
func fresh(t *testing.T, open func(t *testing.T) Partition) Partition {
	t.Helper()
	p := open(t)
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// t0 is the suite's clock origin.
const (
	t0  = int64(1_700_000_000_000_000_000)
	sec = int64(time.Second)
)

const (
	// patience bounds every wait for something that must happen.
	patience = 10 * time.Second
	// quiet is how long a call must go on blocking to count as waiting.
	quiet = 30 * time.Millisecond
)

// noOffset is the Offset of a delayed message's Ack.
const noOffset = ^uint64(0)

// apply runs cmd, stamped at t0 when its Now is zero, and fails the test on
// an error.
func apply(t testing.TB, p Partition, cmd *store.Command) store.Result {
	t.Helper()
	if cmd.Now == 0 {
		cmd.Now = t0
	}
	res, err := p.Apply(context.Background(), cmd)
	if err != nil {
		t.Fatalf("Apply(op %d): %v", cmd.Op, err)
	}
	return res
}

// applyErr runs cmd as it is and returns its error, which must wrap want.
func applyErr(t testing.TB, p Partition, cmd *store.Command, want error) store.Result {
	t.Helper()
	res, err := p.Apply(context.Background(), cmd)
	if !errors.Is(err, want) {
		t.Fatalf("Apply(%+v) = %v, want %v", cmd, err, want)
	}
	return res
}

func appendAt(t testing.TB, p Partition, now int64, msgs ...store.Message) []store.Ack {
	t.Helper()
	return apply(t, p, &store.Command{Op: store.OpAppend, Now: now, Msgs: msgs}).Acks
}

// msg is a message with an ID and a body derived from name.
func msg(name string) store.Message {
	return store.Message{ID: "id-" + name, Key: "key", Body: []byte("body-" + name), Timestamp: t0}
}

// delayed is msg(name) due at due.
func delayed(name string, due int64) store.Message {
	m := msg(name)
	m.DeliverAt = due
	return m
}

// fetch returns what Fetch returns at once: the log holds a message at or
// after from.
func fetch(t testing.TB, p Partition, from uint64, max, maxBytes int) []store.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	got, err := p.Fetch(ctx, from, max, maxBytes, nil)
	if err != nil {
		t.Fatalf("Fetch(%d, %d, %d): %v", from, max, maxBytes, err)
	}
	return got
}

// readAll returns the whole log, checking that its offsets are [Low, Next).
func readAll(t testing.TB, p Partition) []store.Message {
	t.Helper()
	st := p.Stats()
	if st.Low == st.Next {
		return nil
	}
	got := fetch(t, p, 0, 1<<20, 0)
	for i, m := range got {
		if m.Offset != st.Low+uint64(i) {
			t.Fatalf("message %d of the log at offset %d, want %d (Stats %+v)", i, m.Offset, st.Low+uint64(i), st)
		}
	}
	if uint64(len(got)) != st.Next-st.Low {
		t.Fatalf("log holds %d messages, Stats %+v", len(got), st)
	}
	return got
}

// bodies returns the log's bodies, as strings.
func bodies(t testing.TB, p Partition) []string {
	t.Helper()
	var out []string
	for _, m := range readAll(t, p) {
		out = append(out, string(m.Body))
	}
	return out
}

func offsetsOf(acks []store.Ack) []uint64 {
	out := make([]uint64, len(acks))
	for i, a := range acks {
		out[i] = a.Offset
	}
	return out
}

func halves(t testing.TB, p Partition) []store.HalfTx {
	t.Helper()
	var out []store.HalfTx
	if err := p.HalfTxs(func(h store.HalfTx) bool { out = append(out, h); return true }); err != nil {
		t.Fatalf("HalfTxs: %v", err)
	}
	return out
}

func decision(t testing.TB, p Partition, txid string) store.Decision {
	t.Helper()
	d, err := p.Decision(txid)
	if err != nil {
		t.Fatalf("Decision(%s): %v", txid, err)
	}
	return d
}

func nextDue(t testing.TB, p Partition) (int64, bool) {
	t.Helper()
	due, ok, err := p.NextDue()
	if err != nil {
		t.Fatalf("NextDue: %v", err)
	}
	return due, ok
}

func equal(t testing.TB, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s = %+v, want %+v", what, got, want)
	}
}

// waiter is a Fetch running in its own goroutine.
type waiter struct {
	done chan struct{}
	msgs []store.Message
	err  error
}

// startFetch starts Fetch(ctx, from, 100, 0) in a goroutine. The test's
// cleanup cancels it and waits for it, so none outlives the test.
func startFetch(t *testing.T, ctx context.Context, p Partition, from uint64) *waiter {
	ctx, cancel := context.WithCancel(ctx)
	w := &waiter{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.msgs, w.err = p.Fetch(ctx, from, 100, 0, nil)
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// blocked fails the test if the Fetch returns within the quiet period.
func (w *waiter) blocked(t testing.TB, what string) {
	t.Helper()
	select {
	case <-w.done:
		t.Fatalf("Fetch returned %+v, %v %s; want it waiting", w.msgs, w.err, what)
	case <-time.After(quiet):
	}
}

// result waits for the Fetch to return.
func (w *waiter) result(t testing.TB) ([]store.Message, error) {
	t.Helper()
	select {
	case <-w.done:
		return w.msgs, w.err
	case <-time.After(patience):
		t.Fatalf("Fetch still waiting after %v", patience)
		return nil, nil
	}
}
