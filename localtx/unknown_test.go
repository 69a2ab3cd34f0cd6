package localtx_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// unknownTx is the optional part of Tx that BoltTx and SQLTx have.
type unknownTx interface {
	localtx.Tx
	WhileUnknown(fn func())
}

// runFaulty runs one transaction that writes a business row and, with
// marker, its marker; it registers every hook kind and returns the hooks
// that ran, the transaction's id and Run's error.
func runFaulty(t *testing.T, ctx context.Context, h *txtest.Host, marker bool) (events, string, error) {
	t.Helper()
	var ev events
	var id string
	err := h.Run(ctx, func(ctx context.Context) error {
		tx, ok := bind(t, ctx).(unknownTx)
		if !ok {
			t.Fatalf("%T has no WhileUnknown", bind(t, ctx))
		}
		id = tx.ID()
		tx.WhileCommit(ev.hook("commit"))
		tx.WhileRollback(ev.hook("rollback"))
		tx.WhileUnknown(ev.hook("unknown"))
		if marker {
			if err := tx.Put(localtx.MarkerBucket, []byte(id), []byte("m")); err != nil {
				return err
			}
		}
		return h.Put(ctx, "k", "v")
	})
	return ev, id, err
}

// TestSQL_CommitUnknown: a COMMIT that fails may have committed; Run reads
// the outcome back from the marker row, and says so when it cannot.
func TestSQL_CommitUnknown(t *testing.T) {
	for _, c := range []struct {
		name      string
		fault     txtest.CommitFault
		marker    bool
		down      bool
		hooks     events
		unknown   bool // Run's error is ErrCommitUnknown
		committed bool
	}{
		{"LostReply", txtest.CommitLostReply, true, false, events{"commit"}, false, true},
		{"Failed", txtest.CommitFailed, true, false, events{"rollback"}, false, false},
		{"LostReplyNoMarker", txtest.CommitLostReply, false, false, events{"unknown"}, true, true},
		{"FailedNoMarker", txtest.CommitFailed, false, false, events{"unknown"}, true, false},
		{"LostReplyStoreDown", txtest.CommitLostReply, true, true, events{"unknown"}, true, true},
		{"FailedStoreDown", txtest.CommitFailed, true, true, events{"unknown"}, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, f := txtest.FaultySQLite(t, filepath.Join(t.TempDir(), "h.sqlite"))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.down { // Run's ctx ends once it asked the store in vain
				done := make(chan struct{})
				defer close(done)
				go func() {
					for f.Refused() == 0 {
						select {
						case <-done:
							return
						case <-time.After(time.Millisecond):
						}
					}
					cancel()
				}()
			}
			f.NextCommit(c.fault, driver.ErrBadConn, c.down)
			ev, id, err := runFaulty(t, ctx, h, c.marker)
			switch {
			case c.unknown:
				if !errors.Is(err, localtx.ErrCommitUnknown) || !errors.Is(err, driver.ErrBadConn) {
					t.Errorf("Run = %v, want ErrCommitUnknown wrapping the commit's error", err)
				}
			case c.committed:
				if err != nil {
					t.Errorf("Run = %v, want nil", err)
				}
			default:
				if !errors.Is(err, driver.ErrBadConn) || errors.Is(err, localtx.ErrCommitUnknown) {
					t.Errorf("Run = %v, want the commit's error", err)
				}
			}
			if !reflect.DeepEqual(ev, c.hooks) {
				t.Errorf("hooks %v, want %v", ev, c.hooks)
			}
			f.SetDown(false)
			if _, ok := mustGet(t, h, "k"); ok != c.committed {
				t.Errorf("business row present %v, want %v", ok, c.committed)
			}
			want := localtx.RolledBack
			if c.committed && c.marker {
				want = localtx.Committed
			}
			if st, _, err := h.Store.Check(context.Background(), id); err != nil || st != want {
				t.Errorf("Check = %v, %v; want %v", st, err, want)
			}
		})
	}
}

var errFsync = errors.New("fdatasync: input/output error")

// TestBolt_CommitUnknown: a bbolt Commit error is a rollback when bbolt did
// not write its meta page, and unknown when it did (only the fsync after it
// failed): the commit shows but may not be durable.
func TestBolt_CommitUnknown(t *testing.T) {
	for _, c := range []struct {
		name    string
		commit  func(*bolt.Tx) error
		marker  bool
		hooks   events
		unknown bool
	}{
		{"NotWritten", rollThenFail, true, events{"rollback"}, false},
		{"NotWrittenNoMarker", rollThenFail, false, events{"rollback"}, false},
		{"WrittenNotSynced", commitThenFail, true, events{"unknown"}, true},
		{"WrittenNotSyncedNoMarker", commitThenFail, false, events{"unknown"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := txtest.Bolt(t, filepath.Join(t.TempDir(), "h.db"))
			localtx.SetBoltCommit(h.Store.(*localtx.Bolt), c.commit)
			ev, id, err := runFaulty(t, context.Background(), h, c.marker)
			if !errors.Is(err, errFsync) || errors.Is(err, localtx.ErrCommitUnknown) != c.unknown {
				t.Errorf("Run = %v; want the commit's error, ErrCommitUnknown %v", err, c.unknown)
			}
			if !reflect.DeepEqual(ev, c.hooks) {
				t.Errorf("hooks %v, want %v", ev, c.hooks)
			}
			// What the check-back sees is what bbolt shows.
			want := localtx.RolledBack
			if c.unknown && c.marker {
				want = localtx.Committed
			}
			if st, _, err := h.Store.Check(context.Background(), id); err != nil || st != want {
				t.Errorf("Check = %v, %v; want %v", st, err, want)
			}
		})
	}
}

func rollThenFail(tx *bolt.Tx) error {
	if err := tx.Rollback(); err != nil {
		return err
	}
	return errFsync
}

func commitThenFail(tx *bolt.Tx) error {
	if err := tx.Commit(); err != nil {
		return err
	}
	return errFsync
}
