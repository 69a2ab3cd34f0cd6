// Package txtest opens the localtx adapters over temporary host stores, so
// one conformance suite runs against every adapter. It is for tests only.
package txtest

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
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

// Names of the adapters returned by All, in order: bbolt, SQLite, and the
// SQL adapter on a PostgreSQL and a MySQL/MariaDB server (see Server).
var Names = []string{"bolt", "sqlite", "postgres", "mysql"}

// All opens every adapter over new stores, closed at cleanup.
func All(t testing.TB) []*Host {
	t.Helper()
	var hosts []*Host
	for _, name := range Names {
		hosts = append(hosts, Open(t, name, filepath.Join(t.TempDir(), "host")))
	}
	return hosts
}

// Open opens the adapter named name, one of Names, over path: a bbolt or
// SQLite file, or, on a server, tables named after path. The same path
// opens the same tables, in this process or another.
func Open(t testing.TB, name, path string) *Host {
	t.Helper()
	switch name {
	case "bolt":
		return Bolt(t, path)
	case "sqlite":
		return SQLite(t, path)
	case "postgres", "mysql":
		return Server(t, name, path)
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
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return sqlHost(t, "sqlite", db, localtx.SQLite, "app_mq", nil)
}

func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)"
}

// The environment that points the tests at database servers. .ci/servers
// starts both and prints it.
const (
	// PostgresEnv holds a pgx DSN of a PostgreSQL database the tests may
	// create tables in.
	PostgresEnv = "ZEZE_PG_DSN"
	// MySQLEnv holds a go-sql-driver/mysql DSN of a MySQL or MariaDB
	// database.
	MySQLEnv = "ZEZE_MYSQL_DSN"
	// RequiredEnv set to "required" makes a server not configured or not
	// reachable a test failure instead of a skip. CI sets it.
	RequiredEnv = "ZEZE_SQL_SERVERS"
)

// servers are the server adapters: driver, DSN variable, dialect.
var servers = map[string]serverSpec{
	"postgres": {"pgx", PostgresEnv, localtx.PostgreSQL},
	"mysql":    {"mysql", MySQLEnv, localtx.MySQL},
}

type serverSpec struct {
	driver, env string
	dialect     localtx.Dialect
}

// ServerDB opens the database of server ("postgres" or "mysql") named by
// its environment variable, closed at cleanup. Without the variable, or
// when the server does not answer, the test is skipped, saying so, unless
// RequiredEnv is "required": then it fails.
func ServerDB(t testing.TB, server string) (*sql.DB, localtx.Dialect) {
	t.Helper()
	srv, dsn := serverDSN(t, server)
	return openServer(t, server, dsn), srv.dialect
}

// unavailable skips the test, or fails it when RequiredEnv is "required".
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(RequiredEnv) == "required" {
		t.Fatalf("txtest: %s=required: "+format, append([]any{RequiredEnv}, args...)...)
	}
	t.Skipf("txtest: skipped: "+format+" (.ci/servers starts the servers)", args...)
}

// serverDSN returns the server adapter named server and the DSN its
// environment variable holds (see ServerDB).
func serverDSN(t testing.TB, server string) (serverSpec, string) {
	t.Helper()
	srv, ok := servers[server]
	if !ok {
		t.Fatalf("txtest: no server %q", server)
	}
	dsn := os.Getenv(srv.env)
	if dsn == "" {
		unavailable(t, "%s is not set", srv.env)
	}
	return srv, dsn
}

// openServer opens dsn with the driver of server, closed at cleanup, and
// waits for the server to answer (see ServerDB).
func openServer(t testing.TB, server, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(servers[server].driver, dsn)
	if err != nil {
		unavailable(t, "%s: %v", servers[server].env, err)
	}
	return pingServer(t, server, db)
}

// pingServer sets up db, a server's database, closed at cleanup, and waits
// for the server to answer (see ServerDB).
func pingServer(t testing.TB, server string, db *sql.DB) *sql.DB {
	t.Helper()
	srv := servers[server]
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(4)
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		unavailable(t, "%s server at %s: %v", server, srv.env, err)
	}
	return db
}

// Server opens the SQL adapter on server ("postgres" or "mysql", see
// ServerDB) over tables named after path. The tables are dropped at
// cleanup.
func Server(t testing.TB, server, path string) *Host {
	t.Helper()
	db, dialect := ServerDB(t, server)
	return serverHost(t, server, db, dialect, path)
}

// serverHost is Server over db.
func serverHost(t testing.TB, server string, db *sql.DB, dialect localtx.Dialect, path string) *Host {
	t.Helper()
	sum := sha256.Sum256([]byte(path))
	prefix := "t" + hex.EncodeToString(sum[:6])
	t.Cleanup(func() {
		for _, table := range []string{prefix + "_business", prefix + "_marker", prefix + "_outbox"} {
			db.Exec("DROP TABLE IF EXISTS " + table)
		}
	})
	return sqlHost(t, server, db, dialect, prefix, nil)
}

// sqlHost sets up db as a host DB with the SQL adapter: a business table
// and the adapter's tables, named after prefix. opts, if not nil, edits
// the adapter's options.
func sqlHost(t testing.TB, name string, db *sql.DB, dialect localtx.Dialect, prefix string, opts func(*localtx.SQLOptions)) *Host {
	t.Helper()
	ctx := context.Background()
	business := prefix + "_business"
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+business+" (k VARCHAR(200) PRIMARY KEY, v TEXT NOT NULL)"); err != nil {
		t.Fatalf("txtest: %v", err)
	}
	o := localtx.SQLOptions{Dialect: dialect, MarkerTable: prefix + "_marker", OutboxTable: prefix + "_outbox"}
	if opts != nil {
		opts(&o)
	}
	a, err := localtx.NewSQL(db, o)
	if err != nil {
		t.Fatalf("txtest: %v", err)
	}
	if err := a.CreateTables(ctx); err != nil {
		t.Fatalf("txtest: %v", err)
	}
	p1, p2 := "?", "?"
	if dialect == localtx.PostgreSQL {
		p1, p2 = "$1", "$2"
	}
	return &Host{
		Name:  name,
		Store: a,
		Run:   a.Run,
		Put: func(ctx context.Context, key, value string) error {
			tx := a.Tx(ctx)
			if tx == nil {
				return errors.New("txtest: not in a transaction")
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO "+business+" (k, v) VALUES ("+p1+", "+p2+")", key, value)
			return err
		},
		Get: func(key string) (string, bool, error) {
			var v string
			err := db.QueryRow("SELECT v FROM "+business+" WHERE k = "+p1, key).Scan(&v)
			if err == sql.ErrNoRows {
				return "", false, nil
			}
			return v, err == nil, err
		},
		Keys: func() ([]string, error) {
			rows, err := db.Query("SELECT k FROM " + business)
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
			err = db.QueryRow("SELECT COUNT(*) FROM " + o.MarkerTable).Scan(&n)
			return n, err
		},
	}
}
