package boltsafe_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
)

const pageSize = 4096

// dbSize says how much makeDB writes.
type dbSize int

const (
	tiny  dbSize = iota // 12 keys: a leaf per bucket
	small               // 400 keys and a 3-page value: branch pages and overflow
)

// makeDB writes a small bbolt file with every kind of page: a bucket of
// many keys (branch and leaf pages when small), nested buckets (inline and
// not), a value spilling over several pages (when small), and a freelist
// with free pages on it. opts are bbolt's options for it (nil: defaults).
// It returns the file's bytes.
func makeDB(tb testing.TB, opts *bolt.Options, size dbSize) []byte {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "src.db")
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		tb.Fatal(err)
	}
	keys, big := 12, false
	if size == small {
		keys, big = 400, true
	}
	err = db.Update(func(tx *bolt.Tx) error {
		a, err := tx.CreateBucket([]byte("a"))
		if err != nil {
			return err
		}
		for i := 0; i < keys; i++ {
			if err := a.Put(fmt.Appendf(nil, "key-%04d", i), bytes.Repeat([]byte{byte(i)}, 40)); err != nil {
				return err
			}
		}
		b, err := tx.CreateBucket([]byte("b"))
		if err != nil {
			return err
		}
		inline, err := b.CreateBucket([]byte("inline"))
		if err != nil {
			return err
		}
		if err := inline.Put([]byte("k"), []byte("v")); err != nil {
			return err
		}
		deep, err := b.CreateBucket([]byte("deep"))
		if err != nil {
			return err
		}
		for i := 0; i < keys/4; i++ {
			if err := deep.Put(fmt.Appendf(nil, "d-%03d", i), bytes.Repeat([]byte("d"), 100)); err != nil {
				return err
			}
		}
		if _, err := tx.CreateBucket([]byte("empty")); err != nil {
			return err
		}
		if big {
			c, err := tx.CreateBucket([]byte("c"))
			if err != nil {
				return err
			}
			return c.Put([]byte("big"), bytes.Repeat([]byte("o"), 3*pageSize))
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	// A second transaction frees pages, so the freelist lists some.
	err = db.Update(func(tx *bolt.Tx) error {
		a := tx.Bucket([]byte("a"))
		for i := 0; i < keys; i += 3 {
			if err := a.Delete(fmt.Appendf(nil, "key-%04d", i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// walk reads every bucket, key and value of db through boltsafe.View, and
// then writes and deletes a key through boltsafe.Update, so that a damaged
// page anywhere is met.
func walk(db *bolt.DB) error {
	var n int
	var visit func(b *bolt.Bucket) error
	visit = func(b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			n += len(bytes.Clone(k)) + len(bytes.Clone(v))
			if v == nil {
				if child := b.Bucket(k); child != nil {
					return visit(child)
				}
			}
			return nil
		})
	}
	err := boltsafe.View(db, func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return visit(b) })
	})
	if err != nil {
		return err
	}
	return boltsafe.Update(db, func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("a"))
		if err != nil {
			return err
		}
		if err := b.Put([]byte("new"), bytes.Repeat([]byte("n"), 500)); err != nil {
			return err
		}
		return b.Delete([]byte("key-0001"))
	})
}

// outcome opens data as a bbolt file through boltsafe, walks it, and
// returns nil for a file that opened and walked, the error of Open or of
// the walk, or a "panic" error when anything panicked (a test failure).
func outcome(tb testing.TB, dir string, data []byte, opts *bolt.Options) (err error, panicked error) {
	tb.Helper()
	path := filepath.Join(dir, "test.db")
	if data == nil {
		os.Remove(path)
	} else if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		if r := recover(); r != nil {
			panicked = fmt.Errorf("panic: %v", r)
		}
	}()
	db, err := boltsafe.Open(path, opts)
	if err != nil {
		return err, nil
	}
	defer db.Close()
	return walk(db), nil
}

// wantCorrupt checks that err wraps ErrCorrupt and names the file.
func wantCorrupt(tb testing.TB, err error) {
	tb.Helper()
	if !errors.Is(err, boltsafe.ErrCorrupt) || !strings.Contains(err.Error(), "test.db") {
		tb.Fatalf("error %v, want one wrapping ErrCorrupt that names test.db", err)
	}
}

// pageFlags reads the flags of page id in data.
func pageFlags(data []byte, id int) uint16 {
	return binary.NativeEndian.Uint16(data[id*pageSize+8:])
}

func flip(data []byte, from, to int) []byte {
	for i := from; i < to && i < len(data); i++ {
		data[i] ^= 0xff
	}
	return data
}

// TestOpen_Damaged damages a small bbolt file in each way and checks that
// Open and a walk of every bucket either succeed or return ErrCorrupt
// naming the file, and never panic.
func TestOpen_Damaged(t *testing.T) {
	for _, opts := range []struct {
		name string
		opts *bolt.Options
	}{
		{"Freelist", nil},
		{"NoFreelistSync", storeOptions()},
	} {
		t.Run(opts.name, func(t *testing.T) {
			orig := makeDB(t, opts.opts, small)
			const (
				corrupt = "ErrCorrupt"
				ok      = "OK"
				either  = "Either"
			)
			type damage struct {
				name   string
				damage func(d []byte) []byte
				want   string
			}
			tests := []damage{
				{"Intact", func(d []byte) []byte { return d }, ok},
				{"Missing", func([]byte) []byte { return nil }, ok},
				{"TruncateTo0", func([]byte) []byte { return []byte{} }, ok},
				{"TruncateTo1Page", func(d []byte) []byte { return d[:pageSize] }, corrupt},
				{"TruncateTo100", func(d []byte) []byte { return d[:100] }, corrupt},
				{"TruncateToHalf", func(d []byte) []byte { return d[:len(d)/2] }, corrupt},
				{"TruncateLastPage", func(d []byte) []byte { return d[:len(d)-pageSize] }, either},
				{"Garbage", func(d []byte) []byte {
					for i := range d {
						d[i] = byte(i*31 + i>>9)
					}
					return d
				}, corrupt},
				{"Zeros", func(d []byte) []byte { return make([]byte, len(d)) }, corrupt},
				{"BothMetaPages", func(d []byte) []byte { return flip(flip(d, 16, 80), pageSize+16, pageSize+80) }, corrupt},
				{"MetaPage0", func(d []byte) []byte { return flip(d, 16, 80) }, either},
				{"MetaPage1", func(d []byte) []byte { return flip(d, pageSize+16, pageSize+80) }, either},
			}
			types := map[uint16]string{0x01: "Branch", 0x02: "Leaf", 0x10: "Freelist"}
			seen := map[string]bool{}
			for p := 2; p < len(orig)/pageSize; p++ {
				typ, ok := types[pageFlags(orig, p)]
				if !ok {
					typ = "Other"
				}
				seen[typ] = true
				base := p * pageSize
				tests = append(tests,
					damage{fmt.Sprintf("Page%d%sHeader", p, typ), func(d []byte) []byte { return flip(d, base+8, base+16) }, either},
					damage{fmt.Sprintf("Page%d%sID", p, typ), func(d []byte) []byte { return flip(d, base, base+1) }, either},
					damage{fmt.Sprintf("Page%d%sElements", p, typ), func(d []byte) []byte { return flip(d, base+16, base+48) }, either},
					damage{fmt.Sprintf("Page%d%sAll", p, typ), func(d []byte) []byte { return flip(d, base, base+pageSize) }, either},
				)
			}
			want := []string{"Branch", "Leaf"}
			if opts.opts == nil {
				want = append(want, "Freelist")
			}
			for _, typ := range want {
				if !seen[typ] {
					t.Fatalf("the test file has no %s page (pages: %v)", typ, seen)
				}
			}
			dir := t.TempDir()
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					err, panicked := outcome(t, dir, tt.damage(bytes.Clone(orig)), opts.opts)
					if panicked != nil {
						t.Fatal(panicked)
					}
					got := ok
					if err != nil {
						wantCorrupt(t, err)
						got = corrupt
					}
					if tt.want != either && got != tt.want {
						t.Fatalf("outcome %s (%v), want %s", got, err, tt.want)
					}
				})
			}
		})
	}
}

// readable reports whether bbolt may read byte i of the file orig: a byte
// of a page before its last non-zero one (bbolt zeroes the rest), or one
// in 64 of the others, to check that.
func readable(orig []byte, i int) bool {
	return i%64 == 0 || bytes.IndexFunc(orig[i:(i/pageSize+1)*pageSize], func(r rune) bool { return r != 0 }) >= 0
}

// storeOptions are the bbolt options store's partition files of format 1
// were written with: no stored freelist (later ones sync it).
func storeOptions() *bolt.Options {
	return &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType}
}

// TestOpen_EveryByte flips, in turn, bytes of a bbolt file: Open and a walk
// never panic, and every failure is ErrCorrupt naming the file. In the tiny
// file every byte that bbolt may read is inverted; in the tiny file without
// a stored freelist every such byte has its low bit flipped; in the small
// one (branch and overflow pages) the header and first element of each
// page that bbolt may read are inverted.
// (Every byte of the small file, 72,000 flips, passes too, in about 75 s.)
func TestOpen_EveryByte(t *testing.T) {
	for _, tt := range []struct {
		name  string
		opts  *bolt.Options
		size  dbSize
		masks []byte
		flip  func(orig []byte, i int) bool
	}{
		{"Tiny", nil, tiny, []byte{0xff}, readable},
		// As store opens partition files: bbolt then walks the whole file
		// at Open, and reports damage by a panic in a goroutine of its own.
		{"TinyNoFreelistSync", storeOptions(), tiny, []byte{0x01}, readable},
		{"Small", nil, small, []byte{0xff}, func(orig []byte, i int) bool {
			return i%pageSize < 32 && readable(orig, i)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			orig := makeDB(t, tt.opts, tt.size)
			dir := t.TempDir()
			opts := &bolt.Options{NoSync: true} // the walk's Update need not reach the disk
			if tt.opts != nil {
				o := *tt.opts
				o.NoSync = true
				opts = &o
			}
			start := time.Now()
			var opened, refused int
			for i := range orig {
				if !tt.flip(orig, i) {
					continue
				}
				for _, mask := range tt.masks {
					d := bytes.Clone(orig)
					d[i] ^= mask
					err, panicked := outcome(t, dir, d, opts)
					if panicked != nil {
						t.Fatalf("byte %d ^ %#x (page %d, offset %d): %v", i, mask, i/pageSize, i%pageSize, panicked)
					}
					if err != nil {
						if !errors.Is(err, boltsafe.ErrCorrupt) {
							t.Fatalf("byte %d ^ %#x (page %d, offset %d): %v, want ErrCorrupt", i, mask, i/pageSize, i%pageSize, err)
						}
						refused++
					} else {
						opened++
					}
				}
			}
			t.Logf("%d-byte file, %d flips in %v: %d opened, %d refused", len(orig), opened+refused, time.Since(start), opened, refused)
		})
	}
}

// TestCheck checks a whole file, intact and damaged, without opening it
// for writing.
func TestCheck(t *testing.T) {
	orig := makeDB(t, nil, small)
	path := filepath.Join(t.TempDir(), "test.db")
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := boltsafe.Check(path, nil); err != nil {
		t.Fatalf("Check(intact) = %v", err)
	}
	// A leaf page of bucket "a", deep below the root: Check finds it.
	for p := 2; p < len(orig)/pageSize; p++ {
		if pageFlags(orig, p) != 0x02 || !bytes.Contains(orig[p*pageSize:(p+1)*pageSize], []byte("key-")) {
			continue
		}
		d := flip(bytes.Clone(orig), p*pageSize+16, p*pageSize+20)
		if err := os.WriteFile(path, d, 0o600); err != nil {
			t.Fatal(err)
		}
		err := boltsafe.Check(path, nil)
		if !errors.Is(err, boltsafe.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Fatalf("Check(page %d damaged) = %v, want ErrCorrupt naming %s", p, err, path)
		}
		return
	}
	t.Fatal("no leaf page of bucket a found")
}

// newDB opens a new bbolt file through boltsafe, closed when the test ends.
func newDB(t testing.TB) *bolt.DB {
	t.Helper()
	db, err := boltsafe.Open(filepath.Join(t.TempDir(), "test.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

// TestOpen_Locked: the check waits for the file lock, like bbolt, and gives
// up after opts.Timeout with bbolt's timeout error, not ErrCorrupt.
func TestOpen_Locked(t *testing.T) {
	db := newDB(t)
	_, err := boltsafe.Open(db.Path(), &bolt.Options{Timeout: 50 * time.Millisecond})
	if err == nil || errors.Is(err, boltsafe.ErrCorrupt) {
		t.Fatalf("second Open = %v, want bbolt's timeout", err)
	}
}

// TestView_Panics: a panic of bbolt becomes ErrCorrupt; a panic of the
// caller's own function is not hidden.
func TestView_Panics(t *testing.T) {
	db := newDB(t)
	path := db.Path()

	t.Run("Bolt", func(t *testing.T) {
		// bbolt panics on a managed transaction's Rollback.
		err := boltsafe.View(db, func(tx *bolt.Tx) error { return tx.Rollback() })
		if !errors.Is(err, boltsafe.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Fatalf("View = %v, want ErrCorrupt naming %s", err, path)
		}
		err = boltsafe.Update(db, func(tx *bolt.Tx) error { return tx.Commit() })
		if !errors.Is(err, boltsafe.ErrCorrupt) {
			t.Fatalf("Update = %v, want ErrCorrupt", err)
		}
		// The DB still works after the contained panics.
		if err := boltsafe.Update(db, func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("x")); return err }); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Caller", func(t *testing.T) {
		defer func() {
			if r := recover(); r != "mine" {
				t.Fatalf("recovered %v, want the caller's own panic", r)
			}
		}()
		boltsafe.View(db, func(*bolt.Tx) error { panic("mine") })
		t.Fatal("View returned")
	})
	t.Run("Errors", func(t *testing.T) {
		mine := errors.New("mine")
		if err := boltsafe.View(db, func(*bolt.Tx) error { return mine }); err != mine {
			t.Fatalf("View = %v, want fn's error as is", err)
		}
		if err := boltsafe.Update(db, func(*bolt.Tx) error { return mine }); err != mine {
			t.Fatalf("Update = %v, want fn's error as is", err)
		}
	})
}

// FuzzOpen opens mutations of a small bbolt file: never a panic, and every
// error of Open or of a walk is ErrCorrupt.
func FuzzOpen(f *testing.F) {
	f.Add(makeDB(f, nil, tiny))
	f.Add(makeDB(f, &bolt.Options{NoFreelistSync: true}, tiny))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return // a new database
		}
		// A directory of its own: an input whose bolt.Open panicked after
		// the check leaks the file's lock (see the package doc), and the
		// next input on the same path would wait for it forever.
		err, panicked := outcome(t, t.TempDir(), data, nil)
		if panicked != nil {
			t.Fatal(panicked)
		}
		if err != nil && !errors.Is(err, boltsafe.ErrCorrupt) {
			t.Fatalf("%v, want ErrCorrupt", err)
		}
	})
}
