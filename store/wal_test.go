package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// walNode is a partition file and a WAL in one directory, opened like the
// node does.
type walNode struct {
	dir string
	wal *store.WAL
	p   *store.Partition
}

func openWALNode(t testing.TB, dir string) (*walNode, error) {
	return openWALNodeWith(t, dir, store.Options{})
}

// stalled is a partition that keeps what it logs out of its file for an
// hour: a copy of its directory taken while it runs is what a crash leaves
// with every acknowledged command only in the WAL.
var stalled = store.Options{MaterializeAfter: time.Hour}

func openWALNodeWith(t testing.TB, dir string, opts store.Options) (*walNode, error) {
	t.Helper()
	w, p, err := openWALPartition(filepath.Join(dir, "wal"), store.WALOptions{}, filepath.Join(dir, "0.db"), opts)
	if err != nil {
		return nil, err
	}
	n := &walNode{dir: dir, wal: w, p: p}
	t.Cleanup(func() { n.close(t) })
	return n, nil
}

// openWALPartition opens a WAL and one partition (stream "t/0") behind it,
// and finishes the WAL's recovery.
func openWALPartition(walDir string, wopts store.WALOptions, path string, opts store.Options) (*store.WAL, *store.Partition, error) {
	w, err := store.OpenWAL(walDir, wopts)
	if err != nil {
		return nil, nil, err
	}
	opts.WAL, opts.Stream = w, "t/0"
	p, err := store.Open(path, opts)
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	if err := w.FinishRecovery(); err != nil {
		p.Close()
		w.Close()
		return nil, nil, err
	}
	return w, p, nil
}

func mustWALNode(t testing.TB, dir string) *walNode {
	t.Helper()
	return mustWALNodeWith(t, dir, store.Options{})
}

func mustWALNodeWith(t testing.TB, dir string, opts store.Options) *walNode {
	t.Helper()
	n, err := openWALNodeWith(t, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *walNode) close(t testing.TB) {
	if n.p == nil {
		return
	}
	if err := n.p.Close(); err != nil {
		t.Errorf("close partition: %v", err)
	}
	if err := n.wal.Close(); err != nil {
		t.Errorf("close wal: %v", err)
	}
	n.p = nil
}

// copyDir copies src into dst file by file: with the materializer stalled,
// a copy taken while the node runs is what a crash leaves on disk.
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		defer out.Close()
		_, err = io.Copy(out, in)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func segments(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(m)
	return m
}

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

// crashedWithTen returns a directory as a crash leaves it after ten acked
// appends that were only logged, and stalls materialization for the test.
func crashedWithTen(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	for i := range 10 {
		appendAt(t, n.p, t0, msg(fmt.Sprint(i)))
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	return crash
}

// sealLen is the length of a WAL write header frame, which also seals the
// last synced write.
const sealLen = 8 + 25

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
