// Package localtx binds Zeze MQ to the host's local transactions.
//
// A host runs its business logic in local transactions of its own store. An
// adapter's Run begins one, binds it to the context with WithTx, calls the
// host's function, commits on nil and rolls back on an error or a panic, and
// then runs the hooks registered on the transaction. The mq package finds the
// transaction with FromContext: PrepareMessage and CommitMessage write a
// marker into it with Put, CommitMessage its outbox rows too, and register
// WhileCommit and WhileRollback hooks that decide the half messages.
//
// The same adapter answers the node's check-back through Store: a
// transaction whose marker is present committed; one without a marker that is
// no longer running in this process, or that belongs to an earlier run of the
// process, rolled back; a running one is still unknown.
//
// Two adapters ship: Bolt, over the host's own bbolt DB, and SQL, over
// database/sql. Both are safe for concurrent use.
//
//	host, _ := localtx.NewBolt(db, localtx.BoltOptions{})
//	m, _ := mq.Open(dir, mq.WithLocalTx(host)) // check-back and recovery
//	err := host.Run(ctx, func(ctx context.Context) error {
//		if err := host.Tx(ctx).Bucket(orders).Put(k, v); err != nil { // business write
//			return err
//		}
//		return p.CommitMessage(ctx, &mq.Message{Body: b}) // published at commit
//	})
//
// Whether a transaction is running is known to the process that runs it,
// and a half message is checked back by the node that stored it. A node of
// a cluster writes its id into each transaction's marker and publishes
// after a crash only the committed transactions its own markers name, so
// the nodes of a cluster may share one store's tables. A standalone node
// has no id and publishes every committed transaction it finds: give
// standalone processes sharing one SQL database their own tables with
// MarkerTable and OutboxTable.
//
// # Commit errors
//
// A commit that returns an error may have committed: a SQL connection reset
// after COMMIT was sent, a bbolt fsync that failed after the meta page was
// written. Run never takes such an error for a rollback. It reads the
// outcome back from the store, as the check-back does, and runs the hooks of
// the outcome it finds; when it cannot tell before ctx ends, it runs the
// WhileUnknown hooks and returns ErrCommitUnknown, and the queue leaves the
// transaction to the check-back. See SQL.Run and Bolt.Run.
//
// # Redo
//
// A function passed to Run may return an error wrapping ErrRedo to abandon
// the attempt and run again, as Zeze redoes a procedure that met a conflict.
// The attempt is rolled back, its WhileRollback hooks run and its WhileCommit
// hooks are dropped; the next attempt is a new transaction with a new ID and
// no hooks.
package localtx

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Tx is a host's local transaction as the message queue sees it.
// Implementations need not be safe for concurrent use: a transaction belongs
// to the goroutine running it.
//
// A commit that returns an error may have committed. An adapter that can
// end a transaction without knowing its outcome also has
// WhileUnknown(fn func()), which registers fn to run instead of the commit
// and rollback hooks when that happens; BoltTx and SQLTx have it. The
// outcome is then read later from the store by Store.Check.
type Tx interface {
	// ID returns the transaction's id, unique across the runs of the process.
	ID() string
	// Put writes value under key in bucket inside this transaction.
	Put(bucket, key, value []byte) error
	// WhileCommit registers fn to run after the transaction committed.
	WhileCommit(fn func())
	// WhileRollback registers fn to run after the transaction rolled back,
	// aborted or was redone.
	WhileRollback(fn func())
}

// Store is what the node asks of an adapter outside any transaction: the
// check-back of undecided half messages, the outbox left by a crash, and
// the clean-up once the queue's decision is durable.
type Store interface {
	// Check answers the check-back of txid: Committed, with the
	// transaction's record, when its marker is present; RolledBack when the
	// marker is absent and txid is not running in this process; Unknown
	// while it is running.
	Check(ctx context.Context, txid string) (State, Record, error)
	// Committed returns the records of at most max committed transactions
	// whose marker is still present, with ids after after, in the store's
	// id order, the same for every call. It may return fewer than
	// max, to bound a page's bytes; none means there are no more.
	Committed(ctx context.Context, after string, max int) ([]Record, error)
	// Forget deletes the markers and outbox rows of txids in one transaction.
	Forget(ctx context.Context, txids []string) error
}

// State is the outcome of a transaction as its host store knows it.
type State int

// States.
const (
	// Unknown: the transaction is still running, or its outcome cannot be
	// told now.
	Unknown State = iota
	// Committed: the transaction's marker is present.
	Committed
	// RolledBack: the transaction ended without a marker.
	RolledBack
)

func (s State) String() string {
	switch s {
	case Committed:
		return "committed"
	case RolledBack:
		return "rolled back"
	}
	return "unknown"
}

// Record is what a committed transaction left in the host store for the
// queue: its marker and its outbox rows, in write order.
type Record struct {
	TxID   string
	Marker []byte
	Outbox [][]byte
}

// The buckets the queue writes through Tx.Put. Adapters keep them beside the
// host's data; the SQL adapter maps them to its marker and outbox tables.
var (
	// MarkerBucket holds txid -> marker of each transaction that sent
	// messages.
	MarkerBucket = []byte("zeze-mq-marker")
	// OutboxBucket holds OutboxKey(txid, seq) -> one outbox row.
	OutboxBucket = []byte("zeze-mq-outbox")
)

// Errors returned by this package.
var (
	// ErrRedo is returned, wrapped or not, by a function passed to Run to
	// abandon the attempt and run again. Run returns it, wrapped, when the
	// attempts run out.
	ErrRedo = errors.New("localtx: redo")
	// ErrBucket is returned by the SQL adapter's Put for a bucket other
	// than MarkerBucket and OutboxBucket.
	ErrBucket = errors.New("localtx: unsupported bucket")
	// ErrOutboxKey is returned by Put for an OutboxBucket key not made by
	// OutboxKey.
	ErrOutboxKey = errors.New("localtx: malformed outbox key")
	// ErrCommitUnknown is returned, wrapped with the commit's error, by
	// Run when the commit returned an error and Run could not learn the
	// outcome: the store did not answer before ctx ended, or it cannot
	// tell, as when no marker was written, or bbolt wrote the commit but
	// could not sync it. The transaction may have committed. The
	// WhileUnknown hooks ran, neither the commit nor the rollback ones.
	ErrCommitUnknown = errors.New("localtx: commit outcome unknown")
)

// DefaultMaxAttempts is how many attempts Run makes when its function keeps
// asking for a redo or the database keeps refusing the transaction, unless
// the adapter's options say otherwise. With the random pauses between
// attempts, their bound doubling from 1 ms to 100 ms, giving up takes
// about 3 s; ctx ends it sooner. Sixteen writers of one row at
// SERIALIZABLE all commit within it.
const DefaultMaxAttempts = 64

// OutboxKey returns the key of outbox row seq of txid: the txid, a zero
// byte, and seq as 8 big-endian bytes, so a transaction's rows are adjacent
// and in order.
func OutboxKey(txid string, seq uint64) []byte {
	k := make([]byte, len(txid)+9)
	copy(k, txid)
	binary.BigEndian.PutUint64(k[len(txid)+1:], seq)
	return k
}

// ParseOutboxKey splits a key made by OutboxKey.
func ParseOutboxKey(k []byte) (txid string, seq uint64, ok bool) {
	if len(k) < 9 || k[len(k)-9] != 0 {
		return "", 0, false
	}
	return string(k[:len(k)-9]), binary.BigEndian.Uint64(k[len(k)-8:]), true
}

type ctxKey struct{}

// WithTx returns a context carrying tx.
func WithTx(ctx context.Context, tx Tx) context.Context {
	return context.WithValue(ctx, ctxKey{}, tx)
}

// FromContext returns the transaction carried by ctx.
func FromContext(ctx context.Context) (Tx, bool) {
	tx, ok := ctx.Value(ctxKey{}).(Tx)
	return tx, ok && tx != nil
}

// The transactions running in this process. An id starts with the run's
// random prefix, so an id of an earlier run of the process is never running.
var (
	runPrefix = newRunPrefix()
	txSeq     atomic.Uint64

	liveMu sync.Mutex // guards live
	live   = map[string]struct{}{}
)

func newRunPrefix() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("localtx: no randomness: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// running reports whether txid is a transaction running in this process:
// begun and neither committed nor rolled back yet.
func running(txid string) bool {
	liveMu.Lock()
	defer liveMu.Unlock()
	_, ok := live[txid]
	return ok
}

// attempt is one try of a Run: a transaction id and its hooks.
type attempt struct {
	id     string
	marker bool // the transaction wrote its marker, key id in MarkerBucket; owned by its goroutine

	mu       sync.Mutex // guards commit, rollback, unknown, done
	commit   []func()
	rollback []func()
	unknown  []func()
	done     bool
}

func newAttempt() *attempt {
	a := &attempt{id: runPrefix + "-" + strconv.FormatUint(txSeq.Add(1), 36)}
	liveMu.Lock()
	live[a.id] = struct{}{}
	liveMu.Unlock()
	return a
}

// ID returns the transaction's id.
func (a *attempt) ID() string { return a.id }

// WhileCommit registers fn to run after the commit, in registration order.
// Hooks registered after the outcome never run.
func (a *attempt) WhileCommit(fn func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.done {
		a.commit = append(a.commit, fn)
	}
}

// WhileRollback registers fn to run after a rollback, an abort or a redo of
// this attempt, in registration order. Hooks registered after the outcome
// never run.
func (a *attempt) WhileRollback(fn func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.done {
		a.rollback = append(a.rollback, fn)
	}
}

// WhileUnknown registers fn to run, in registration order, when the commit
// returned an error and Run could not read back whether it committed, as
// ErrCommitUnknown says. Hooks registered after the outcome never run.
func (a *attempt) WhileUnknown(fn func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.done {
		a.unknown = append(a.unknown, fn)
	}
}

// wrote notes a successful Put, to know whether the marker was written.
func (a *attempt) wrote(bucket, key []byte) {
	if bytes.Equal(bucket, MarkerBucket) && string(key) == a.id {
		a.marker = true
	}
}

// end marks the attempt as no longer running and returns the hooks
// of its outcome; the others are dropped.
func (a *attempt) end(outcome State) []func() {
	liveMu.Lock()
	delete(live, a.id)
	liveMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done = true
	var hooks []func()
	switch outcome {
	case Committed:
		hooks = a.commit
	case RolledBack:
		hooks = a.rollback
	default:
		hooks = a.unknown
	}
	a.commit, a.rollback, a.unknown = nil, nil, nil
	return hooks
}

// runHooks runs every hook, even after one panics, then re-panics with the
// first panic.
func runHooks(hooks []func()) {
	var first any
	for _, h := range hooks {
		func() {
			defer func() {
				if r := recover(); r != nil && first == nil {
					first = r
				}
			}()
			h()
		}()
	}
	if first != nil {
		panic(first)
	}
}

// outcomer is a transaction whose outcome can be read back after its
// commit returned an error.
type outcomer interface {
	// outcome reads back, after the commit returned an error, whether the
	// transaction committed: Committed or RolledBack when the store says
	// so; Unknown with an error when the store could not answer now, and
	// Run asks again; Unknown without one when it can never tell.
	outcome(ctx context.Context) (State, error)
}

// hostTx is an adapter's begun transaction.
type hostTx interface {
	Tx
	outcomer
	commitTx() error
	rollbackTx() error
}

// run is the managed transaction of an adapter whose Runs each have a
// transaction of their own: begin, bind, call fn, commit or roll back, then
// run the hooks of the outcome; redo while fn asks for it or the store
// refuses the attempt with an error retryable reports, up to attempts
// times.
//
// refused reports the commit errors that are a rollback by the store for
// certain, the server having answered with one; any other commit error is
// read back by settle, and redone only when that says rolled back.
func run(ctx context.Context, attempts int, retryable, refused func(error) bool, begin func(a *attempt) (hostTx, error), fn func(context.Context) error) error {
	return redo(ctx, attempts, retryable, func() error {
		a := newAttempt()
		tx, err := begin(a)
		if err != nil {
			a.end(RolledBack)
			return err
		}
		return once(ctx, tx, a, fn, refused)
	})
}

// How long redo pauses before an attempt, at most: the first redo up to
// redoPause, doubling with each attempt up to redoPauseMax, each pause
// drawn at random below its bound, so that transactions that keep
// conflicting spread out.
const (
	redoPause    = time.Millisecond
	redoPauseMax = 100 * time.Millisecond
)

// redo calls try until it returns an error that neither wraps ErrRedo nor
// is one a non-nil retryable reports, or one that wraps ErrCommitUnknown
// whatever else it wraps, up to attempts times, pausing before each new
// attempt. It gives up, returning the last error, when ctx ends during a
// pause.
func redo(ctx context.Context, attempts int, retryable func(error) bool, try func() error) error {
	if attempts <= 0 {
		attempts = DefaultMaxAttempts
	}
	bound := redoPause
	for n := 1; ; n++ {
		err := try()
		if err == nil || errors.Is(err, ErrCommitUnknown) { // never redo what may have committed
			return err
		}
		if !errors.Is(err, ErrRedo) && (retryable == nil || !retryable(err)) {
			return err
		}
		if n == attempts {
			return fmt.Errorf("localtx: gave up after %d attempts: %w", n, err)
		}
		t := time.NewTimer(mrand.N(bound) + 1)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("localtx: gave up after %d attempts (%w): %w", n, context.Cause(ctx), err)
		case <-t.C:
		}
		bound = min(2*bound, redoPauseMax)
	}
}

// once runs one attempt. A panic or runtime.Goexit in fn rolls back, runs
// the rollback hooks and goes on panicking. A commit error that refused
// reports is a rollback by the store.
func once(ctx context.Context, tx hostTx, a *attempt, fn func(context.Context) error, refused func(error) bool) (err error) {
	finished := false
	defer func() {
		if finished {
			return
		}
		r := recover()
		_ = tx.rollbackTx()
		runHooks(a.end(RolledBack))
		if r != nil {
			panic(r)
		}
	}()
	ferr := fn(WithTx(ctx, tx))
	finished = true
	if ferr != nil {
		_ = tx.rollbackTx()
		runHooks(a.end(RolledBack))
		return ferr
	}
	cerr := tx.commitTx()
	if cerr == nil {
		runHooks(a.end(Committed))
		return nil
	}
	_ = tx.rollbackTx() // releases whatever the failed commit still holds
	if refused != nil && refused(cerr) {
		// The server answered: it rolled the transaction back.
		runHooks(a.end(RolledBack))
		return fmt.Errorf("localtx: commit: %w", cerr)
	}
	// The commit may have happened anyway, with a reply lost with the
	// connection or a failed fsync: the outcome is read back from the store
	// while the attempt still counts as running, so the check-back waits.
	st, rerr := settle(ctx, tx)
	runHooks(a.end(st))
	return commitError(st, cerr, rerr)
}

// commitError is Run's error after its commit failed with cerr and the
// outcome read back was st; rerr says why it could not be read.
func commitError(st State, cerr, rerr error) error {
	switch {
	case st == Committed:
		return nil
	case st == RolledBack:
		return fmt.Errorf("localtx: commit: %w", cerr)
	case rerr != nil:
		return fmt.Errorf("%w: commit: %w; reading it back: %v", ErrCommitUnknown, cerr, rerr)
	}
	return fmt.Errorf("%w: commit: %w", ErrCommitUnknown, cerr)
}

// How long Run goes on reading back the outcome of a failed commit, at
// most, and its first pause between tries, doubling up to a second.
const (
	settleFor   = time.Minute
	settlePause = 10 * time.Millisecond
)

// settle reads back the outcome of tx after its commit failed, trying again
// with backoff while the store cannot answer, until ctx ends or settleFor
// passes. The first try runs even when ctx has ended already: a commit that
// failed because ctx ended is still worth one look.
func settle(ctx context.Context, tx outcomer) (State, error) {
	deadline := time.Now().Add(settleFor)
	st, err := readBack(context.WithoutCancel(ctx), tx, deadline)
	return settleFrom(ctx, tx, deadline, st, err)
}

// readBack is one try of settle.
func readBack(ctx context.Context, tx outcomer, deadline time.Time) (State, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return tx.outcome(ctx)
}

// settleFrom goes on with settle after its first try answered st, err.
func settleFrom(ctx context.Context, tx outcomer, deadline time.Time, st State, err error) (State, error) {
	for pause := settlePause; err != nil; pause = min(2*pause, time.Second) {
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return Unknown, err
		case <-t.C:
		}
		if time.Now().After(deadline) {
			return Unknown, err
		}
		st, err = readBack(ctx, tx, deadline)
	}
	return st, nil
}
