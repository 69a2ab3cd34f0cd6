package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
