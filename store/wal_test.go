package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// TestWAL_ReplayRestoresAcks: acked appends that were only logged (the
// materializer stalled) come back at their acked offsets with their dedup
// answers, and a command after them continues the same sequence.
func TestWAL_ReplayRestoresAcks(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	var acks []store.Ack
	for i := range 50 {
		acks = append(acks, appendAt(t, n.p, t0+int64(i), msg(fmt.Sprint(i)), msg(fmt.Sprint(i/2)))...)
	}
	// a group offset is logged (and replayed) like an append
	apply(t, n.p, &store.Command{Op: store.OpCommitOffset, Group: "g2", Offset: 33})
	if st := n.p.Stats(); st.Next != 50 {
		t.Fatalf("acked next = %d, want 50", st.Next)
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)

	r := mustWALNode(t, crash)
	bodies, offsets := readAll(t, r.p)
	if len(bodies) != 50 {
		t.Fatalf("replayed %d messages, want 50", len(bodies))
	}
	for i, a := range acks {
		if a.Duplicate {
			continue
		}
		if offsets[a.Offset] != a.Offset || bodies[a.Offset] != "body-"+fmt.Sprint(i/2) {
			t.Fatalf("ack %d %+v: stored %q at %d", i, a, bodies[a.Offset], offsets[a.Offset])
		}
	}
	if off, ok, _ := r.p.GroupOffset("g2"); !ok || off != 33 {
		t.Fatalf("logged group offset after replay: %d %v", off, ok)
	}
	// Dedup survived: every ID resent is a duplicate at its acked offset.
	for i := range 50 {
		got := appendAt(t, r.p, t0+100, msg(fmt.Sprint(i)))
		if !got[0].Duplicate || got[0].Offset != uint64(i) {
			t.Fatalf("resend of %d after replay: %+v", i, got[0])
		}
	}
	// A synchronous command, then more appends, then a clean reopen.
	apply(t, r.p, &store.Command{Op: store.OpCommitOffset, Group: "g", Offset: 7})
	equal(t, "append after replay", offsetsOf(appendAt(t, r.p, t0+200, msg("new"))), []uint64{50})
	r.close(t)
	r2 := mustWALNode(t, crash)
	bodies, _ = readAll(t, r2.p)
	equal(t, "messages after reopen", len(bodies), 51)
	if off, ok, _ := r2.p.GroupOffset("g"); !ok || off != 7 {
		t.Fatalf("group offset after reopen: %d %v", off, ok)
	}
	// Replaying twice changes nothing: the copy still holds the old segment.
	if len(segments(t, crash)) != 1 {
		t.Fatalf("segments after clean reopen: %v", segments(t, crash))
	}
}

// TestWAL_TornTail: a record written in part, or damaged, at the end of the
// newest segment is an unacknowledged write: replay stops before it and cuts it.
func TestWAL_TornTail(t *testing.T) {
	for _, damage := range []string{"cut", "flip", "garbage"} {
		t.Run(damage, func(t *testing.T) {
			crash := crashedWithTen(t)
			seg, b := newestSegment(t, crash)
			end := len(b)
			for end > 0 && b[end-1] == 0 { // the zeros allocated ahead
				end--
			}
			// The seal after the last write (a write header, 33 bytes)
			// is written once that write is synced: a crash before, as
			// here, leaves none.
			end -= sealLen
			clear(b[end : end+sealLen])
			switch damage {
			case "cut":
				// The record's last bytes never reached the disk: the
				// file keeps its size (the writer synced it before
				// writing), they read as the zeros allocated ahead. A
				// file cut short is TestWAL_TruncatedSegment's.
				clear(b[end-5 : end])
			case "flip":
				b[end-3] ^= 0xff
			case "garbage":
				copy(b[len(b)-100:], "garbage after the zeros: not a record")
			}
			if err := os.WriteFile(seg, b, 0o600); err != nil {
				t.Fatal(err)
			}
			r := mustWALNode(t, crash)
			bodies, _ := readAll(t, r.p)
			want := 9
			if damage == "garbage" {
				want = 10
			}
			equal(t, "replayed", len(bodies), want)
			equal(t, "next append", offsetsOf(appendAt(t, r.p, t0, msg("next"))), []uint64{uint64(want)})
		})
	}
}

// TestWAL_DamageBeforeTail: a damaged record in a segment that is not the
// newest was acknowledged: Open reports it instead of dropping acked data.
func TestWAL_DamageBeforeTail(t *testing.T) {
	crash := crashedWithTen(t)
	seg := segments(t, crash)[0]
	b, _ := os.ReadFile(seg)
	b[20] ^= 0xff // inside the first record
	os.WriteFile(seg, b, 0o600)
	// a newer, empty segment makes the damaged one not the newest
	next := filepath.Join(filepath.Dir(seg), "ffffffffffffff00.wal")
	os.WriteFile(next, []byte("ZZMQWAL\x02saltsalt"), 0o600)
	if _, err := openWALNode(t, crash); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("open with a damaged old segment: %v, want ErrCorrupt", err)
	}
}

// TestWAL_Truncation: segments are deleted once every record in them is
// materialized; what is left replays to the same log.
func TestWAL_Truncation(t *testing.T) {
	dir := t.TempDir()
	w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{SegmentSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var parts []*store.Partition
	for i := range 3 {
		p, err := store.Open(filepath.Join(dir, fmt.Sprintf("%d.db", i)), store.Options{WAL: w, Stream: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, p)
	}
	w.FinishRecovery()
	ctx := context.Background()
	for i := range 600 {
		p := parts[i%3]
		m := msg(fmt.Sprint(i))
		m.Body = make([]byte, 200)
		if _, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{m}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range parts {
		if st := p.Stats(); st.Next != 200 {
			t.Fatalf("next = %d", st.Next)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for w.Segments() > 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d segments left after everything was materialized (%v)", w.Segments(), segments(t, dir))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, p := range parts {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()

	w, err = store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range 3 {
		p, err := store.Open(filepath.Join(dir, fmt.Sprintf("%d.db", i)), store.Options{WAL: w, Stream: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := p.Read(0, 1000, 0, nil)
		if err != nil || len(msgs) != 200 {
			t.Fatalf("partition %d after reopen: %d messages, %v", i, len(msgs), err)
		}
		p.Close()
	}
}

// TestWAL_MixedOrder: synchronous commands between logged appends keep the
// partition's order, live and after replay.
func TestWAL_MixedOrder(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNode(t, dir)
	for i := range 30 {
		appendAt(t, n.p, t0+int64(i)*sec, msg(fmt.Sprint(i)))
		switch i % 10 {
		case 3:
			apply(t, n.p, &store.Command{Op: store.OpCommitOffset, Group: "g", Offset: uint64(i)})
		case 6:
			d := msg(fmt.Sprint("d", i))
			d.DeliverAt = t0 + 1000*sec
			appendAt(t, n.p, t0+int64(i)*sec, d)
		case 9:
			apply(t, n.p, &store.Command{Op: store.OpTrim, Now: t0 + int64(i)*sec, MaxAge: 5 * sec})
		}
	}
	st := n.p.Stats()
	bodies, offsets := readAll(t, n.p)
	n.close(t)
	r := mustWALNode(t, dir)
	equal(t, "stats after reopen", r.p.Stats(), st)
	b2, o2 := readAll(t, r.p)
	equal(t, "bodies", b2, bodies)
	equal(t, "offsets", o2, offsets)
	equal(t, "next", offsetsOf(appendAt(t, r.p, t0+100*sec, msg("x"))), []uint64{st.Next})
}

// TestWAL_OutboxCommitReplay: an outbox commit (OpCommitTx with no half
// messages here) takes the logged path; its repeat in the same run and after
// replay reports the first decision, its messages land at their acked
// offsets, and a rollback arriving later changes nothing.
func TestWAL_OutboxCommitReplay(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	appendAt(t, n.p, t0, msg("plain"))
	c := apply(t, n.p, &store.Command{Op: store.OpCommitTx, Now: t0 + 1, TxID: "tx", Msgs: []store.Message{msg("o1"), msg("o2")}})
	equal(t, "outbox offsets", offsetsOf(c.Acks), []uint64{1, 2})
	again := apply(t, n.p, &store.Command{Op: store.OpCommitTx, Now: t0 + 2, TxID: "tx", Msgs: []store.Message{msg("o3")}})
	if again.Previous != store.Committed || len(again.Acks) != 0 {
		t.Fatalf("repeat while logged: previous %v, acks %+v", again.Previous, again.Acks)
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)

	r := mustWALNode(t, crash)
	bodies, _ := readAll(t, r.p)
	equal(t, "replayed", len(bodies), 3)
	if bodies[1] != "body-o1" || bodies[2] != "body-o2" {
		t.Fatalf("replayed outbox: %q %q", bodies[1], bodies[2])
	}
	if d, err := r.p.Decision("tx"); err != nil || d != store.Committed {
		t.Fatalf("decision after replay: %v %v", d, err)
	}
	rb := apply(t, r.p, &store.Command{Op: store.OpRollbackTx, TxID: "tx"})
	if rb.Previous != store.Committed {
		t.Fatalf("rollback after replay: previous %v", rb.Previous)
	}
	late := apply(t, r.p, &store.Command{Op: store.OpCommitTx, TxID: "tx", Msgs: []store.Message{msg("o4")}})
	if late.Previous != store.Committed || len(late.Acks) != 0 {
		t.Fatalf("repeat after replay: previous %v, acks %+v", late.Previous, late.Acks)
	}
	bodies, _ = readAll(t, r.p)
	equal(t, "after repeats", len(bodies), 3)
}

// TestWAL_ExtendsBoundedAhead: the zero-filling goroutine keeps a segment
// allocated at most a few chunks ahead of its records; a wake-up queued
// while it extended made it extend again, running up to 16 MiB ahead (a full
// disk then failed the WAL that much early).
func TestWAL_ExtendsBoundedAhead(t *testing.T) {
	mfs := memfs.New()
	w, err := store.OpenWAL("/wal", store.WALOptions{FS: mfs, SegmentSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	payload := bytes.Repeat([]byte{7}, 16<<10)
	worst := int64(0)
	for i := range 1200 {
		done := make(chan error, 1)
		w.Append("s", payload, func(_ uint64, err error) { done <- err })
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		written := int64(i+1) * int64(len(payload)+64)
		for _, name := range mfs.Names(".wal") {
			if ahead := mfs.Size(name) - written; ahead > worst {
				worst = ahead
			}
		}
	}
	if limit := int64(3*store.WALChunk + 1<<20); worst > limit {
		t.Fatalf("the segment ran %d MiB ahead of its records, want at most %d", worst>>20, limit>>20)
	}
	t.Logf("at most %.1f MiB ahead", float64(worst)/(1<<20))
}

// TestWAL_TxDelayReplay: transactions interleaved with appends and
// delayed messages, released and trimmed, replayed from a crash image and
// reopened with other options (no stall; SyncInterval): the same log,
// state and decisions.
func TestWAL_TxDelayReplay(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	p := n.p
	for i := range 40 {
		now := t0 + int64(i)*sec
		m := msg(fmt.Sprint(i))
		if i%3 == 0 {
			m.DeliverAt = now + 5*sec
		}
		tx := fmt.Sprint("tx", i/4)
		_, errs, err := p.ApplyBatch(context.Background(), []*store.Command{
			{Op: store.OpAppend, Now: now, Msgs: []store.Message{m}},
			{Op: store.OpPrepare, Now: now, TxID: tx, Msgs: []store.Message{msg(fmt.Sprint("h", i))}},
			{Op: store.OpRelease, Now: now},
			{Op: store.OpAppend, Now: now, Msgs: []store.Message{msg(fmt.Sprint(i - 1))}}, // a dup
		})
		if err != nil {
			t.Fatal(err)
		}
		for j, e := range errs {
			if e != nil && !(j == 1 && errors.Is(e, store.ErrDecided)) {
				t.Fatalf("batch %d cmd %d: %v", i, j, e)
			}
		}
		switch i % 4 {
		case 3:
			apply(t, p, &store.Command{Op: store.OpCommitTx, Now: now, TxID: tx, Msgs: []store.Message{msg(fmt.Sprint("o", i))}})
		case 2:
			if i%8 == 2 {
				apply(t, p, &store.Command{Op: store.OpRollbackTx, Now: now, TxID: tx})
			}
		}
		if i%10 == 9 {
			apply(t, p, &store.Command{Op: store.OpTrim, Now: now, MaxAge: 20 * sec, DedupTTL: 30 * sec})
		}
	}
	st := p.Stats()
	msgs, _ := p.Read(0, 1<<20, 0, nil)
	var halves []store.HalfTx
	p.HalfTxs(func(h store.HalfTx) bool { halves = append(halves, h); return true })
	var decisions []store.Decision
	for i := 0; i < 10; i++ {
		d, err := p.Decision(fmt.Sprint("tx", i))
		if err != nil {
			t.Fatal(err)
		}
		decisions = append(decisions, d)
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	for _, every := range []time.Duration{0, time.Millisecond} {
		d := t.TempDir()
		copyDir(t, crash, d)
		w, err := store.OpenWAL(filepath.Join(d, "wal"), store.WALOptions{SyncInterval: every})
		if err != nil {
			t.Fatal(err)
		}
		r, err := store.Open(filepath.Join(d, "0.db"), store.Options{WAL: w, Stream: "t/0", MaterializeAfter: time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		w.FinishRecovery()
		equal(t, "stats", r.Stats(), st)
		m2, _ := r.Read(0, 1<<20, 0, nil)
		equal(t, "log", fmt.Sprint(m2), fmt.Sprint(msgs))
		var h2 []store.HalfTx
		r.HalfTxs(func(h store.HalfTx) bool { h2 = append(h2, h); return true })
		equal(t, "halves", fmt.Sprint(h2), fmt.Sprint(halves))
		for i := 0; i < 10; i++ {
			d, err := r.Decision(fmt.Sprint("tx", i))
			if err != nil || d != decisions[i] {
				t.Fatalf("decision tx%d: %v %v, want %v", i, d, err, decisions[i])
			}
		}
		r.Close()
		w.Close()
	}
}

// readFailFS fails the first n ReadAt calls on .wal files with EIO.
type readFailFS struct {
	store.OSFS
	left atomic.Int64
}

func (f *readFailFS) OpenFile(name string, flag int, perm os.FileMode) (store.File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &readFailFile{File: file, fs: f}, nil
}

type readFailFile struct {
	store.File
	fs *readFailFS
}

func (f *readFailFile) ReadAt(b []byte, off int64) (int, error) {
	if f.fs.left.Add(-1) >= 0 {
		return 0, syscall.EIO
	}
	return f.File.ReadAt(b, off)
}

// TestWAL_RecoverRetryKeepsRecords: when one read of a replay fails (a
// transient EIO) and the caller retries store.Open on the same WAL, the
// retry replays every record: the partition opens with its acked messages.
// This broke when WAL.Recover deleted the stream's index before reading
// it: the retry replayed nothing, the partition handed the acked messages'
// offsets to new ones, and FinishRecovery deleted the only copy.
func TestWAL_RecoverRetryKeepsRecords(t *testing.T) {
	crash := crashImage(t, 10, nil)
	rf := &readFailFS{}
	w, err := store.OpenWAL(filepath.Join(crash, "wal"), store.WALOptions{FS: rf})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	path := filepath.Join(crash, "0.db")
	rf.left.Store(1) // the next read, Recover's first, fails once
	if _, err := store.Open(path, store.Options{WAL: w, Stream: "t/0"}); err == nil {
		t.Fatal("open with a failing read succeeded")
	}
	p, err := store.Open(path, store.Options{WAL: w, Stream: "t/0"})
	if err != nil {
		return // refusing is fine: nothing lost
	}
	defer p.Close()
	bodies, _ := readAll(t, p)
	if len(bodies) != 10 {
		acks := appendAt(t, p, t0, msg("new"))
		t.Fatalf("retried Open after one failed read: %d of 10 acked messages, and a new send got offset %d (reused)", len(bodies), acks[0].Offset)
	}
}

// TestWAL_StreamReuseSkipsStaleRecords: a stream's records of an earlier
// incarnation of its file (closed, removed with RemoveFile, created again,
// as a deleted and re-created topic would) stay in the current segment;
// after a crash, replay applies the new incarnation's records, never the
// stale ones. This broke when replay applied the stale records (index 1..)
// and skipped the new ones as already applied: the acked messages were
// replaced by the deleted ones at the same offsets.
func TestWAL_StreamReuseSkipsStaleRecords(t *testing.T) {
	dir := t.TempDir()
	w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "0.db")
	p, err := store.Open(path, store.Options{WAL: w, Stream: "t/0"})
	if err != nil {
		t.Fatal(err)
	}
	w.FinishRecovery()
	for i := range 5 {
		appendAt(t, p, t0, msg(fmt.Sprint("old", i)))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.RemoveFile(path); err != nil {
		t.Fatal(err)
	}
	p, err = store.Open(path, store.Options{WAL: w, Stream: "t/0", MaterializeAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		appendAt(t, p, t0, msg(fmt.Sprint("new", i)))
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	p.Close()
	w.Close()

	r, err := openWALNode(t, crash)
	if err != nil {
		if errors.Is(err, store.ErrCorrupt) {
			return // detected: acceptable
		}
		t.Fatal(err)
	}
	bodies, _ := readAll(t, r.p)
	want := []string{"body-new0", "body-new1", "body-new2"}
	if fmt.Sprint(bodies) != fmt.Sprint(want) {
		t.Fatalf("after a crash the re-created partition holds %q, want its acked %q", bodies, want)
	}
}

// TestWAL_DirDurable: OpenWAL syncs the directory it created in its
// parent, as well as the entries in it. This broke when it synced only the
// entries: a power loss could take the directory, and every acknowledged
// record with it.
func TestWAL_DirDurable(t *testing.T) {
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

// TestWAL_RecoveryMemory: opening a WAL holding much more than the
// partition's batches does not read it into memory, and replay applies it
// in bounded batches.
func TestWAL_RecoveryMemory(t *testing.T) {
	const (
		total = 256 << 20
		body  = 256 << 10
	)
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, store.Options{MaterializeAfter: time.Hour, MaxPendingBytes: 8 * total}) // no materialization before the copy
	b := bytes.Repeat([]byte("x"), body)
	for i := range total / body {
		m := msg(fmt.Sprint(i))
		m.Body = b
		appendAt(t, n.p, t0, m)
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	n.close(t)
	b = nil

	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	base := heap()
	w, err := store.OpenWAL(filepath.Join(crash, "wal"), store.WALOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if held := heap() - min(base, heap()); held > 16<<20 {
		t.Fatalf("OpenWAL holds %d MiB of a %d MiB log", held>>20, total>>20)
	}
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	p, err := store.Open(filepath.Join(crash, "0.db"), store.Options{WAL: w, Stream: "t/0"})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if st := p.Stats(); st.Next != total/body {
		t.Fatalf("replayed %d messages, want %d", st.Next, total/body)
	}
	if used := peak.Load() - min(base, peak.Load()); used > 160<<20 {
		t.Fatalf("replay of %d MiB peaked at %d MiB of heap", total>>20, used>>20)
	}
	t.Logf("replay of %d MiB: heap peak %d MiB above the base", total>>20, (peak.Load()-min(base, peak.Load()))>>20)
}
