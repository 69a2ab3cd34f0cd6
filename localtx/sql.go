package localtx

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
)

// Placeholder is how a SQL dialect writes query parameters.
type Placeholder int

// Placeholders.
const (
	// Question writes ?, as SQLite and MySQL do (the default).
	Question Placeholder = iota
	// Dollar writes $1, $2, ..., as PostgreSQL does.
	Dollar
)

// SQLOptions tune a SQL adapter. The zero value suits SQLite and MySQL.
type SQLOptions struct {
	// MarkerTable is the table of markers, one row per transaction that
	// sent messages; default "mq_tx_marker".
	MarkerTable string
	// OutboxTable is the table of outbox rows; default "mq_tx_outbox".
	OutboxTable string
	// Placeholder is the dialect's parameter style; default Question.
	Placeholder Placeholder
	// BlobType is the column type of the stored bytes used by CreateTables;
	// default "BLOB" (PostgreSQL: "BYTEA", MySQL: "LONGBLOB").
	BlobType string
	// TxOptions are passed to BeginTx.
	TxOptions *sql.TxOptions
	// MaxAttempts bounds the attempts of Run when its function asks for a
	// redo; zero means DefaultMaxAttempts.
	MaxAttempts int
}

// SQL is the adapter over database/sql: the queue's marker and outbox rows
// are written to two tables in the same SQL transaction as the host's
// business rows. The SQL is plain (no upserts, no RETURNING), for SQLite,
// PostgreSQL and MySQL. It is safe for concurrent use.
type SQL struct {
	db   *sql.DB
	opts SQLOptions

	insMarker, updMarker, insOutbox   string
	getMarker, getOutbox, listMarkers string
	delMarker, delOutbox              string
	createMarker, createOutbox        string
}

var _ Store = (*SQL)(nil)

// NewSQL returns an adapter over db. It checks the table names (letters,
// digits, '_' and '.') but creates nothing; see CreateTables. The adapter
// does not own db.
func NewSQL(db *sql.DB, opts SQLOptions) (*SQL, error) {
	if opts.MarkerTable == "" {
		opts.MarkerTable = "mq_tx_marker"
	}
	if opts.OutboxTable == "" {
		opts.OutboxTable = "mq_tx_outbox"
	}
	if opts.BlobType == "" {
		opts.BlobType = "BLOB"
	}
	for _, n := range []string{opts.MarkerTable, opts.OutboxTable, opts.BlobType} {
		if !identifier(n) {
			return nil, fmt.Errorf("localtx: bad SQL identifier %q", n)
		}
	}
	if opts.Placeholder != Question && opts.Placeholder != Dollar {
		return nil, fmt.Errorf("localtx: bad placeholder %d", opts.Placeholder)
	}
	s := &SQL{db: db, opts: opts}
	m, o := opts.MarkerTable, opts.OutboxTable
	s.insMarker = s.q("INSERT INTO " + m + " (txid, body) VALUES (?, ?)")
	s.updMarker = s.q("UPDATE " + m + " SET body = ? WHERE txid = ?")
	s.insOutbox = s.q("INSERT INTO " + o + " (txid, seq, body) VALUES (?, ?, ?)")
	s.getMarker = s.q("SELECT body FROM " + m + " WHERE txid = ?")
	s.getOutbox = s.q("SELECT body FROM " + o + " WHERE txid = ? ORDER BY seq")
	s.listMarkers = s.q("SELECT txid FROM " + m + " WHERE txid > ? ORDER BY txid")
	s.delMarker = s.q("DELETE FROM " + m + " WHERE txid = ?")
	s.delOutbox = s.q("DELETE FROM " + o + " WHERE txid = ?")
	s.createMarker = "CREATE TABLE IF NOT EXISTS " + m + " (txid VARCHAR(128) NOT NULL PRIMARY KEY, body " + opts.BlobType + " NOT NULL)"
	s.createOutbox = "CREATE TABLE IF NOT EXISTS " + o + " (txid VARCHAR(128) NOT NULL, seq BIGINT NOT NULL, body " + opts.BlobType + " NOT NULL, PRIMARY KEY (txid, seq))"
	return s, nil
}

func identifier(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// q rewrites the ? of query in the adapter's placeholder style.
func (s *SQL) q(query string) string {
	if s.opts.Placeholder == Question {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// CreateTables creates the marker and outbox tables when they do not exist.
func (s *SQL) CreateTables(ctx context.Context) error {
	for _, q := range []string{s.createMarker, s.createOutbox} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("localtx: create tables: %w", err)
		}
	}
	return nil
}

// SQLTx is one attempt of SQL.Run. It is bound to the context given to Run's
// function; SQL.Tx returns its *sql.Tx for business writes.
type SQLTx struct {
	*attempt
	ctx    context.Context
	tx     *sql.Tx
	store  *SQL
	marked bool // the marker row exists in this transaction
}

var _ Tx = (*SQLTx)(nil)

// Put writes the queue's marker or outbox row inside the transaction. Other
// buckets return ErrBucket: write business rows with the *sql.Tx.
func (t *SQLTx) Put(bucket, key, value []byte) error {
	s := t.store
	switch {
	case bytes.Equal(bucket, MarkerBucket):
		q, args := s.insMarker, []any{string(key), value}
		if t.marked {
			q, args = s.updMarker, []any{value, string(key)}
		}
		if _, err := t.tx.ExecContext(t.ctx, q, args...); err != nil {
			return fmt.Errorf("localtx: marker: %w", err)
		}
		t.marked = true
		t.wrote(bucket, key)
		return nil
	case bytes.Equal(bucket, OutboxBucket):
		txid, seq, ok := ParseOutboxKey(key)
		if !ok {
			return fmt.Errorf("%w: %q", ErrOutboxKey, key)
		}
		if _, err := t.tx.ExecContext(t.ctx, s.insOutbox, txid, int64(seq), value); err != nil {
			return fmt.Errorf("localtx: outbox: %w", err)
		}
		return nil
	}
	return fmt.Errorf("%w: %q", ErrBucket, bucket)
}

// SQL returns the SQL transaction.
func (t *SQLTx) SQL() *sql.Tx { return t.tx }

// Store returns the adapter that began the transaction.
func (t *SQLTx) Store() Store { return t.store }

func (t *SQLTx) commitTx() error   { return t.tx.Commit() }
func (t *SQLTx) rollbackTx() error { return t.tx.Rollback() }

// outcome reads back whether the transaction committed from its marker
// row; without one it can never tell.
func (t *SQLTx) outcome(ctx context.Context) (State, error) {
	if !t.marker {
		return Unknown, nil
	}
	st, _, err := t.store.outcomeOf(ctx, t.id)
	return st, err
}

// Tx returns the SQL transaction that Run bound to ctx, or nil outside Run.
func (s *SQL) Tx(ctx context.Context) *sql.Tx {
	if t, ok := ctx.Value(ctxKey{}).(*SQLTx); ok && t.store == s {
		return t.tx
	}
	return nil
}

// Run runs fn in a SQL transaction bound to ctx (see FromContext and
// SQL.Tx). It commits when fn returns nil and rolls back when fn returns an
// error or panics (the panic goes on after the rollback); then the hooks of
// the outcome run, before Run returns. When fn returns an error wrapping
// ErrRedo the attempt is rolled back and fn runs again in a new transaction.
// Inside a transaction of this adapter, Run joins it and just calls fn.
//
// A COMMIT that returns an error may have committed. When the transaction
// wrote its marker (the queue sent messages), Run reads the outcome back
// from the marker row (see Check), trying again with backoff while the
// database cannot answer, until ctx ends (one try at least, a minute at
// most): committed, it runs the commit hooks and returns nil; rolled back,
// the rollback hooks and the commit's error. Otherwise, or without a
// marker, it runs the WhileUnknown hooks and returns an error wrapping
// ErrCommitUnknown and the commit's error.
//
// As with Bolt.Run, a commit hook that fails (the queue could not publish)
// does not undo the commit and Run returns nil: the queue publishes the
// transaction later from the marker and outbox rows it left; see Bolt.Run.
//
// Run returns fn's error, or the commit's.
func (s *SQL) Run(ctx context.Context, fn func(ctx context.Context) error) error {
	if s.Tx(ctx) != nil {
		return fn(ctx)
	}
	return run(ctx, s.opts.MaxAttempts, func(a *attempt) (hostTx, error) {
		tx, err := s.db.BeginTx(ctx, s.opts.TxOptions)
		if err != nil {
			return nil, fmt.Errorf("localtx: begin: %w", err)
		}
		return &SQLTx{attempt: a, ctx: ctx, tx: tx, store: s}, nil
	}, fn)
}

// Check answers the check-back of txid; see Store. A missing marker row is
// confirmed (see outcomeOf), so that a commit the server is still
// processing is not taken for a rollback.
func (s *SQL) Check(ctx context.Context, txid string) (State, Record, error) {
	// Running first: a transaction leaves the running set only after its
	// commit returned (or, when it failed, its outcome was looked for).
	if running(txid) {
		return Unknown, Record{}, nil
	}
	st, rec, err := s.outcomeOf(ctx, txid)
	if err != nil {
		return Unknown, Record{}, fmt.Errorf("localtx: check %s: %w", txid, err)
	}
	return st, rec, nil
}

// outcomeOf reads the outcome of txid, a transaction that no longer runs
// here. Its marker row present means committed. Absent, the
// transaction may still be committing on the server (its COMMIT sent and
// the reply lost): an INSERT of the same key, in a transaction rolled back
// at once, waits for such a commit to end and fails if it committed. So a
// probe that succeeds means rolled back; one that fails means committed if
// the row is there now, and otherwise that the store cannot answer.
func (s *SQL) outcomeOf(ctx context.Context, txid string) (State, Record, error) {
	rec, ok, err := s.record(ctx, s.db, txid)
	if err != nil {
		return Unknown, Record{}, err
	}
	if ok {
		return Committed, rec, nil
	}
	perr := s.probe(ctx, txid)
	if perr == nil {
		return RolledBack, Record{}, nil
	}
	if rec, ok, err := s.record(ctx, s.db, txid); err == nil && ok {
		return Committed, rec, nil
	}
	return Unknown, Record{}, fmt.Errorf("probe of the marker: %w", perr)
}

// probe inserts the marker row of txid in a transaction it rolls back.
func (s *SQL) probe(ctx context.Context, txid string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, s.insMarker, txid, []byte{0})
	return err
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *SQL) record(ctx context.Context, db queryer, txid string) (Record, bool, error) {
	var marker []byte
	err := db.QueryRowContext(ctx, s.getMarker, txid).Scan(&marker)
	if err == sql.ErrNoRows {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, err
	}
	rec := Record{TxID: txid, Marker: marker}
	rows, err := db.QueryContext(ctx, s.getOutbox, txid)
	if err != nil {
		return Record{}, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return Record{}, false, err
		}
		rec.Outbox = append(rec.Outbox, b)
	}
	return rec, true, rows.Err()
}

// Committed returns the records of committed transactions not yet
// forgotten; see Store.
func (s *SQL) Committed(ctx context.Context, after string, max int) ([]Record, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("localtx: committed: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, s.listMarkers, after)
	if err != nil {
		return nil, fmt.Errorf("localtx: committed: %w", err)
	}
	var ids []string
	for rows.Next() && len(ids) < max {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("localtx: committed: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("localtx: committed: %w", err)
	}
	out := make([]Record, 0, len(ids))
	for _, id := range ids {
		rec, ok, err := s.record(ctx, tx, id)
		if err != nil {
			return nil, fmt.Errorf("localtx: committed: %w", err)
		}
		if ok {
			out = append(out, rec)
		}
	}
	return out, nil
}

// Forget deletes the markers and outbox rows of txids; see Store.
func (s *SQL) Forget(ctx context.Context, txids []string) error {
	if len(txids) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("localtx: forget: %w", err)
	}
	defer tx.Rollback()
	for _, id := range txids {
		if _, err := tx.ExecContext(ctx, s.delOutbox, id); err != nil {
			return fmt.Errorf("localtx: forget: %w", err)
		}
		if _, err := tx.ExecContext(ctx, s.delMarker, id); err != nil {
			return fmt.Errorf("localtx: forget: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("localtx: forget: %w", err)
	}
	return nil
}
