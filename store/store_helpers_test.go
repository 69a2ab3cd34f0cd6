package store_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// t0 is the tests' clock origin; commands carry Now explicitly so that ages
// and time to live are exact.
const t0 = int64(1_700_000_000_000_000_000)

const sec = int64(time.Second)

// openAt opens the partition file at path and closes it when the test ends.
// With ZEZE_STORE_WAL=1 every partition opened by openAt goes through a
// write-ahead log of its own (path + ".wal"): the whole suite then runs on
// the WAL path.
var withWAL = os.Getenv("ZEZE_STORE_WAL") == "1"

func openAt(t testing.TB, path string) *store.Partition {
	t.Helper()
	var opts store.Options
	var wal *store.WAL
	if withWAL {
		var err error
		if wal, err = store.OpenWAL(path+".wal", store.WALOptions{}); err != nil {
			t.Fatalf("OpenWAL(%s): %v", path, err)
		}
		opts.WAL, opts.Stream = wal, "p"
	}
	p, err := store.Open(path, opts)
	if err != nil {
		if wal != nil {
			wal.Close()
		}
		t.Fatalf("Open(%s): %v", path, err)
	}
	if wal != nil {
		if err := wal.FinishRecovery(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close(%s): %v", path, err)
		}
		if wal != nil {
			wal.Close()
		}
	})
	return p
}

// open opens a partition in a new temporary directory.
func open(t testing.TB) (*store.Partition, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "0.db")
	return openAt(t, path), path
}

// apply runs cmd and fails the test on an error.
// apply runs cmd (stamped at t0 when its Now is zero, as the tests'
// proposer) and fails the test on an error.
func apply(t testing.TB, p *store.Partition, cmd *store.Command) store.Result {
	t.Helper()
	if cmd.Now == 0 {
		cmd.Now = t0
	}
	res, err := p.Apply(context.Background(), cmd)
	if err != nil {
		t.Fatalf("Apply(op %d): %v", cmd.Op, err)
	}
	return res
}

// msg is a message with an ID and a body derived from name.
func msg(name string) store.Message {
	return store.Message{ID: "id-" + name, Key: "key", Body: []byte("body-" + name), Timestamp: t0}
}

func appendAt(t testing.TB, p *store.Partition, now int64, msgs ...store.Message) []store.Ack {
	t.Helper()
	return apply(t, p, &store.Command{Op: store.OpAppend, Now: now, Msgs: msgs}).Acks
}

// readAll returns the bodies of every message in the log, and their offsets.
func readAll(t testing.TB, p *store.Partition) (bodies []string, offsets []uint64) {
	t.Helper()
	msgs, err := p.Read(0, 1<<20, 0, nil)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	for _, m := range msgs {
		bodies = append(bodies, string(m.Body))
		offsets = append(offsets, m.Offset)
	}
	return bodies, offsets
}

func offsetsOf(acks []store.Ack) []uint64 {
	out := make([]uint64, len(acks))
	for i, a := range acks {
		out[i] = a.Offset
	}
	return out
}

func equal(t testing.TB, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func be64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// rewritten returns the path of a closed partition file holding one
// message, changed by fn in a write transaction: a file as another release,
// or damage, left it.
func rewritten(t testing.TB, fn func(*bolt.Tx) error) string {
	t.Helper()
	p, path := open(t)
	appendAt(t, p, t0, msg("a"))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	updateBolt(t, path, fn)
	return path
}

// updateBolt runs fn in a write transaction on the closed partition file.
func updateBolt(t testing.TB, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		db.Close()
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// flipInBucket flips one byte of the value stored under key in bucket, inside
// the part of the value that holds needle.
func flipInBucket(t testing.TB, path, bucket string, key []byte, needle string) {
	t.Helper()
	updateBolt(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		v := bytes.Clone(b.Get(key))
		i := bytes.Index(v, []byte(needle))
		if i < 0 {
			return fmt.Errorf("%s[%x] = %q does not hold %q", bucket, key, v, needle)
		}
		v[i] ^= 0x20
		return b.Put(key, v)
	})
}

// dump returns store.Dump of p, failing the test on an error.
func dump(t testing.TB, p *store.Partition) string {
	t.Helper()
	d, err := store.Dump(p)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
