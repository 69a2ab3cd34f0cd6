package txtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"testing"

	"modernc.org/sqlite"

	"github.com/zeze-go/mq/localtx"
)

// CommitFault is what the next COMMIT of a FaultySQLite host does.
type CommitFault int

// Commit faults.
const (
	// CommitOK commits and reports it.
	CommitOK CommitFault = iota
	// CommitLostReply commits, then returns the fault's error, as when the
	// connection breaks after the server committed but before its reply.
	CommitLostReply
	// CommitFailed rolls back, then returns the fault's error.
	CommitFailed
)

// Faults break the database of a FaultySQLite host on the test's command.
// It is safe for concurrent use.
type Faults struct {
	mu        sync.Mutex // guards the fields below
	next      CommitFault
	err       error
	downAfter bool // the store goes down after the faulty commit
	down      bool
	refused   int
}

// ErrDown is returned by every connection and statement of a host that is
// down.
var ErrDown = errors.New("txtest: host store down")

// NextCommit makes the next COMMIT do fault and return err; with down, the
// store goes down right after it (see SetDown).
func (f *Faults) NextCommit(fault CommitFault, err error, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next, f.err, f.downAfter = fault, err, down
}

// SetDown makes every new connection, transaction and statement fail with
// ErrDown until SetDown(false).
func (f *Faults) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// Refused counts the calls refused while down.
func (f *Faults) Refused() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

func (f *Faults) check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		f.refused++
		return ErrDown
	}
	return nil
}

// commit runs the COMMIT of tx as the next fault says.
func (f *Faults) commit(tx driver.Tx) error {
	f.mu.Lock()
	fault, err, down := f.next, f.err, f.downAfter
	f.next, f.err, f.downAfter = CommitOK, nil, false
	f.mu.Unlock()
	switch fault {
	case CommitLostReply:
		if cerr := tx.Commit(); cerr != nil {
			return cerr
		}
	case CommitFailed:
		if rerr := tx.Rollback(); rerr != nil {
			return rerr
		}
	default:
		return tx.Commit()
	}
	if down {
		f.SetDown(true)
	}
	return err
}

// FaultySQLite is SQLite over a database/sql driver whose faults the test
// sets with the returned Faults. opts, if any, edit the adapter's options.
func FaultySQLite(t testing.TB, path string, opts ...func(*localtx.SQLOptions)) (*Host, *Faults) {
	t.Helper()
	f := &Faults{}
	db := sql.OpenDB(&faultConnector{dsn: sqliteDSN(path), f: f})
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return sqlHost(t, "sqlite", db, localtx.SQLite, "app_mq", func(o *localtx.SQLOptions) {
		for _, edit := range opts {
			edit(o)
		}
	}), f
}

type faultConnector struct {
	dsn string
	f   *Faults
}

func (c *faultConnector) Connect(context.Context) (driver.Conn, error) {
	if err := c.f.check(); err != nil {
		return nil, err
	}
	conn, err := (&sqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &faultConn{conn: conn, f: c.f}, nil
}

func (c *faultConnector) Driver() driver.Driver { return &sqlite.Driver{} }

// faultConn passes statements through Prepare, so that every one can be
// refused while the store is down.
type faultConn struct {
	conn driver.Conn
	f    *Faults
}

func (c *faultConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *faultConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.f.check(); err != nil {
		return nil, err
	}
	return c.conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *faultConn) Close() error { return c.conn.Close() }

func (c *faultConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *faultConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := c.f.check(); err != nil {
		return nil, err
	}
	tx, err := c.conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &faultTx{tx: tx, f: c.f}, nil
}

type faultTx struct {
	tx driver.Tx
	f  *Faults
}

func (t *faultTx) Commit() error   { return t.f.commit(t.tx) }
func (t *faultTx) Rollback() error { return t.tx.Rollback() }
