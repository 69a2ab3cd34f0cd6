package localtx

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Dialect is the SQL database behind a SQL adapter. It decides how query
// parameters are written, how table names are quoted, the column types
// CreateTables uses and which errors redo a transaction.
type Dialect int

// Dialects. Set SQLOptions.Dialect to the one of the database/sql driver:
//
//	SQLite      modernc.org/sqlite ("sqlite"), github.com/mattn/go-sqlite3
//	PostgreSQL  github.com/jackc/pgx/v5/stdlib ("pgx"), github.com/lib/pq
//	MySQL       github.com/go-sql-driver/mysql ("mysql"), for MySQL and MariaDB
const (
	SQLite Dialect = iota + 1
	PostgreSQL
	MySQL
)

// dialect is what a Dialect stands for.
type dialect struct {
	name   string
	dollar bool   // parameters are $1, $2, ...; otherwise ?
	quote  byte   // quotes an identifier
	blob   string // the default column type of stored bytes
	// blobs maps a column type of stored bytes, in upper case, to the bytes
	// it holds; sized, if set, tells it for types with a size.
	blobs map[string]int64
	sized func(typ string) int64
	// key is the column type of transaction ids, of up to maxKeyBytes:
	// compared byte by byte, whatever the database's collation.
	key string
	// strict: the server refuses a value too long for its column, so a
	// column type of unknown capacity may be used. MySQL outside strict
	// mode truncates it instead.
	strict bool
	// retryable reports whether err, from a statement or a commit, means
	// that the server rolled the transaction back and it may run again.
	retryable func(err error) bool
}

var dialects = map[Dialect]dialect{
	SQLite: {
		name: "SQLite", quote: '"', blob: "BLOB", key: "VARCHAR(128)", strict: true, // SQLite never truncates
		// SQLite's default length limit, SQLITE_MAX_LENGTH.
		blobs:     map[string]int64{"BLOB": 1e9},
		retryable: sqliteRetryable,
	},
	PostgreSQL: {
		name: "PostgreSQL", dollar: true, quote: '"', blob: "BYTEA", key: `VARCHAR(128) COLLATE "C"`, strict: true,
		blobs:     map[string]int64{"BYTEA": 1<<30 - 1},
		retryable: postgresRetryable,
	},
	MySQL: {
		// VARBINARY: ascii_bin would pad with spaces ("x" = "x ").
		name: "MySQL", quote: '`', blob: "LONGBLOB", key: "VARBINARY(128)",
		blobs: map[string]int64{
			"TINYBLOB": 1<<8 - 1, "BLOB": 1<<16 - 1, "MEDIUMBLOB": 1<<24 - 1, "LONGBLOB": 1<<32 - 1,
			"LONG VARBINARY": 1<<24 - 1,
		},
		sized:     mysqlSized,
		retryable: mysqlRetryable,
	},
}

func (d Dialect) String() string {
	if x, ok := dialects[d]; ok {
		return x.name
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// quoteName quotes each dot-separated part of a table name, so that a
// reserved word such as "order" is a name. It refuses parts that are not
// letters, digits and '_', that start with a digit, or that are longer
// than PostgreSQL's limit of 63 bytes.
func (x *dialect) quoteName(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("localtx: table name %q: at most schema.table", name)
	}
	q := string(x.quote)
	for i, p := range parts {
		if !identifier(p) {
			return "", fmt.Errorf("localtx: table name %q: want letters, digits and '_', not starting with a digit, 1 to 63 of them per part", name)
		}
		parts[i] = q + p + q
	}
	return strings.Join(parts, "."), nil
}

func identifier(s string) bool {
	if s == "" || len(s) > 63 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// maxKeyBytes is what the id columns hold; the node's transaction ids
// are shorter.
const maxKeyBytes = 128

// blobType returns the column type of stored bytes and what it holds, zero
// when the dialect does not know the type and its server refuses what does
// not fit. On a server that truncates, a type of unknown capacity is
// refused.
func (x *dialect) blobType(typ string) (string, int64, error) {
	if typ == "" {
		typ = x.blob
	}
	for _, c := range []byte(typ) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == ' ' || c == '(' || c == ')') {
			return "", 0, fmt.Errorf("localtx: column type %q: want letters, digits, '_', ' ', '(' and ')'", typ)
		}
	}
	norm := strings.Join(strings.Fields(strings.ToUpper(typ)), " ")
	holds := x.blobs[norm]
	if holds == 0 && x.sized != nil {
		holds = x.sized(norm)
	}
	if holds == 0 && !x.strict {
		return "", 0, fmt.Errorf("localtx: column type %q: %s may truncate a value too long for it, and its size is not known here: use %s", typ, x.name, x.blob)
	}
	return typ, holds, nil
}

// mysqlSized is what MySQL's sized types hold: BLOB(n) is the smallest
// BLOB type that holds n bytes, VARBINARY(n) holds n.
func mysqlSized(typ string) int64 {
	var n int64
	if _, err := fmt.Sscanf(typ, "BLOB(%d)", &n); err == nil && n >= 0 && typ == fmt.Sprintf("BLOB(%d)", n) {
		for _, c := range []int64{1<<8 - 1, 1<<16 - 1, 1<<24 - 1, 1<<32 - 1} {
			if n <= c {
				return c
			}
		}
		return 0
	}
	if _, err := fmt.Sscanf(typ, "VARBINARY(%d)", &n); err == nil && n > 0 && typ == fmt.Sprintf("VARBINARY(%d)", n) {
		return n
	}
	return 0
}

// sqliteRetryable: SQLITE_BUSY and SQLITE_LOCKED, with their extended
// codes. A read transaction in WAL mode that cannot become a write one
// gets SQLITE_BUSY_SNAPSHOT at once, whatever the busy timeout.
func sqliteRetryable(err error) bool {
	var coded interface{ Code() int }
	if !errors.As(err, &coded) {
		return false
	}
	c := coded.Code() & 0xff
	return c == 5 || c == 6
}

// postgresRetryable: serialization_failure (40001) and deadlock_detected
// (40P01), from any driver whose errors have SQLState() (pgx, lib/pq).
func postgresRetryable(err error) bool {
	var st interface{ SQLState() string }
	if !errors.As(err, &st) {
		return false
	}
	s := st.SQLState()
	return s == "40001" || s == "40P01"
}

// mysqlRetryable: ER_LOCK_DEADLOCK (1213) and ER_LOCK_WAIT_TIMEOUT (1205).
func mysqlRetryable(err error) bool {
	n, ok := mysqlNumber(err)
	return ok && (n == 1213 || n == 1205)
}

// mysqlNumber finds the server's error number in err's chain: the Number
// field of go-sql-driver/mysql's *MySQLError, read by reflection so that
// this package does not link the driver into every program that uses it.
func mysqlNumber(err error) (uint16, bool) {
	for _, e := range chain(err) {
		v := reflect.ValueOf(e)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct || v.Elem().Type().Name() != "MySQLError" {
			continue
		}
		if f := v.Elem().FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
			return uint16(f.Uint()), true
		}
	}
	return 0, false
}

// chain lists err and every error it wraps, depth first.
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil || len(out) >= 64 {
			return
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}
