package store_test

// Records a stream keeps in the WAL by location (AppendRecord, Retain,
// ReadRecord, Release): read back across restarts, and segments deleted
// only once nothing in them is needed.

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// openRecordWAL opens the WAL in /wal of mfs.
func openRecordWAL(t testing.TB, mfs *memfs.FS, segSize int64) *store.WAL {
	t.Helper()
	w, err := store.OpenWAL("/wal", store.WALOptions{FS: mfs, SegmentSize: segSize})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// appendRecord appends payload as a record of stream and waits until it
// is synced.
func appendRecord(t testing.TB, w *store.WAL, stream string, payload []byte) store.WALRecord {
	t.Helper()
	type done struct {
		r   store.WALRecord
		err error
	}
	ch := make(chan done, 1)
	w.AppendRecord(stream, payload, func(r store.WALRecord, err error) { ch <- done{r, err} })
	d := <-ch
	if d.err != nil {
		t.Fatal(d.err)
	}
	return d.r
}

// appendPlain appends payload as a record of stream that is not kept by
// location (a partition's), and waits until it is synced.
func appendPlain(t testing.TB, w *store.WAL, stream string, payload []byte) {
	t.Helper()
	ch := make(chan error, 1)
	w.Append(stream, payload, func(_ uint64, err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
}

// readBack checks that each record reads as its payload.
func readBack(t testing.TB, w *store.WAL, recs []store.WALRecord, payloads [][]byte) {
	t.Helper()
	if len(recs) != len(payloads) {
		t.Fatalf("%d records, want %d", len(recs), len(payloads))
	}
	var buf []byte
	for i, r := range recs {
		p, err := w.ReadRecord(r, buf)
		if err != nil {
			t.Fatalf("record %d (%+v): %v", i, r, err)
		}
		if !bytes.Equal(p, payloads[i]) {
			t.Fatalf("record %d reads %q, want %q", i, p, payloads[i])
		}
		buf = p
	}
}

func segName(seg uint64) string { return fmt.Sprintf("/wal/%016x.wal", seg) }

// wantSegment fails t unless segment seg is in mfs exactly when want.
func wantSegment(t testing.TB, mfs *memfs.FS, seg uint64, want bool, what string) {
	t.Helper()
	if got := slices.Contains(mfs.Names(".wal"), segName(seg)); got != want {
		t.Fatalf("%s: segment %d there: %v, want %v (segments: %v)", what, seg, got, want, mfs.Names(".wal"))
	}
}

// TestWAL_RecordRestart: records kept by location read back in this run
// (from the segment being written), after a restart (retained in log
// order, at the same places, before and after FinishRecovery), and are
// gone once released.
func TestWAL_RecordRestart(t *testing.T) {
	mfs := memfs.New()
	w := openRecordWAL(t, mfs, 0)
	payloads := [][]byte{[]byte("first"), {}, bytes.Repeat([]byte{0xa5}, 5000), []byte("last")}
	var recs []store.WALRecord
	for i, p := range payloads {
		recs = append(recs, appendRecord(t, w, "g", p))
		if i == 1 {
			appendPlain(t, w, "t/0", []byte("a partition's record between"))
		}
	}
	readBack(t, w, recs, payloads)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	w = openRecordWAL(t, mfs, 0)
	got, err := w.Retain("g")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, recs) {
		t.Fatalf("retained %+v, want %+v", got, recs)
	}
	readBack(t, w, got, payloads)
	if err := w.FinishRecovery(); err != nil {
		t.Fatal(err)
	}
	readBack(t, w, got, payloads)
	for _, r := range got {
		w.Release(r)
	}
	wantSegment(t, mfs, recs[0].Seg, false, "every record in it released")
	if _, err := w.ReadRecord(recs[0], nil); err == nil {
		t.Error("a record of a deleted segment read")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	w = openRecordWAL(t, mfs, 0)
	defer w.Close()
	if got, err := w.Retain("g"); err != nil || len(got) != 0 {
		t.Fatalf("after release and a restart: retained %+v, %v", got, err)
	}
}

// TestWAL_RetainTwice: a stream retains its records once; a second Retain
// would count every record twice.
func TestWAL_RetainTwice(t *testing.T) {
	mfs := memfs.New()
	w := openRecordWAL(t, mfs, 0)
	appendRecord(t, w, "g", []byte("x"))
	w.Close()
	w = openRecordWAL(t, mfs, 0)
	defer w.Close()
	for _, stream := range []string{"g", "empty"} {
		if _, err := w.Retain(stream); err != nil {
			t.Fatalf("Retain(%q): %v", stream, err)
		}
		if _, err := w.Retain(stream); err == nil {
			t.Fatalf("Retain(%q) twice", stream)
		}
	}
}

// TestWAL_ReleaseBeforeFinishRecovery: a segment of the previous run whose
// kept records are all released before FinishRecovery stays until then:
// another stream (a partition) may not have recovered from it yet.
func TestWAL_ReleaseBeforeFinishRecovery(t *testing.T) {
	mfs := memfs.New()
	w := openRecordWAL(t, mfs, 0)
	r := appendRecord(t, w, "g", []byte("kept"))
	appendPlain(t, w, "t/0", []byte("the partition's"))
	w.Close()

	w = openRecordWAL(t, mfs, 0)
	defer w.Close()
	recs, err := w.Retain("g")
	if err != nil || len(recs) != 1 || recs[0] != r {
		t.Fatalf("retained %+v, %v", recs, err)
	}
	w.Release(recs[0])
	wantSegment(t, mfs, r.Seg, true, "its records released before FinishRecovery")
	var got []string
	if err := w.Recover("t/0", 0, func(rec []byte) error { got = append(got, string(rec)); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"the partition's"}) {
		t.Fatalf("the partition recovered %q", got)
	}
	if err := w.FinishRecovery(); err != nil {
		t.Fatal(err)
	}
	wantSegment(t, mfs, r.Seg, false, "its records released, after FinishRecovery")
}

// TestWAL_FinishRecoveryDeletesUnretained: at FinishRecovery, segments of
// the previous run that hold only records no stream retained are deleted;
// one holding a retained record stays until that record is released.
func TestWAL_FinishRecoveryDeletesUnretained(t *testing.T) {
	mfs := memfs.New()
	w := openRecordWAL(t, mfs, 4<<10)
	big := bytes.Repeat([]byte{1}, 5000) // each fills a segment
	kept := appendRecord(t, w, "g", big)
	dead := appendRecord(t, w, "g", big)
	other := appendRecord(t, w, "h", big) // nobody retains h
	w.Release(dead)
	wantSegment(t, mfs, dead.Seg, false, "its only record released, in the run that wrote it")
	w.Close()
	if kept.Seg == other.Seg {
		t.Fatalf("records of g and h in one segment, %d", kept.Seg)
	}
	wantSegment(t, mfs, other.Seg, true, "holding a record of h, before a restart")

	w = openRecordWAL(t, mfs, 4<<10)
	defer w.Close()
	recs, err := w.Retain("g")
	if err != nil || !slices.Equal(recs, []store.WALRecord{kept}) {
		t.Fatalf("retained %+v, %v; want %+v", recs, err, kept)
	}
	if err := w.FinishRecovery(); err != nil {
		t.Fatal(err)
	}
	wantSegment(t, mfs, other.Seg, false, "holding only records nobody retained, after FinishRecovery")
	wantSegment(t, mfs, kept.Seg, true, "holding a retained record, after FinishRecovery")
	readBack(t, w, recs, [][]byte{big})
	w.Release(kept)
	wantSegment(t, mfs, kept.Seg, false, "its retained record released")
}

// TestWAL_ReleaseDeletesSegment: a segment is deleted once every record
// in it is released and it is no longer the one being written, and not
// before.
func TestWAL_ReleaseDeletesSegment(t *testing.T) {
	mfs := memfs.New()
	w := openRecordWAL(t, mfs, 4<<10)
	defer w.Close()
	a := appendRecord(t, w, "g", []byte("a"))
	b := appendRecord(t, w, "g", []byte("b"))
	w.Release(a)
	w.Release(b)
	wantSegment(t, mfs, a.Seg, true, "being written, its records released")
	c := appendRecord(t, w, "g", bytes.Repeat([]byte{2}, 5000)) // fills it
	d := appendRecord(t, w, "g", []byte("d"))
	if c.Seg != a.Seg || d.Seg == c.Seg {
		t.Fatalf("records in segments %d, %d, %d", a.Seg, c.Seg, d.Seg)
	}
	wantSegment(t, mfs, c.Seg, true, "full, a record in it")
	readBack(t, w, []store.WALRecord{c, d}, [][]byte{bytes.Repeat([]byte{2}, 5000), []byte("d")})
	w.Release(c)
	wantSegment(t, mfs, c.Seg, false, "full, its records released")
	wantSegment(t, mfs, d.Seg, true, "being written")
}

// TestWAL_ReadRecordDamaged: a kept record whose bytes changed reads as
// ErrCorrupt, never as other bytes: damaged in a running WAL, each byte
// of its frame in turn, and damaged between restarts (then OpenWAL
// refuses the segment).
func TestWAL_ReadRecordDamaged(t *testing.T) {
	mfs := memfs.New()
	w := openRecordWAL(t, mfs, 0)
	payload := []byte("the record under damage")
	r := appendRecord(t, w, "g", payload)
	appendRecord(t, w, "g", []byte("a later write"))
	w.Close()
	name := segName(r.Seg)
	orig := mfs.Bytes(name)
	flip := func(at int64) {
		b := bytes.Clone(orig)
		b[at] ^= 0x10
		mfs.SetBytes(name, b)
	}
	// Every byte of the frame; under the race detector, which slows each
	// reopen most, the first and last of each field.
	var bytesOf []int64
	for at := r.Off; at < r.Off+int64(r.N); at++ {
		if k := at - r.Off; !raceEnabled || slices.Contains([]int64{0, 3, 4, 7, 8, 9, 10, 11, 12, int64(r.N) - 1}, k) {
			bytesOf = append(bytesOf, at)
		}
	}

	t.Run("Running", func(t *testing.T) {
		w := openRecordWAL(t, mfs, 0)
		defer w.Close()
		recs, err := w.Retain("g")
		if err != nil || len(recs) != 2 || recs[0] != r {
			t.Fatalf("retained %+v, %v", recs, err)
		}
		for _, at := range bytesOf {
			flip(at)
			p, err := w.ReadRecord(r, nil)
			if !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("byte %d of the frame damaged: read %q, %v", at-r.Off, p, err)
			}
		}
		mfs.SetBytes(name, orig)
		readBack(t, w, recs[:1], [][]byte{payload})
		if _, err := w.ReadRecord(store.WALRecord{Seg: r.Seg, Off: r.Off, N: 3}, nil); err == nil {
			t.Error("a record of 3 bytes read")
		}
	})
	t.Run("Restart", func(t *testing.T) {
		for _, at := range bytesOf {
			flip(at)
			w, err := store.OpenWAL("/wal", store.WALOptions{FS: mfs})
			if err == nil {
				recs, _ := w.Retain("g")
				var got [][]byte
				for _, rec := range recs {
					p, err := w.ReadRecord(rec, nil)
					got = append(got, p)
					if err != nil {
						break
					}
				}
				w.Close()
				t.Errorf("byte %d of the frame damaged: opened, %d records retained, reading %q", at-r.Off, len(recs), got)
			} else if !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("byte %d of the frame damaged: %v", at-r.Off, err)
			}
		}
		mfs.SetBytes(name, orig)
	})
}

// TestWAL_RecordSyncedDespiteInterval: a kept record is durable when its
// done is called even when the WAL acknowledges other records before their
// sync (SyncInterval): a raft log's StoreLogs must not return before the
// fsync, whatever the node's sync option. A power loss right after done
// keeps it; the interval's plain records may go.
func TestWAL_RecordSyncedDespiteInterval(t *testing.T) {
	mfs := memfs.New()
	w, err := store.OpenWAL("/wal", store.WALOptions{FS: mfs, SyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	appendPlain(t, w, "p", []byte("plain"))
	// The segment's pre-allocator syncs the file as it extends it, after
	// the first write: let it finish, so that only the WAL's own sync can
	// cover the record.
	time.Sleep(200 * time.Millisecond)
	r := appendRecord(t, w, "raft", []byte("kept"))
	img := mfs.Image(true, nil) // a power loss: only what was synced
	w.Close()
	w2, err := store.OpenWAL("/wal", store.WALOptions{FS: img})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	recs, err := w2.Retain("raft")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("after a power loss: %d kept records, want 1 (written at %+v)", len(recs), r)
	}
	got, err := w2.ReadRecord(recs[0], nil)
	if err != nil || string(got) != "kept" {
		t.Fatalf("ReadRecord: %q, %v", got, err)
	}
}
