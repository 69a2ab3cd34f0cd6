package localtx_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// sqliteCode is an error with a result code, as modernc.org/sqlite's.
type sqliteCode int

func (c sqliteCode) Error() string { return fmt.Sprintf("sqlite code %d", int(c)) }
func (c sqliteCode) Code() int     { return int(c) }

// MySQLError has the shape of go-sql-driver/mysql's, without being it.
type MySQLError struct {
	Number   uint16
	SQLState [5]byte
	Message  string
}

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d: %s", e.Number, e.Message) }

// TestDialect_Retryable: each dialect redoes after the errors its server
// rolls a transaction back with, found anywhere in the chain, and after
// nothing else.
func TestDialect_Retryable(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("debit: %w", err) }
	for _, c := range []struct {
		name    string
		dialect localtx.Dialect
		err     error
		want    bool
	}{
		{"PGSerialization", localtx.PostgreSQL, &pgconn.PgError{Code: "40001"}, true},
		{"PGDeadlock", localtx.PostgreSQL, wrap(&pgconn.PgError{Code: "40P01"}), true},
		{"PGJoined", localtx.PostgreSQL, errors.Join(errors.New("x"), &pgconn.PgError{Code: "40001"}), true},
		{"PGUnique", localtx.PostgreSQL, &pgconn.PgError{Code: "23505"}, false},
		{"PGOther", localtx.PostgreSQL, errors.New("40001"), false},
		{"MySQLDeadlock", localtx.MySQL, &mysql.MySQLError{Number: 1213}, true},
		{"MySQLLockWait", localtx.MySQL, wrap(&mysql.MySQLError{Number: 1205}), true},
		{"MySQLLookAlike", localtx.MySQL, wrap(&MySQLError{Number: 1213}), true},
		{"MySQLDuplicate", localtx.MySQL, &mysql.MySQLError{Number: 1062}, false},
		{"MySQLNil", localtx.MySQL, (*mysql.MySQLError)(nil), false},
		{"MySQLOther", localtx.MySQL, errors.New("Error 1213"), false},
		{"SQLiteBusy", localtx.SQLite, sqliteCode(5), true},
		{"SQLiteBusySnapshot", localtx.SQLite, wrap(sqliteCode(517)), true},
		{"SQLiteLocked", localtx.SQLite, sqliteCode(6), true},
		{"SQLiteConstraint", localtx.SQLite, sqliteCode(19), false},
		{"Nil", localtx.PostgreSQL, nil, false},
		{"PGErrorOnMySQL", localtx.MySQL, &pgconn.PgError{Code: "40001"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := localtx.Retryable(c.dialect, c.err); got != c.want {
				t.Errorf("Retryable(%v, %v) = %v, want %v", c.dialect, c.err, got, c.want)
			}
		})
	}
}

var errConflict = errors.New("conflict")

// TestSQL_RetryableStatement: a function that returns a retryable error of
// its statements is run again in a new transaction; the failed attempts'
// rollback hooks run and their commit hooks are dropped.
func TestSQL_RetryableStatement(t *testing.T) {
	h, _ := txtest.FaultySQLite(t, filepath.Join(t.TempDir(), "h.sqlite"), func(o *localtx.SQLOptions) {
		o.Retryable = func(err error) bool { return errors.Is(err, errConflict) }
	})
	var ev events
	var ids []string
	err := h.Run(context.Background(), func(ctx context.Context) error {
		tx := bind(t, ctx)
		n := len(ids)
		ids = append(ids, tx.ID())
		tx.WhileCommit(ev.hook(fmt.Sprintf("commit%d", n)))
		tx.WhileRollback(ev.hook(fmt.Sprintf("rollback%d", n)))
		if err := h.Put(ctx, fmt.Sprintf("k%d", n), "v"); err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("update: %w", errConflict)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if want := (events{"rollback0", "rollback1", "commit2"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
	if len(ids) != 3 || ids[0] == ids[1] || ids[1] == ids[2] {
		t.Errorf("attempt ids %v, want three distinct", ids)
	}
	keys, err := h.Keys()
	if err != nil || !reflect.DeepEqual(keys, []string{"k2"}) {
		t.Errorf("business rows %v (%v), want only the last attempt's", keys, err)
	}
}

// TestSQL_RetryableCommit: a COMMIT the server refuses with an error of
// the dialect's retryable classes rolled back, even without a marker to
// read back: Run runs the function again. An error only the host's own
// Retryable matches says nothing about the commit by itself: without a
// marker it is unknown, and it is not redone.
func TestSQL_RetryableCommit(t *testing.T) {
	h, f := txtest.FaultySQLite(t, filepath.Join(t.TempDir(), "h.sqlite"), func(o *localtx.SQLOptions) {
		o.Retryable = func(err error) bool { return errors.Is(err, errConflict) }
	})
	attempts := 0
	var ev events
	fn := func(ctx context.Context) error {
		tx := bind(t, ctx)
		attempts++
		tx.WhileCommit(ev.hook(fmt.Sprintf("commit%d", attempts)))
		tx.WhileRollback(ev.hook(fmt.Sprintf("rollback%d", attempts)))
		if u, ok := tx.(unknownTx); ok {
			u.WhileUnknown(ev.hook(fmt.Sprintf("unknown%d", attempts)))
		}
		// No marker: only the error tells that the commit did not happen.
		return h.Put(ctx, fmt.Sprintf("k%d", attempts), "v")
	}
	f.NextCommit(txtest.CommitFailed, fmt.Errorf("commit: %w", sqliteCode(5)), false) // SQLITE_BUSY
	err := h.Run(context.Background(), fn)
	if err != nil || attempts != 2 {
		t.Fatalf("Run = %v after %d attempts, want nil after 2", err, attempts)
	}
	if want := (events{"rollback1", "commit2"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
	if keys, err := h.Keys(); err != nil || !reflect.DeepEqual(keys, []string{"k2"}) {
		t.Errorf("business rows %v (%v), want [k2]", keys, err)
	}

	attempts, ev = 0, nil
	f.NextCommit(txtest.CommitLostReply, fmt.Errorf("commit: %w", errConflict), false)
	err = h.Run(context.Background(), fn)
	if !errors.Is(err, localtx.ErrCommitUnknown) || attempts != 1 {
		t.Errorf("Run = %v after %d attempts, want ErrCommitUnknown after 1", err, attempts)
	}
	if want := (events{"unknown1"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}

	errRefused := errors.New("refused")
	attempts = 0
	f.NextCommit(txtest.CommitFailed, errRefused, false)
	err = h.Run(context.Background(), func(ctx context.Context) error {
		attempts++
		tx := bind(t, ctx)
		return tx.Put(localtx.MarkerBucket, []byte(tx.ID()), []byte("m"))
	})
	if !errors.Is(err, errRefused) || attempts != 1 {
		t.Errorf("Run = %v after %d attempts, want the refusal after 1", err, attempts)
	}
}

// TestRun_RedoEndsWithCtx: redoing pauses, and a ctx that ends during the
// pauses ends Run with both the redo and the ctx's error, long before the
// attempts run out; no commit hook of any attempt runs.
func TestRun_RedoEndsWithCtx(t *testing.T) {
	h, _ := txtest.FaultySQLite(t, filepath.Join(t.TempDir(), "h.sqlite"), func(o *localtx.SQLOptions) {
		o.MaxAttempts = 1000
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	attempts, commits := 0, 0
	start := time.Now()
	err := h.Run(ctx, func(ctx context.Context) error {
		attempts++
		bind(t, ctx).WhileCommit(func() { commits++ })
		return localtx.ErrRedo
	})
	if !errors.Is(err, localtx.ErrRedo) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run = %v, want ErrRedo and the deadline", err)
	}
	if attempts >= 100 || commits != 0 {
		t.Errorf("%d attempts, %d commit hooks in 300ms: the redo did not pause", attempts, commits)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run returned after %v", d)
	}
}

// TestSQL_SecondMarkerKey: several marker keys in one transaction each get
// their row, and rewriting a key, with the same body or another, keeps one.
func TestSQL_SecondMarkerKey(t *testing.T) {
	for _, name := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(name, func(t *testing.T) {
			h := txtest.Open(t, name, filepath.Join(t.TempDir(), "host"))
			err := h.Run(context.Background(), func(ctx context.Context) error {
				tx := bind(t, ctx)
				for _, kv := range [][2]string{{"a", "1"}, {"b", "1"}, {"a", "2"}, {"a", "2"}, {"b", "3"}} {
					if err := tx.Put(localtx.MarkerBucket, []byte(tx.ID()+kv[0]), []byte(kv[1])); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			recs, err := h.Store.Committed(context.Background(), "", 10)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, r := range recs {
				got[r.TxID[len(r.TxID)-1:]] = string(r.Marker)
			}
			if want := map[string]string{"a": "2", "b": "3"}; !reflect.DeepEqual(got, want) {
				t.Errorf("markers %v, want %v", got, want)
			}
		})
	}
}

// TestRun_NoRedoOfUnknown: an error that says a commit may have happened
// is never redone, whatever else it wraps: a redo could commit twice.
func TestRun_NoRedoOfUnknown(t *testing.T) {
	h, _ := txtest.FaultySQLite(t, filepath.Join(t.TempDir(), "h.sqlite"), func(o *localtx.SQLOptions) {
		o.Retryable = func(err error) bool { return errors.Is(err, errConflict) }
	})
	for _, e := range []error{
		fmt.Errorf("%w: %w", localtx.ErrCommitUnknown, localtx.ErrRedo),
		fmt.Errorf("%w: %w", localtx.ErrCommitUnknown, errConflict),
	} {
		attempts := 0
		err := h.Run(context.Background(), func(ctx context.Context) error {
			attempts++
			return e
		})
		if !errors.Is(err, localtx.ErrCommitUnknown) || attempts != 1 {
			t.Errorf("Run = %v after %d attempts, want it after 1", err, attempts)
		}
	}
}
