package localtx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// database/sql keeps one opener goroutine per *sql.DB until Close;
		// the hosts are closed by t.Cleanup, after which it ends.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

var errBoom = errors.New("boom")

// TestAdapter is the conformance suite of the localtx adapters: every case
// runs against each of them.
func TestAdapter(t *testing.T) {
	cases := []struct {
		name string
		fn   func(t *testing.T, h *txtest.Host)
	}{
		{"Commit", testCommit},
		{"Error", testError},
		{"Panic", testPanic},
		{"Redo", testRedo},
		{"RedoLimit", testRedoLimit},
		{"Nested", testNested},
		{"Check", testCheck},
		{"CommittedAndForget", testCommittedAndForget},
		{"BadOutboxKey", testBadOutboxKey},
		{"HookPanics", testHookPanics},
	}
	for _, name := range txtest.Names {
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					h := txtest.Open(t, name, filepath.Join(t.TempDir(), "host"))
					c.fn(t, h)
				})
			}
		})
	}
}

// events records hook calls in order.
type events []string

func (e *events) hook(s string) func() { return func() { *e = append(*e, s) } }

func bind(t *testing.T, ctx context.Context) localtx.Tx {
	t.Helper()
	tx, ok := localtx.FromContext(ctx)
	if !ok {
		t.Fatal("no transaction in ctx")
	}
	return tx
}

func mustGet(t *testing.T, h *txtest.Host, key string) (string, bool) {
	t.Helper()
	v, ok, err := h.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	return v, ok
}

func testCommit(t *testing.T, h *txtest.Host) {
	var ev events
	var id string
	err := h.Run(context.Background(), func(ctx context.Context) error {
		tx := bind(t, ctx)
		id = tx.ID()
		tx.WhileCommit(ev.hook("commit1"))
		tx.WhileRollback(ev.hook("rollback"))
		tx.WhileCommit(ev.hook("commit2"))
		if err := tx.Put(localtx.MarkerBucket, []byte(id), []byte("m")); err != nil {
			return err
		}
		if err := tx.Put(localtx.MarkerBucket, []byte(id), []byte("m2")); err != nil { // overwrite
			return err
		}
		for i := range 3 {
			if err := tx.Put(localtx.OutboxBucket, localtx.OutboxKey(id, uint64(i)), []byte(fmt.Sprint("row", i))); err != nil {
				return err
			}
		}
		if len(ev) != 0 {
			t.Errorf("hooks ran before the outcome: %v", ev)
		}
		return h.Put(ctx, "k", "v")
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if want := (events{"commit1", "commit2"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
	if v, ok := mustGet(t, h, "k"); !ok || v != "v" {
		t.Errorf("business row: %q %v", v, ok)
	}
	st, rec, err := h.Store.Check(context.Background(), id)
	if err != nil || st != localtx.Committed {
		t.Fatalf("Check = %v, %v; want committed", st, err)
	}
	want := localtx.Record{TxID: id, Marker: []byte("m2"), Outbox: [][]byte{[]byte("row0"), []byte("row1"), []byte("row2")}}
	if !reflect.DeepEqual(rec, want) {
		t.Errorf("record %+v, want %+v", rec, want)
	}
	// A hook registered after the outcome never runs.
	var late localtx.Tx
	h.Run(context.Background(), func(ctx context.Context) error { late = bind(t, ctx); return nil })
	late.WhileCommit(ev.hook("late"))
	if len(ev) != 2 {
		t.Errorf("late hook ran: %v", ev)
	}
}

func testError(t *testing.T, h *txtest.Host) {
	var ev events
	var id string
	err := h.Run(context.Background(), func(ctx context.Context) error {
		tx := bind(t, ctx)
		id = tx.ID()
		tx.WhileCommit(ev.hook("commit"))
		tx.WhileRollback(ev.hook("rollback"))
		if err := tx.Put(localtx.MarkerBucket, []byte(id), []byte("m")); err != nil {
			return err
		}
		if err := h.Put(ctx, "k", "v"); err != nil {
			return err
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Run = %v, want %v", err, errBoom)
	}
	if want := (events{"rollback"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
	if _, ok := mustGet(t, h, "k"); ok {
		t.Error("business row of a rolled back transaction is there")
	}
	if st, _, err := h.Store.Check(context.Background(), id); err != nil || st != localtx.RolledBack {
		t.Errorf("Check = %v, %v; want rolled back", st, err)
	}
}

func testPanic(t *testing.T, h *txtest.Host) {
	var ev events
	var id string
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the panic to go on", r)
			}
		}()
		h.Run(context.Background(), func(ctx context.Context) error {
			tx := bind(t, ctx)
			id = tx.ID()
			tx.WhileCommit(ev.hook("commit"))
			tx.WhileRollback(ev.hook("rollback"))
			tx.Put(localtx.MarkerBucket, []byte(id), []byte("m"))
			h.Put(ctx, "k", "v")
			panic("boom")
		})
	}()
	if want := (events{"rollback"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
	if _, ok := mustGet(t, h, "k"); ok {
		t.Error("business row of a panicked transaction is there")
	}
	if st, _, err := h.Store.Check(context.Background(), id); err != nil || st != localtx.RolledBack {
		t.Errorf("Check = %v, %v; want rolled back", st, err)
	}
	// The adapter still works (the write lock was released).
	if err := h.Run(context.Background(), func(ctx context.Context) error { return h.Put(ctx, "k2", "v") }); err != nil {
		t.Fatalf("Run after a panic: %v", err)
	}
}

func testRedo(t *testing.T, h *txtest.Host) {
	var ev events
	var ids []string
	err := h.Run(context.Background(), func(ctx context.Context) error {
		tx := bind(t, ctx)
		n := len(ids)
		ids = append(ids, tx.ID())
		tx.WhileCommit(ev.hook(fmt.Sprint("commit", n)))
		tx.WhileRollback(ev.hook(fmt.Sprint("rollback", n)))
		if err := h.Put(ctx, fmt.Sprint("k", n), "v"); err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("conflict: %w", localtx.ErrRedo)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if want := (events{"rollback0", "rollback1", "commit2"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
	if len(ids) != 3 || ids[0] == ids[1] || ids[1] == ids[2] {
		t.Errorf("attempt ids %v: want 3 distinct", ids)
	}
	for i, want := range []bool{false, false, true} {
		if _, ok := mustGet(t, h, fmt.Sprint("k", i)); ok != want {
			t.Errorf("row of attempt %d present %v, want %v", i, ok, want)
		}
	}
}

func testRedoLimit(t *testing.T, h *txtest.Host) {
	n := 0
	err := h.Run(context.Background(), func(ctx context.Context) error {
		n++
		return localtx.ErrRedo
	})
	if !errors.Is(err, localtx.ErrRedo) || n != localtx.DefaultMaxAttempts {
		t.Errorf("Run = %v after %d attempts; want ErrRedo after %d", err, n, localtx.DefaultMaxAttempts)
	}
}

func testNested(t *testing.T, h *txtest.Host) {
	err := h.Run(context.Background(), func(ctx context.Context) error {
		outer := bind(t, ctx).ID()
		return h.Run(ctx, func(ctx context.Context) error {
			if inner := bind(t, ctx).ID(); inner != outer {
				t.Errorf("nested Run began %s inside %s; want it joined", inner, outer)
			}
			return h.Put(ctx, "k", "v")
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := mustGet(t, h, "k"); !ok {
		t.Error("row of the nested Run is missing")
	}
}

func testCheck(t *testing.T, h *txtest.Host) {
	ctx := context.Background()
	err := h.Run(ctx, func(ctx context.Context) error {
		id := bind(t, ctx).ID()
		if st, _, err := h.Store.Check(ctx, id); err != nil || st != localtx.Unknown {
			t.Errorf("Check of a running transaction = %v, %v; want unknown", st, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// An id of an earlier run of the process is not running.
	if st, _, err := h.Store.Check(ctx, "0123456789abcdef-1"); err != nil || st != localtx.RolledBack {
		t.Errorf("Check of an old transaction = %v, %v; want rolled back", st, err)
	}
}

func testCommittedAndForget(t *testing.T, h *txtest.Host) {
	ctx := context.Background()
	var ids []string
	for i := range 5 {
		err := h.Run(ctx, func(ctx context.Context) error {
			tx := bind(t, ctx)
			ids = append(ids, tx.ID())
			if err := tx.Put(localtx.MarkerBucket, []byte(tx.ID()), []byte{byte(i)}); err != nil {
				return err
			}
			return tx.Put(localtx.OutboxBucket, localtx.OutboxKey(tx.ID(), 0), []byte{byte(i)})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Pages of two, in id order.
	var got []string
	after := ""
	for {
		recs, err := h.Store.Committed(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			got = append(got, r.TxID)
			if len(r.Outbox) != 1 || len(r.Marker) != 1 || r.Outbox[0][0] != r.Marker[0] {
				t.Errorf("record %+v", r)
			}
			after = r.TxID
		}
		if len(recs) < 2 {
			break
		}
	}
	if len(got) != 5 {
		t.Fatalf("Committed listed %v, want the 5 of %v", got, ids)
	}
	if err := h.Store.Forget(ctx, ids[:3]); err != nil {
		t.Fatal(err)
	}
	recs, err := h.Store.Committed(ctx, "", 10)
	if err != nil || len(recs) != 2 {
		t.Fatalf("after Forget: %d records, %v; want 2", len(recs), err)
	}
	if st, _, _ := h.Store.Check(ctx, ids[0]); st != localtx.RolledBack {
		t.Errorf("forgotten transaction checks %v", st)
	}
	if n, err := h.Markers(); err != nil || n != 2 {
		t.Errorf("markers %d, %v; want 2", n, err)
	}
}

func testBadOutboxKey(t *testing.T, h *txtest.Host) {
	err := h.Run(context.Background(), func(ctx context.Context) error {
		return bind(t, ctx).Put(localtx.OutboxBucket, []byte("nope"), []byte("x"))
	})
	if !errors.Is(err, localtx.ErrOutboxKey) {
		t.Errorf("Put(bad outbox key) = %v, want ErrOutboxKey", err)
	}
}

// testHookPanics: a commit hook that fails does not undo the commit. One
// that panics makes Run panic, after the other hooks ran.
func testHookPanics(t *testing.T, h *txtest.Host) {
	var ev events
	var id string
	func() {
		defer func() {
			if r := recover(); r != "hook" {
				t.Errorf("recovered %v, want the hook's panic", r)
			}
		}()
		h.Run(context.Background(), func(ctx context.Context) error {
			tx := bind(t, ctx)
			id = tx.ID()
			tx.WhileCommit(func() { panic("hook") })
			tx.WhileCommit(ev.hook("commit2"))
			if err := tx.Put(localtx.MarkerBucket, []byte(id), []byte("m")); err != nil {
				return err
			}
			return h.Put(ctx, "k", "v")
		})
	}()
	if want := (events{"commit2"}); !reflect.DeepEqual(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
	if _, ok := mustGet(t, h, "k"); !ok {
		t.Error("business row missing: the hook undid the commit")
	}
	if st, _, err := h.Store.Check(context.Background(), id); err != nil || st != localtx.Committed {
		t.Errorf("Check = %v, %v; want committed", st, err)
	}
}

func TestSQL_Put(t *testing.T) {
	h := txtest.SQLite(t, filepath.Join(t.TempDir(), "h.sqlite"))
	err := h.Run(context.Background(), func(ctx context.Context) error {
		return bind(t, ctx).Put([]byte("accounts"), []byte("k"), []byte("v"))
	})
	if !errors.Is(err, localtx.ErrBucket) {
		t.Errorf("Put(other bucket) = %v, want ErrBucket", err)
	}
}

func TestNewSQL(t *testing.T) {
	for _, c := range []struct {
		name string
		opts localtx.SQLOptions
		ok   bool
	}{
		{"SQLite", localtx.SQLOptions{Dialect: localtx.SQLite}, true},
		{"PostgreSQL", localtx.SQLOptions{Dialect: localtx.PostgreSQL}, true},
		{"MySQL", localtx.SQLOptions{Dialect: localtx.MySQL}, true},
		{"NoDialect", localtx.SQLOptions{}, false},
		{"BadDialect", localtx.SQLOptions{Dialect: 9}, false},
		{"ReservedWords", localtx.SQLOptions{Dialect: localtx.PostgreSQL, MarkerTable: "order", OutboxTable: "select"}, true},
		{"Schema", localtx.SQLOptions{Dialect: localtx.PostgreSQL, MarkerTable: "app.order"}, true},
		{"ThreeParts", localtx.SQLOptions{Dialect: localtx.PostgreSQL, MarkerTable: "a.b.c"}, false},
		{"EmptyPart", localtx.SQLOptions{Dialect: localtx.PostgreSQL, MarkerTable: "app."}, false},
		{"BadTable", localtx.SQLOptions{Dialect: localtx.SQLite, MarkerTable: "x; DROP TABLE y"}, false},
		{"QuoteInName", localtx.SQLOptions{Dialect: localtx.MySQL, MarkerTable: "a`b"}, false},
		{"DigitFirst", localtx.SQLOptions{Dialect: localtx.SQLite, MarkerTable: "1x"}, false},
		{"LongName", localtx.SQLOptions{Dialect: localtx.SQLite, MarkerTable: strings.Repeat("x", 64)}, false},
		{"SameTables", localtx.SQLOptions{Dialect: localtx.SQLite, MarkerTable: "t", OutboxTable: "t"}, false},
		{"MySQLBlobTooSmall", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "BLOB"}, false},
		{"MySQLMediumBlobTooSmall", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "mediumblob", MaxRowBytes: 32 << 20}, false},
		{"MySQLBlobSmallRows", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "BLOB", MaxRowBytes: 60000}, true},
		{"MySQLVarbinarySmall", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "VARBINARY(100)"}, false},
		{"MySQLVarbinaryFits", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "varbinary(100)", MaxRowBytes: 100}, true},
		{"MySQLSizedBlob", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "blob(20000000)"}, true},
		{"MySQLSizedBlobSmall", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "BLOB(100)"}, false},
		{"MySQLUnknownType", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "GEOMETRY"}, false},
		{"PostgresUnknownType", localtx.SQLOptions{Dialect: localtx.PostgreSQL, BlobType: "app_bytes"}, true},
		{"BadType", localtx.SQLOptions{Dialect: localtx.MySQL, BlobType: "BLOB; DROP TABLE y"}, false},
		{"NegativeRowBytes", localtx.SQLOptions{Dialect: localtx.SQLite, MaxRowBytes: -1}, false},
		{"NegativeAttempts", localtx.SQLOptions{Dialect: localtx.SQLite, MaxAttempts: -1}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := localtx.NewSQL(&sql.DB{}, c.opts)
			if (err == nil) != c.ok {
				t.Errorf("NewSQL = %v, want ok %v", err, c.ok)
			}
		})
	}
	if _, err := localtx.NewSQL(nil, localtx.SQLOptions{Dialect: localtx.SQLite}); err == nil {
		t.Error("NewSQL of a nil DB succeeded")
	}
}

func TestOutboxKey(t *testing.T) {
	k := localtx.OutboxKey("tx-1", 258)
	id, seq, ok := localtx.ParseOutboxKey(k)
	if !ok || id != "tx-1" || seq != 258 {
		t.Errorf("ParseOutboxKey = %q %d %v", id, seq, ok)
	}
	if _, _, ok := localtx.ParseOutboxKey([]byte("short")); ok {
		t.Error("parsed a short key")
	}
}

func TestFromContext(t *testing.T) {
	if _, ok := localtx.FromContext(context.Background()); ok {
		t.Error("a transaction in the background context")
	}
}

// TestAdapter_EmptyAndNilValues: Put of an empty and of a nil value, on
// every adapter: they behave alike (Bolt stores both).
func TestAdapter_EmptyAndNilValues(t *testing.T) {
	for _, name := range txtest.Names {
		t.Run(name, func(t *testing.T) {
			h := txtest.Open(t, name, filepath.Join(t.TempDir(), "host"))
			ctx := context.Background()
			for _, v := range []struct {
				what  string
				value []byte
			}{{"empty", []byte{}}, {"nil", nil}} {
				var id string
				err := h.Run(ctx, func(ctx context.Context) error {
					tx, _ := localtx.FromContext(ctx)
					id = tx.ID()
					if err := tx.Put(localtx.MarkerBucket, []byte(id), v.value); err != nil {
						return err
					}
					return tx.Put(localtx.OutboxBucket, localtx.OutboxKey(id, 0), v.value)
				})
				if err != nil {
					t.Errorf("%s value: Run = %v", v.what, err)
					continue
				}
				st, rec, err := h.Store.Check(ctx, id)
				if err != nil || st != localtx.Committed || len(rec.Outbox) != 1 {
					t.Errorf("%s value: Check = %v %+v %v", v.what, st, rec, err)
				}
				h.Store.Forget(ctx, []string{id})
			}
		})
	}
}

// TestAdapter_CommittedConsistent: Committed, paging while transactions of
// 5 outbox rows commit and others are forgotten, never returns a record
// with a partial outbox, nor one twice in a pass, and always pages in
// increasing id order.
func TestAdapter_CommittedConsistent(t *testing.T) {
	for _, name := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(name, func(t *testing.T) {
			h := txtest.Open(t, name, filepath.Join(t.TempDir(), "host"))
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var committed atomic.Int64
			ids := make(chan string, 10000)
			for w := 0; w < 4; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						err := h.Run(ctx, func(ctx context.Context) error {
							tx, _ := localtx.FromContext(ctx)
							if err := tx.Put(localtx.MarkerBucket, []byte(tx.ID()), []byte("m")); err != nil {
								return err
							}
							for i := range 5 {
								if err := tx.Put(localtx.OutboxBucket, localtx.OutboxKey(tx.ID(), uint64(i)), []byte(fmt.Sprint(i))); err != nil {
									return err
								}
							}
							ids <- tx.ID()
							return nil
						})
						if err == nil {
							committed.Add(1)
						}
					}
				}()
			}
			wg.Add(1)
			go func() { // forgets what committed, in batches
				defer wg.Done()
				var batch []string
				for ctx.Err() == nil {
					select {
					case id := <-ids:
						batch = append(batch, id)
						if len(batch) >= 7 {
							h.Store.Forget(ctx, batch)
							batch = nil
						}
					case <-ctx.Done():
					}
				}
			}()
			passes := 0
			for ctx.Err() == nil {
				after, seen := "", map[string]bool{}
				for {
					recs, err := h.Store.Committed(ctx, after, 3)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("Committed: %v", err)
						}
						break
					}
					if len(recs) == 0 {
						break
					}
					for _, r := range recs {
						if r.TxID <= after && name != "mysql" {
							t.Errorf("Committed(%q) returned %q, not after it", after, r.TxID)
						}
						if seen[r.TxID] {
							t.Errorf("%s listed twice in one pass", r.TxID)
						}
						seen[r.TxID] = true
						if len(r.Outbox) != 5 {
							t.Errorf("%s listed with %d outbox rows, want 5", r.TxID, len(r.Outbox))
						}
						after = r.TxID
					}
				}
				passes++
			}
			cancel()
			wg.Wait()
			t.Logf("%d passes, %d transactions", passes, committed.Load())
		})
	}
}

// TestAdapter_EdgeCases: Forget of many ids with duplicates, empty and
// unknown ones; Committed with a huge max; a panic in the attempt after a
// redo.
func TestAdapter_EdgeCases(t *testing.T) {
	for _, name := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(name, func(t *testing.T) {
			h := txtest.Open(t, name, filepath.Join(t.TempDir(), "host"))
			ctx := context.Background()
			var real []string
			for range 3 {
				if err := h.Run(ctx, func(ctx context.Context) error {
					tx, _ := localtx.FromContext(ctx)
					real = append(real, tx.ID())
					return tx.Put(localtx.MarkerBucket, []byte(tx.ID()), []byte("m"))
				}); err != nil {
					t.Fatal(err)
				}
			}
			recs, err := h.Store.Committed(ctx, "", int(^uint(0)>>1))
			if err != nil || len(recs) != 3 {
				t.Errorf("Committed(max int) = %d records, %v", len(recs), err)
			}
			ids := []string{"", "", "nope"}
			for i := range 1000 {
				ids = append(ids, fmt.Sprintf("x-%d", i), real[i%2])
			}
			if err := h.Store.Forget(ctx, ids); err != nil {
				t.Fatalf("Forget: %v", err)
			}
			if n, err := h.Markers(); err != nil || n != 1 {
				t.Errorf("after Forget: %d markers (%v), want 1", n, err)
			}

			var ev []string
			attempts := 0
			func() {
				defer func() {
					if r := recover(); r != "boom" {
						t.Errorf("recovered %v, want boom", r)
					}
				}()
				h.Run(ctx, func(ctx context.Context) error {
					attempts++
					tx, _ := localtx.FromContext(ctx)
					n := attempts
					tx.WhileCommit(func() { ev = append(ev, fmt.Sprint("commit", n)) })
					tx.WhileRollback(func() { ev = append(ev, fmt.Sprint("rollback", n)) })
					if err := tx.Put(localtx.MarkerBucket, []byte(tx.ID()), []byte("m")); err != nil {
						return err
					}
					if attempts == 1 {
						return localtx.ErrRedo
					}
					panic("boom")
				})
			}()
			if fmt.Sprint(ev) != "[rollback1 rollback2]" || attempts != 2 {
				t.Errorf("hooks %v after %d attempts", ev, attempts)
			}
			if n, _ := h.Markers(); n != 1 {
				t.Errorf("%d markers after the panic, want 1", n)
			}
		})
	}
}
