package localtx_test

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/zeze-go/mq/localtx"
)

// cutProxy forwards TCP to a server; armed, it forwards the next client
// packet that holds a COMMIT, lets the server run it, and cuts the
// connection before the reply reaches the client: a reply lost with the
// connection, after the server committed.
type cutProxy struct {
	ln    net.Listener
	up    string
	armed atomic.Bool
	cuts  atomic.Int32
}

func newCutProxy(t *testing.T, upstream string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, up: upstream}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

var commitRe = regexp.MustCompile(`(?i)\bcommit\b`)

func (p *cutProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.up)
	if err != nil {
		c.Close()
		return
	}
	var cut atomic.Bool
	var once sync.Once
	closeBoth := func() { once.Do(func() { c.Close(); s.Close() }) }
	go func() { // server -> client
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 && !cut.Load() {
				if _, werr := c.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		closeBoth()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if p.armed.Load() && commitRe.Match(chunk) && p.armed.CompareAndSwap(true, false) {
				cut.Store(true)
				s.Write(chunk)
				time.Sleep(300 * time.Millisecond) // the server commits
				p.cuts.Add(1)
				closeBoth()
				return
			}
			if _, werr := s.Write(chunk); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	closeBoth()
}

// proxiedDB opens server's database through a cutProxy.
func proxiedDB(t *testing.T, server string) (*sql.DB, localtx.Dialect, *cutProxy) {
	t.Helper()
	var driverName, dsn, hostport string
	var dialect localtx.Dialect
	switch server {
	case "postgres":
		driverName, dsn, dialect = "pgx", os.Getenv("ZEZE_PG_DSN"), localtx.PostgreSQL
		hostport = regexp.MustCompile(`@([^/]+)/`).FindStringSubmatch(dsn)[1]
	case "mysql":
		driverName, dsn, dialect = "mysql", os.Getenv("ZEZE_MYSQL_DSN"), localtx.MySQL
		hostport = regexp.MustCompile(`tcp\(([^)]+)\)`).FindStringSubmatch(dsn)[1]
	}
	if dsn == "" {
		t.Skip("no server")
	}
	p := newCutProxy(t, hostport)
	pdsn := bytes.Replace([]byte(dsn), []byte(hostport), []byte(p.ln.Addr().String()), 1)
	db, err := sql.Open(driverName, string(pdsn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, dialect, p
}

// connLost is what a host would pass as SQLOptions.Retryable to "run the
// transaction again when the connection was lost": a statement that fails
// that way rolled back with the connection.
func connLost(err error) bool {
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// TestReview_LostCommitReply: the server commits, the reply is lost with
// the connection. Without SQLOptions.Retryable, Run reads the marker back
// and returns nil after one attempt (this holds). With a Retryable that
// reports lost connections (the option applies to statement errors, where
// such an error is a rollback, and to commit errors alike), Run takes the
// lost COMMIT reply for a rollback by the server and runs the transaction
// again: it commits twice, two business rows and two markers, and the
// first attempt's rollback hooks run although it committed.
func TestReview_LostCommitReply(t *testing.T) {
	for _, server := range serverNames {
		for _, withRetryable := range []bool{false, true} {
			name := server + "/noRetryable"
			if withRetryable {
				name = server + "/connLostRetryable"
			}
			t.Run(name, func(t *testing.T) {
				db, dialect, p := proxiedDB(t, server)
				business := uniqueTable(t, db, "rv_biz")
				ctx := context.Background()
				if _, err := db.ExecContext(ctx, "CREATE TABLE "+business+" (k VARCHAR(64) NOT NULL)"); err != nil {
					t.Fatal(err)
				}
				a, _ := reviewAdapter(t, db, dialect, func(o *localtx.SQLOptions) {
					if withRetryable {
						o.Retryable = connLost
					}
				})
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
						p.armed.Store(true)
					}
					return nil
				})
				if p.cuts.Load() != 1 {
					t.Fatalf("the proxy cut %d commits, want 1", p.cuts.Load())
				}
				var rows int
				if err := db.QueryRow("SELECT COUNT(*) FROM " + business).Scan(&rows); err != nil {
					t.Fatal(err)
				}
				recs, _ := a.Committed(ctx, "", 10)
				t.Logf("Run = %v after %d attempts; hooks %v; %d business rows, %d markers", err, attempts, hooks, rows, len(recs))
				if rows != 1 || len(recs) != 1 || attempts != 1 {
					t.Errorf("one transaction committed %d times (%d markers) in %d attempts, hooks %v; Run = %v", rows, len(recs), attempts, hooks, err)
				}
			})
		}
	}
}
