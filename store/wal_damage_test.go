package store_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/memfs"
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
// release writes (a flipped high bit, such as 0000200000000002)
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
// header both damaged. No intact write
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

// TestWAL_DamageEverywhere flips each byte (sampled) of a crash image's
// segment before its last write: Open reports ErrCorrupt naming the
// segment, or (for a byte the records do not cover) opens with every acked
// message; never a panic, never a silent loss.
func TestWAL_DamageEverywhere(t *testing.T) {
	clean := crashImage(t, 12, func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 100+i*40) })
	seg := segments(t, clean)[0]
	orig, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	fr := walFrames(t, orig)
	lastWrite := fr[len(fr)-2].off
	recEnd := fr[len(fr)-1].off + 8 + int64(len(fr[len(fr)-1].body))
	var offs []int64
	for o := int64(0); o < lastWrite; o += 31 {
		offs = append(offs, o)
	}
	offs = append(offs, recEnd, recEnd+3, recEnd+4096, int64(len(orig))-1) // the zero area
	var corrupt, fine int
	for _, o := range offs {
		dir := t.TempDir()
		copyDir(t, clean, dir)
		b := bytes.Clone(orig)
		b[o] ^= 0x40
		s := filepath.Join(dir, "wal", filepath.Base(seg))
		if err := os.WriteFile(s, b, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := openWALNode(t, dir)
		if err != nil {
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), s) {
				t.Fatalf("flip at %d: %v, want ErrCorrupt naming %s", o, err, s)
			}
			corrupt++
			continue
		}
		bodies, _ := readAll(t, r.p)
		if len(bodies) != 12 {
			t.Fatalf("flip at %d (records end at %d): opened with %d of 12 acked messages", o, recEnd, len(bodies))
		}
		r.close(t)
		fine++
	}
	t.Logf("%d flips: %d ErrCorrupt, %d harmless", len(offs), corrupt, fine)
}

// TestWAL_LastWriteFlipIsCorrupt: damaged bytes anywhere give ErrCorrupt,
// never a silent cut of acked data, also one flipped byte inside the last
// write of the newest segment, a write that was synced and acknowledged. A
// tear over the zero-filled segment leaves whole zero sectors (or a short
// file); a frame with no zero sector that fails its CRC is damage. This
// broke when scan() took such a write for a torn tail and cut it: the
// acked message was silently gone.
func TestWAL_LastWriteFlipIsCorrupt(t *testing.T) {
	for _, where := range []string{"RecordBody", "RecordCRC", "WriteHeader"} {
		t.Run(where, func(t *testing.T) {
			crash := crashImage(t, 10, nil)
			seg := segments(t, crash)[0]
			b, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			fr := walFrames(t, b)
			last, hdr := fr[len(fr)-1], fr[len(fr)-2]
			if last.write || !hdr.write {
				t.Fatalf("unexpected layout: %+v", fr[len(fr)-2:])
			}
			switch where {
			case "RecordBody":
				b[last.off+8+int64(len(last.body))-3] ^= 0x01
			case "RecordCRC":
				b[last.off+4] ^= 0x01
			case "WriteHeader":
				b[hdr.off+8+2] ^= 0x01 // inside the write number
			}
			if err := os.WriteFile(seg, b, 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := openWALNode(t, crash)
			if errors.Is(err, store.ErrCorrupt) && strings.Contains(err.Error(), seg) {
				return // what the promise asks
			}
			if err != nil {
				t.Fatalf("open: %v, want ErrCorrupt naming %s", err, seg)
			}
			bodies, _ := readAll(t, r.p)
			t.Fatalf("one flipped byte in the last acked write: open succeeded with %d of 10 acked messages (want ErrCorrupt naming the segment)", len(bodies))
		})
	}
}

// forgedWriteHeader is a write header frame, as scan() recognizes one,
// claiming the segment was synced up to synced.
func forgedWriteHeader(synced uint64) []byte {
	body := make([]byte, 17)
	body[0] = 1
	binary.BigEndian.PutUint64(body[1:], 7)
	binary.BigEndian.PutUint64(body[9:], synced)
	fr := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	fr = binary.BigEndian.AppendUint32(fr, crc32.Checksum(body, castagnoliT))
	return append(fr, body...)
}

// TestWAL_TornTailWithHeaderInBodyCut: a torn tail of the WAL, a write
// that was never acked, is cut, also when a message body in it carries
// bytes that look like a write header (any binary payload can; a WAL
// segment shipped through the queue does). This broke when syncedPast()
// searched the raw bytes after a bad frame for anything that looked like a
// write header, payloads included: a genuine torn write became ErrCorrupt,
// and the node did not open after an ordinary power loss.
func TestWAL_TornTailWithHeaderInBodyCut(t *testing.T) {
	const sector = 512
	body := func(i int) []byte {
		if i < 9 {
			return []byte(fmt.Sprint("body-", i))
		}
		b := bytes.Repeat([]byte{'x'}, 3*sector)
		return append(b, forgedWriteHeader(1<<40)...)
	}
	crash := crashImage(t, 10, body)
	seg := segments(t, crash)[0]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	fr := walFrames(t, b)
	hdr := fr[len(fr)-2] // the header of the last write: the torn one
	if !hdr.write {
		t.Fatalf("unexpected layout")
	}
	forged := bytes.LastIndex(b, forgedWriteHeader(1<<40))
	// Power loss during the last write's sync: the sectors from the write's
	// start to the one holding the forged bytes never reached the disk
	// (they read as the zeros allocated ahead); the later ones did.
	keepFrom := int64(forged) / sector * sector
	clear(b[hdr.off:keepFrom])
	// Nor did the seal, which is written only once the sync returned.
	last := fr[len(fr)-1]
	sealAt := last.off + 8 + int64(len(last.body))
	clear(b[sealAt : sealAt+8+25])
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := openWALNode(t, crash)
	if err != nil {
		t.Fatalf("open after a torn, never acknowledged last write: %v (want the tail cut)", err)
	}
	bodies, _ := readAll(t, r.p)
	equal(t, "replayed", len(bodies), 9)
}

// TestWAL_LargeWriteSealed: a write larger than half a chunk past the
// zeros allocated ahead ends exactly at the new end of the file, and is
// sealed there too: damage in that acknowledged write, after a clean
// Close, is ErrCorrupt. This broke when the seal did not fit and was
// skipped: the damage read as a torn tail and was cut without an error.
func TestWAL_LargeWriteSealed(t *testing.T) {
	for i := range 5 {
		mfs := memfs.New()
		w, err := store.OpenWAL("/wal", store.WALOptions{FS: mfs})
		if err != nil {
			t.Fatal(err)
		}
		big := make([]byte, 7<<20)
		for j := range big {
			big[j] = byte(j%251 + 1)
		}
		appendWait(t, w, "s", big)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		names := mfs.Names(".wal")
		seg := names[len(names)-1]
		b := mfs.Bytes(seg)
		b[len(b)/2] ^= 0x40 // inside the record
		mfs.SetBytes(seg, b)
		w2, err := store.OpenWAL("/wal", store.WALOptions{FS: mfs})
		if err == nil {
			recs := recoverAll(t, w2, "s")
			w2.Close()
			t.Fatalf("attempt %d: a damaged acknowledged record opened without an error (%d records recovered, file %d bytes)", i, len(recs), len(b))
		}
		if !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("attempt %d: %v, want ErrCorrupt", i, err)
		}
	}
}

// TestWAL_DamagedSaltNotCut: a damaged byte in the salt of the newest
// segment's header of a WAL alone (no partition) is ErrCorrupt naming the
// segment. This broke when every write header of the segment then looked
// foreign: the whole segment, acknowledged records and all, was cut as a
// torn tail.
func TestWAL_DamagedSaltNotCut(t *testing.T) {
	mfs := memfs.New()
	w, err := store.OpenWAL("/wal", store.WALOptions{FS: mfs})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		appendWait(t, w, "s", []byte("acked"))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	names := mfs.Names(".wal")
	seg := names[len(names)-1]
	b := mfs.Bytes(seg)
	b[10] ^= 1 // the salt: bytes 8..15
	mfs.SetBytes(seg, b)
	w2, err := store.OpenWAL("/wal", store.WALOptions{FS: mfs})
	if err == nil {
		recs := recoverAll(t, w2, "s")
		w2.Close()
		t.Fatalf("a damaged segment header opened without an error: %d of 3 acknowledged records recovered", len(recs))
	}
	if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), seg) {
		t.Fatalf("%v, want ErrCorrupt naming %s", err, seg)
	}
}
