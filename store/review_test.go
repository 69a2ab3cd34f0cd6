package store_test

// Regression tests of the second review of the write-ahead log (issue 8):
// each is a defect found by attacking the WAL's promises.

import (
	"errors"
	"strings"
	"testing"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// appendWait appends payload to stream of w and waits for its answer.
func appendWait(t testing.TB, w *store.WAL, stream string, payload []byte) {
	t.Helper()
	done := make(chan error, 1)
	w.Append(stream, payload, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatalf("append: %v", err)
	}
}

// recoverAll returns the records of stream that w recovered.
func recoverAll(t testing.TB, w *store.WAL, stream string) [][]byte {
	t.Helper()
	var out [][]byte
	if err := w.Recover(stream, 0, func(rec []byte) error {
		out = append(out, append([]byte(nil), rec...))
		return nil
	}); err != nil {
		t.Fatalf("recover: %v", err)
	}
	return out
}

// TestReview_LargeWriteSealed: a write larger than half a chunk past the
// zeros allocated ahead ends exactly at the new end of the file, where the
// seal did not fit: it was skipped, and damage in that acknowledged write,
// after a clean Close, read as a torn tail and was cut without an error.
func TestReview_LargeWriteSealed(t *testing.T) {
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

// TestReview_WALDirDurable: OpenWAL created its directory and synced the
// entries in it, never the directory's own entry in its parent: a power
// loss could take the directory, and every acknowledged record with it.
func TestReview_WALDirDurable(t *testing.T) {
	mfs := memfs.New()
	w, err := store.OpenWAL("/node/wal", store.WALOptions{FS: mfs})
	if err != nil {
		t.Fatal(err)
	}
	appendWait(t, w, "s", []byte("acked"))
	img := mfs.Image(true, nil) // a power loss: only what was synced
	w.Close()
	w2, err := store.OpenWAL("/node/wal", store.WALOptions{FS: img})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if recs := recoverAll(t, w2, "s"); len(recs) != 1 || string(recs[0]) != "acked" {
		t.Fatalf("after a power loss the WAL holds %q, want the acknowledged record", recs)
	}
}

// TestReview_DamagedSalt: a damaged byte in the salt of the newest
// segment's header made every write header of the segment look foreign:
// the whole segment, acknowledged records and all, was cut as a torn tail.
func TestReview_DamagedSalt(t *testing.T) {
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
