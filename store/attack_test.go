package store_test

// Attacks on store/ that held: kept as regression tests.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
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

// TestAttack_PowerLoss runs a mixed load on three partitions sharing a WAL
// of small segments over a file system that loses unsynced bytes (keeping a
// random subset of unsynced sectors), crashes at a random moment, recovers,
// crashes again in the middle of recovery (after some partitions replayed,
// before FinishRecovery) and recovers again: every acknowledged message is at
// its acked offset with its dedup answer, offsets are dense, IDs unique.
func TestAttack_PowerLoss(t *testing.T) {
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

// TestAttack_CtxManySenders: senders whose ctx ends at random points (before
// enqueue, queued, applied, waiting for the sync) under a steady load: each
// returns promptly, each acked message is at its offset, and a message whose
// send failed is stored once or not at all.
func TestAttack_CtxManySenders(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNode(t, dir)
	var mu sync.Mutex
	acked := map[string]uint64{}
	var slow atomic.Int64
	var wg sync.WaitGroup
	for s := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 1))
			for k := range 60 {
				id := fmt.Sprint(s, "-", k)
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
				if rng.IntN(8) == 0 {
					cancel() // ended before enqueue
				}
				start := time.Now()
				res, err := n.p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}})
				if err != nil && time.Since(start) > 200*time.Millisecond {
					slow.Add(1)
				}
				cancel()
				if err == nil {
					mu.Lock()
					acked["id-"+id] = res.Acks[0].Offset
					mu.Unlock()
				} else if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					t.Errorf("Apply: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if slow.Load() > 0 {
		t.Errorf("%d sends returned more than 200ms after their ctx", slow.Load())
	}
	check := func(p *store.Partition) {
		msgs, err := p.Read(0, 1<<20, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for i, m := range msgs {
			if m.Offset != uint64(i) {
				t.Fatalf("offset %d at %d", m.Offset, i)
			}
			if seen[m.ID] {
				t.Fatalf("%s stored twice", m.ID)
			}
			seen[m.ID] = true
			if off, ok := acked[m.ID]; ok && off != m.Offset {
				t.Fatalf("%s acked at %d, stored at %d", m.ID, off, m.Offset)
			}
		}
		for id := range acked {
			if !seen[id] {
				t.Fatalf("acked %s missing", id)
			}
		}
	}
	check(n.p)
	crash := t.TempDir()
	copyDir(t, dir, crash)
	r := mustWALNode(t, crash)
	check(r.p)
}

// TestAttack_CloseConcurrent: Close racing Apply, ApplyBatch and every
// reader, with and without a WAL: nothing panics or hangs, every call
// returns a result or ErrClosed, and what was acked is there after reopen.
func TestAttack_CloseConcurrent(t *testing.T) {
	for _, withW := range []bool{false, true} {
		for round := range 20 {
			dir := t.TempDir()
			var w *store.WAL
			opts := store.Options{}
			if withW {
				var err error
				if w, err = store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{}); err != nil {
					t.Fatal(err)
				}
				opts = store.Options{WAL: w, Stream: "s", MaterializeAfter: time.Duration(round) * time.Millisecond}
			}
			path := filepath.Join(dir, "0.db")
			p, err := store.Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var acked []string
			var wg sync.WaitGroup
			ok := func(err error) bool {
				return err == nil || errors.Is(err, store.ErrClosed)
			}
			for s := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := 0; ; k++ {
						id := fmt.Sprint(s, "-", k)
						var err error
						switch k % 4 {
						case 0:
							var errs []error
							_, errs, err = p.ApplyBatch(context.Background(), []*store.Command{
								{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}},
								{Op: store.OpAppend}, // bad: zero Now
								{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: uint64(k)},
							})
							if err == nil && errs[0] == nil {
								mu.Lock()
								acked = append(acked, "id-"+id)
								mu.Unlock()
							}
							if err == nil && !errors.Is(errs[1], store.ErrBadCommand) && !errors.Is(errs[1], store.ErrClosed) {
								t.Errorf("bad command in a batch: %v", errs[1])
							}
						case 1:
							_, err = p.Read(0, 10, 0, nil)
						case 2:
							_, _, err = p.Get(uint64(k))
							if err == nil {
								_, err = p.Groups()
							}
							if err == nil {
								_, _, err = p.NextDue()
							}
						case 3:
							err = p.HalfTxs(func(store.HalfTx) bool { return true })
						}
						if !ok(err) {
							t.Errorf("op %d: %v", k%4, err)
							return
						}
						if errors.Is(err, store.ErrClosed) {
							return
						}
					}
				}()
			}
			time.Sleep(time.Duration(round) * time.Millisecond)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if w != nil {
				w.Close()
				if w, err = store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{}); err != nil {
					t.Fatal(err)
				}
				opts.WAL = w
			}
			p, err = store.Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := p.Read(0, 1<<20, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			have := map[string]bool{}
			for _, m := range msgs {
				have[m.ID] = true
			}
			for _, id := range acked {
				if !have[id] {
					t.Fatalf("acked %s missing after Close and reopen", id)
				}
			}
			p.Close()
			if w != nil {
				w.Close()
			}
		}
	}
}

// TestAttack_Bounds: edge inputs give ErrBadCommand or ErrTooLarge or work,
// never a panic, and survive a replay.
func TestAttack_Bounds(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	p := n.p
	key := strings.Repeat("k", store.MaxKeyBytes)
	bad := []store.Command{
		{Op: 0, Now: t0},
		{Op: 200, Now: t0},
		{Op: store.OpAppend, Now: 0},
		{Op: store.OpAppend, Now: -1},
		{Op: store.OpAppend, Now: math.MinInt64},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: key + "x"}}},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{FreshID: true}}},
		{Op: store.OpCommitOffset, Now: t0},
		{Op: store.OpCommitOffset, Now: t0, Group: key + "x"},
		{Op: store.OpPrepare, Now: t0},
		{Op: store.OpPrepare, Now: t0, TxID: key + "x"},
		{Op: store.OpTrim, Now: t0, Limit: -1},
		{Op: store.OpTrim, Now: t0, MaxAge: -1},
		{Op: store.OpTrim, Now: t0, Msgs: []store.Message{{}}},
		{Op: store.OpRelease, Now: t0, Msgs: []store.Message{{}}},
		{Op: store.OpRollbackTx, Now: t0},
	}
	for i := range bad {
		if _, err := p.Apply(context.Background(), &bad[i]); !errors.Is(err, store.ErrBadCommand) {
			t.Fatalf("bad command %d %+v: %v, want ErrBadCommand", i, bad[i], err)
		}
	}
	good := []store.Command{
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: key, Body: []byte("max id")}}},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{}}},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{Body: []byte{}}}},
		{Op: store.OpAppend, Now: t0},
		{Op: store.OpAppend, Now: math.MaxInt64, Msgs: []store.Message{{ID: "late", DeliverAt: math.MinInt64, Timestamp: math.MinInt64}}},
		{Op: store.OpAppend, Now: 1, Msgs: []store.Message{{ID: "early-delayed", DeliverAt: math.MaxInt64}}},
		{Op: store.OpCommitOffset, Now: t0, Group: key, Offset: math.MaxUint64},
		{Op: store.OpPrepare, Now: t0, TxID: key, Producer: key, Msgs: []store.Message{{ID: key}}},
		{Op: store.OpTxChecked, Now: t0, TxID: key},
		{Op: store.OpTrim, Now: math.MaxInt64, MaxAge: math.MaxInt64, DedupTTL: math.MaxInt64, DecideTTL: math.MaxInt64},
		{Op: store.OpRelease, Now: math.MaxInt64 - 1},
		{Op: store.OpCommitTx, Now: t0, TxID: key},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: key, Body: []byte("dup")}}},
	}
	for i := range good {
		if _, err := p.Apply(context.Background(), &good[i]); err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
	}
	st := p.Stats()
	msgs, err := p.Read(0, 100, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	r := mustWALNode(t, crash)
	equal(t, "stats after replay", r.p.Stats(), st)
	m2, err := r.p.Read(0, 100, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "messages after replay", fmt.Sprint(m2), fmt.Sprint(msgs))
	if off, ok, err := r.p.GroupOffset(key); err != nil || !ok || off != math.MaxUint64 {
		t.Fatalf("group after replay: %d %v %v", off, ok, err)
	}
}

// TestAttack_WALDamageEverywhere flips each byte (sampled) of a crash
// image's segment before its last write: Open reports ErrCorrupt naming the
// segment, or (for a byte the records do not cover) opens with every acked
// message; never a panic, never a silent loss.
func TestAttack_WALDamageEverywhere(t *testing.T) {
	clean := crashImage(t, 12, func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 100+i*40) })
	seg := segments(t, clean)[0]
	orig, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	fr := walFrames(t, orig)
	lastWrite := fr[len(fr)-2].off
	recEnd := fr[len(fr)-1].off + 8 + int64(len(fr[len(fr)-1].body))
	var offs []int64
	for o := int64(0); o < lastWrite; o += 31 {
		offs = append(offs, o)
	}
	offs = append(offs, recEnd, recEnd+3, recEnd+4096, int64(len(orig))-1) // the zero area
	var corrupt, fine int
	for _, o := range offs {
		dir := t.TempDir()
		copyDir(t, clean, dir)
		b := bytes.Clone(orig)
		b[o] ^= 0x40
		s := filepath.Join(dir, "wal", filepath.Base(seg))
		if err := os.WriteFile(s, b, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := openWALNode(t, dir)
		if err != nil {
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), s) {
				t.Fatalf("flip at %d: %v, want ErrCorrupt naming %s", o, err, s)
			}
			corrupt++
			continue
		}
		bodies, _ := readAll(t, r.p)
		if len(bodies) != 12 {
			t.Fatalf("flip at %d (records end at %d): opened with %d of 12 acked messages", o, recEnd, len(bodies))
		}
		r.close(t)
		fine++
	}
	t.Logf("%d flips: %d ErrCorrupt, %d harmless", len(offs), corrupt, fine)
}

// TestAttack_TxDelayReplay: transactions interleaved with appends and
// delayed messages, released and trimmed, replayed from a crash image and
// reopened with other options (no stall; SyncInterval): the same log, state
// and decisions.
func TestAttack_TxDelayReplay(t *testing.T) {
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
