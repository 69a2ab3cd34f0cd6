package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue/pairlog"
)

// compactOften compacts every 8 entries, keeping 2.
func compactOften(cfg *PairConfig) { cfg.CompactEvery, cfg.KeepEntries = 8, 2 }

// sendN sends n messages named tag0.. through replica i, one at a time
// (an entry each).
func (ps *pairs) sendN(ctx context.Context, i, n int, tag string) {
	ps.t.Helper()
	for k := range n {
		if _, err := ps.send(ctx, i, msg(fmt.Sprintf("%s%d", tag, k))); err != nil {
			ps.t.Fatalf("send %s%d: %v", tag, k, err)
		}
	}
}

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
