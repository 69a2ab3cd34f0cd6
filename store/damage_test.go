package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// TestOpen_DamagedFile damages each page of a partition file in turn:
// Open and every read either work or return ErrCorrupt naming the file;
// nothing panics.
func TestOpen_DamagedFile(t *testing.T) {
	p, path := open(t)
	for i := range 300 {
		m := msg(fmt.Sprint(i))
		m.Body = bytes.Repeat([]byte{byte(i)}, 300)
		appendAt(t, p, t0+int64(i), m)
	}
	apply(t, p, &store.Command{Op: store.OpCommitOffset, Group: "g", Offset: 5})
	apply(t, p, &store.Command{Op: store.OpPrepare, TxID: "tx", Msgs: []store.Message{msg("h")}})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	clean, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const page = 4096
	// The pages of zeros that end the file are bbolt's growth ahead
	// (openBolt's boltGrowBy), which it never reads: the first two of them
	// are damaged, and the data's pages before them.
	damaged := len(clean)
	for damaged >= page && !slices.ContainsFunc(clean[damaged-page:damaged], func(c byte) bool { return c != 0 }) {
		damaged -= page
	}
	damaged = min(len(clean), damaged+2*page)
	damages := map[string]func(b []byte, at int){
		"Flip":  func(b []byte, at int) { b[at+page/2] ^= 0xff; b[at+page/2+1] ^= 0x5a },
		"Head":  func(b []byte, at int) { copy(b[at:at+16], bytes.Repeat([]byte{0xee}, 16)) },
		"Zero":  func(b []byte, at int) { clear(b[at : at+page]) },
		"Count": func(b []byte, at int) { b[at+10], b[at+11] = 0xff, 0x7f },
	}
	for name, damage := range damages {
		t.Run(name, func(t *testing.T) {
			var corrupt, fine int
			for at := 0; at+page <= damaged; at += page {
				b := bytes.Clone(clean)
				damage(b, at)
				dpath := filepath.Join(t.TempDir(), "d.db")
				if err := os.WriteFile(dpath, b, 0o600); err != nil {
					t.Fatal(err)
				}
				err := exercise(dpath)
				switch {
				case err == nil:
					fine++
				case errors.Is(err, store.ErrCorrupt) && strings.Contains(err.Error(), dpath):
					corrupt++
				default:
					t.Fatalf("page %d: %v, want nil or ErrCorrupt naming the file", at/page, err)
				}
			}
			if corrupt == 0 {
				t.Fatalf("no damage of %d pages detected", damaged/page)
			}
			t.Logf("%d of the file's %d pages: %d ErrCorrupt, %d read fine", damaged/page, len(clean)/page, corrupt, fine)
		})
	}
}

// exercise opens path and reads everything through every read method,
// turning a panic into an error.
func exercise(path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	p, err := store.Open(path, store.Options{})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := p.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := p.Read(0, 1000, 0, nil); err != nil {
		return err
	}
	for off := range uint64(300) {
		if _, _, err := p.Get(off); err != nil {
			return err
		}
	}
	if _, err := p.Groups(); err != nil {
		return err
	}
	if _, _, err := p.GroupOffset("g"); err != nil {
		return err
	}
	if _, err := p.GroupStates(); err != nil {
		return err
	}
	if err := p.HalfTxs(func(store.HalfTx) bool { return true }); err != nil {
		return err
	}
	if _, err := p.SeekTime(t0 + 100); err != nil {
		return err
	}
	if _, err := p.Decision("tx"); err != nil {
		return err
	}
	_, err = p.Apply(context.Background(), &store.Command{Op: store.OpTrim, Now: t0 + 1000, MaxAge: 1, DedupTTL: 1})
	if errors.Is(err, store.ErrFailed) && !errors.Is(err, store.ErrCorrupt) {
		return nil // a commit bbolt refused: the file is failed, not damaged further
	}
	return err
}

// TestOpen_DamagedNames: a bit flipped in the name of one of a partition
// file's buckets, or of one of its meta keys, is ErrCorrupt naming the
// file. This broke with the meta bucket's name damaged: Open made a new
// meta bucket and the file opened empty, its acked messages gone without
// an error (a damaged dedup or groups name would have lost the dedup index
// or the committed offsets the same way).
func TestOpen_DamagedNames(t *testing.T) {
	build := func(t *testing.T) string {
		p, path := open(t)
		appendAt(t, p, t0, msg("a"), msg("b"))
		apply(t, p, &store.Command{Op: store.OpCommitOffset, Group: "g", Offset: 1})
		apply(t, p, &store.Command{Op: store.OpPrepare, TxID: "tx", Producer: "node", Msgs: []store.Message{msg("h")}})
		apply(t, p, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: "d", Body: []byte("d"), DeliverAt: t0 + 3600e9}}})
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	flip := func(b []byte) []byte { b = bytes.Clone(b); b[0] ^= 0x02; return b }
	damage := func(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(fn); err != nil {
			t.Fatal(err)
		}
	}
	// rename moves bucket name's keys to a bucket of name flipped.
	rename := func(tx *bolt.Tx, name []byte) error {
		old := tx.Bucket(name)
		nb, err := tx.CreateBucket(flip(name))
		if err != nil {
			return err
		}
		if err := old.ForEach(func(k, v []byte) error { return nb.Put(k, v) }); err != nil {
			return err
		}
		return tx.DeleteBucket(name)
	}
	for _, name := range []string{"log", "half", "txs", "groups", "delay", "dedup", "meta"} {
		t.Run("Bucket/"+name, func(t *testing.T) {
			path := build(t)
			damage(t, path, func(tx *bolt.Tx) error { return rename(tx, []byte(name)) })
			if _, err := store.Open(path, store.Options{}); !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("bucket %q renamed: %v, want ErrCorrupt naming the file", name, err)
			}
		})
	}
	for _, key := range []string{"version", "state", "id"} {
		t.Run("MetaKey/"+key, func(t *testing.T) {
			path := build(t)
			damage(t, path, func(tx *bolt.Tx) error {
				meta := tx.Bucket([]byte("meta"))
				v := bytes.Clone(meta.Get([]byte(key)))
				if err := meta.Put(flip([]byte(key)), v); err != nil {
					return err
				}
				return meta.Delete([]byte(key))
			})
			if _, err := store.Open(path, store.Options{}); !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("meta key %q renamed: %v, want ErrCorrupt naming the file", key, err)
			}
		})
	}
	t.Run("Intact", func(t *testing.T) {
		p := openAt(t, build(t))
		bodies, _ := readAll(t, p)
		equal(t, "log", bodies, []string{"body-a", "body-b"})
	})
}

// TestPartition_DamagedHalfPageIsCorrupt: a damaged page of the half
// bucket is ErrCorrupt naming the file, never a panic (run in a child
// process, which such a panic would kill). This broke when the writer read
// the file outside its recover (ready() -> view.cost() reads the half
// bucket for OpPrepare, OpCommitTx and OpTxChecked, and start() looked up
// buckets before builder.apply installed its deferred recover): the panic
// in the writer goroutine killed the process.
func TestPartition_DamagedHalfPageIsCorrupt(t *testing.T) {
	if path := os.Getenv("ZEZE_DAMAGED_HALF_CHILD"); path != "" {
		p, err := store.Open(path, store.Options{})
		if err != nil {
			fmt.Println("open:", err)
			os.Exit(0)
		}
		// The first command makes the gen non-empty, so ready() sizes the
		// second with cost(), which reads the half bucket.
		_, errs, err := p.ApplyBatch(context.Background(), []*store.Command{
			{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 1},
			{Op: store.OpPrepare, Now: t0, TxID: "tx-3", Msgs: []store.Message{msg("x")}},
		})
		fmt.Println("apply:", errs, err)
		p.Close()
		os.Exit(0)
	}
	path := filepath.Join(t.TempDir(), "0.db")
	p, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		m := msg(fmt.Sprint(i))
		m.Body = bytes.Repeat([]byte{'h'}, 1000)
		apply(t, p, &store.Command{Op: store.OpPrepare, TxID: fmt.Sprint("tx-", i), Msgs: []store.Message{m}})
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage the page type of the half bucket's root page.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var root uint64
	db.View(func(tx *bolt.Tx) error { root = uint64(tx.Bucket([]byte("half")).Root()); return nil })
	pageSize := db.Info().PageSize
	db.Close()
	if root == 0 {
		t.Fatal("half bucket is inline")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0, 0}, int64(root)*int64(pageSize)+8) // page flags
	f.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestPartition_DamagedHalfPageIsCorrupt$")
	cmd.Env = append(os.Environ(), "ZEZE_DAMAGED_HALF_CHILD="+path)
	out, err := cmd.CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("panic")) {
		t.Fatalf("a damaged half page crashed the process (%v):\n%s", err, firstLines(out, 40))
	}
	t.Logf("child: %s", out)
	if !bytes.Contains(out, []byte("ErrCorrupt")) && !bytes.Contains(out, []byte("corrupt")) {
		t.Fatalf("want ErrCorrupt naming the file, got:\n%s", out)
	}
}

func firstLines(b []byte, n int) string {
	lines := strings.SplitN(string(b), "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
