package store_test

// I/O faults: EIO and ENOSPC at every write and sync of one send, one
// transaction commit and one recovery.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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
