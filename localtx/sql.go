package localtx

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SQLOptions tune a SQL adapter. Dialect is required.
type SQLOptions struct {
	// Dialect is the database: SQLite, PostgreSQL or MySQL, which serves
	// MariaDB too. It sets the parameter style, the quoting of table names,
	// the column types of CreateTables and the errors that redo a
	// transaction.
	Dialect Dialect
	// MarkerTable is the table of markers, one row per transaction that
	// sent messages; default "mq_tx_marker". A name may be schema.table;
	// each part is quoted, so reserved words are fine.
	MarkerTable string
	// OutboxTable is the table of outbox rows; default "mq_tx_outbox".
	OutboxTable string
	// BlobType overrides the dialect's column type of stored bytes used by
	// CreateTables: SQLite's BLOB, PostgreSQL's BYTEA, MySQL's LONGBLOB.
	BlobType string
	// MaxRowBytes is the largest marker or outbox row the tables must
	// hold; default DefaultMaxRowBytes. NewSQL refuses a column type the
	// dialect knows to hold less, such as MySQL's BLOB of 64 KiB. Raise it
	// with the node's WithMaxMessageBytes.
	MaxRowBytes int64
	// TxOptions are passed to BeginTx.
	TxOptions *sql.TxOptions
	// MaxAttempts bounds the attempts of Run when its function asks for a
	// redo or the database refuses the transaction with a retryable error;
	// zero means DefaultMaxAttempts.
	MaxAttempts int
	// Retryable reports further errors after which Run should run the
	// transaction again, beside the dialect's own: serialization failures
	// and deadlocks (PostgreSQL 40001, 40P01), deadlocks and lock wait
	// timeouts (MySQL 1213, 1205), SQLite's busy and locked. It is asked
	// about the function's errors, and about a commit's error only once the
	// marker row says the commit did not happen: a commit error, such as a
	// lost connection, does not tell by itself.
	Retryable func(err error) bool
}

// DefaultMaxRowBytes is the default SQLOptions.MaxRowBytes: a message of
// the node's default size limit, 4 MiB, with room for its envelope.
const DefaultMaxRowBytes = 4<<20 + 64<<10

// ErrRowTooLarge is returned by Put for a row larger than its column holds,
// before anything is sent: a server not in strict mode would truncate it.
var ErrRowTooLarge = errors.New("localtx: row too large for its column")

// SQL is the adapter over database/sql: the queue's marker and outbox rows
// are written to two tables in the same SQL transaction as the host's
// business rows. It is safe for concurrent use.
type SQL struct {
	db        *sql.DB
	opts      SQLOptions
	dialect   *dialect
	maxRow    int64 // what a stored-bytes column holds; 0: unknown
	retryable func(error) bool

	insMarker, updMarker, insOutbox string
	getRecord, committed            string // one transaction's rows; a page of them
	createMarker, createOutbox      string
	marker, outbox                  string // quoted table names
}

var _ Store = (*SQL)(nil)

// NewSQL returns an adapter over db. It checks the options but creates
// nothing; see CreateTables. The adapter does not own db.
func NewSQL(db *sql.DB, opts SQLOptions) (*SQL, error) {
	d, ok := dialects[opts.Dialect]
	if !ok {
		return nil, fmt.Errorf("localtx: SQLOptions.Dialect %v: want localtx.SQLite, localtx.PostgreSQL or localtx.MySQL", opts.Dialect)
	}
	if db == nil {
		return nil, errors.New("localtx: NewSQL of a nil *sql.DB")
	}
	if opts.MarkerTable == "" {
		opts.MarkerTable = "mq_tx_marker"
	}
	if opts.OutboxTable == "" {
		opts.OutboxTable = "mq_tx_outbox"
	}
	if opts.MaxRowBytes == 0 {
		opts.MaxRowBytes = DefaultMaxRowBytes
	}
	if opts.MaxRowBytes < 0 {
		return nil, fmt.Errorf("localtx: SQLOptions.MaxRowBytes %d", opts.MaxRowBytes)
	}
	if opts.MaxAttempts < 0 {
		return nil, fmt.Errorf("localtx: SQLOptions.MaxAttempts %d", opts.MaxAttempts)
	}
	m, err := d.quoteName(opts.MarkerTable)
	if err != nil {
		return nil, err
	}
	o, err := d.quoteName(opts.OutboxTable)
	if err != nil {
		return nil, err
	}
	if m == o {
		return nil, fmt.Errorf("localtx: marker and outbox tables are both %s", m)
	}
	blob, holds, err := d.blobType(opts.BlobType)
	if err != nil {
		return nil, err
	}
	if holds != 0 && holds < opts.MaxRowBytes {
		return nil, fmt.Errorf("localtx: a %s column of %s holds %d bytes, less than MaxRowBytes %d: use %s",
			blob, d.name, holds, opts.MaxRowBytes, d.blob)
	}
	s := &SQL{db: db, opts: opts, dialect: &d, maxRow: holds, marker: m, outbox: o}
	s.retryable = d.retryable
	if extra := opts.Retryable; extra != nil {
		s.retryable = func(err error) bool { return d.retryable(err) || extra(err) }
	}
	s.insMarker = s.q("INSERT INTO " + m + " (txid, body) VALUES (?, ?)")
	s.updMarker = s.q("UPDATE " + m + " SET body = ? WHERE txid = ?")
	s.insOutbox = s.q("INSERT INTO " + o + " (txid, seq, body) VALUES (?, ?, ?)")
	s.getRecord = s.q("SELECT k.txid, k.body, o.seq, o.body FROM " + m + " k LEFT JOIN " + o +
		" o ON o.txid = k.txid WHERE k.txid = ? ORDER BY o.seq")
	// One statement, so one snapshot: a page of markers with their outbox
	// rows, in id and write order.
	s.committed = s.q("SELECT k.txid, k.body, o.seq, o.body FROM (SELECT txid, body FROM " + m +
		" WHERE txid > ? ORDER BY txid LIMIT ?) k LEFT JOIN " + o + " o ON o.txid = k.txid ORDER BY k.txid, o.seq")
	s.createMarker = "CREATE TABLE IF NOT EXISTS " + m + " (txid " + d.key + " NOT NULL PRIMARY KEY, body " + blob + " NOT NULL)"
	s.createOutbox = "CREATE TABLE IF NOT EXISTS " + o + " (txid " + d.key + " NOT NULL, seq BIGINT NOT NULL, body " + blob + " NOT NULL, PRIMARY KEY (txid, seq))"
	return s, nil
}

// q rewrites the ? of query in the dialect's parameter style.
func (s *SQL) q(query string) string {
	if !s.dialect.dollar {
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

// in returns the list "(?, ?, ...)" of n parameters, in the dialect's
// style, for a statement with no other parameters.
func (s *SQL) in(n int) string {
	return s.q("(" + strings.Repeat("?, ", n-1) + "?)")
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
	ctx   context.Context
	tx    *sql.Tx
	store *SQL
	// markers holds the last body written under each marker key in this
	// transaction: a later Put of the key updates its row.
	markers map[string][]byte
}

var _ Tx = (*SQLTx)(nil)

// Put writes the queue's marker or outbox row inside the transaction. Other
// buckets return ErrBucket: write business rows with the *sql.Tx. A row
// larger than its column holds returns ErrRowTooLarge.
func (t *SQLTx) Put(bucket, key, value []byte) error {
	s := t.store
	if s.maxRow != 0 && int64(len(value)) > s.maxRow {
		return fmt.Errorf("%w: %d bytes, the column holds %d", ErrRowTooLarge, len(value), s.maxRow)
	}
	if value == nil {
		value = []byte{} // the columns are NOT NULL; bbolt stores nil as empty too
	}
	switch {
	case bytes.Equal(bucket, MarkerBucket):
		if len(key) > maxKeyBytes {
			return fmt.Errorf("%w: a marker key of %d bytes, the column holds %d", ErrRowTooLarge, len(key), maxKeyBytes)
		}
		if err := t.putMarker(string(key), value); err != nil {
			return fmt.Errorf("localtx: marker: %w", err)
		}
		t.wrote(bucket, key)
		return nil
	case bytes.Equal(bucket, OutboxBucket):
		txid, seq, ok := ParseOutboxKey(key)
		if !ok {
			return fmt.Errorf("%w: %q", ErrOutboxKey, key)
		}
		if len(txid) > maxKeyBytes {
			return fmt.Errorf("%w: an outbox key of %d bytes, the column holds %d", ErrRowTooLarge, len(txid), maxKeyBytes)
		}
		if _, err := t.tx.ExecContext(t.ctx, s.insOutbox, txid, int64(seq), value); err != nil {
			return fmt.Errorf("localtx: outbox: %w", err)
		}
		return nil
	}
	return fmt.Errorf("%w: %q", ErrBucket, bucket)
}

// putMarker inserts the marker row of key, or updates the one this
// transaction inserted. An update that changes nothing is not sent, as
// MySQL would count no affected row; one that affects no row is an error.
func (t *SQLTx) putMarker(key string, value []byte) error {
	s := t.store
	prev, ok := t.markers[key]
	if !ok {
		if _, err := t.tx.ExecContext(t.ctx, s.insMarker, key, value); err != nil {
			return err
		}
	} else {
		if bytes.Equal(prev, value) {
			return nil
		}
		res, err := t.tx.ExecContext(t.ctx, s.updMarker, value, key)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("update of %q affected %d rows (%v), want 1", key, n, err)
		}
	}
	if t.markers == nil {
		t.markers = map[string][]byte{}
	}
	t.markers[key] = bytes.Clone(value)
	return nil
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

// Run runs fn in a SQL transaction bound to ctx, which FromContext and
// SQL.Tx find. It commits when fn returns nil and rolls back when fn
// returns an error or panics, the panic going on after the rollback; then
// the hooks of the outcome run, before Run returns. Inside a transaction of
// this adapter, Run joins it and just calls fn.
//
// The attempt runs again, in a new transaction, after a pause with jitter
// that grows with each attempt, when fn returns an error wrapping ErrRedo
// or a retryable error of the database, and when the commit fails with a
// retryable error: the server rolled it back. SQLOptions.Retryable says
// which errors are retryable; fn may return its statements' errors as they
// are, wrapped or not. The rollback hooks of that attempt run and its
// commit hooks are dropped.
//
// A COMMIT that fails otherwise may have committed: the reply may have
// been lost with the connection. When the transaction wrote its marker,
// because the queue sent messages, Run reads the outcome back from the
// marker row as Check does, trying again with backoff while the database
// cannot answer, until ctx ends, one try at least and a minute at most.
// Committed, it runs the commit hooks and returns nil; rolled back, the
// rollback hooks and the commit's error. Otherwise, or without a marker, it
// runs the WhileUnknown hooks and returns an error wrapping
// ErrCommitUnknown and the commit's error.
//
// As with Bolt.Run, a commit hook that fails because the queue could not
// publish does not undo the commit and Run returns nil: the queue publishes
// the transaction later from the marker and outbox rows it left; see
// Bolt.Run.
//
// Run returns fn's error, or the commit's.
func (s *SQL) Run(ctx context.Context, fn func(ctx context.Context) error) error {
	if s.Tx(ctx) != nil {
		return fn(ctx)
	}
	return run(ctx, s.opts.MaxAttempts, s.retryable, s.dialect.retryable, func(a *attempt) (hostTx, error) {
		tx, err := s.db.BeginTx(ctx, s.opts.TxOptions)
		if err != nil {
			return nil, fmt.Errorf("localtx: begin: %w", err)
		}
		return &SQLTx{attempt: a, ctx: ctx, tx: tx, store: s}, nil
	}, fn)
}

// Check answers the check-back of txid; see Store. A missing marker row is
// confirmed as outcomeOf explains, so that a commit the server is still
// processing is not taken for a rollback.
func (s *SQL) Check(ctx context.Context, txid string) (State, Record, error) {
	// Running first: a transaction leaves the running set only after its
	// commit returned or, when it failed, its outcome was looked for.
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
// transaction may still be committing on the server, its COMMIT sent and
// the reply lost: an INSERT of the same key, in a transaction rolled back
// at once, waits for such a commit to end and fails if it committed. So a
// probe that succeeds means rolled back; one that fails means committed if
// the row is there now, and otherwise that the store cannot answer.
func (s *SQL) outcomeOf(ctx context.Context, txid string) (State, Record, error) {
	rec, ok, err := s.record(ctx, txid)
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
	if rec, ok, err := s.record(ctx, txid); err == nil && ok {
		return Committed, rec, nil
	}
	return Unknown, Record{}, fmt.Errorf("probe of the marker: %w", perr)
}

// probeFor bounds the wait of a probe: another transaction holding the
// marker row, a commit in flight or a transaction that hangs, makes it
// wait, and the check-back must not stall on one transaction.
const probeFor = 5 * time.Second

// probe inserts the marker row of txid in a transaction it rolls back.
func (s *SQL) probe(ctx context.Context, txid string) error {
	ctx, cancel := context.WithTimeout(ctx, probeFor)
	defer cancel()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, s.insMarker, txid, []byte{0})
	return err
}

// record reads the marker and outbox rows of txid.
func (s *SQL) record(ctx context.Context, txid string) (Record, bool, error) {
	recs, err := s.page(ctx, s.getRecord, 0, txid)
	if err != nil || len(recs) == 0 {
		return Record{}, false, err
	}
	return recs[0], true, nil
}

// maxPageBytes bounds the bytes of one page of Committed, but for its last
// record: a page of many large outboxes would otherwise be held at once.
const maxPageBytes = 16 << 20

// Committed returns the records of committed transactions not yet
// forgotten, in pages of at most max records and about maxPageBytes; see
// Store.
func (s *SQL) Committed(ctx context.Context, after string, max int) ([]Record, error) {
	if max <= 0 {
		return nil, nil
	}
	recs, err := s.page(ctx, s.committed, maxPageBytes, after, int64(max))
	if err != nil {
		return nil, fmt.Errorf("localtx: committed: %w", err)
	}
	return recs, nil
}

// page runs query, whose rows are (txid, marker, seq, outbox row) ordered by
// txid and seq, with seq and the row NULL for a transaction without outbox,
// and gathers them into records. With maxBytes, it stops before a record
// that begins past maxBytes.
func (s *SQL) page(ctx context.Context, query string, maxBytes int, args ...any) ([]Record, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Record
	size := 0
	for rows.Next() {
		var (
			id          string
			marker, row []byte
			seq         sql.NullInt64
		)
		if err := rows.Scan(&id, &marker, &seq, &row); err != nil {
			return nil, err
		}
		if len(out) == 0 || out[len(out)-1].TxID != id {
			if maxBytes > 0 && size >= maxBytes {
				break
			}
			out = append(out, Record{TxID: id, Marker: marker})
			size += len(marker)
		}
		if seq.Valid {
			r := &out[len(out)-1]
			r.Outbox = append(r.Outbox, row)
			size += len(row)
		}
	}
	return out, rows.Err()
}

// forgetChunk bounds the ids of one DELETE of Forget.
const forgetChunk = 256

// Forget deletes the markers and outbox rows of txids, in one transaction;
// see Store.
func (s *SQL) Forget(ctx context.Context, txids []string) error {
	if len(txids) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("localtx: forget: %w", err)
	}
	defer tx.Rollback()
	for ids := range slices.Chunk(txids, forgetChunk) {
		args := make([]any, len(ids))
		for i, id := range ids {
			args[i] = id
		}
		for _, table := range []string{s.outbox, s.marker} {
			if _, err := tx.ExecContext(ctx, "DELETE FROM "+table+" WHERE txid IN "+s.in(len(ids)), args...); err != nil {
				return fmt.Errorf("localtx: forget: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("localtx: forget: %w", err)
	}
	return nil
}
