package localtx

import (
	"bytes"
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// BoltOptions tune a Bolt adapter. The zero value is ready to use.
type BoltOptions struct {
	// MaxAttempts bounds the attempts of Run when its function asks for a
	// redo; zero means DefaultMaxAttempts.
	MaxAttempts int
}

// Bolt is the adapter over the host's own bbolt DB: the queue's marker and
// outbox buckets live in that DB and are written in the same bbolt
// transaction as the host's business data. It is safe for concurrent use;
// like any bbolt DB it runs one write transaction at a time, which
// concurrent Runs share, as Run explains.
type Bolt struct {
	db   *bolt.DB
	opts BoltOptions

	group  boltGroup
	commit func(*bolt.Tx) error // commits a transaction; nil: (*bolt.Tx).Commit. Set only by tests.
}

var _ Store = (*Bolt)(nil)

// NewBolt returns an adapter over db and creates its marker and outbox
// buckets. The adapter does not own db: close it after the node.
func NewBolt(db *bolt.DB, opts BoltOptions) (*Bolt, error) {
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{MarkerBucket, OutboxBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("localtx: bolt buckets: %w", err)
	}
	return &Bolt{db: db, opts: opts, group: boltGroup{lead: make(chan struct{}, 1)}}, nil
}

// BoltTx is one attempt of Bolt.Run. It is bound to the context given to
// Run's function; Bolt.Tx returns its bbolt transaction for business writes.
type BoltTx struct {
	*attempt
	tx    *bolt.Tx
	txid  int // bbolt's id of tx: its meta page's once it is written
	store *Bolt
}

var _ Tx = (*BoltTx)(nil)

// Put writes value under key in bucket inside the transaction, creating the
// bucket when missing. Key and value are copied.
func (t *BoltTx) Put(bucket, key, value []byte) error {
	if bytes.Equal(bucket, OutboxBucket) {
		if _, _, ok := ParseOutboxKey(key); !ok {
			return fmt.Errorf("%w: %q", ErrOutboxKey, key)
		}
	}
	b, err := t.tx.CreateBucketIfNotExists(bucket)
	if err != nil {
		return err
	}
	if err := b.Put(bytes.Clone(key), bytes.Clone(value)); err != nil {
		return err
	}
	t.wrote(bucket, key)
	return nil
}

// Bolt returns the bbolt write transaction, which the other Runs of the
// batch share: use it only inside Run's function, and never commit or roll
// it back.
func (t *BoltTx) Bolt() *bolt.Tx { return t.tx }

// Store returns the adapter that began the transaction.
func (t *BoltTx) Store() Store { return t.store }

func (b *Bolt) commitTx(tx *bolt.Tx) error {
	if b.commit != nil {
		return b.commit(tx)
	}
	return tx.Commit()
}

// outcome reads back whether bbolt wrote the transaction's meta page. If it
// did not, because the marker is absent or, without a marker, the DB's meta
// is older than the transaction, nothing committed. Written, only the fsync
// after it failed: the commit shows, in this process, but may not survive a
// power loss, which is Unknown. A later writer moves the meta on too, so
// without a marker a rollback may also read as Unknown.
func (t *BoltTx) outcome(context.Context) (State, error) {
	st := Unknown
	err := t.store.db.View(func(v *bolt.Tx) error {
		switch {
		case t.marker:
			if mb := v.Bucket(MarkerBucket); mb == nil || mb.Get([]byte(t.id)) == nil {
				st = RolledBack
			}
		case v.ID() < t.txid:
			st = RolledBack
		}
		return nil
	})
	if err != nil {
		return Unknown, fmt.Errorf("localtx: read back commit of %s: %w", t.id, err)
	}
	return st, nil
}

// Tx returns the bbolt transaction that Run bound to ctx, or nil outside Run;
// see BoltTx.Bolt.
func (b *Bolt) Tx(ctx context.Context) *bolt.Tx {
	if t, ok := ctx.Value(ctxKey{}).(*BoltTx); ok && t.store == b {
		return t.tx
	}
	return nil
}

// Run runs fn in a bbolt write transaction bound to ctx, which FromContext
// and Bolt.Tx find. It commits when fn returns nil and rolls back when fn
// returns an error or panics, the panic going on after the rollback; then
// the hooks of the outcome run, before Run returns. When fn returns an error
// wrapping ErrRedo the attempt is rolled back and fn runs again in a new
// transaction. Inside a transaction of this adapter, Run joins it and just
// calls fn.
//
// Concurrent Runs share one bbolt transaction and one commit, one fsync:
// their functions run one after another, each in its caller's goroutine,
// and each Run keeps its own ID, hooks and outcome. A function sees the
// writes of the functions that ran before it in the shared transaction, as
// if they had committed. bbolt cannot undo one function's writes alone, so
// when a function fails, the functions that ran before it run again in a
// new transaction. A re-run, like a redo, is a new attempt, and its earlier
// one's rollback hooks run, but it does not count against MaxAttempts. A
// function may thus run more than once without asking for it: keep effects
// outside the transaction in hooks. When ctx ends before fn's turn, Run
// returns ctx.Err() and fn does not run; once fn ran, Run waits for the
// commit. Run does not wait for other callers: a lone caller commits at
// once.
//
// When bbolt's Commit returns an error, Run reads back whether bbolt wrote
// the transaction's meta page. If not, nothing committed: the rollback hooks
// run and Run returns the commit's error. If it did, only the fsync after
// it failed: the commit shows in this process but may not survive a power
// loss, so Run runs the WhileUnknown hooks and returns an error wrapping
// ErrCommitUnknown. The queue then follows what the DB shows, since its
// check-back reads it like any reader, but bbolt is not safe to write
// after a failed fsync: close the DB and reopen it. Every Run of a batch
// whose commit failed gets its own reading.
//
// A commit hook that fails does not undo the commit, and Run returns nil all
// the same: the transaction committed. This is what happens when the queue
// cannot publish a committed transaction's messages because its own storage
// failed or it is closing: its hook logs a warning on the node's logger and
// leaves the transaction's marker and outbox rows in this DB, and the node
// publishes them later from there, at its next sweep or, for half messages,
// at their check-back. A sweep runs every five TxCheckAfter and at the
// node's start. The messages are late, not lost; until then the transaction
// stays listed by Committed. A hook that panics makes Run panic after the
// other hooks ran, though the transaction committed.
//
// Run returns fn's error, or the commit's.
func (b *Bolt) Run(ctx context.Context, fn func(ctx context.Context) error) error {
	if b.Tx(ctx) != nil {
		return fn(ctx)
	}
	return redo(ctx, b.opts.MaxAttempts, nil, func() error { return b.try(ctx, fn) })
}

// Check answers the check-back of txid; see Store.
func (b *Bolt) Check(_ context.Context, txid string) (State, Record, error) {
	// Running first: a transaction leaves the running set only after its
	// commit is durable, so a marker read afterwards is final.
	if running(txid) {
		return Unknown, Record{}, nil
	}
	var (
		st  = RolledBack
		rec Record
	)
	err := b.db.View(func(tx *bolt.Tx) error {
		r, ok := boltRecord(tx, []byte(txid))
		if ok {
			st, rec = Committed, r
		}
		return nil
	})
	if err != nil {
		return Unknown, Record{}, fmt.Errorf("localtx: check %s: %w", txid, err)
	}
	return st, rec, nil
}

// boltRecord reads the marker and outbox rows of txid.
func boltRecord(tx *bolt.Tx, txid []byte) (Record, bool) {
	mb := tx.Bucket(MarkerBucket)
	if mb == nil {
		return Record{}, false
	}
	v := mb.Get(txid)
	if v == nil {
		return Record{}, false
	}
	rec := Record{TxID: string(txid), Marker: bytes.Clone(v)}
	if ob := tx.Bucket(OutboxBucket); ob != nil {
		prefix := append(bytes.Clone(txid), 0)
		c := ob.Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+8; k, v = c.Next() {
			rec.Outbox = append(rec.Outbox, bytes.Clone(v))
		}
	}
	return rec, true
}

// Committed returns the records of committed transactions not yet
// forgotten; see Store.
func (b *Bolt) Committed(_ context.Context, after string, max int) ([]Record, error) {
	var out []Record
	err := b.db.View(func(tx *bolt.Tx) error {
		mb := tx.Bucket(MarkerBucket)
		if mb == nil {
			return nil
		}
		c := mb.Cursor()
		k, _ := c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, _ = c.Next()
		}
		for ; k != nil && len(out) < max; k, _ = c.Next() {
			r, _ := boltRecord(tx, k)
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("localtx: committed: %w", err)
	}
	return out, nil
}

// Forget deletes the markers and outbox rows of txids; see Store. It joins
// the group commit of Run, or inside a transaction of Run that transaction,
// so the clean-up adds no commit of its own while Runs are busy; like Run
// it returns ctx.Err() when ctx ends before its turn.
func (b *Bolt) Forget(ctx context.Context, txids []string) error {
	if len(txids) == 0 {
		return nil
	}
	err := b.Run(ctx, func(ctx context.Context) error {
		tx := b.Tx(ctx)
		mb, ob := tx.Bucket(MarkerBucket), tx.Bucket(OutboxBucket)
		for _, id := range txids {
			if mb != nil {
				if err := mb.Delete([]byte(id)); err != nil {
					return err
				}
			}
			if ob == nil {
				continue
			}
			prefix := append([]byte(id), 0)
			c := ob.Cursor()
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
				if len(k) != len(prefix)+8 {
					break
				}
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("localtx: forget: %w", err)
	}
	return nil
}
