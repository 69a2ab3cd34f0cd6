package store_test

// I/O faults: EIO and ENOSPC at every write and sync of one send, one
// transaction commit and one recovery.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// faultNode is one partition behind a WAL on a memfs.FS.
type faultNode struct {
	fs  *memfs.FS
	dir string
	w   *store.WAL
	p   *store.Partition
}

func openFaultNode(mfs *memfs.FS, dir string, opts store.Options) (*faultNode, error) {
	w, p, err := openWALPartition("/wal", store.WALOptions{FS: mfs, SegmentSize: 64 << 10}, filepath.Join(dir, "p.db"), opts)
	if err != nil {
		return nil, err
	}
	return &faultNode{fs: mfs, dir: dir, w: w, p: p}, nil
}

func (n *faultNode) close() {
	n.p.Close()
	n.w.Close()
}

// faultHit is the operation failAt failed.
type faultHit struct {
	mu     sync.Mutex // the zero-filler's operations may come after the run
	op     string
	record bool // a write holding the message under fault
}

func (h *faultHit) get() (op string, record bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.op, h.record
}

// failAt makes the k-th write, sync, truncate, remove or directory sync
// from now fail with errno, and says which one it failed.
func failAt(m *memfs.FS, k int, errno error) *faultHit {
	hit := &faultHit{}
	m.SetFail(func(op memfs.Op) error {
		if op.N != k {
			return nil
		}
		hit.mu.Lock()
		hit.op, hit.record = op.Kind+" "+op.Name, op.Kind == "write" && bytes.Contains(op.Data, faultBody)
		hit.mu.Unlock()
		return fmt.Errorf("%s %s: %w", op.Kind, op.Name, errno)
	})
	return hit
}

// opsOfRun returns the operations run makes, once it calls its fault
// argument, on a fresh copy of the setup.
func opsOfRun(t *testing.T, setup func(t *testing.T) (*memfs.FS, string), run func(mfs *memfs.FS, dir string, fault func()) error) []string {
	t.Helper()
	mfs, dir := setup(t)
	var mu sync.Mutex
	var ops []string
	err := run(mfs, dir, func() {
		mfs.SetFail(func(op memfs.Op) error {
			mu.Lock()
			defer mu.Unlock()
			ops = append(ops, op.Kind+" "+op.Name)
			return nil
		})
	})
	if err != nil {
		t.Fatalf("without faults: %v", err)
	}
	mfs.SetFail(nil)
	mu.Lock()
	defer mu.Unlock()
	return ops
}

var faultBody = []byte("the message under fault")

// faultSetup leaves a closed node with three acked messages at 0..2 and,
// with prepared, transaction "tx" prepared (one half message): all of it
// in the WAL only, as a crash left it.
func faultSetup(prepared bool) func(t *testing.T) (*memfs.FS, string) {
	return func(t *testing.T) (*memfs.FS, string) {
		t.Helper()
		dir, err := os.MkdirTemp(simTempRoot(), "fault")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		mfs := memfs.New()
		n, err := openFaultNode(mfs, dir, store.Options{MaterializeAfter: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for i := range 3 {
			if _, err := n.p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: fmt.Sprint("m", i), Body: []byte(fmt.Sprint("body", i))}}}); err != nil {
				t.Fatal(err)
			}
		}
		if prepared {
			if _, err := n.p.Apply(ctx, &store.Command{Op: store.OpPrepare, Now: t0, TxID: "tx", Msgs: []store.Message{{ID: "half", Body: faultBody}}}); err != nil {
				t.Fatal(err)
			}
		}
		img := mfs.Image(false, nil) // the files as written: the partition file is behind
		n.close()
		return img, dir
	}
}

// TestFault_EveryWriteAndSync fails, in turn, each write and sync of a send,
// a transaction commit and a recovery with EIO and with ENOSPC: the call
// returns a clear error (wrapping the errno) in time and without a panic,
// nothing is acknowledged that the fault kept from the disk, the partition
// refuses writes until reopened, and a reopen finds every acknowledged
// message, the failed one at most once, and sends work.
func TestFault_EveryWriteAndSync(t *testing.T) {
	send := func(n *faultNode) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := n.p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0 + 1, Msgs: []store.Message{{ID: "new", Body: faultBody}}})
		return err
	}
	commit := func(n *faultNode) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := n.p.Apply(ctx, &store.Command{Op: store.OpCommitTx, Now: t0 + 1, TxID: "tx"})
		return err
	}
	scenarios := []struct {
		name     string
		prepared bool
		// act runs on an open node (nil: the fault hits the recovery).
		act func(*faultNode) error
	}{
		{"send", false, send},
		{"commit", true, commit},
		{"recovery", true, nil},
	}
	var table []string
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			setup := faultSetup(sc.prepared)
			// The run under fault: the recovery (open), or the act on an
			// open node.
			var node *faultNode
			run := func(mfs *memfs.FS, dir string, fault func()) error {
				if sc.act == nil {
					fault()
					n, err := openFaultNode(mfs, dir, store.Options{MaterializeAfter: time.Hour})
					if err != nil {
						return err
					}
					node = n
					return nil
				}
				n, err := openFaultNode(mfs, dir, store.Options{MaterializeAfter: time.Hour})
				if err != nil {
					return err
				}
				node = n
				fault()
				return sc.act(n)
			}
			ops := opsOfRun(t, setup, func(mfs *memfs.FS, dir string, fault func()) error {
				err := run(mfs, dir, fault)
				if node != nil {
					node.close()
					node = nil
				}
				return err
			})
			failed, acked, records := 0, 0, 0
			for k := 1; k <= len(ops); k++ {
				for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOSPC} {
					mfs, dir := setup(t)
					var hitp *faultHit
					err := run(mfs, dir, func() { hitp = failAt(mfs, k, errno) })
					var hitOp string
					var hitRecord bool
					if hitp != nil {
						hitOp, hitRecord = hitp.get()
					}
					what := fmt.Sprintf("%s failing at %d (%s) with %v", sc.name, k, hitOp, errno)
					if hitRecord {
						records++
					}
					if err != nil {
						failed++
						if !errors.Is(err, errno) {
							t.Errorf("%s: error %q does not wrap the errno", what, err)
						}
						if node != nil && sc.act != nil {
							// Fail closed: no write is accepted until reopen.
							if err2 := send(node); err2 == nil {
								t.Errorf("%s: a send after the failure was acknowledged", what)
							}
						}
					} else {
						acked++
						if hitRecord {
							t.Errorf("%s: acknowledged, though the write holding it failed", what)
						}
					}
					if node != nil {
						node.close()
						node = nil
					}
					// A power loss now; then a clean reopen.
					checkFaultReopen(t, what, mfs.Image(true, nil), dir, sc.name, err == nil)
				}
			}
			table = append(table, fmt.Sprintf("%-8s %2d writes and syncs x 2 errnos: %2d failed with the errno (%d at the record's own write), %2d acknowledged (the fault came after the sync)",
				sc.name, len(ops), failed, records, acked))
		})
	}
	for _, l := range table {
		t.Log(l)
	}
}

// checkFaultReopen opens img cleanly and checks the acknowledged state:
// messages 0..2, the message under fault (present when acked, at most once
// otherwise; for a commit: committed when acked, else either committed with
// its half message or still prepared), and a working send.
func checkFaultReopen(t *testing.T, what string, img *memfs.FS, dir, scenario string, acked bool) {
	t.Helper()
	n, err := openFaultNode(img, dir, store.Options{})
	if err != nil {
		t.Errorf("%s: reopen: %v", what, err)
		return
	}
	defer n.close()
	msgs, err := n.p.Read(0, 100, 0, nil)
	if err != nil {
		t.Errorf("%s: read: %v", what, err)
		return
	}
	for i := range 3 {
		if i >= len(msgs) || string(msgs[i].Body) != fmt.Sprint("body", i) {
			t.Errorf("%s: acknowledged message %d lost: %d messages", what, i, len(msgs))
			return
		}
	}
	extra := len(msgs) - 3
	switch scenario {
	case "send":
		if extra > 1 || acked && extra != 1 || extra == 1 && string(msgs[3].Body) != string(faultBody) {
			t.Errorf("%s: %d messages after the three acked (acked: %v)", what, extra, acked)
		}
	case "commit", "recovery":
		d, err := n.p.Decision("tx")
		if err != nil {
			t.Errorf("%s: decision: %v", what, err)
		}
		committed := d == store.Committed
		if scenario == "commit" && acked && !committed || committed != (extra == 1) || extra > 1 {
			t.Errorf("%s: decision %v with %d messages after the three acked (acked: %v)", what, d, extra, acked)
		}
		if !committed {
			halves := 0
			if err := n.p.HalfTxs(func(store.HalfTx) bool { halves++; return true }); err != nil || halves != 1 {
				t.Errorf("%s: %d prepared transactions (%v), want the one", what, halves, err)
			}
		}
	}
	res, err := n.p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0 + 2, Msgs: []store.Message{{ID: "after", Body: []byte("after")}}})
	if err != nil || res.Acks[0].Offset != uint64(len(msgs)) {
		t.Errorf("%s: send after reopen: %+v, %v", what, res, err)
	}
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
