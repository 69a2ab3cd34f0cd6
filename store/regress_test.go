package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// TestPartition_FreshIDIsAnInput: FreshID travels with the command, so what
// a send is acknowledged with is what the file holds, also when a sender
// marks an ID fresh that the dedup index knows (the old fast path acked a
// new offset, the materializer found a duplicate, and the partition refused
// every later send).
func TestPartition_FreshIDIsAnInput(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNode(t, dir)
	appendAt(t, n.p, t0, msg("a"))
	fresh := msg("a")
	fresh.FreshID = true
	acks := appendAt(t, n.p, t0, fresh)
	equal(t, "fresh ack", acks, []store.Ack{{Offset: 1}})
	acks = appendAt(t, n.p, t0, msg("a")) // a resend dedups to the newest copy
	equal(t, "resend", acks, []store.Ack{{Offset: 1, Duplicate: true}})
	equal(t, "later send", offsetsOf(appendAt(t, n.p, t0, msg("b"))), []uint64{2})
	n.close(t)
	r := mustWALNode(t, dir)
	bodies, offsets := readAll(t, r.p)
	equal(t, "bodies", bodies, []string{"body-a", "body-a", "body-b"})
	equal(t, "offsets", offsets, []uint64{0, 1, 2})
}

// TestPartition_CommandTooLarge: a command whose effects would exceed what
// one log record (and recovery) holds is refused before anything is
// written; the partition goes on and reopens.
func TestPartition_CommandTooLarge(t *testing.T) {
	p, path := open(t)
	body := make([]byte, 210<<20)
	msgs := make([]store.Message, 5)
	for i := range msgs {
		msgs[i] = store.Message{ID: fmt.Sprint(i), Body: body}
	}
	_, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: msgs})
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("5 x 210 MiB: %v, want ErrTooLarge", err)
	}
	_, err = p.Apply(context.Background(), &store.Command{Op: store.OpCommitTx, Now: t0, TxID: "tx", Msgs: msgs})
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("commit of 5 x 210 MiB: %v, want ErrTooLarge", err)
	}
	equal(t, "send after", offsetsOf(appendAt(t, p, t0, msg("a"))), []uint64{0})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openAt(t, path)
	bodies, _ := readAll(t, p)
	equal(t, "after reopen", bodies, []string{"body-a"})
}

// faultFS is the OS file system with a hook that can fail any write or
// sync of a WAL segment.
type faultFS struct {
	store.OSFS
	mu      sync.Mutex
	handles map[string]int // opens per path
	fail    func(op, name string, handle int) error
}

func (f *faultFS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.handles[name]++
	h := f.handles[name]
	f.mu.Unlock()
	return &faultFile{File: file, fs: f, name: name, handle: h}, nil
}

func (f *faultFS) check(op, name string, handle int) error {
	f.mu.Lock()
	fail := f.fail
	f.mu.Unlock()
	if fail == nil {
		return nil
	}
	return fail(op, name, handle)
}

func (f *faultFS) setFail(fn func(op, name string, handle int) error) {
	f.mu.Lock()
	f.fail = fn
	f.mu.Unlock()
}

type faultFile struct {
	store.File
	fs     *faultFS
	name   string
	handle int
}

func (f *faultFile) WriteAt(b []byte, off int64) (int, error) {
	if err := f.fs.check("write", f.name, f.handle); err != nil {
		return 0, err
	}
	return f.File.WriteAt(b, off)
}

func (f *faultFile) Sync() error {
	if err := f.fs.check("sync", f.name, f.handle); err != nil {
		return err
	}
	return f.File.Sync()
}

// TestWAL_FailureSticks: after a write or sync of the WAL fails, nothing
// more is acknowledged until reopen, even when the disk answers again: a
// writeback error is reported once per file description, so a retried sync
// that succeeds does not make the lost pages durable. The extender's sync,
// on its own handle, fails the WAL the same way.
func TestWAL_FailureSticks(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   string
		ext  bool // the extender's handle (the second one of the segment)
	}{
		{"WriteEIO", "write", false},
		{"SyncEIO", "sync", false},
		{"SyncENOSPC", "sync", false},
		{"ExtenderSync", "sync", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ffs := &faultFS{handles: map[string]int{}}
			w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{FS: ffs})
			if err != nil {
				t.Fatal(err)
			}
			p, err := store.Open(filepath.Join(dir, "0.db"), store.Options{WAL: w, Stream: "t/0"})
			if err != nil {
				t.Fatal(err)
			}
			w.FinishRecovery()
			ctx := context.Background()
			var acked []string
			send := func(id string, size int) error {
				m := msg(id)
				m.Body = make([]byte, size)
				_, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{m}})
				if err == nil {
					acked = append(acked, id)
				}
				return err
			}
			for i := range 5 {
				if err := send(fmt.Sprint("before", i), 100); err != nil {
					t.Fatal(err)
				}
			}
			errno := syscall.EIO
			if strings.Contains(tc.name, "ENOSPC") {
				errno = syscall.ENOSPC
			}
			var failed atomic.Int64
			ffs.setFail(func(op, name string, handle int) error {
				if op != tc.op || !strings.HasSuffix(name, ".wal") || (handle == 2) != tc.ext {
					return nil
				}
				if failed.Add(1) == 1 {
					return errno // the first one only: the disk answers again after
				}
				return nil
			})
			var first error
			for i := 0; i < 200 && first == nil; i++ {
				first = send(fmt.Sprint("during", i), 64<<10) // pushes the extender within a few sends
			}
			if first == nil {
				t.Fatalf("no send failed (%d faults injected)", failed.Load())
			}
			if !errors.Is(first, store.ErrFailed) {
				t.Fatalf("send after the fault: %v, want ErrFailed", first)
			}
			for i := range 5 {
				if err := send(fmt.Sprint("after", i), 100); !errors.Is(err, store.ErrFailed) {
					t.Fatalf("send %d after the failure: %v, want ErrFailed", i, err)
				}
			}
			p.Close()
			w.Close()
			ffs.setFail(nil)
			r := mustWALNode(t, dir)
			msgs, err := r.p.Read(0, 1000, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			have := map[string]bool{}
			for _, m := range msgs {
				have[m.ID] = true
			}
			for _, id := range acked {
				if !have["id-"+id] {
					t.Fatalf("acked %s missing after reopen", id)
				}
			}
			equal(t, "send after reopen", len(appendAt(t, r.p, t0, msg("new"))), 1)
		})
	}
}

// TestOpen_FormatOne: a file of format 1 (state and half transactions as
// msgpack maps keyed by Go field names) opens, keeps its data and is
// upgraded; unknown fields are damage, not zeros.
func TestOpen_FormatOne(t *testing.T) {
	type legacyHalf struct {
		Producer  string   `msgpack:"p"`
		FirstSeen int64    `msgpack:"f"`
		LastCheck int64    `msgpack:"l"`
		Checks    int      `msgpack:"c"`
		Records   [][]byte `msgpack:"r"`
	}
	build := func(t *testing.T, state any) string {
		// Write the file with the current code, then rewrite meta and the
		// half bucket as format 1 had them.
		p, path := open(t)
		appendAt(t, p, t0, msg("a"), msg("b"))
		apply(t, p, &store.Command{Op: store.OpPrepare, TxID: "tx", Producer: "node", Msgs: []store.Message{msg("h")}})
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = db.Update(func(tx *bolt.Tx) error {
			meta := tx.Bucket([]byte("meta"))
			meta.Put([]byte("version"), be64(1))
			s, _ := msgpack.Marshal(state)
			meta.Put([]byte("state"), s)
			var recs [][]byte
			p2 := tx.Bucket([]byte("half"))
			// the record inside stays as it is: its layout did not change
			store.HalfRecords(p2.Get([]byte("tx")), func(r []byte) { recs = append(recs, bytes.Clone(r)) })
			h, _ := msgpack.Marshal(legacyHalf{Producer: "node", FirstSeen: t0, Records: recs})
			return p2.Put([]byte("tx"), h)
		})
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
	type v1State struct {
		Next, Low  uint64
		Bytes      int64
		DedupLow   uint64
		Applied    uint64
		LastStored int64
		DelaySeq   uint64
		Delayed    int64
	}
	t.Run("Upgrades", func(t *testing.T) {
		path := build(t, v1State{Next: 2, Bytes: 100, LastStored: t0, Applied: 3})
		p := openAt(t, path)
		bodies, _ := readAll(t, p)
		equal(t, "log", bodies, []string{"body-a", "body-b"})
		equal(t, "next", offsetsOf(appendAt(t, p, t0, msg("c"))), []uint64{2})
		var half []store.HalfTx
		p.HalfTxs(func(h store.HalfTx) bool { half = append(half, h); return true })
		equal(t, "half", half, []store.HalfTx{{TxID: "tx", Producer: "node", FirstSeen: t0, Messages: 1}})
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx"})
		equal(t, "commit", offsetsOf(c.Acks), []uint64{3})
	})
	t.Run("RenamedField", func(t *testing.T) {
		path := build(t, map[string]any{"NextOffset": 2, "Low": 0})
		_, err := store.Open(path, store.Options{})
		if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Fatalf("state with an unknown field: %v, want ErrCorrupt naming the file", err)
		}
	})
}

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

// TestPartition_BoltFailureSticks: after a bbolt commit fails (the file's
// writes return ENOSPC), nothing more is acknowledged, even once the file
// takes writes again; reopening finds every acknowledged message.
func TestPartition_BoltFailureSticks(t *testing.T) {
	for _, withLog := range []bool{false, true} {
		t.Run(fmt.Sprintf("WAL=%v", withLog), func(t *testing.T) {
			dir := t.TempDir()
			var n *walNode
			var p *store.Partition
			path := filepath.Join(dir, "0.db")
			if withLog {
				n = mustWALNode(t, dir)
				p = n.p
			} else {
				var err error
				if p, err = store.Open(path, store.Options{}); err != nil {
					t.Fatal(err)
				}
			}
			var acked []uint64
			send := func(id string) error {
				res, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}})
				if err == nil {
					acked = append(acked, res.Acks[0].Offset)
				}
				return err
			}
			for i := range 3 {
				if err := send(fmt.Sprint("a", i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.HalfTxs(func(store.HalfTx) bool { return true }); err != nil { // everything in the file
				t.Fatal(err)
			}
			restore := store.BreakFile(p)
			err := send("during")
			if withLog {
				// The log took it; the file cannot: reading the file fails,
				// and so does every later write.
				if err != nil {
					t.Fatalf("logged send: %v", err)
				}
				err = p.HalfTxs(func(store.HalfTx) bool { return true })
			}
			if !errors.Is(err, store.ErrFailed) {
				t.Fatalf("after the failed commit: %v, want ErrFailed", err)
			}
			restore()
			for i := range 3 {
				if err := send(fmt.Sprint("after", i)); !errors.Is(err, store.ErrFailed) {
					t.Fatalf("send %d once the file takes writes again: %v, want ErrFailed", i, err)
				}
			}
			if err := p.Close(); !errors.Is(err, store.ErrFailed) {
				t.Fatalf("Close: %v, want the failure", err)
			}
			if withLog {
				n.wal.Close()
				n.p = nil
				r := mustWALNode(t, dir)
				p = r.p
			} else {
				p = openAt(t, path)
			}
			_, offsets := readAll(t, p)
			for _, off := range acked {
				if int(off) >= len(offsets) || offsets[off] != off {
					t.Fatalf("acked offset %d missing after reopen (have %v)", off, offsets)
				}
			}
		})
	}
}

// TestPartition_ApplyBatch: the batch form applies commands in order in one
// batch; a command's own error fails that command only.
func TestPartition_ApplyBatch(t *testing.T) {
	p, _ := open(t)
	cmds := []*store.Command{
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}},
		{Op: store.OpCommitOffset, Now: t0}, // no group
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b"), msg("a")}},
		{Op: store.OpAppend, Msgs: []store.Message{msg("c")}}, // no Now
		{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 2},
	}
	res, errs, err := p.ApplyBatch(context.Background(), cmds)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, store.ErrBadCommand, nil, store.ErrBadCommand, nil} {
		if !errors.Is(errs[i], want) || (want == nil) != (errs[i] == nil) {
			t.Fatalf("command %d: %v, want %v", i, errs[i], want)
		}
	}
	equal(t, "acks", res[2].Acks, []store.Ack{{Offset: 1}, {Offset: 0, Duplicate: true}})
	if off, ok, _ := p.GroupOffset("g"); !ok || off != 2 {
		t.Fatalf("group offset %d %v", off, ok)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := p.ApplyBatch(ctx, cmds); !errors.Is(err, context.Canceled) {
		t.Fatalf("ApplyBatch with an ended ctx: %v", err)
	}
	bodies, _ := readAll(t, p)
	equal(t, "log", bodies, []string{"body-a", "body-b"})
}

// TestRegress_StateOnlyChangeKept: a command whose only effect is on the
// partition's state (a dedup prune over records without an ID advances
// DedupLow and deletes nothing) was dropped as an empty batch when it came
// alone, and kept when batched with others: two partitions given the same
// commands ended in different states (found by TestCrashSim).
func TestRegress_StateOnlyChangeKept(t *testing.T) {
	ms := int64(time.Millisecond)
	cmds := []*store.Command{
		{Op: store.OpAppend, Now: t0 + 4*ms, Msgs: []store.Message{{Body: []byte("no id")}}},
		{Op: store.OpTrim, Now: t0 + 12*ms, DedupTTL: 2 * ms},
	}
	dir := t.TempDir()
	_, _, alone, err := simReference(dir, cmds, len(cmds))
	if err != nil {
		t.Fatal(err)
	}
	p, err := store.Open(filepath.Join(dir, "batched.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, _, err := p.ApplyBatch(context.Background(), append(cmds, &store.Command{Op: store.OpCommitOffset, Now: t0 + 12*ms, Group: "g"})); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(context.Background(), &store.Command{Op: store.OpDeleteGroup, Now: t0 + 12*ms, Group: "g"}); err != nil {
		t.Fatal(err)
	}
	batched, err := store.Dump(p)
	if err != nil {
		t.Fatal(err)
	}
	if alone[0] != batched {
		t.Fatalf("the same commands, alone and batched, end in different states:\n%s", dumpDiff(alone[0], batched))
	}
	if !strings.Contains(batched, "DedupLow:1") {
		t.Fatalf("the prune did not advance DedupLow:\n%s", batched)
	}
}

// TestOpen_DamagedNames: a bit flipped in the name of one of a partition
// file's buckets, or of one of its meta keys, is ErrCorrupt naming the
// file. Found by TestMQ_CorruptionTrials (seed 1796224600876179737): the
// meta bucket's name damaged, Open made a new meta bucket and the file
// opened empty, its 24 acked messages gone without an error; a damaged
// dedup or groups name would have lost the dedup index or the committed
// offsets the same way.
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

// TestOpen_NewFileStaysSmall: a partition file is mapped ahead of its data
// (openBolt's boltMapSize) but grows in small steps. bbolt sizes a file
// whose mapping is within its AllocSize to the whole mapping, which made
// every new partition file 16 MiB or more in an earlier attempt.
func TestOpen_NewFileStaysSmall(t *testing.T) {
	p, path := open(t)
	for i := range 100 {
		appendAt(t, p, t0+int64(i), msg(fmt.Sprint(i)))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 2<<20 {
		t.Fatalf("a file holding 100 small messages is %d bytes", fi.Size())
	}
	p = openAt(t, path)
	if bodies, _ := readAll(t, p); len(bodies) != 100 {
		t.Fatalf("reopened: %d messages, want 100", len(bodies))
	}
}
