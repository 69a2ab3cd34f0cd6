package store_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// TestWAL_TruncatedSegment: a segment cut below its last synced record (at
// a frame boundary, inside a frame, just after its header) lost acked
// records: Open reports ErrCorrupt instead of replaying fewer of them as if
// the rest were a torn tail.
func TestWAL_TruncatedSegment(t *testing.T) {
	crash := crashedWithTen(t)
	segs := segments(t, crash)
	seg := segs[len(segs)-1]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	off, frames := walFrameStarts(b)
	last := frames[len(frames)-2] // the last record; the seal follows it
	cuts := map[string]int{
		"AfterHeader":    16,
		"FrameBoundary":  last,
		"InsideRecord":   last + 10,
		"InsideFrameLen": last + 2,
		"AfterLastFrame": off, // the seal's end, no room for the zeros after
	}
	for name, at := range cuts {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, crash, dir)
			if err := os.Truncate(dir+seg[len(crash):], int64(at)); err != nil {
				t.Fatal(err)
			}
			n, err := openWALNode(t, dir)
			if !errors.Is(err, store.ErrCorrupt) {
				got := "an error"
				if err == nil {
					bodies, _ := readAll(t, n.p)
					got = fmt.Sprintf("%d of 10 records", len(bodies))
				}
				t.Fatalf("open after a cut at %d: %s (%v), want ErrCorrupt", at, got, err)
			}
		})
	}
}

// TestWAL_DamagedSalt: a flipped bit in the salt of the newest segment's
// header makes every write header in it look foreign; that is damage, not a
// torn tail at the first write.
func TestWAL_DamagedSalt(t *testing.T) {
	crash := crashedWithTen(t)
	segs := segments(t, crash)
	seg := segs[len(segs)-1]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[12] ^= 0x10
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := openWALNode(t, crash)
	if !errors.Is(err, store.ErrCorrupt) {
		got := "an error"
		if err == nil {
			bodies, _ := readAll(t, n.p)
			got = fmt.Sprintf("%d of 10 records", len(bodies))
		}
		t.Fatalf("open with a damaged salt: %s (%v), want ErrCorrupt", got, err)
	}
}

// TestWAL_TornTailReopened: a torn tail is cut by zeroing it, so the
// segment keeps a size the writer synced: opened again before recovery
// finished (a crash during it), it is an older segment that reads clean.
func TestWAL_TornTailReopened(t *testing.T) {
	crash := crashedWithTen(t)
	segs := segments(t, crash)
	seg := segs[len(segs)-1]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	_, frames := walFrameStarts(b)
	last := frames[len(frames)-2]
	clear(b[last+20:]) // the last record and its seal written in part
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := store.OpenWAL(crash+"/wal", store.WALOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil { // recovery never finished
		t.Fatal(err)
	}
	n := mustWALNode(t, crash)
	bodies, _ := readAll(t, n.p)
	equal(t, "replayed", len(bodies), 9)
}

// walFrameStarts returns where a segment's frames end and where each starts.
func walFrameStarts(b []byte) (end int, starts []int) {
	off := 16
	for off+8 <= len(b) {
		l := int(binary.BigEndian.Uint32(b[off:]))
		if l == 0 || off+8+l > len(b) {
			break
		}
		starts = append(starts, off)
		off += 8 + l
	}
	return off, starts
}

// TestWAL_DamagedVersion: a bit flipped in the version byte of a segment's
// magic is a bad header, never an older format read by that format's
// rules (format 1 would find no records in it, and drop them).
func TestWAL_DamagedVersion(t *testing.T) {
	crash := crashedWithTen(t)
	for bit := range 8 {
		t.Run(fmt.Sprint(bit), func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, crash, dir)
			segs := segments(t, dir)
			seg := segs[len(segs)-1]
			b, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			b[7] ^= 1 << bit
			if err := os.WriteFile(seg, b, 0o600); err != nil {
				t.Fatal(err)
			}
			n, err := openWALNode(t, dir)
			if !errors.Is(err, store.ErrCorrupt) {
				got := "an error"
				if err == nil {
					bodies, _ := readAll(t, n.p)
					got = fmt.Sprintf("%d of 10 records", len(bodies))
				}
				t.Fatalf("open with version byte %#x: %s (%v), want ErrCorrupt", b[7], got, err)
			}
		})
	}
}

// TestOpen_DamagedFormatVersion: a partition file's format version that no
// release writes (a flipped high bit, as a trial found: 0000200000000002)
// is damage, ErrCorrupt; a plausible newer one stays ErrFormat.
func TestOpen_DamagedFormatVersion(t *testing.T) {
	for _, tt := range []struct {
		name    string
		version []byte
		want    error
	}{
		{"HighBit", []byte{0, 0, 0x20, 0, 0, 0, 0, 2}, store.ErrCorrupt},
		{"Zero", make([]byte, 8), store.ErrCorrupt},
		{"Short", []byte{2}, store.ErrCorrupt},
		{"Newer", []byte{0, 0, 0, 0, 0, 0, 0, 3}, store.ErrFormat},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "0.db")
			p, err := store.Open(path, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("meta")).Put([]byte("version"), tt.version)
			})
			if cerr := db.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			p, err = store.Open(path, store.Options{})
			if err == nil {
				p.Close()
			}
			if !errors.Is(err, tt.want) || tt.want == store.ErrFormat && errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Open with version %x: %v, want %v", tt.version, err, tt.want)
			}
		})
	}
}
