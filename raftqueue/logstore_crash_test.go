package raftqueue

// Crashes and I/O faults under WALLog, on the in-memory file system of the
// store's crash tests: what StoreLogs and DeleteRange acknowledged must be
// what a restart finds.

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// crashSegSize makes the WAL start a segment every few calls, and delete
// old ones as records are released.
const crashSegSize = 32 << 10

// openMemLog opens the WAL in /wal of mfs and the group log "g" in it, as a
// node does.
func openMemLog(mfs *memfs.FS, segSize int64) (*store.WAL, *WALLog, error) {
	return openNodeLogWith("/wal", store.WALOptions{FS: mfs, SegmentSize: segSize}, "g")
}

// resolve checks that l holds m, or m with unknown applied (the call that
// failed when the disk did, which may have landed), and returns the model
// of what it holds.
func resolve(l *WALLog, m *raftLogModel, unknown *logOp) (*raftLogModel, error) {
	d := m.diff(l)
	if d == "" {
		return m, nil
	}
	if unknown == nil {
		return nil, errors.New(d)
	}
	m2 := m.applied(*unknown)
	d2 := m2.diff(l)
	if d2 == "" {
		return m2, nil
	}
	return nil, fmt.Errorf("without %v: %s; with it: %s", *unknown, d, d2)
}

// crashImage is the image a crash of a memfs.FS left, once it crashed.
type crashImage struct {
	mu  sync.Mutex
	img *memfs.FS
}

func (c *crashImage) set(img *memfs.FS) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.img = img
}

func (c *crashImage) get() *memfs.FS {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.img
}

// TestWALLog_Crash drives a log as raft does (raftLogGen) on a file system
// that crashes at a random write, sync, truncate, remove or directory sync
// (a power loss keeping a random subset of the unsynced sectors, or a
// process crash keeping what was written), recovery included, then reopens
// the image: every call that returned nil is there (an entry stored with
// its exact content, a deletion not undone), the call that failed is
// there or not, and nothing else is. Removes also fail at random, and a
// power loss may undo an unsynced one: records the log released are left
// behind, which must change nothing.
func TestWALLog_Crash(t *testing.T) {
	// Each reopen reads the zeros allocated ahead in the newest segments
	// (megabytes), which the race detector slows most.
	schedules := 150
	if raceEnabled {
		schedules = 6
	}
	start := time.Now()
	var calls, lives int
	for seed := range uint64(schedules) {
		c, n := walLogCrashRun(t, seed)
		calls += c
		lives += n
	}
	t.Logf("%d schedules, %d lives, %d calls acknowledged in %v", schedules, lives, calls, time.Since(start).Round(time.Millisecond))
}

// walLogCrashRun runs one schedule: lives of the log, each ended by a
// crash; it returns the calls acknowledged and the lives.
func walLogCrashRun(t *testing.T, seed uint64) (calls, lives int) {
	t.Helper()
	g := newRaftLogGen(seed, 300)
	rng := rand.New(rand.NewPCG(seed, 1))
	m := &raftLogModel{first: 1}
	var unknown *logOp
	mfs := memfs.New()
	for lives = 1; lives <= 4; lives++ {
		what := fmt.Sprintf("seed %d life %d", seed, lives)
		var crash crashImage
		powerLoss := rng.IntN(2) == 0
		// The file system's own generator: it draws under its lock, from
		// whichever goroutine crashes it.
		fsRng := rand.New(rand.NewPCG(seed, uint64(lives)))
		mfs.CrashAt(1+rng.IntN(200), powerLoss, fsRng, crash.set)
		w, l, err := openMemLog(mfs, crashSegSize)
		if err != nil {
			if crash.get() == nil {
				t.Fatalf("%s: open: %v", what, err)
			}
			mfs = crash.get() // crashed in recovery: the unknown call stays unknown
			continue
		}
		if crash.get() == nil { // not crashed yet: the log reads what recovery found
			if m, err = resolve(l, m, unknown); err != nil {
				t.Fatalf("%s: after reopening: %v", what, err)
			}
			unknown = nil
		}
		failRemoves(mfs, fsRng)
		for failed := false; !failed; {
			for _, op := range g.next(m) {
				if err := op.run(l); err != nil {
					if crash.get() == nil {
						t.Fatalf("%s: %v failed before the crash: %v", what, op, err)
					}
					unknown, failed = &op, true
					break
				}
				m.apply(op)
				calls++
			}
		}
		w.Close() // the crash's error
		mfs = crash.get()
	}
	w, l, err := openMemLog(mfs, crashSegSize)
	if err != nil {
		t.Fatalf("seed %d: open at the end: %v", seed, err)
	}
	defer w.Close()
	if _, err := resolve(l, m, unknown); err != nil {
		t.Fatalf("seed %d: at the end: %v", seed, err)
	}
	return calls, lives - 1
}

// failRemoves makes a third of mfs's removes fail: the WAL then keeps the
// segment, records released by the log and all.
func failRemoves(mfs *memfs.FS, rng *rand.Rand) {
	mfs.SetFail(func(op memfs.Op) error {
		if op.Kind == "remove" && rng.IntN(3) == 0 {
			return syscall.EIO
		}
		return nil
	})
}

// TestWALLog_Faults fails each write, sync, truncate, remove and directory
// sync of a run of raft-like calls, one at a time, with EIO and ENOSPC:
// the call that meets the fault fails with the errno (never a success the
// sync did not cover), every later write is refused (a failed fsync is
// sticky), and after a power loss the log holds every call acknowledged,
// the failed one or not, and nothing else.
func TestWALLog_Faults(t *testing.T) {
	const calls = 30
	stride := 1 // under the race detector, every stride-th operation
	if raceEnabled {
		stride = 10
	}
	ops := 0 // the operations of the run without faults
	{
		mfs := memfs.New()
		w, l, err := openMemLog(mfs, crashSegSize)
		if err != nil {
			t.Fatal(err)
		}
		before := mfs.Ops()
		g, m := newRaftLogGen(1, 600), &raftLogModel{first: 1}
		for range calls {
			for _, op := range g.next(m) {
				if err := op.run(l); err != nil {
					t.Fatal(err)
				}
				m.apply(op)
			}
		}
		ops = mfs.Ops() - before
		w.Close()
	}
	failed, acked := 0, 0
	for k := 1; k <= ops; k += stride {
		for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOSPC} {
			what := fmt.Sprintf("operation %d failing with %v", k, errno)
			mfs := memfs.New()
			w, l, err := openMemLog(mfs, crashSegSize)
			if err != nil {
				t.Fatal(err)
			}
			var hit string
			var hitMu sync.Mutex
			mfs.SetFail(func(op memfs.Op) error {
				if op.N != k {
					return nil
				}
				hitMu.Lock()
				hit = op.Kind + " " + op.Name
				hitMu.Unlock()
				return fmt.Errorf("%s %s: %w", op.Kind, op.Name, errno)
			})
			g, m := newRaftLogGen(1, 600), &raftLogModel{first: 1}
			var unknown *logOp
		run:
			for range calls {
				for _, op := range g.next(m) {
					if err := op.run(l); err != nil {
						// (A sync failed through the zero-filler's handle
						// reports EIO to the writer's, which may fail the
						// WAL first.)
						if !errors.Is(err, errno) && !errors.Is(err, syscall.EIO) {
							t.Errorf("%s: %v: error %q does not wrap the errno", what, op, err)
						}
						unknown = &op
						break run
					}
					m.apply(op)
				}
			}
			if unknown != nil {
				failed++
				checkRefused(t, what, l, m)
			} else {
				acked++
			}
			w.Close()
			hitMu.Lock()
			what += " (" + hit + ")"
			hitMu.Unlock()
			// A power loss now: only what was synced is left.
			w2, l2, err := openMemLog(mfs.Image(true, nil), crashSegSize)
			if err != nil {
				t.Fatalf("%s: reopen: %v", what, err)
			}
			if _, err := resolve(l2, m, unknown); err != nil {
				t.Errorf("%s: after a power loss: %v", what, err)
			}
			w2.Close()
		}
	}
	t.Logf("%d operations, every %d failed in turn, x 2 errnos: %d runs failed a call, %d acknowledged every call (the fault hit a seal, a remove, the zero-filler after the last call)", ops, stride, failed, acked)
}

// checkRefused checks that a log whose write failed refuses every write:
// an append, a tail deletion and a compaction.
func checkRefused(t *testing.T, what string, l *WALLog, m *raftLogModel) {
	t.Helper()
	next := m.first
	if len(m.ents) > 0 {
		next = m.last() + 1
	}
	if err := l.StoreLogs([]*raft.Log{{Index: next, Term: 1}}); err == nil {
		t.Errorf("%s: an append after the failure was acknowledged", what)
	}
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	if last > first {
		if err := l.DeleteRange(last, last); err == nil {
			t.Errorf("%s: a tail deletion after the failure was acknowledged", what)
		}
		if err := l.DeleteRange(first, first); err == nil {
			t.Errorf("%s: a compaction after the failure was acknowledged", what)
		}
	}
}

// replayPayloads rebuilds a log from record payloads as OpenWALLog does
// from the records it retains, in order; each record's place is made up
// (segment 0, its number as offset), so w only counts their releases. It
// returns the log, which keeps the records it needs, like one opened.
func replayPayloads(w *store.WAL, payloads [][]byte) (*WALLog, error) {
	l := &WALLog{w: w, stream: "g", live: map[store.WALRecord]int{}}
	rp := &replayer{l: l, ents: map[uint64]logLoc{}}
	for i, p := range payloads {
		r := store.WALRecord{Off: int64(i), N: len(p)}
		l.live[r] = 0
		if err := rp.replay(r, p); err != nil {
			return nil, err
		}
	}
	if err := rp.finish(); err != nil {
		return nil, err
	}
	for r, n := range l.live {
		if n == 0 {
			delete(l.live, r)
		}
	}
	return l, nil
}

// replayedEntries decodes the entries of a log from replayPayloads.
func replayedEntries(l *WALLog, payloads [][]byte) ([]*raft.Log, error) {
	var out []*raft.Log
	for i, loc := range l.ents {
		p := payloads[loc.rec.Off]
		e := new(raft.Log)
		rest, err := decodeLog(p[loc.off:loc.off+loc.len], e)
		if err != nil || len(rest) != 0 || e.Index != l.first+uint64(i) || e.Index != loc.index {
			return nil, fmt.Errorf("entry %d of the log: %+v, %v", l.first+uint64(i), e, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// sameEntries reports whether two runs of entries are equal, field by
// field.
func sameEntries(a, b []*raft.Log) bool {
	return slices.EqualFunc(a, b, func(x, y *raft.Log) bool {
		return x.Index == y.Index && x.Term == y.Term && x.Type == y.Type &&
			bytes.Equal(x.Data, y.Data) && bytes.Equal(x.Extensions, y.Extensions) &&
			x.AppendedAt.Equal(y.AppendedAt)
	})
}

// TestWALLog_DeadRecords: a record the log released may be gone after a
// restart (its segment deleted) or still there (other records kept the
// segment, a remove failed, a power loss undid an unsynced one). After
// every call of a raft-like run, the records the log keeps plus any subset
// of those it released must replay to the log, and keep at least the
// records the log keeps.
func TestWALLog_DeadRecords(t *testing.T) {
	seeds := uint64(6)
	if raceEnabled {
		seeds = 2
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { deadRecordsRun(t, seed) })
	}
}

func deadRecordsRun(t *testing.T, seed uint64) {
	w, l, err := openMemLog(memfs.New(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	scratch, _, err := openMemLog(memfs.New(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer scratch.Close()
	g := newRaftLogGen(seed, 50)
	rng := rand.New(rand.NewPCG(seed, 3))
	m := &raftLogModel{first: 1}
	var recs []store.WALRecord // every record written, in log order
	payload := map[store.WALRecord][]byte{}
	for step := range 300 {
		for _, op := range g.next(m) {
			if err := op.run(l); err != nil {
				t.Fatalf("step %d: %v: %v", step, op, err)
			}
			m.apply(op)
		}
		// The records written by this step's calls: each is kept at first
		// (its entries, or pinned).
		l.mu.RLock()
		kept := map[store.WALRecord]bool{}
		for r := range l.live {
			kept[r] = true
		}
		l.mu.RUnlock()
		var fresh []store.WALRecord
		for r := range kept {
			if payload[r] == nil {
				fresh = append(fresh, r)
			}
		}
		slices.SortFunc(fresh, func(a, b store.WALRecord) int {
			return cmp.Or(cmp.Compare(a.Seg, b.Seg), cmp.Compare(a.Off, b.Off))
		})
		for _, r := range fresh {
			p, err := w.ReadRecord(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			payload[r] = p
			recs = append(recs, r)
		}
		for try := range 4 {
			// Every released record gone, every one still there, or a
			// random subset.
			var set []store.WALRecord
			var payloads [][]byte
			for _, r := range recs {
				if kept[r] || try == 1 || try > 1 && rng.IntN(2) == 0 {
					set = append(set, r)
					payloads = append(payloads, payload[r])
				}
			}
			what := fmt.Sprintf("step %d, %d of %d records (%d kept)", step, len(set), len(recs), len(kept))
			rl, err := replayPayloads(scratch, payloads)
			if err != nil {
				t.Fatalf("%s: replay: %v", what, err)
			}
			got, err := replayedEntries(rl, payloads)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if !sameEntries(got, m.ents) {
				t.Fatalf("%s: replayed %d entries from %d, want %d from %d", what, len(got), rl.first, len(m.ents), m.first)
			}
			lost := maps.Clone(kept)
			for r := range rl.live {
				delete(lost, set[r.Off])
			}
			if len(lost) > 0 {
				t.Fatalf("%s: a restart would release %v, which the log keeps", what, slices.Collect(maps.Keys(lost)))
			}
		}
	}
}
