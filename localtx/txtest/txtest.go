// Package txtest opens the localtx adapters over temporary host stores, so
// one conformance suite runs against every adapter. It is for tests only.
package txtest

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sort"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/zeze-go/mq/localtx"
)

// Host is a host store with one business table and its adapter.
type Host struct {
	Name  string
	Store localtx.Store
	// Run is the adapter's managed transaction.
	Run func(ctx context.Context, fn func(ctx context.Context) error) error
	// Put writes a business row inside the transaction bound to ctx.
	Put func(ctx context.Context, key, value string) error
	// Get reads a committed business row.
	Get func(key string) (value string, ok bool, err error)
	// Keys lists the committed business rows' keys, sorted.
	Keys func() ([]string, error)
	// Markers counts the markers not yet forgotten.
	Markers func() (int, error)
}

// Names of the adapters returned by All, in order.
var Names = []string{"bolt", "sqlite"}

// All opens every adapter over new stores in t.TempDir(), closed at cleanup.
func All(t testing.TB) []*Host {
	t.Helper()
	return []*Host{Bolt(t, filepath.Join(t.TempDir(), "host.db")), SQLite(t, filepath.Join(t.TempDir(), "host.sqlite"))}
}

// Open opens the adapter named name (one of Names) over path.
func Open(t testing.TB, name, path string) *Host {
	t.Helper()
	switch name {
	case "bolt":
		return Bolt(t, path)
	case "sqlite":
		return SQLite(t, path)
	}
	t.Fatalf("txtest: no adapter %q", name)
	return nil
}

var accounts = []byte("business")

// Bolt opens a bbolt host DB at path with the Bolt adapter.
func Bolt(t testing.TB, path string) *Host {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("txtest: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(accounts)
		return err
	}); err != nil {
		t.Fatalf("txtest: %v", err)
	}
	a, err := localtx.NewBolt(db, localtx.BoltOptions{})
	if err != nil {
		t.Fatalf("txtest: %v", err)
	}
	return &Host{
		Name:  "bolt",
		Store: a,
		Run:   a.Run,
		Put: func(ctx context.Context, key, value string) error {
			tx := a.Tx(ctx)
			if tx == nil {
				return errors.New("txtest: not in a transaction")
			}
			return tx.Bucket(accounts).Put([]byte(key), []byte(value))
		},
		Get: func(key string) (v string, ok bool, err error) {
			err = db.View(func(tx *bolt.Tx) error {
				b := tx.Bucket(accounts).Get([]byte(key))
				v, ok = string(b), b != nil
				return nil
			})
			return v, ok, err
		},
		Keys: func() (keys []string, err error) {
			err = db.View(func(tx *bolt.Tx) error {
				return tx.Bucket(accounts).ForEach(func(k, _ []byte) error {
					keys = append(keys, string(k))
					return nil
				})
			})
			return keys, err
		},
		Markers: func() (n int, err error) {
			err = db.View(func(tx *bolt.Tx) error {
				n = tx.Bucket(localtx.MarkerBucket).Stats().KeyN
				return nil
			})
			return n, err
		},
	}
}

// SQLite opens an SQLite host DB at path with the SQL adapter; its tables
// get non-default names, to exercise the option.
func SQLite(t testing.TB, path string) *Host {
	t.Helper()
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		t.Fatalf("txtest: %v", err)
	}
	return sqlHost(t, db)
}

func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)"
}

// sqlHost sets up db as an SQLite host DB with the SQL adapter and closes it
// at cleanup.
func sqlHost(t testing.TB, db *sql.DB) *Host {
	t.Helper()
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS business (k VARCHAR(200) PRIMARY KEY, v TEXT NOT NULL)"); err != nil {
		t.Fatalf("txtest: %v", err)
	}
	a, err := localtx.NewSQL(db, localtx.SQLOptions{MarkerTable: "app_mq_marker", OutboxTable: "app_mq_outbox"})
	if err != nil {
		t.Fatalf("txtest: %v", err)
	}
	if err := a.CreateTables(ctx); err != nil {
		t.Fatalf("txtest: %v", err)
	}
	return &Host{
		Name:  "sqlite",
		Store: a,
		Run:   a.Run,
		Put: func(ctx context.Context, key, value string) error {
			tx := a.Tx(ctx)
			if tx == nil {
				return errors.New("txtest: not in a transaction")
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO business (k, v) VALUES (?, ?)", key, value)
			return err
		},
		Get: func(key string) (string, bool, error) {
			var v string
			err := db.QueryRow("SELECT v FROM business WHERE k = ?", key).Scan(&v)
			if err == sql.ErrNoRows {
				return "", false, nil
			}
			return v, err == nil, err
		},
		Keys: func() ([]string, error) {
			rows, err := db.Query("SELECT k FROM business")
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var keys []string
			for rows.Next() {
				var k string
				if err := rows.Scan(&k); err != nil {
					return nil, err
				}
				keys = append(keys, k)
			}
			sort.Strings(keys)
			return keys, rows.Err()
		},
		Markers: func() (n int, err error) {
			err = db.QueryRow("SELECT COUNT(*) FROM app_mq_marker").Scan(&n)
			return n, err
		},
	}
}
