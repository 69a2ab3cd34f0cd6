package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// ackRec is what one acknowledged message must be after any crash.
type ackRec struct {
	id      string
	body    string // "" for a duplicate ack (the first copy's body is elsewhere)
	offset  uint64
	delayed bool
}

type partLog struct {
	mu   sync.Mutex
	acks []ackRec
}

func (l *partLog) add(msgs []store.Message, acks []store.Ack) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, a := range acks {
		r := ackRec{id: msgs[i].ID, offset: a.Offset, delayed: a.Delayed}
		if !a.Duplicate {
			r.body = string(msgs[i].Body)
		}
		l.acks = append(l.acks, r)
	}
}

// crashNode is a WAL on a memfs.FS and partitions on the OS file system.
type crashNode struct {
	fs    *memfs.FS
	dir   string // partition files
	wal   *store.WAL
	parts []*store.Partition
}

func (n *crashNode) close() {
	for _, p := range n.parts {
		p.Close()
	}
	n.wal.Close()
}

// check verifies every acknowledged message of logs in n.
func (n *crashNode) check(t *testing.T, logs []*partLog, what string) {
	t.Helper()
	for i, p := range n.parts {
		st := p.Stats()
		msgs, err := p.Read(0, math.MaxInt32, 0, nil)
		if err != nil {
			t.Fatalf("%s: partition %d: read: %v", what, i, err)
		}
		if uint64(len(msgs)) != st.Next-st.Low {
			t.Fatalf("%s: partition %d: %d messages in [%d, %d)", what, i, len(msgs), st.Low, st.Next)
		}
		ids := map[string]uint64{}
		for j, m := range msgs {
			if m.Offset != st.Low+uint64(j) {
				t.Fatalf("%s: partition %d: offset %d at position %d: not dense", what, i, m.Offset, j)
			}
			if prev, dup := ids[m.ID]; dup && m.ID != "" {
				t.Fatalf("%s: partition %d: ID %s stored at %d and %d", what, i, m.ID, prev, m.Offset)
			}
			ids[m.ID] = m.Offset
		}
		delayed := 0
		for _, a := range logs[i].acks {
			if a.delayed {
				delayed++
				continue
			}
			if a.offset < st.Low || a.offset >= st.Next {
				t.Fatalf("%s: partition %d: acked %s at %d outside [%d, %d)", what, i, a.id, a.offset, st.Low, st.Next)
			}
			m := msgs[a.offset-st.Low]
			if m.ID != a.id || a.body != "" && string(m.Body) != a.body {
				t.Fatalf("%s: partition %d: offset %d holds %s, acked %s", what, i, a.offset, m.ID, a.id)
			}
		}
		if st.Delayed < int64(delayed) {
			// delayed acks may repeat (duplicates); count distinct IDs
			seen := map[string]bool{}
			for _, a := range logs[i].acks {
				if a.delayed {
					seen[a.id] = true
				}
			}
			if st.Delayed < int64(len(seen)) {
				t.Fatalf("%s: partition %d: %d delayed, %d acked", what, i, st.Delayed, len(seen))
			}
		}
		// Dedup answers survive: resend a sample of acked IDs.
		for k, a := range logs[i].acks {
			if k%7 != 0 {
				continue
			}
			res, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0 + 1e12,
				Msgs: []store.Message{{ID: a.id, Body: []byte("resend")}}})
			if err != nil {
				t.Fatalf("%s: resend: %v", what, err)
			}
			got := res.Acks[0]
			if !got.Duplicate || got.Delayed != a.delayed || !a.delayed && got.Offset != a.offset {
				t.Fatalf("%s: partition %d: resend of %s (acked %+v): %+v", what, i, a.id, a, got)
			}
		}
	}
}

const crashParts = 3

func openCrashNode(t *testing.T, mfs *memfs.FS, dir string, wopts store.WALOptions, popts store.Options) (*crashNode, error) {
	t.Helper()
	wopts.FS = mfs
	w, err := store.OpenWAL("/wal", wopts)
	if err != nil {
		return nil, err
	}
	n := &crashNode{fs: mfs, dir: dir, wal: w}
	for i := range crashParts {
		o := popts
		o.WAL, o.Stream = w, fmt.Sprint("t/", i)
		p, err := store.Open(filepath.Join(dir, fmt.Sprint(i, ".db")), o)
		if err != nil {
			n.close()
			return nil, err
		}
		n.parts = append(n.parts, p)
	}
	if err := w.FinishRecovery(); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

func copyFiles(t *testing.T, src, dst string) {
	t.Helper()
	if err := copyFlat(src, dst); err != nil {
		t.Fatal(err)
	}
}

// copyFlat copies the files of src into dst.
func copyFlat(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// runLoad sends a mixed load to every partition of n until stop, recording
// what is acknowledged.
func runLoad(n *crashNode, logs []*partLog, seed uint64, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	var ids atomic.Int64
	for i, p := range n.parts {
		for s := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(i*10+s)))
				for k := 0; ; k++ {
					select {
					case <-stop:
						return
					default:
					}
					var msgs []store.Message
					for range 1 + rng.IntN(3) {
						id := ids.Add(1)
						if rng.IntN(5) == 0 && id > 10 {
							id = rng.Int64N(id) // a resend of an earlier ID
						}
						m := store.Message{ID: fmt.Sprint("m", id), Body: bytes.Repeat([]byte{byte(id)}, rng.IntN(3000))}
						m.Body = append(m.Body, fmt.Sprint("#", id)...)
						if rng.IntN(10) == 0 {
							m.DeliverAt = t0 + 1e15
						}
						msgs = append(msgs, m)
					}
					ctx := context.Background()
					var cancel context.CancelFunc = func() {}
					if rng.IntN(4) == 0 {
						ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(2000))*time.Microsecond)
					}
					var res store.Result
					var err error
					switch rng.IntN(10) {
					case 0:
						txid := fmt.Sprint("tx", i, "-", s, "-", k)
						if _, err = p.Apply(ctx, &store.Command{Op: store.OpPrepare, Now: t0, TxID: txid, Msgs: msgs}); err == nil {
							res, err = p.Apply(ctx, &store.Command{Op: store.OpCommitTx, Now: t0, TxID: txid})
						}
					case 1:
						_, err = p.Apply(ctx, &store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: uint64(k)})
						msgs = nil
					default:
						res, err = p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: msgs})
					}
					cancel()
					if err == nil && msgs != nil {
						logs[i].add(msgs, res.Acks)
					}
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						return // crashed: the partition failed
					}
				}
			}()
		}
	}
	return &wg
}

// TestWAL_PowerLossTwice runs a mixed load on three partitions sharing a
// WAL of small segments over a file system that loses unsynced bytes
// (keeping a random subset of unsynced sectors), crashes at a random
// moment, recovers, crashes again in the middle of recovery (after some
// partitions replayed, before FinishRecovery) and recovers again: every
// acknowledged message is at its acked offset with its dedup answer,
// offsets are dense, IDs unique.
func TestWAL_PowerLossTwice(t *testing.T) {
	rounds := 12
	if testing.Short() {
		rounds = 3
	}
	for round := range rounds {
		for _, powerLoss := range []bool{true, false} {
			every := time.Duration(0)
			if !powerLoss && round%2 == 1 {
				every = 5 * time.Millisecond // WithSyncInterval: a process crash loses nothing
			}
			t.Run(fmt.Sprintf("round%d/powerLoss=%v/every=%v", round, powerLoss, every), func(t *testing.T) {
				seed := uint64(round*2 + 1)
				rng := rand.New(rand.NewPCG(seed, 99))
				mfs := memfs.New()
				dir := t.TempDir()
				wopts := store.WALOptions{SegmentSize: 128 << 10, SyncInterval: every}
				// Odd rounds materialize (and delete released segments)
				// while the load runs.
				mat := time.Hour
				if round%2 == 1 {
					mat = time.Millisecond
				}
				n, err := openCrashNode(t, mfs, dir, wopts, store.Options{MaterializeAfter: mat, MaxPendingBytes: 1 << 30})
				if err != nil {
					t.Fatal(err)
				}
				logs := make([]*partLog, crashParts)
				for i := range logs {
					logs[i] = &partLog{}
				}
				stop := make(chan struct{})
				wg := runLoad(n, logs, seed, stop)
				time.Sleep(time.Duration(50+rng.IntN(700)) * time.Millisecond)
				img := mfs.Image(powerLoss, rng)
				crashDir := t.TempDir()
				// What the crash leaves of each partition file: its last
				// commit (a copy of the file taken while bbolt writes it
				// may mix two commits, which no crash leaves).
				for i, p := range n.parts {
					if err := store.SnapshotFile(p, filepath.Join(crashDir, fmt.Sprint(i, ".db"))); err != nil {
						t.Fatal(err)
					}
				}
				close(stop)
				wg.Wait()
				n.close()
				total := 0
				for _, l := range logs {
					total += len(l.acks)
				}
				t.Logf("%d acks, %d segments", total, len(img.Names(".wal")))

				// Recovery, crashed after partition 0 replayed: the
				// replay is in its file, the old segments not deleted.
				w, err := store.OpenWAL("/wal", store.WALOptions{FS: img})
				if err != nil {
					t.Fatalf("recovery 1: %v", err)
				}
				p0, err := store.Open(filepath.Join(crashDir, "0.db"), store.Options{WAL: w, Stream: "t/0"})
				if err != nil {
					t.Fatalf("recovery 1: %v", err)
				}
				img2 := img.Image(true, rng)
				crash2 := t.TempDir()
				copyFiles(t, crashDir, crash2)
				if err := store.SnapshotFile(p0, filepath.Join(crash2, "0.db")); err != nil {
					t.Fatal(err)
				}
				p0.Close()
				w.Close()

				r, err := openCrashNode(t, img2, crash2, store.WALOptions{}, store.Options{})
				if err != nil {
					t.Fatalf("recovery 2: %v", err)
				}
				r.check(t, logs, "after crash and crashed recovery")
				r.close()
				// Idempotent: once more, cleanly.
				r, err = openCrashNode(t, img2, crash2, store.WALOptions{}, store.Options{MaterializeAfter: time.Hour})
				if err != nil {
					t.Fatalf("reopen: %v", err)
				}
				r.check(t, logs, "after clean reopen")
				r.close()
			})
		}
	}
}
