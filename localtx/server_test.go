package localtx_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// The tests in this file need the database servers (see txtest.ServerDB);
// without them they skip, saying so.

var serverNames = []string{"postgres", "mysql"}

// uniqueTable returns a table name no other test uses, dropped at cleanup.
func uniqueTable(t *testing.T, db *sql.DB, base string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d_%d", base, time.Now().UnixNano()%1e9, tableSeq.Add(1))
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + name) })
	return name
}

var tableSeq atomic.Int64

// serverAdapter opens a SQL adapter on db over new tables, dropped at
// cleanup, and creates them; edit, if not nil, edits the options first.
func serverAdapter(t *testing.T, db *sql.DB, dialect localtx.Dialect, edit func(*localtx.SQLOptions)) *localtx.SQL {
	t.Helper()
	o := localtx.SQLOptions{Dialect: dialect, MarkerTable: uniqueTable(t, db, "rv_marker"), OutboxTable: uniqueTable(t, db, "rv_outbox")}
	if edit != nil {
		edit(&o)
	}
	a, err := localtx.NewSQL(db, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CreateTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a
}

// commitRecord runs a transaction on a that writes its marker and one
// outbox row, and returns its id.
func commitRecord(ctx context.Context, a *localtx.SQL, row []byte) (string, error) {
	var id string
	err := a.Run(ctx, func(ctx context.Context) error {
		tx, _ := localtx.FromContext(ctx)
		id = tx.ID()
		if err := tx.Put(localtx.MarkerBucket, []byte(id), []byte("m")); err != nil {
			return err
		}
		return tx.Put(localtx.OutboxBucket, localtx.OutboxKey(id, 0), row)
	})
	return id, err
}

// ph is the n-th parameter in dialect d.
func ph(d localtx.Dialect, n int) string {
	if d == localtx.PostgreSQL {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// TestServer_ReservedTableNames: tables named by reserved words work,
// because the adapter quotes them.
func TestServer_ReservedTableNames(t *testing.T) {
	for _, server := range serverNames {
		t.Run(server, func(t *testing.T) {
			db, dialect := txtest.ServerDB(t, server)
			q := "`"
			if dialect == localtx.PostgreSQL {
				q = `"`
			}
			for _, n := range []string{"order", "select"} {
				db.Exec("DROP TABLE IF EXISTS " + q + n + q)
				t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + q + n + q) })
			}
			a := serverAdapter(t, db, dialect, func(o *localtx.SQLOptions) { o.MarkerTable, o.OutboxTable = "order", "select" })
			ctx := context.Background()
			id, err := commitRecord(ctx, a, []byte("row"))
			if err != nil {
				t.Fatal(err)
			}
			recs, err := a.Committed(ctx, "", 10)
			if err != nil || len(recs) != 1 || recs[0].TxID != id || len(recs[0].Outbox) != 1 {
				t.Fatalf("Committed = %+v, %v", recs, err)
			}
			if err := a.Forget(ctx, []string{id}); err != nil {
				t.Fatal(err)
			}
			if recs, err := a.Committed(ctx, "", 10); err != nil || len(recs) != 0 {
				t.Fatalf("after Forget: %+v, %v", recs, err)
			}
		})
	}
}

// TestServer_RowTooLarge: on MySQL, a row larger than its column is
// refused by Put before it is sent, also when the server is not in strict
// mode and would truncate it; LONGBLOB, the preset's, takes it.
func TestServer_RowTooLarge(t *testing.T) {
	db, dialect := txtest.ServerDB(t, "mysql")
	db.SetMaxOpenConns(1) // the session's sql_mode holds for every statement
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "SET SESSION sql_mode = ''"); err != nil {
		t.Fatal(err)
	}
	row := bytes.Repeat([]byte{7}, 100_000)
	for _, c := range []struct {
		blob    string
		maxRow  int64
		tooLong bool
	}{{"BLOB", 60_000, true}, {"", 0, false}} {
		a := serverAdapter(t, db, dialect, func(o *localtx.SQLOptions) { o.BlobType, o.MaxRowBytes = c.blob, c.maxRow })
		_, err := commitRecord(ctx, a, row)
		if c.tooLong {
			if !errors.Is(err, localtx.ErrRowTooLarge) {
				t.Errorf("%s: Run = %v, want ErrRowTooLarge", c.blob, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		recs, err := a.Committed(ctx, "", 1)
		if err != nil || len(recs) != 1 || !bytes.Equal(recs[0].Outbox[0], row) {
			t.Fatalf("LONGBLOB: the row did not come back whole (%v)", err)
		}
	}
}

// TestServer_CommitTimeConflict: PostgreSQL refuses at COMMIT a
// serializable transaction that another one overtook (SQLSTATE 40001); Run
// runs it again, rolling back the first attempt's hooks.
func TestServer_CommitTimeConflict(t *testing.T) {
	db, dialect := txtest.ServerDB(t, "postgres")
	ctx := context.Background()
	table := uniqueTable(t, db, "skew")
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (id INT PRIMARY KEY, n INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	a := serverAdapter(t, db, dialect, func(o *localtx.SQLOptions) { o.TxOptions = &sql.TxOptions{Isolation: sql.LevelSerializable} })
	var ev events
	attempts := 0
	err := a.Run(ctx, func(ctx context.Context) error {
		attempts++
		tx := a.Tx(ctx)
		lt, _ := localtx.FromContext(ctx)
		lt.WhileCommit(ev.hook(fmt.Sprintf("commit%d", attempts)))
		lt.WhileRollback(ev.hook(fmt.Sprintf("rollback%d", attempts)))
		var sum int
		if err := tx.QueryRowContext(ctx, "SELECT SUM(n) FROM "+table).Scan(&sum); err != nil {
			return err
		}
		if attempts == 1 { // another transaction reads both rows and writes row 1
			other, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
			if err != nil {
				return err
			}
			var s int
			if err := other.QueryRowContext(ctx, "SELECT SUM(n) FROM "+table).Scan(&s); err != nil {
				return err
			}
			if _, err := other.ExecContext(ctx, "UPDATE "+table+" SET n = n + 1 WHERE id = 1"); err != nil {
				return err
			}
			defer func() {
				if err := other.Commit(); err != nil {
					t.Errorf("the other transaction: %v", err)
				}
			}()
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+table+" SET n = n + 1 WHERE id = 2"); err != nil {
			return err
		}
		return lt.Put(localtx.MarkerBucket, []byte(lt.ID()), []byte("m"))
	})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if attempts != 2 {
		t.Errorf("%d attempts, want 2 (the first refused at commit)", attempts)
	}
	if want := (events{"rollback1", "commit2"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
}

// TestServer_Contention: many transactions on one hot row, at
// SERIALIZABLE on PostgreSQL and REPEATABLE READ (with shared locks that
// deadlock) on MySQL: every Run commits or returns an error that is not
// retryable, the row counts exactly the commits, and the servers did
// refuse attempts (so the redo was exercised).
func TestServer_Contention(t *testing.T) {
	const workers, each = 16, 25
	for _, server := range serverNames {
		t.Run(server, func(t *testing.T) {
			db, dialect := txtest.ServerDB(t, server)
			db.SetMaxOpenConns(workers + 4)
			ctx := context.Background()
			table := uniqueTable(t, db, "hot")
			if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (id INT PRIMARY KEY, n INT NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1, 0)"); err != nil {
				t.Fatal(err)
			}
			iso, read := sql.LevelSerializable, "SELECT n FROM "+table+" WHERE id = 1"
			if dialect == localtx.MySQL {
				iso, read = sql.LevelRepeatableRead, read+" LOCK IN SHARE MODE"
			}
			a := serverAdapter(t, db, dialect, func(o *localtx.SQLOptions) { o.TxOptions = &sql.TxOptions{Isolation: iso} }) // the default attempts
			var attempts, commits atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers*each)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						err := a.Run(ctx, func(ctx context.Context) error {
							attempts.Add(1)
							tx := a.Tx(ctx)
							lt, _ := localtx.FromContext(ctx)
							if err := lt.Put(localtx.MarkerBucket, []byte(lt.ID()), []byte("m")); err != nil {
								return err
							}
							var n int
							if err := tx.QueryRowContext(ctx, read).Scan(&n); err != nil {
								return err
							}
							_, err := tx.ExecContext(ctx, "UPDATE "+table+" SET n = "+ph(dialect, 1)+" WHERE id = 1", n+1)
							return err
						})
						if err == nil {
							commits.Add(1)
						} else {
							errs <- err
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if localtx.Retryable(dialect, err) {
					t.Errorf("Run returned a retryable error: %v", err)
				} else {
					t.Logf("Run: %v", err)
				}
			}
			var n int64
			if err := db.QueryRowContext(ctx, "SELECT n FROM "+table+" WHERE id = 1").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != commits.Load() {
				t.Errorf("the row counts %d, %d Runs committed", n, commits.Load())
			}
			t.Logf("%s: %d Runs, %d committed, %d attempts", server, workers*each, commits.Load(), attempts.Load())
			if attempts.Load() == int64(workers*each) {
				t.Error("no attempt was refused: the test did not contend")
			}
		})
	}
}

// TestServer_CheckBoundedOnLockedMarker: a connection left over from an
// earlier run of the process (its client died with the transaction open,
// the server has not noticed yet) holds the uncommitted marker row of a
// transaction, and the node's check-back asks Check about it with the
// node's context, which has no deadline. Check answers unknown with an
// error within its own bound. This broke when Check's probe INSERT waited
// for that lock with no bound of its own (on PostgreSQL forever, no
// lock_timeout; on MariaDB innodb_lock_wait_timeout, 50 s), so one such
// transaction stalled the node's single check-back/sweep loop.
func TestServer_CheckBoundedOnLockedMarker(t *testing.T) {
	for _, server := range serverNames {
		t.Run(server, func(t *testing.T) {
			db, dialect := txtest.ServerDB(t, server)
			marker := uniqueTable(t, db, "rv_lock_marker")
			a := serverAdapter(t, db, dialect, func(o *localtx.SQLOptions) { o.MarkerTable = marker })
			ctx := context.Background()
			const txid = "00000000deadbeef-1" // an earlier run's id: not running here
			orphan, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer orphan.Rollback()
			if _, err := orphan.ExecContext(ctx, "INSERT INTO "+marker+" (txid, body) VALUES ("+ph(dialect, 1)+", "+ph(dialect, 2)+")", txid, []byte("m")); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				st  localtx.State
				err error
			}
			done := make(chan answer, 1)
			start := time.Now()
			go func() {
				st, _, err := a.Check(ctx, txid) // the node's ctx: no deadline
				done <- answer{st, err}
			}()
			select {
			case a := <-done:
				t.Logf("Check answered %v, %v after %v", a.st, a.err, time.Since(start))
				if a.st != localtx.Unknown || a.err == nil {
					t.Errorf("Check = %v, %v while another session holds the marker row; want unknown with an error", a.st, a.err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Check(%s) has not answered after 10s: it waits on another session's row lock with no bound", txid)
				orphan.Rollback()
				a := <-done
				t.Logf("after the orphan rolled back: %v, %v (%v)", a.st, a.err, time.Since(start))
			}
		})
	}
}

// TestServer_NonStrictTruncationRefused: MariaDB outside strict mode cuts
// a value too long for its column, so the adapter refuses such rows
// itself. With BlobType "BLOB(100)" (MySQL makes it a TINYBLOB, 255 bytes)
// NewSQL refuses the default MaxRowBytes; allowed 255 bytes, Put refuses a
// 1000-byte row before sending it. A marker key longer than the id column
// is refused too.
func TestServer_NonStrictTruncationRefused(t *testing.T) {
	db, dialect := txtest.ServerDB(t, "mysql")
	db.SetMaxOpenConns(1) // the session's sql_mode holds for every statement
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "SET SESSION sql_mode = ''"); err != nil {
		t.Fatal(err)
	}
	if _, err := localtx.NewSQL(db, localtx.SQLOptions{Dialect: dialect, BlobType: "BLOB(100)"}); err == nil {
		t.Error("NewSQL took BLOB(100) for 4 MiB rows")
	}
	a := serverAdapter(t, db, dialect, func(o *localtx.SQLOptions) { o.BlobType, o.MaxRowBytes = "BLOB(100)", 255 })
	row := bytes.Repeat([]byte{7}, 1000)
	err := a.Run(ctx, func(ctx context.Context) error {
		tx, _ := localtx.FromContext(ctx)
		if err := tx.Put(localtx.MarkerBucket, []byte(tx.ID()), []byte("m")); err != nil {
			return err
		}
		return tx.Put(localtx.OutboxBucket, localtx.OutboxKey(tx.ID(), 0), row)
	})
	if !errors.Is(err, localtx.ErrRowTooLarge) {
		t.Errorf("BLOB(100): Run = %v, want ErrRowTooLarge", err)
	}
	if recs, err := a.Committed(ctx, "", 10); err != nil || len(recs) != 0 {
		t.Errorf("Committed = %v, %v; want nothing", recs, err)
	}

	b := serverAdapter(t, db, dialect, nil)
	long := string(bytes.Repeat([]byte{'k'}, 200))
	err = b.Run(ctx, func(ctx context.Context) error {
		tx, _ := localtx.FromContext(ctx)
		return tx.Put(localtx.MarkerBucket, []byte(long), []byte("m"))
	})
	if !errors.Is(err, localtx.ErrRowTooLarge) {
		t.Errorf("a %d-byte marker key: Run = %v, want ErrRowTooLarge", len(long), err)
	}
}
