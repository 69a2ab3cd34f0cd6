package localtx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestReview_CheckBlocksOnLockedMarker: a session left over from an
// earlier run of the process (its client died with the transaction open,
// the server has not noticed yet) holds the uncommitted marker row of a
// transaction. The node's check-back asks Check about it with the node's
// context, which has no deadline. Check's probe INSERT waits for that lock
// with no bound of its own: on PostgreSQL forever (no lock_timeout), on
// MariaDB innodb_lock_wait_timeout (50 s), so one such transaction stalls
// the node's single check-back/sweep loop.
func TestReview_CheckBlocksOnLockedMarker(t *testing.T) {
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

// TestReview_MySQLNonStrictTruncation: MariaDB outside strict mode cuts a
// value too long for its column. With BlobType "BLOB(100)" (MySQL makes it
// a TINYBLOB, 255 bytes) NewSQL refuses the default MaxRowBytes; allowed
// 255 bytes, Put refuses a 1000-byte row before sending it. A marker key
// longer than the id column is refused too.
func TestReview_MySQLNonStrictTruncation(t *testing.T) {
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

// TestReview_EmptyAndNilValues: Put of an empty and of a nil value, on
// every adapter: they should behave alike (Bolt stores both).
func TestReview_EmptyAndNilValues(t *testing.T) {
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

// TestReview_CommittedConsistent: Committed, paging while transactions of
// 5 outbox rows commit and others are forgotten, never returns a record
// with a partial outbox, nor one twice in a pass, and always pages in
// increasing id order.
func TestReview_CommittedConsistent(t *testing.T) {
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

// TestReview_Holds: things that hold (kept as regression checks): Forget
// of many ids with duplicates, empty and unknown ones; Committed with a
// huge max; a panic in the attempt after a redo.
func TestReview_Holds(t *testing.T) {
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
