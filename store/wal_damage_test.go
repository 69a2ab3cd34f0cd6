package store_test

import (
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
	seg, b := newestSegment(t, crash)
	fr := walFrames(t, b)
	rec := fr[len(fr)-1] // the last record; the seal follows it
	last := int(rec.off)
	cuts := map[string]int{
		"AfterHeader":    16,
		"FrameBoundary":  last,
		"InsideRecord":   last + 10,
		"InsideFrameLen": last + 2,
		"AfterLastFrame": last + 8 + len(rec.body) + sealLen, // the seal's end, no room for the zeros after
	}
	for name, at := range cuts {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, crash, dir)
			if err := os.Truncate(dir+seg[len(crash):], int64(at)); err != nil {
				t.Fatal(err)
			}
			wantCorruptOpen(t, dir, fmt.Sprintf("a cut at %d", at))
		})
	}
}

// newestSegment returns the path and the bytes of the newest WAL segment
// of the node in dir.
func newestSegment(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	segs := segments(t, dir)
	seg := segs[len(segs)-1]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	return seg, b
}

// damageNewest applies damage to the newest WAL segment of the node in dir.
func damageNewest(t *testing.T, dir string, damage func(b []byte)) {
	t.Helper()
	seg, b := newestSegment(t, dir)
	damage(b)
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// wantCorruptOpen opens the node in dir (of crashedWithTen), which must
// fail with ErrCorrupt; what says what was done to it.
func wantCorruptOpen(t *testing.T, dir, what string) {
	t.Helper()
	n, err := openWALNode(t, dir)
	if errors.Is(err, store.ErrCorrupt) {
		return
	}
	got := "an error"
	if err == nil {
		bodies, _ := readAll(t, n.p)
		got = fmt.Sprintf("%d of 10 records", len(bodies))
	}
	t.Fatalf("open after %s: %s (%v), want ErrCorrupt", what, got, err)
}

// TestWAL_DamagedSalt: a flipped bit in the salt of the newest segment's
// header makes every write header in it look foreign; that is damage, not a
// torn tail at the first write.
func TestWAL_DamagedSalt(t *testing.T) {
	crash := crashedWithTen(t)
	damageNewest(t, crash, func(b []byte) { b[12] ^= 0x10 })
	wantCorruptOpen(t, crash, "a damaged salt")
}

// TestWAL_TornTailReopened: a torn tail is cut by zeroing it, so the
// segment keeps a size the writer synced: opened again before recovery
// finished (a crash during it), it is an older segment that reads clean.
func TestWAL_TornTailReopened(t *testing.T) {
	crash := crashedWithTen(t)
	damageNewest(t, crash, func(b []byte) {
		fr := walFrames(t, b)
		clear(b[fr[len(fr)-1].off+20:]) // the last record and its seal written in part
	})
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

// TestWAL_DamagedVersion: a bit flipped in the version byte of a segment's
// magic is a bad header, never an older format read by that format's
// rules (format 1 would find no records in it, and drop them).
func TestWAL_DamagedVersion(t *testing.T) {
	crash := crashedWithTen(t)
	for bit := range 8 {
		t.Run(fmt.Sprint(bit), func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, crash, dir)
			damageNewest(t, dir, func(b []byte) { b[7] ^= 1 << bit })
			wantCorruptOpen(t, dir, fmt.Sprintf("flipping bit %d of the version byte", bit))
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
		{"Newer", be64(store.FormatVersion + 1), store.ErrFormat},
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

// TestWAL_DamagedSaltAndFirstFrame: the header's salt and the first write
// header both damaged (a CI corruption trial found it). No intact write
// header ever checks the salt, and the later ones, with the true salt, must
// still say the segment was synced past the first frame: ErrCorrupt, never
// every record cut as a torn tail.
func TestWAL_DamagedSaltAndFirstFrame(t *testing.T) {
	crash := crashedWithTen(t)
	damageNewest(t, crash, func(b []byte) {
		b[13] ^= 0x10 // the salt
		b[17] ^= 0x04 // the first frame's length
	})
	wantCorruptOpen(t, crash, "a damaged salt and first frame")
}
