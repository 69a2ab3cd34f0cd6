package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// state is what a snapshot must carry of a partition: everything a reader
// or a later command sees.
type partState struct {
	Stats  store.Stats
	Pos    store.Position
	Bodies []string
	Offs   []uint64
	Groups map[string]store.GroupState
	Half   []store.HalfTx
	Due    int64
	HasDue bool
	Dec    store.Decision
}

func stateOf(t testing.TB, p *store.Partition) partState {
	t.Helper()
	if _, err := p.Sync(); err != nil { // Position is the file's: wait for it
		t.Fatal(err)
	}
	var s partState
	s.Stats, s.Pos = p.Stats(), p.Position()
	s.Bodies, s.Offs = readAll(t, p)
	var err error
	if s.Groups, err = p.GroupStates(); err != nil {
		t.Fatal(err)
	}
	if err := p.HalfTxs(func(h store.HalfTx) bool { s.Half = append(s.Half, h); return true }); err != nil {
		t.Fatal(err)
	}
	if s.Due, s.HasDue, err = p.NextDue(); err != nil {
		t.Fatal(err)
	}
	if s.Dec, err = p.Decision("done"); err != nil {
		t.Fatal(err)
	}
	return s
}

// snapshotFixture fills a replicated partition with every kind of state:
// n messages of 1 KiB (the first trimmed away by size, so the file holds
// free pages), two groups, a half transaction, a decided one, a delayed
// message and the dedup index.
func snapshotFixture(t testing.TB, path string, n int) *store.Partition {
	t.Helper()
	p := openReplicated(t, path)
	body := bytes.Repeat([]byte{'x'}, 1024)
	idx := uint64(1)
	for i := 0; i < n; i += 100 {
		c := &store.Command{Op: store.OpAppend, Now: t0}
		for j := i; j < min(n, i+100); j++ {
			c.Msgs = append(c.Msgs, store.Message{ID: fmt.Sprint("m", j), Body: body, Timestamp: t0})
		}
		applyLogged(t, p, idx, c)
		idx++
	}
	later := &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: "late", Body: []byte("late"), DeliverAt: t0 + 3600e9}}}
	applyLogged(t, p, idx,
		later,
		&store.Command{Op: store.OpClaim, Now: t0, Group: "g1"},
		&store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g2", Offset: uint64(n - 3)},
		&store.Command{Op: store.OpPrepare, Now: t0, TxID: "open", Producer: "node-a", Msgs: []store.Message{msg("half")}},
		&store.Command{Op: store.OpPrepare, Now: t0, TxID: "done", Producer: "node-a", Msgs: []store.Message{msg("tx")}},
		&store.Command{Op: store.OpCommitTx, Now: t0, TxID: "done"},
		&store.Command{Op: store.OpTrim, Now: t0, MaxBytes: 20 << 10},
	)
	return p
}

// TestSnapshot_RoundTrip: a restored snapshot is the same partition (every
// read, the dedup index, the position), and its size is the live state's:
// the head trimmed away is not in it.
func TestSnapshot_RoundTrip(t *testing.T) {
	dir := t.TempDir()
	p := snapshotFixture(t, filepath.Join(dir, "0.db"), 3000)
	var buf bytes.Buffer
	pos, err := p.WriteSnapshot(&buf)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "snapshot position", pos, p.Position())
	fi, err := os.Stat(p.Path())
	if err != nil {
		t.Fatal(err)
	}
	if int64(buf.Len())*8 > fi.Size() {
		t.Fatalf("snapshot of %d bytes for a file of %d whose log holds %d bytes: the trimmed head is in it", buf.Len(), fi.Size(), p.Stats().Bytes)
	}
	t.Logf("file %d bytes, snapshot %d bytes, log %d bytes", fi.Size(), buf.Len(), p.Stats().Bytes)

	copyPath := filepath.Join(dir, "copy.db")
	if err := store.RestoreSnapshot(copyPath, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	q := openReplicated(t, copyPath)
	want, got := stateOf(t, p), stateOf(t, q)
	equal(t, "restored state", got, want)
	if !want.HasDue || len(want.Half) != 1 || len(want.Groups) != 2 || want.Dec != store.Committed || want.Stats.Low == 0 {
		t.Fatalf("the fixture lacks some state: %+v", want)
	}
	// The dedup index came along: the same ID is a duplicate at its offset
	// on both, and the next command goes on from the same state.
	next := store.Position{Index: pos.Index + 1, Cmds: 1}
	for _, r := range []*store.Partition{p, q} {
		res, errs, err := r.ApplyLogged(t.Context(), []*store.Command{{Op: store.OpAppend, Now: t0,
			Msgs: []store.Message{{ID: "m2999", Body: []byte("again")}, {ID: "new", Body: []byte("new")}}}}, []store.Position{next})
		if err != nil || errs[0] != nil {
			t.Fatal(err, errs)
		}
		if a := res[0].Acks; !a[0].Duplicate || a[0].Offset != 2999 || a[1].Duplicate || a[1].Offset != want.Stats.Next {
			t.Fatalf("acks after the snapshot: %+v", a)
		}
	}
	equal(t, "state after one more command", stateOf(t, q), stateOf(t, p))

	if err := store.RestoreSnapshot(copyPath, bytes.NewReader(buf.Bytes())); err == nil {
		t.Fatal("RestoreSnapshot over an existing file succeeded")
	}
}

// TestSnapshot_Large: a snapshot larger than one restore transaction.
func TestSnapshot_Large(t *testing.T) {
	defer store.SetSnapTxBytes(4 << 10)()
	dir := t.TempDir()
	p := snapshotFixture(t, filepath.Join(dir, "0.db"), 500)
	var buf bytes.Buffer
	if _, err := p.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "copy.db")
	if err := store.RestoreSnapshot(copyPath, &buf); err != nil {
		t.Fatal(err)
	}
	equal(t, "restored state", stateOf(t, openReplicated(t, copyPath)), stateOf(t, p))
}

// TestSnapshot_Damaged: a byte of a snapshot flipped (every fourth byte, and
// all of its first and last 64, with a mask that varies), and a cut at
// such a place, is ErrCorrupt from RestoreSnapshot, which leaves no file behind; never a
// panic, never a partition that opens with other contents.
func TestSnapshot_Damaged(t *testing.T) {
	dir := t.TempDir()
	p := snapshotFixture(t, filepath.Join(dir, "0.db"), 3)
	var buf bytes.Buffer
	if _, err := p.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	snap := buf.Bytes()
	copyPath := filepath.Join(dir, "copy.db")
	try := func(what string, b []byte) {
		t.Helper()
		err := store.RestoreSnapshot(copyPath, bytes.NewReader(b))
		if !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("%s: %v, want ErrCorrupt", what, err)
		}
		if _, err := os.Stat(copyPath); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: the file is left behind: %v", what, err)
		}
	}
	masks := []byte{0x01, 0x80, 0xff, 0x10, 0x42}
	for i := range snap {
		if i%4 != 0 && i >= 64 && i < len(snap)-64 {
			continue
		}
		b := bytes.Clone(snap)
		b[i] ^= masks[i%len(masks)]
		try(fmt.Sprintf("byte %d of %d ^ %#x", i, len(snap), masks[i%len(masks)]), b)
		try(fmt.Sprintf("cut at %d of %d", i, len(snap)), snap[:i])
	}
	try("trailing frame", append(bytes.Clone(snap[:len(snap)-5]), 'K', 1, 'k', 1, 'v', 'E', 0, 0, 0, 0))
	try("huge length", append([]byte(snap[:4:4]), append([]byte{'B', 0xff, 0xff, 0xff, 0xff, 0x0f}, strings.Repeat("b", 64)...)...))
}

// entryCommands builds, afresh each call, the commands of raft entry i (index
// i+1): appends (fresh and re-sent IDs), delayed messages, releases, half
// messages and their decisions, group commits, resets, deletes and consumed
// trims. Some entries hold two commands, so a snapshot may stand inside one.
func entryCommands(i int) []*store.Command {
	now := t0 + int64(i)*sec/4
	app := func(ids ...string) *store.Command {
		c := &store.Command{Op: store.OpAppend, Now: now}
		for _, id := range ids {
			c.Msgs = append(c.Msgs, store.Message{ID: id, Key: "k", Body: []byte("body-" + id), Timestamp: t0})
		}
		return c
	}
	switch {
	case i%7 == 0:
		return []*store.Command{{Op: store.OpPrepare, Now: now, TxID: fmt.Sprint("tx", i), Producer: "node-a",
			Msgs: []store.Message{msg(fmt.Sprint("half", i))}}}
	case i%7 == 1 && i >= 8:
		op := store.OpCommitTx
		if i%3 == 0 {
			op = store.OpRollbackTx
		}
		return []*store.Command{{Op: op, Now: now, TxID: fmt.Sprint("tx", i-8)}}
	case i%11 == 3:
		return []*store.Command{
			app(fmt.Sprint("m", i, "a")),
			{Op: store.OpCommitOffset, Now: now, Group: fmt.Sprint("g", i%3), Offset: uint64(i / 2)},
		}
	case i%13 == 5:
		return []*store.Command{{Op: store.OpAppend, Now: now, Msgs: []store.Message{
			{ID: fmt.Sprint("d", i), Body: []byte("delayed"), DeliverAt: now + 3*sec}}}}
	case i%17 == 9:
		return []*store.Command{{Op: store.OpRelease, Now: now, Limit: 2}}
	case i%19 == 4:
		return []*store.Command{{Op: store.OpTrim, Now: now + 1, Consumed: true, Limit: 3}}
	case i%23 == 6:
		return []*store.Command{{Op: store.OpCommitOffset, Now: now, Group: "b@inst", Offset: uint64(i / 3)}}
	case i%29 == 7:
		return []*store.Command{{Op: store.OpDeleteGroup, Now: now, Group: "b@inst"}}
	case i%5 == 2 && i > 10:
		return []*store.Command{app(fmt.Sprint("m", i-10, "a"), fmt.Sprint("m", i, "b"))} // a re-sent ID
	default:
		return []*store.Command{app(fmt.Sprint("m", i, "a"), fmt.Sprint("m", i, "b"))}
	}
}

func entryPositions(i int, n int) []store.Position {
	at := make([]store.Position, n)
	for k := range at {
		at[k] = store.Position{Index: uint64(i + 1), Cmds: uint64(k + 1)}
	}
	return at
}

// applyEntries applies entries [from, to) to p, skipping the commands at or
// before skip (as raftqueue's fsm does after a restore). Command errors
// (a commit of a decided tx, ...) are the command's own and fine; they must
// be the same on every replica, which the caller compares.
func applyEntries(t testing.TB, p *store.Partition, from, to int, skip store.Position) []string {
	t.Helper()
	out, err := applyEntriesErr(p, from, to, skip)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func applyEntriesErr(p *store.Partition, from, to int, skip store.Position) ([]string, error) {
	var out []string
	for i := from; i < to; i++ {
		cmds, at := entryCommands(i), entryPositions(i, len(entryCommands(i)))
		var c2 []*store.Command
		var a2 []store.Position
		for k := range cmds {
			if at[k].Index < skip.Index || at[k].Index == skip.Index && at[k].Cmds <= skip.Cmds {
				continue
			}
			c2, a2 = append(c2, cmds[k]), append(a2, at[k])
		}
		if len(c2) == 0 {
			continue
		}
		res, errs, err := p.ApplyLogged(context.Background(), c2, a2)
		if err != nil {
			return out, fmt.Errorf("ApplyLogged(%d): %v", i+1, err)
		}
		for k := range c2 {
			out = append(out, fmt.Sprintf("%v|%+v|%v", a2[k], res[k], errs[k]))
		}
	}
	return out, nil
}

// fullState is every read a partition answers, for comparisons.
type fullState struct {
	partState
	Decisions map[string]store.Decision
	Gets      map[uint64]string
}

func fullStateOf(t testing.TB, p *store.Partition, entries int) fullState {
	t.Helper()
	s := fullState{partState: stateOf(t, p), Decisions: map[string]store.Decision{}, Gets: map[uint64]string{}}
	for i := 0; i < entries; i += 7 {
		d, err := p.Decision(fmt.Sprint("tx", i))
		if err != nil {
			t.Fatal(err)
		}
		s.Decisions[fmt.Sprint("tx", i)] = d
	}
	for off := s.Stats.Low; off < s.Stats.Next; off++ {
		m, ok, err := p.Get(off)
		if err != nil {
			t.Fatal(err)
		}
		s.Gets[off] = fmt.Sprint(ok, m.ID, string(m.Body), m.StoredAt)
	}
	return s
}

// dumpBolt returns every key of every bucket of the bbolt file at path.
func dumpBolt(t testing.TB, path string) map[string]map[string]string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]map[string]string{}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			m := map[string]string{}
			out[string(name)] = m
			return b.ForEach(func(k, v []byte) error { m[string(k)] = string(v); return nil })
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// logBytes sums the sizes of the log bucket's records.
func logBytes(dump map[string]map[string]string) int64 {
	var n int64
	for _, v := range dump["log"] {
		n += int64(len(v))
	}
	return n
}

// TestWriteSnapshot_ConcurrentApply: WriteSnapshot taken while
// ApplyLogged runs concurrently. Each snapshot's position describes its
// contents: a replica that restores it and applies the commands after that
// position (skipping the ones it holds, as the fsm does) ends with exactly
// the original's state and the same command results (no duplicate, no
// gap).
func TestWriteSnapshot_ConcurrentApply(t *testing.T) {
	dir := t.TempDir()
	const entries = 400
	p := openReplicated(t, filepath.Join(dir, "0.db"))
	var (
		wg       sync.WaitGroup
		results  []string
		applyErr error
	)
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		results, applyErr = applyEntriesErr(p, 0, entries, store.Position{})
	}()
	type snap struct {
		pos store.Position
		b   []byte
	}
	var snaps []snap
	for len(snaps) < 40 {
		var buf bytes.Buffer
		pos, err := p.WriteSnapshot(&buf)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, snap{pos, buf.Bytes()})
		select {
		case <-done:
		default:
			continue
		}
		break
	}
	wg.Wait()
	if applyErr != nil {
		t.Fatal(applyErr)
	}
	want := fullStateOf(t, p, entries)
	inside := 0
	for n, s := range snaps {
		if s.pos.Index > 0 && s.pos.Cmds < uint64(len(entryCommands(int(s.pos.Index-1)))) {
			inside++
		}
		path := filepath.Join(dir, fmt.Sprint("r", n, ".db"))
		if err := store.RestoreSnapshot(path, bytes.NewReader(s.b)); err != nil {
			t.Fatalf("snapshot %d at %v: %v", n, s.pos, err)
		}
		q := openReplicated(t, path)
		if q.Position() != s.pos {
			t.Fatalf("snapshot %d: WriteSnapshot said %v, the restored file is at %v", n, s.pos, q.Position())
		}
		got := applyEntries(t, q, 0, entries, s.pos)
		// The results of the replayed commands are the original's.
		tail := results[len(results)-len(got):]
		if !reflect.DeepEqual(got, tail) {
			for k := range got {
				if got[k] != tail[k] {
					t.Fatalf("snapshot %d at %v: replayed command result\n%s\nwant\n%s", n, s.pos, got[k], tail[k])
				}
			}
		}
		equal(t, fmt.Sprintf("state restored from snapshot %d at %v and caught up", n, s.pos), fullStateOf(t, q, entries), want)
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d snapshots, %d of them inside an entry, final position %v", len(snaps), inside, p.Position())
}

// TestSnapshot_RawEqualAndExtremes: a restored file is the original, byte
// for byte in every key (meta included), for an empty partition, one whose
// log was trimmed away entirely, and one with everything; and both go on
// identically.
func TestSnapshot_RawEqualAndExtremes(t *testing.T) {
	cases := []struct {
		name string
		fill func(t *testing.T, p *store.Partition)
	}{
		{"Empty", func(t *testing.T, p *store.Partition) {}},
		{"AllTrimmed", func(t *testing.T, p *store.Partition) {
			applyLogged(t, p, 1, appendCmd("a", "b", "c"))
			applyLogged(t, p, 2, &store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 3})
			res := applyLogged(t, p, 3, &store.Command{Op: store.OpTrim, Now: t0 + 1, Consumed: true})
			if res[0].Count != 3 {
				t.Fatalf("trim deleted %d", res[0].Count)
			}
		}},
		{"Everything", func(t *testing.T, p *store.Partition) {
			applyEntries(t, p, 0, 300, store.Position{})
		}},
		{"LargeValues", func(t *testing.T, p *store.Partition) {
			big := bytes.Repeat([]byte{0xA5}, 3<<20)
			id := string(bytes.Repeat([]byte{'i'}, store.MaxKeyBytes))
			applyLogged(t, p, 1, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: id, Body: big}}})
			grp := string(bytes.Repeat([]byte{'g'}, store.MaxKeyBytes))
			applyLogged(t, p, 2, &store.Command{Op: store.OpCommitOffset, Now: t0, Group: grp, Offset: 1})
			tx := string(bytes.Repeat([]byte{'t'}, store.MaxKeyBytes))
			applyLogged(t, p, 3, &store.Command{Op: store.OpPrepare, Now: t0, TxID: tx, Producer: "p", Msgs: []store.Message{{Body: big}}})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer store.SetSnapTxBytes(1 << 20)()
			dir := t.TempDir()
			src := filepath.Join(dir, "0.db")
			p, err := store.Open(src, store.Options{Replicated: true})
			if err != nil {
				t.Fatal(err)
			}
			tc.fill(t, p)
			var buf bytes.Buffer
			pos, err := p.WriteSnapshot(&buf)
			if err != nil {
				t.Fatal(err)
			}
			want := stateOf(t, p)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(dir, "copy.db")
			if err := store.RestoreSnapshot(dst, bytes.NewReader(buf.Bytes())); err != nil {
				t.Fatal(err)
			}
			a, b := dumpBolt(t, src), dumpBolt(t, dst)
			if !reflect.DeepEqual(a, b) {
				for name := range a {
					if !reflect.DeepEqual(a[name], b[name]) {
						t.Errorf("bucket %q differs: %d keys, restored %d", name, len(a[name]), len(b[name]))
					}
				}
				t.Fatalf("restored file differs (buckets %d, %d)", len(a), len(b))
			}
			if int64(len(buf.Bytes())) < logBytes(a) {
				t.Fatalf("snapshot of %d bytes holds a log of %d", buf.Len(), logBytes(a))
			}
			q := openReplicated(t, dst)
			equal(t, "restored state", stateOf(t, q), want)
			equal(t, "restored position", q.Position(), pos)
			if st := q.Stats(); st.Bytes != logBytes(b) {
				t.Fatalf("Stats.Bytes %d, the log's records take %d", st.Bytes, logBytes(b))
			}
			// Both go on the same way.
			p2 := openReplicated(t, src)
			next := pos.Index + 1
			for _, r := range []*store.Partition{p2, q} {
				applyLogged(t, r, next, appendCmd("after", "a"))
			}
			equal(t, "state after one more entry", stateOf(t, q), stateOf(t, p2))
		})
	}
}

// errIO is a reader's own failure.
var errIO = errors.New("test: the network went away")

type failingReader struct {
	r io.Reader
	n int // bytes left before the failure
}

func (f *failingReader) Read(b []byte) (int, error) {
	if f.n <= 0 {
		return 0, errIO
	}
	if len(b) > f.n {
		b = b[:f.n]
	}
	n, err := f.r.Read(b)
	f.n -= n
	return n, err
}

// TestRestoreSnapshot_ReaderError: a reader that fails anywhere in the
// stream (an I/O error, not a damaged snapshot) fails RestoreSnapshot with
// that error, and no file is left behind: also with transactions committed
// before the failure.
func TestRestoreSnapshot_ReaderError(t *testing.T) {
	defer store.SetSnapTxBytes(4 << 10)()
	dir := t.TempDir()
	p := snapshotFixture(t, filepath.Join(dir, "0.db"), 200)
	var buf bytes.Buffer
	if _, err := p.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	snap := buf.Bytes()
	dst := filepath.Join(dir, "copy.db")
	var cuts []int
	for n := 0; n < len(snap); n += 1 + n/3 {
		cuts = append(cuts, n)
	}
	cuts = append(cuts, len(snap)-5, len(snap)-4, len(snap)-1)
	misreported := 0
	for _, n := range cuts {
		err := store.RestoreSnapshot(dst, &failingReader{r: bytes.NewReader(snap), n: n})
		if err == nil {
			t.Fatalf("a reader failing after %d of %d bytes: RestoreSnapshot succeeded", n, len(snap))
		}
		if _, serr := os.Lstat(dst); !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("a reader failing after %d of %d bytes: %v, and the file is left behind (%v)", n, len(snap), err, serr)
		}
		if !errors.Is(err, errIO) {
			misreported++
			t.Logf("a reader failing after %d bytes: %v (the I/O error is lost)", n, err)
		}
	}
	// The whole stream but a failure instead of EOF after it: the snapshot
	// is complete, so it is restored.
	if err := store.RestoreSnapshot(dst, &failingReader{r: bytes.NewReader(snap), n: len(snap)}); err != nil {
		t.Fatalf("a complete snapshot followed by a read error: %v", err)
	}
	if misreported > 0 {
		t.Logf("%d of %d read failures reported without the reader's error", misreported, len(cuts))
	}
}

// TestRestoreSnapshot_ReaderErrorNotCorrupt: a reader failing before the
// 4 bytes of magic, or inside the 4 bytes of the checksum, gives the
// reader's error, as anywhere else. This broke when such a failure was
// reported as a damaged snapshot (ErrCorrupt, the reader's error flattened
// into the text): a transient I/O failure read as permanent damage.
func TestRestoreSnapshot_ReaderErrorNotCorrupt(t *testing.T) {
	dir := t.TempDir()
	p := snapshotFixture(t, filepath.Join(dir, "0.db"), 3)
	var buf bytes.Buffer
	if _, err := p.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	snap := buf.Bytes()
	for _, n := range []int{0, 2, len(snap) / 2, len(snap) - 2} {
		err := store.RestoreSnapshot(filepath.Join(dir, "copy.db"), &failingReader{r: bytes.NewReader(snap), n: n})
		if !errors.Is(err, errIO) || errors.Is(err, store.ErrCorrupt) {
			t.Errorf("a reader failing after %d of %d bytes: %v; want the reader's error, not ErrCorrupt", n, len(snap), err)
		}
	}
}

// TestRestoreSnapshot_DiskFull: the disk fills during a restore, from its
// k-th transaction on (its file's descriptor then refers to /dev/full:
// writes fail with ENOSPC, and bbolt's fstat sees an empty file):
// RestoreSnapshot fails, not with ErrCorrupt (the snapshot is intact, and a
// caller must not take it for a damaged one), and leaves no file; a
// restore with room afterwards gives the partition.
func TestRestoreSnapshot_DiskFull(t *testing.T) {
	defer store.SetSnapTxBytes(1 << 10)()
	dir := t.TempDir()
	p := snapshotFixture(t, filepath.Join(dir, "0.db"), 200)
	var buf bytes.Buffer
	if _, err := p.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "copy.db")
	for _, k := range []int{1, 2, 5, 10} {
		stop := store.FillDiskDuringRestore(k)
		err := store.RestoreSnapshot(dst, bytes.NewReader(buf.Bytes()))
		stop()
		if err == nil {
			t.Fatalf("disk full from transaction %d: RestoreSnapshot succeeded", k)
		}
		if errors.Is(err, store.ErrCorrupt) {
			t.Errorf("disk full from transaction %d: %v: an intact snapshot reported damaged", k, err)
		}
		t.Logf("disk full from transaction %d: %v", k, err)
		if _, serr := os.Lstat(dst); !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("disk full from transaction %d: the file is left behind (%v)", k, serr)
		}
	}
	if err := store.RestoreSnapshot(dst, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	equal(t, "restored state", stateOf(t, openReplicated(t, dst)), stateOf(t, p))
}

// TestWriteSnapshot_WriterError: the snapshot's sink fails (EIO, ENOSPC)
// at any byte: WriteSnapshot returns that error, the partition goes on
// serving and applying, and the next snapshot is whole.
func TestWriteSnapshot_WriterError(t *testing.T) {
	dir := t.TempDir()
	p := snapshotFixture(t, filepath.Join(dir, "0.db"), 200)
	var whole bytes.Buffer
	if _, err := p.WriteSnapshot(&whole); err != nil {
		t.Fatal(err)
	}
	idx := p.Position().Index
	for n := 0; n < whole.Len(); n += 1 + n/2 {
		for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOSPC} {
			if _, err := p.WriteSnapshot(&failingWriter{n: n, err: errno}); !errors.Is(err, errno) {
				t.Fatalf("a sink failing with %v after %d of %d bytes: WriteSnapshot returned %v", errno, n, whole.Len(), err)
			}
		}
		idx++
		applyLogged(t, p, idx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(fmt.Sprint("after-", n))}})
	}
	var buf bytes.Buffer
	if _, err := p.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "copy.db")
	if err := store.RestoreSnapshot(dst, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	equal(t, "restored state", stateOf(t, openReplicated(t, dst)), stateOf(t, p))
}

// failingWriter takes n bytes, then fails with err.
type failingWriter struct {
	n   int
	err error
}

func (f *failingWriter) Write(b []byte) (int, error) {
	if len(b) <= f.n {
		f.n -= len(b)
		return len(b), nil
	}
	k := f.n
	f.n = 0
	return k, f.err
}
