// Package localtx binds Zeze MQ to the host's local transactions.
//
// A host runs its business logic in local transactions of its own store. An
// adapter's Run begins one, binds it to the context (WithTx), calls the
// host's function, commits on nil and rolls back on an error or a panic, and
// then runs the hooks registered on the transaction. The mq package finds the
// transaction with FromContext: PrepareMessage and CommitMessage write a
// marker (and, for CommitMessage, outbox rows) into it with Put, and register
// WhileCommit and WhileRollback hooks that decide the half messages.
//
// The same adapter answers the node's check-back through Store: a
// transaction whose marker is present committed; one without a marker that is
// no longer running in this process (or that belongs to an earlier run of the
// process) rolled back; a running one is still unknown.
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
// Whether a transaction is running is known to the process that runs it:
// each node checks back only the half messages it stored, so a host store
// may be shared by several processes, each with its own node.
//
// # Redo
//
// A function passed to Run may return an error wrapping ErrRedo to abandon
// the attempt and run again (Zeze redoes a procedure that met a conflict).
// The attempt is rolled back, its WhileRollback hooks run and its WhileCommit
// hooks are dropped; the next attempt is a new transaction with a new ID and
// no hooks.
package localtx

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
)

// Tx is a host's local transaction as the message queue sees it.
// Implementations need not be safe for concurrent use: a transaction belongs
// to the goroutine running it.
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
	// whose marker is still present, with ids after after, in id order.
	Committed(ctx context.Context, after string, max int) ([]Record, error)
	// Forget deletes the markers and outbox rows of txids in one transaction.
	Forget(ctx context.Context, txids []string) error
}

// State is the outcome of a transaction as its host store knows it.
type State int

// States.
const (
	// Unknown: the transaction is still running.
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
// host's data (the SQL adapter maps them to its marker and outbox tables).
var (
	// MarkerBucket holds txid -> marker of each transaction that sent
	// messages.
	MarkerBucket = []byte("zeze-mq-marker")
	// OutboxBucket holds OutboxKey(txid, seq) -> one outbox row.
	OutboxBucket = []byte("zeze-mq-outbox")
)

// Errors returned by this package.
var (
	// ErrRedo is returned (wrapped or not) by a function passed to Run to
	// abandon the attempt and run again. Run returns it, wrapped, when the
	// attempts run out.
	ErrRedo = errors.New("localtx: redo")
	// ErrBucket is returned by the SQL adapter's Put for a bucket other
	// than MarkerBucket and OutboxBucket.
	ErrBucket = errors.New("localtx: unsupported bucket")
	// ErrOutboxKey is returned by Put for an OutboxBucket key not made by
	// OutboxKey.
	ErrOutboxKey = errors.New("localtx: malformed outbox key")
)

// DefaultMaxAttempts is how many attempts Run makes when its function keeps
// asking for a redo, unless the adapter's options say otherwise.
const DefaultMaxAttempts = 10

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
	id string

	mu       sync.Mutex // guards commit, rollback, done
	commit   []func()
	rollback []func()
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

// end marks the attempt finished (no longer running) and returns the hooks
// of its outcome; the others are dropped.
func (a *attempt) end(committed bool) []func() {
	liveMu.Lock()
	delete(live, a.id)
	liveMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done = true
	hooks := a.rollback
	if committed {
		hooks = a.commit
	}
	a.commit, a.rollback = nil, nil
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

// hostTx is an adapter's begun transaction.
type hostTx interface {
	Tx
	commitTx() error
	rollbackTx() error
}

// run is the managed transaction shared by the adapters: begin, bind, call
// fn, commit or roll back, then run the hooks of the outcome; redo while fn
// asks for it, up to attempts times.
func run(ctx context.Context, attempts int, begin func(a *attempt) (hostTx, error), fn func(context.Context) error) error {
	if attempts <= 0 {
		attempts = DefaultMaxAttempts
	}
	for n := 1; ; n++ {
		a := newAttempt()
		tx, err := begin(a)
		if err != nil {
			a.end(false)
			return err
		}
		err = once(ctx, tx, a, fn)
		if !errors.Is(err, ErrRedo) {
			return err
		}
		if n == attempts {
			return fmt.Errorf("localtx: gave up after %d attempts: %w", n, err)
		}
	}
}

// once runs one attempt. A panic in fn (or runtime.Goexit) rolls back, runs
// the rollback hooks and goes on panicking.
func once(ctx context.Context, tx hostTx, a *attempt, fn func(context.Context) error) (err error) {
	finished := false
	defer func() {
		if finished {
			return
		}
		r := recover()
		_ = tx.rollbackTx()
		runHooks(a.end(false))
		if r != nil {
			panic(r)
		}
	}()
	ferr := fn(WithTx(ctx, tx))
	finished = true
	if ferr != nil {
		_ = tx.rollbackTx()
		runHooks(a.end(false))
		return ferr
	}
	if cerr := tx.commitTx(); cerr != nil {
		_ = tx.rollbackTx()
		runHooks(a.end(false))
		return fmt.Errorf("localtx: commit: %w", cerr)
	}
	runHooks(a.end(true))
	return nil
}
