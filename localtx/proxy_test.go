package localtx_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestSQL_LostCommitOnServer: on a real server, behind a proxy that breaks
// the connection carrying the COMMIT. A COMMIT whose reply is lost after
// the server committed is never taken for a rollback: with a marker, Run
// reads the commit back; without one, it says it cannot tell. A
// connection cut before the COMMIT reached the server is read back as the
// rollback it is.
func TestSQL_LostCommitOnServer(t *testing.T) {
	for _, server := range []string{"postgres", "mysql"} {
		t.Run(server, func(t *testing.T) {
			reply := map[string]string{"postgres": "COMMIT", "mysql": "OK"}[server]
			for _, c := range []struct {
				name      string
				fault     txtest.ProxyFault
				marker    bool
				hooks     events
				unknown   bool // Run's error is ErrCommitUnknown
				committed bool // the server committed
			}{
				{"ReplyDropped", txtest.DropCommitReply, true, events{"commit"}, false, true},
				{"ReplyDroppedNoMarker", txtest.DropCommitReply, false, events{"unknown"}, true, true},
				{"CutBeforeCommit", txtest.CutBeforeCommit, true, events{"rollback"}, false, false},
				{"CutBeforeCommitNoMarker", txtest.CutBeforeCommit, false, events{"unknown"}, true, false},
			} {
				t.Run(c.name, func(t *testing.T) {
					h, px := txtest.ProxiedServer(t, server, filepath.Join(t.TempDir(), "host"))
					// Nothing else commits through this proxy: the fault
					// hits the COMMIT of Run.
					px.Arm(c.fault, "")
					ev, id, err := runFaulty(t, context.Background(), h, c.marker)
					want := []txtest.Cut{{Fault: c.fault}}
					if c.fault == txtest.DropCommitReply {
						want[0].Reply = reply // the server did commit
					}
					if cuts := px.Cuts(); !reflect.DeepEqual(cuts, want) {
						t.Fatalf("proxy cuts %v, want %v", cuts, want)
					}
					switch {
					case c.unknown:
						if !errors.Is(err, localtx.ErrCommitUnknown) || len(wrapped(err)) < 2 {
							t.Errorf("Run = %v, want ErrCommitUnknown with the commit's error", err)
						}
					case c.committed:
						if err != nil {
							t.Errorf("Run = %v, want nil: the marker is there", err)
						}
					default:
						if err == nil || errors.Is(err, localtx.ErrCommitUnknown) {
							t.Errorf("Run = %v, want the commit's error", err)
						}
					}
					if !reflect.DeepEqual(ev, c.hooks) {
						t.Errorf("hooks %v, want %v", ev, c.hooks)
					}
					if _, ok := mustGet(t, h, "k"); ok != c.committed {
						t.Errorf("business row present %v, want %v", ok, c.committed)
					}
					st := localtx.RolledBack
					if c.committed && c.marker {
						st = localtx.Committed
					}
					if got, _, err := h.Store.Check(context.Background(), id); err != nil || got != st {
						t.Errorf("Check = %v, %v; want %v", got, err, st)
					}
				})
			}
		})
	}
}

// wrapped returns the errors err wraps directly.
func wrapped(err error) []error {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		return u.Unwrap()
	case interface{ Unwrap() error }:
		return []error{u.Unwrap()}
	}
	return nil
}

// connLost is what a host would pass as SQLOptions.Retryable to "run the
// transaction again when the connection was lost": right for a statement,
// which rolled back with the connection, but not for a COMMIT.
func connLost(err error) bool {
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// TestSQL_LostCommitRetryable: the server commits and the reply is lost
// with the connection, on an adapter whose Retryable matches lost
// connections. The commit's error is read back from the marker, not taken
// for a rollback: one attempt, the commit hooks, one business row, one
// marker (this broke when the lost reply was redone: the transaction
// committed twice).
func TestSQL_LostCommitRetryable(t *testing.T) {
	for _, server := range serverNames {
		t.Run(server, func(t *testing.T) {
			db, dialect, p := txtest.ProxiedServerDB(t, server)
			business := uniqueTable(t, db, "lost_biz")
			ctx := context.Background()
			if _, err := db.ExecContext(ctx, "CREATE TABLE "+business+" (k VARCHAR(64) NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			a := serverAdapter(t, db, dialect, func(o *localtx.SQLOptions) { o.Retryable = connLost })
			attempts := 0
			var hooks []string
			err := a.Run(ctx, func(ctx context.Context) error {
				attempts++
				tx, _ := localtx.FromContext(ctx)
				tx.WhileCommit(func() { hooks = append(hooks, "commit") })
				tx.WhileRollback(func() { hooks = append(hooks, "rollback") })
				if _, err := a.Tx(ctx).ExecContext(ctx, "INSERT INTO "+business+" (k) VALUES ("+ph(dialect, 1)+")", "order-1"); err != nil {
					return err
				}
				if err := tx.Put(localtx.MarkerBucket, []byte(tx.ID()), []byte("m")); err != nil {
					return err
				}
				if attempts == 1 {
					p.DropNextCommitReply()
				}
				return nil
			})
			if n := len(p.Cuts()); n != 1 {
				t.Fatalf("the proxy cut %d commits, want 1", n)
			}
			var rows int
			if err := db.QueryRow("SELECT COUNT(*) FROM " + business).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			recs, _ := a.Committed(ctx, "", 10)
			if err != nil || rows != 1 || len(recs) != 1 || attempts != 1 || len(hooks) != 1 || hooks[0] != "commit" {
				t.Errorf("Run = %v after %d attempts, hooks %v, %d business rows, %d markers; want nil, 1, [commit], 1, 1", err, attempts, hooks, rows, len(recs))
			}
		})
	}
}
