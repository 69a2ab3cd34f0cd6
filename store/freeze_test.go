package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// TestPartition_FreezeRefusesAllButThaw: a frozen partition runs no
// command but OpFreeze and OpThaw, each refused one changing nothing;
// reads go on; OpThaw lets commands run again; a freeze at 0 is a bad
// command.
func TestPartition_FreezeRefusesAllButThaw(t *testing.T) {
	p, _ := open(t)
	appendAt(t, p, t0, msg("a"))
	if _, err := p.Apply(context.Background(), &store.Command{Op: store.OpFreeze, Now: t0}); !errors.Is(err, store.ErrBadCommand) {
		t.Fatalf("freeze at 0: %v, want ErrBadCommand", err)
	}
	apply(t, p, &store.Command{Op: store.OpFreeze, Offset: 7})
	if got := p.Frozen(); got != 7 {
		t.Fatalf("Frozen() = %d, want 7", got)
	}
	before := p.Stats()
	for _, c := range []*store.Command{
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b")}},
		{Op: store.OpClaim, Now: t0, Group: "g"},
		{Op: store.OpTrim, Now: t0, MaxAge: 1},
		{Op: store.OpPrepare, Now: t0, TxID: "tx", Producer: "n", Msgs: []store.Message{msg("c")}},
	} {
		if _, err := p.Apply(context.Background(), c); !errors.Is(err, store.ErrFrozen) {
			t.Fatalf("op %d on a frozen partition: %v, want ErrFrozen", c.Op, err)
		}
	}
	if got := p.Stats(); got != before {
		t.Fatalf("refused commands changed the partition: %+v, was %+v", got, before)
	}
	if bodies, _ := readAll(t, p); len(bodies) != 1 || bodies[0] != "body-a" {
		t.Fatalf("read of a frozen partition: %q", bodies)
	}
	apply(t, p, &store.Command{Op: store.OpFreeze, Offset: 9}) // frozen again, by a later move
	if got := p.Frozen(); got != 9 {
		t.Fatalf("Frozen() = %d after a second freeze, want 9", got)
	}
	apply(t, p, &store.Command{Op: store.OpThaw})
	if got := p.Frozen(); got != 0 {
		t.Fatalf("Frozen() = %d after thaw", got)
	}
	if acks := appendAt(t, p, t0, msg("b")); acks[0].Offset != 1 {
		t.Fatalf("append after thaw at %d, want 1", acks[0].Offset)
	}
}

// TestWAL_FreezeSurvivesReplay: a freeze only in the WAL (the
// materializer stalled) is frozen again after a crash, and one in the file
// after a clean close; a thawed partition's state is written in the
// format earlier releases read (version 2), a frozen one's in version 3.
func TestWAL_FreezeSurvivesReplay(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	appendAt(t, n.p, t0, msg("a"))
	apply(t, n.p, &store.Command{Op: store.OpFreeze, Offset: 3})
	crash := t.TempDir()
	copyDir(t, dir, crash)
	r := mustWALNode(t, crash)
	if got := r.p.Frozen(); got != 3 {
		t.Fatalf("Frozen() after replay = %d, want 3", got)
	}
	if _, err := r.p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b")}}); !errors.Is(err, store.ErrFrozen) {
		t.Fatalf("append after replay: %v, want ErrFrozen", err)
	}
	r.close(t)
	if v := stateVersion(t, filepath.Join(crash, "0.db")); v != 3 {
		t.Fatalf("a frozen partition's state has version %d, want 3", v)
	}
	r = mustWALNode(t, crash)
	if got := r.p.Frozen(); got != 3 {
		t.Fatalf("Frozen() after a clean reopen = %d, want 3", got)
	}
	apply(t, r.p, &store.Command{Op: store.OpThaw})
	r.close(t)
	if v := stateVersion(t, filepath.Join(crash, "0.db")); v != 2 {
		t.Fatalf("a thawed partition's state has version %d, want 2", v)
	}
}

// TestSnapshot_KeepsFreeze: a frozen partition's snapshot restores frozen,
// with the same file id and messages, so the node it moves to thaws it.
func TestSnapshot_KeepsFreeze(t *testing.T) {
	p, _ := open(t)
	appendAt(t, p, t0, msg("a"), msg("b"))
	apply(t, p, &store.Command{Op: store.OpFreeze, Offset: 5})
	var buf bytes.Buffer
	if _, err := p.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "moved.db")
	if err := store.RestoreSnapshot(path, &buf); err != nil {
		t.Fatal(err)
	}
	q := openAt(t, path)
	if got := q.Frozen(); got != 5 {
		t.Fatalf("restored Frozen() = %d, want 5", got)
	}
	apply(t, q, &store.Command{Op: store.OpThaw})
	if acks := appendAt(t, q, t0, msg("c")); acks[0].Offset != 2 {
		t.Fatalf("append on the restored copy at %d, want 2", acks[0].Offset)
	}
	if bodies, _ := readAll(t, q); len(bodies) != 3 {
		t.Fatalf("restored copy holds %q", bodies)
	}
}

// stateVersion returns the version byte of the state in the closed
// partition file at path.
func stateVersion(t *testing.T, path string) byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v byte
	err = db.View(func(tx *bolt.Tx) error {
		st := tx.Bucket([]byte("meta")).Get([]byte("state"))
		if len(st) < 3 {
			return errors.New("no state")
		}
		v = st[2]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestFrozenAt_ReadsTheClosedFile: FrozenAt reads a closed file's freeze
// token (0 once thawed), and a file with damaged bytes is ErrCorrupt,
// never a panic.
func TestFrozenAt_ReadsTheClosedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.db")
	p, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	appendAt(t, p, t0, msg("a"))
	apply(t, p, &store.Command{Op: store.OpFreeze, Offset: 4})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := store.FrozenAt(path); err != nil || got != 4 {
		t.Fatalf("FrozenAt = %d, %v; want 4", got, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 2 * 4096; i < len(b); i++ { // every page's header past the two meta pages
		if i%4096 < 16 {
			b[i] ^= 0xFF
		}
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.FrozenAt(path); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("FrozenAt of a damaged file: %v, want ErrCorrupt", err)
	}
}
