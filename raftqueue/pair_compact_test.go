package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// compactOften compacts every 8 entries, keeping 2.
func compactOften(cfg *PairConfig) { cfg.CompactEvery, cfg.KeepEntries = 8, 2 }

// firstIndex returns where replica i's log starts.
func (ps *pairs) firstIndex(i int) uint64 {
	ps.t.Helper()
	first, _, err := ps.rep(i).log.Bounds()
	if err != nil {
		ps.t.Fatal(err)
	}
	return first
}

// aloneWithNewFollower stops the follower, lets the leader go on alone
// (the risk stage) for n sends, wipes the follower's directory and brings
// it back empty as the follower of the next epoch: it needs a snapshot.
func (ps *pairs) aloneWithNewFollower(ctx context.Context, n int) {
	ps.t.Helper()
	ps.leadAlone(ctx, n)
	if err := os.RemoveAll(ps.dirs[1]); err != nil {
		ps.t.Fatal(err)
	}
	ps.renew() // the leader at the next epoch, to the follower once it is up
	ps.rejoin()
}

// leadAlone stops the follower, replica 1, and has replica 0 lead the next
// epoch alone (the risk stage) for n sends: it compacts past what the
// follower holds.
func (ps *pairs) leadAlone(ctx context.Context, n int) {
	ps.t.Helper()
	ps.stop(1)
	ps.mu.Lock()
	ps.epoch++
	epoch := ps.epoch
	ps.ledBy[epoch] = 0
	ps.mu.Unlock()
	if err := ps.rep(0).Lead(epoch, nil, false); err != nil {
		ps.t.Fatal(err)
	}
	ps.sendN(ctx, 0, n, "alone")
}

// TestPair_Compaction: both replicas compact their logs as they apply
// (the leader only below what its follower holds), and replicas reopened
// from compacted logs hold every acked message: they apply from where the
// log was compacted (Log.Synced), not from their files' oldest position.
func TestPair_Compaction(t *testing.T) {
	ps := newPairs(t, compactOften)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.sendN(ctx, 0, 100, "m")
	ps.settle()
	for i := range 2 {
		if first := ps.firstIndex(i); first < 50 || ps.rep(i).Compactions() == 0 {
			t.Fatalf("%s: the log starts at %d after 100 entries, %d compactions", ps.id(i), first, ps.rep(i).Compactions())
		}
	}
	ps.close()
	ps.start(0)
	ps.start(1)
	ps.mu.Lock()
	ps.leader = 1
	ps.mu.Unlock()
	ps.promote(false) // replica 0 at epoch 2
	ps.rejoin()
	ps.sendN(ctx, 0, 10, "n")
	if got := ps.settle(); len(got) != 110 {
		t.Fatalf("after the restart the replicas hold %d messages, 110 acked", len(got))
	}
}

// TestPair_InstallSnapshot: a leader that went on alone and compacted its
// log gives a new, empty follower its state in a snapshot (in pieces), and
// the appends go on from the snapshot's index; the follower, promoted when
// the leader is killed, holds every acked message, and so does the old
// leader following it.
func TestPair_InstallSnapshot(t *testing.T) {
	ps := newPairs(t, func(cfg *PairConfig) { compactOften(cfg); cfg.MaxBatchBytes = 512 })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.sendN(ctx, 0, 20, "a")
	ps.aloneWithNewFollower(ctx, 60)
	ps.sendN(ctx, 0, 20, "b")
	if got := ps.settle(); len(got) != 100 {
		t.Fatalf("the replicas hold %d messages, 100 acked", len(got))
	}
	if n := ps.rep(1).Installs(); n != 1 {
		t.Fatalf("the new follower installed %d snapshots, want 1", n)
	}
	ps.stop(0)
	ps.promote(false)
	ps.rejoin()
	ps.sendN(ctx, 1, 10, "c")
	if got := ps.settle(); len(got) != 110 {
		t.Fatalf("after the failover the replicas hold %d messages, 110 acked", len(got))
	}
}

// breakLink wraps the pair's link from the leader: pieces of a snapshot
// are damaged (a flipped byte) or refused while bad is positive, each
// taking one from it.
type breakLink struct {
	pairLink
	bad   *atomic.Int32
	flip  bool
	tried *atomic.Int32
}

var errPiece = errors.New("test: piece lost")

func (l breakLink) Install(ctx context.Context, in pairlog.Install) error {
	l.tried.Add(1)
	if l.bad.Add(-1) >= 0 {
		if !l.flip {
			return errPiece
		}
		if len(in.Data) > 0 {
			in.Data = append([]byte(nil), in.Data...)
			in.Data[len(in.Data)/2] ^= 0x40
		}
	}
	return l.pairLink.Install(ctx, in)
}

// TestPair_InstallFaults: a snapshot whose pieces are lost, or damaged (the
// restore finds the damage: the follower keeps a consistent, empty log and
// its old files), is sent again from the start until one is installed;
// the follower ends with every acked message.
func TestPair_InstallFaults(t *testing.T) {
	for _, flip := range []bool{false, true} {
		t.Run(fmt.Sprintf("damaged=%v", flip), func(t *testing.T) {
			ps := newPairs(t, func(cfg *PairConfig) { compactOften(cfg); cfg.MaxBatchBytes = 512 })
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			ps.sendN(ctx, 0, 20, "a")
			ps.leadAlone(ctx, 60)
			ps.start(1) // behind the leader's log: it needs a snapshot
			ps.mu.Lock()
			ps.epoch++
			epoch := ps.epoch
			ps.ledBy[epoch] = 0
			ps.mu.Unlock()
			if err := ps.rep(1).Follow(epoch); err != nil {
				t.Fatal(err)
			}
			var bad, tried atomic.Int32
			bad.Store(3)
			if err := ps.rep(0).Lead(epoch, breakLink{pairLink{ps, 0}, &bad, flip, &tried}, false); err != nil {
				t.Fatal(err)
			}
			ps.sendN(ctx, 0, 10, "b")
			if got := ps.settle(); len(got) != 90 {
				t.Fatalf("the replicas hold %d messages, 90 acked", len(got))
			}
			if ps.rep(1).Installs() != 1 || tried.Load() < 4 {
				t.Fatalf("%d installs after %d pieces tried, 3 of them broken", ps.rep(1).Installs(), tried.Load())
			}
			ps.stop(1)
			ps.start(1) // the restored replica reopens
			ps.rejoin()
			if got := ps.settle(); len(got) != 90 {
				t.Fatalf("after the follower's restart the replicas hold %d messages", len(got))
			}
		})
	}
}

// failingLog is a log whose writes fail while fail is set (a disk that
// went bad).
type failingLog struct {
	raft.LogStore
	fail *atomic.Bool
}

var errDisk = errors.New("test: input/output error")

func (l failingLog) StoreLogs(logs []*raft.Log) error {
	if l.fail.Load() {
		return errDisk
	}
	return l.LogStore.StoreLogs(logs)
}

func (l failingLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

// TestPair_FailedLeader: a leader whose log write fails reports it
// (Failed), which the node hands the pair over on; its follower has not
// failed, and, promoted, holds every acked message; a leader merely
// deposed by a newer epoch has not failed.
func TestPair_FailedLeader(t *testing.T) {
	var fail atomic.Bool
	ps := newPairs(t, func(cfg *PairConfig) {
		if filepath.Base(cfg.Dir) == "a" {
			cfg.Log = failingLog{cfg.Log, &fail}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.sendN(ctx, 0, 10, "a")
	if err := ps.rep(0).Failed(); err != nil {
		t.Fatalf("a sound leader: Failed %v", err)
	}
	fail.Store(true)
	if _, err := ps.send(ctx, 0, msg("lost")); !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("a send whose write failed: %v, want ErrUnknownOutcome", err)
	}
	if err := ps.rep(0).Failed(); !errors.Is(err, errDisk) {
		t.Fatalf("the leader whose write failed: Failed %v, want the write's error", err)
	}
	if err := ps.rep(1).Failed(); err != nil {
		t.Fatalf("its follower: Failed %v", err)
	}
	ps.promote(true)
	ps.sendN(ctx, 1, 5, "b")
	// The send of unknown outcome may be there too: the follower may have
	// taken it while the leader's own write failed.
	if n := len(ps.logOf(1)); n != 15 && n != 16 {
		t.Fatalf("the promoted follower holds %d messages, 15 acked and one of unknown outcome", n)
	}
	fail.Store(false)

	// Deposed, not failed.
	ps2 := newPairs(t, nil)
	ps2.sendN(ctx, 0, 3, "a")
	ps2.promote(false)
	ps2.rejoin()
	ps2.sendN(ctx, 1, 3, "b")
	if err := ps2.rep(0).Failed(); err != nil {
		t.Fatalf("a deposed leader, following: Failed %v", err)
	}
}

// TestPair_InstallKeepsQuietPartitionThroughCrash: a follower of a pair of
// two partitions applied a few commands to partition 1 (in memory: a
// Replicated partition writes them into its file up to a second later, the
// log being their durable record), then fell behind a leader that went on
// alone and compacted. It installs a snapshot that holds partition 1 at
// the position the follower's memory holds, and crashes right after the
// install (the directory as it is on disk): reopened, it holds every acked
// message of partition 1, and the replicas agree. This broke when Restore
// kept the follower's partition 1 as it was (in memory) while the log, the
// only durable record of those commands, was emptied and Restored recorded
// Synced at the snapshot's index: the crash lost them for good.
func TestPair_InstallKeepsQuietPartitionThroughCrash(t *testing.T) {
	ps := newPairs(t, func(cfg *PairConfig) { compactOften(cfg); cfg.Partitions = 2 })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for k := range 3 {
		if _, err := ps.sendTo(ctx, 0, 1, msg(fmt.Sprintf("q%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	b := ps.rep(1)
	start := time.Now()
	if !waitFor(patience, func() bool {
		b.applyMu.Lock()
		defer b.applyMu.Unlock()
		return b.applied >= 3
	}) {
		t.Fatal("the follower did not apply partition 1's entries")
	}
	// The leader goes on alone (the risk stage) while the follower, still
	// running, hears nothing: it compacts past what the follower holds.
	ps.cut[0].Store(true)
	if err := ps.rep(0).Lead(ps.nextEpoch(0), nil, false); err != nil {
		t.Fatal(err)
	}
	ps.sendN(ctx, 0, 20, "p")
	if first := ps.firstIndex(0); first <= 4 {
		t.Fatalf("the leader's log starts at %d: not compacted past the follower", first)
	}
	sp, err := b.Partition(1)
	if err != nil {
		t.Fatal(err)
	}
	if inFile := sp.Position(); !inFile.Less(store.Position{Index: 3, Cmds: 1}) {
		t.Skipf("partition 1's file caught up (%+v) within %v: the crash window was missed", inFile, time.Since(start))
	}
	epoch := ps.nextEpoch(0)
	if err := b.Follow(epoch); err != nil {
		t.Fatal(err)
	}
	ps.cut[0].Store(false)
	if err := ps.rep(0).Lead(epoch, pairLink{ps, 0}, false); err != nil {
		t.Fatal(err)
	}
	if !waitFor(patience, func() bool { return b.Installs() == 1 }) {
		t.Fatalf("no snapshot installed: %v", ps)
	}
	ps.settle()
	crash := filepath.Join(t.TempDir(), "b-crashed")
	copyDir(t, ps.dirs[1], crash)
	synced := b.log.Synced()
	if sp, err = b.Partition(1); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the install (%v after the follower applied partition 1's entries): Synced %d, partition 1's file at %+v", time.Since(start), synced, sp.Position())

	// Kill -9 of the follower at this instant: reopen what its disk holds.
	ps.close()
	ps.dirs[1] = crash
	ps.start(0)
	ps.start(1)
	if got := ps.partOf(1, 1); len(got) != 3 {
		t.Errorf("the follower reopened after a crash right after the install holds %d of partition 1's 3 acked messages (Synced %d claimed them durable)", len(got), synced)
	}
	// Nor does the pair heal: the follower applies from Synced.
	ps.mu.Lock()
	ps.leader = 1
	ps.mu.Unlock()
	ps.promote(false) // replica 0 leads
	ps.rejoin()
	if _, err := ps.sendTo(ctx, 0, 1, msg("q3")); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return len(ps.partOf(1, 1)) == len(ps.partOf(0, 1)) }) {
		t.Errorf("partition 1 diverges for good: the leader holds %v, the follower %v", ids(ps.partOf(0, 1)), ids(ps.partOf(1, 1)))
	}
}

// TestPair_PromotedRightAfterInstall: a new follower installs the
// leader's snapshot, gets no entry after it (its log is empty, following
// the snapshot's index) and is promoted: its sends are acked, and the old
// leader installs no snapshot of a state it holds. This broke when the new
// leader needed the epoch of the entry at the snapshot's index to send
// anything (Append.PrevEpoch): its log no longer held it (ErrCompacted),
// so it sent a snapshot, after which it needed it again, and no send was
// ever acked.
func TestPair_PromotedRightAfterInstall(t *testing.T) {
	ps := newPairs(t, func(cfg *PairConfig) { compactOften(cfg); cfg.MaxBatchBytes = 512 })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.sendN(ctx, 0, 20, "a")
	ps.aloneWithNewFollower(ctx, 60)
	if !waitFor(patience, func() bool { return ps.rep(1).Installs() == 1 }) {
		t.Fatalf("no snapshot installed: %v", ps)
	}
	if got := ps.settle(); len(got) != 80 {
		t.Fatalf("the replicas hold %d messages, 80 acked", len(got))
	}
	if first, last, _ := ps.rep(1).log.Bounds(); first <= last {
		t.Fatalf("the follower's log holds %d-%d: want it empty after the install", first, last)
	}
	ps.promote(false) // the follower leads, replicating to the old leader
	ps.rejoin()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if _, err := ps.send(sctx, 1, msg("after")); err != nil {
		t.Fatalf("a send through the follower promoted right after its install: %v (%v; the old leader installed %d snapshots)", err, ps, ps.rep(0).Installs())
	}
	if n := ps.rep(0).Installs(); n > 1 {
		t.Errorf("the old leader installed %d snapshots of a state it held", n)
	}
	if got := ps.settle(); len(got) != 81 {
		t.Fatalf("the replicas hold %d messages, 81 acked", len(got))
	}
}

// TestPair_RestoredAheadOfLogReopens: a leader's snapshot holds every
// effect up to its Index "or more" (Pair.snapshot reads applied, then
// writes the state while an async leader goes on applying: the state
// records its own position, and the follower skips what it holds). A
// follower restores such a state (its file at P), takes an entry after
// Index and restarts before its log reaches P: it reopens with every
// acked message. This broke when OpenPair opened the log with committed =
// its files' position P, beyond the log's last entry, and refused the
// state ("entries committed, the log ends at").
func TestPair_RestoredAheadOfLogReopens(t *testing.T) {
	ps := newPairs(t, func(cfg *PairConfig) { cfg.CompactEvery, cfg.KeepEntries = 8, 12 })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.sendN(ctx, 0, 20, "a")
	ps.leadAlone(ctx, 60) // replica 1 is stopped
	a := ps.rep(0)
	// The leader's compactor may still be at work: take two entries it
	// holds, the first the snapshot's Index (the leader applied it when it
	// began), the state once it applied up to last.
	var es []*raft.Log
	var index, last uint64
	if !waitFor(patience, func() bool {
		first, l, err := a.log.Bounds()
		if err != nil || first <= 21 || l < first+4 {
			return false
		}
		index, last = first, l
		es, err = a.log.Entries(index, index+1)
		return err == nil
	}) {
		t.Fatal("the leader's log is not compacted past the follower")
	}
	want := len(ps.logOf(0))
	ps.start(1)
	b := ps.rep(1)
	epoch := ps.nextEpoch(0)
	if err := b.Follow(epoch); err != nil {
		t.Fatal(err)
	}
	_, rc, err := a.snapshot() // the state once it applied up to last
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Install(ctx, pairlog.Install{Epoch: epoch, Index: index, Data: data, Done: true}); err != nil {
		t.Fatal(err)
	}
	if end, err := b.Append(ctx, pairlog.Append{Epoch: epoch, PrevIndex: index, PrevEpoch: es[0].Term, Entries: es[1:], Commit: index + 1}); err != nil || end != index+1 {
		t.Fatalf("append after the install: %d, %v", end, err)
	}
	b.waitApplied(t)
	ps.stop(1)
	w, l, err := openNodeLogWith(filepath.Join(ps.dirs[1], "wal"), store.WALOptions{}, "dw")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	p, err := OpenPair(PairConfig{Dir: ps.dirs[1], Log: l})
	if err != nil {
		t.Fatalf("the follower, restored to a state at %d with its log at %d-%d, does not reopen: %v", last, index+1, index+1, err)
	}
	defer p.Close()
	part, err := p.Partition(0)
	if err != nil {
		t.Fatal(err)
	}
	if msgs, err := part.Read(0, 1<<20, 0, nil); err != nil || len(msgs) != want {
		t.Fatalf("the reopened follower holds %d messages (%v), %d acked", len(msgs), err, want)
	}
}

// TestPair_HostileInstallsRefused: pieces that do not hold together are
// refused with an error and change nothing: the follower's log keeps the
// entries it holds (committed ones among them, perhaps not yet in its
// files) and the pair goes on. Each case on a pair of its own.
func TestPair_HostileInstallsRefused(t *testing.T) {
	type install func(epoch uint64, good []byte) pairlog.Install
	for _, c := range []struct {
		name string
		in   install
	}{
		{"stale epoch", func(e uint64, g []byte) pairlog.Install {
			return pairlog.Install{Epoch: e - 1, Index: 10, Data: g, Done: true}
		}},
		{"newer epoch", func(e uint64, g []byte) pairlog.Install {
			return pairlog.Install{Epoch: e + 1, Index: 10, Data: g, Done: true}
		}},
		{"epoch 0", func(e uint64, g []byte) pairlog.Install { return pairlog.Install{Index: 10, Data: g, Done: true} }},
		{"piece without a first", func(e uint64, g []byte) pairlog.Install {
			return pairlog.Install{Epoch: e, Index: 10, Offset: 5, Data: g[5:], Done: true}
		}},
		{"huge offset", func(e uint64, g []byte) pairlog.Install {
			return pairlog.Install{Epoch: e, Index: 10, Offset: math.MaxUint64, Data: []byte("x")}
		}},
		{"done, no data", func(e uint64, g []byte) pairlog.Install { return pairlog.Install{Epoch: e, Index: 10, Done: true} }},
		{"done, garbage", func(e uint64, g []byte) pairlog.Install {
			return pairlog.Install{Epoch: e, Index: 10, Data: []byte("not a snapshot"), Done: true}
		}},
		{"done, truncated", func(e uint64, g []byte) pairlog.Install {
			return pairlog.Install{Epoch: e, Index: 10, Data: g[:len(g)/2], Done: true}
		}},
		{"index at the end of the uint64s", func(e uint64, g []byte) pairlog.Install {
			return pairlog.Install{Epoch: e, Index: math.MaxUint64, Data: g, Done: true}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := newPairs(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			ps.sendN(ctx, 0, 10, "a")
			ps.settle()
			a, b := ps.rep(0), ps.rep(1)
			_, rc, err := a.snapshot()
			if err != nil {
				t.Fatal(err)
			}
			good, _ := io.ReadAll(rc)
			rc.Close()
			bounds := func() string {
				f, l, _ := b.log.Bounds()
				return fmt.Sprintf("%d-%d synced %d", f, l, b.log.Synced())
			}
			before := bounds()
			if err := b.Install(ctx, c.in(b.Epoch(), good)); err == nil {
				t.Errorf("accepted")
			} else if got := bounds(); got != before {
				t.Errorf("refused (%v), and the follower's log went from %s to %s", err, before, got)
			}
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			defer scancel()
			ps.sendN(sctx, 0, 5, "b")
			if got := ps.settle(); len(got) != 15 {
				t.Fatalf("the replicas hold %d messages, 15 acked", len(got))
			}
		})
	}
}

// TestPair_InstallOutOfOrder: a piece past the end of what was received
// restarts nothing silently (ErrBadAppend, the file removed); an install
// to the leader is refused.
func TestPair_InstallOutOfOrder(t *testing.T) {
	ps := newPairs(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ps.sendN(ctx, 0, 10, "a")
	ps.settle()
	a, b := ps.rep(0), ps.rep(1)
	_, rc, err := a.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	good, _ := io.ReadAll(rc)
	rc.Close()
	epoch := b.Epoch()
	half := len(good) / 2
	if err := b.Install(ctx, pairlog.Install{Epoch: epoch, Index: 10, Data: good[:half]}); err != nil {
		t.Fatal(err)
	}
	if err := b.Install(ctx, pairlog.Install{Epoch: epoch, Index: 10, Offset: uint64(half) + 1, Data: good[half+1:], Done: true}); !errors.Is(err, pairlog.ErrBadAppend) {
		t.Errorf("a piece past the end: %v, want ErrBadAppend", err)
	}
	if _, err := os.Stat(filepath.Join(ps.dirs[1], installFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused install leaves %s: %v", installFile, err)
	}
	if err := a.Install(ctx, pairlog.Install{Epoch: epoch, Index: 10, Data: good, Done: true}); err == nil {
		t.Error("the leader installed a snapshot")
	}
	ps.sendN(ctx, 0, 5, "b")
	if got := ps.settle(); len(got) != 15 {
		t.Fatalf("the replicas hold %d messages, 15 acked", len(got))
	}
}
