package raftqueue

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/store"
)

const nParts = 4

// identicalParts checks, per partition, that the live replicas hold the
// same log of next[part] messages, and returns replica 0's logs.
func (c *cluster) identicalParts(next []uint64) [][]store.Message {
	c.t.Helper()
	out := make([][]store.Message, len(next))
	for part := range next {
		var want []store.Message
		first := -1
		for i := range c.groups {
			if c.group(i) == nil {
				continue
			}
			deadline := time.Now().Add(patience)
			for {
				p, err := c.group(i).Partition(part)
				if err == nil && p.Stats().Next == next[part] {
					break
				}
				if time.Now().After(deadline) {
					c.t.Fatalf("%s partition %d: log does not end at %d (%v)", c.ids[i], part, next[part], err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			got := c.logOf(i, part)
			if first < 0 {
				want, first = got, i
				out[part] = got
				continue
			}
			if !reflect.DeepEqual(got, want) {
				c.t.Fatalf("partition %d: %s and %s hold different logs", part, c.ids[first], c.ids[i])
			}
		}
	}
	return out
}

// ackAt is where an ID was acked.
type ackAt struct {
	part int
	off  uint64
}

// sendParts sends n messages to each partition from 8 senders per
// partition, all at once, and returns where each ID was acked.
func sendParts(t *testing.T, c *cluster, prefix string, n int) map[string]ackAt {
	t.Helper()
	var mu sync.Mutex
	acked := map[string]ackAt{}
	var wg sync.WaitGroup
	for part := range nParts {
		for s := range 8 {
			wg.Go(func() {
				for k := s; k < n; k += 8 {
					id := fmt.Sprintf("%s-p%d-%d", prefix, part, k)
					res, err := c.applyTo(context.Background(), part, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg(id)}})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					acked[id] = ackAt{part, res.Acks[0].Offset}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return acked
}

// checkAcked: every acked ID is at its acked offset in its partition's log.
func checkAcked(t *testing.T, logs [][]store.Message, acked map[string]ackAt) {
	t.Helper()
	for id, a := range acked {
		log := logs[a.part]
		if len(log) == 0 || a.off < log[0].Offset || a.off-log[0].Offset >= uint64(len(log)) || log[a.off-log[0].Offset].ID != id {
			t.Fatalf("%s acked at offset %d of partition %d, which does not hold it", id, a.off, a.part)
		}
	}
}

// A group of several partitions: concurrent senders of every partition
// share its entries (fewer entries than commands, commands of several
// partitions in one), each partition's offsets are its own and dense, and
// the three replicas hold the same logs; a restart of all three applies
// nothing twice (FreshID-free IDs would dedup, so the offsets prove it).
func TestGroup_Partitions(t *testing.T) {
	c := newClusterOpts(t, t.TempDir(), 3, stableConfig(), false, nParts)
	l := c.leader()
	acked := sendParts(t, c, "a", 40)
	if len(acked) != nParts*40 {
		t.Fatalf("%d acks, want %d", len(acked), nParts*40)
	}
	logs := c.identicalParts([]uint64{40, 40, 40, 40})
	checkAcked(t, logs, acked)
	prop := c.group(l).prop
	entries, cmds := prop.entries.Load(), prop.proposedCmd.Load()
	t.Logf("%d commands in %d entries", cmds, entries)
	if entries >= cmds {
		t.Fatalf("%d commands in %d entries: none shared", cmds, entries)
	}

	for i := range 3 {
		c.stop(i)
	}
	for i := range 3 {
		c.start(i)
	}
	c.leader()
	checkAcked(t, c.identicalParts([]uint64{40, 40, 40, 40}), acked)
	for i := range 3 {
		if n := c.group(i).fsm.restores.Load(); n != 0 {
			t.Fatalf("%s restored a snapshot at a plain restart", c.ids[i])
		}
	}
	res, err := c.applyTo(context.Background(), 2, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg("after")}})
	if err != nil || res.Acks[0].Offset != 40 {
		t.Fatalf("a send to partition 2 after the restart: %+v, %v; want offset 40", res.Acks, err)
	}
	if _, err := c.group(c.leader()).ApplyTo(context.Background(), nParts, &store.Command{Op: store.OpAppend, Now: t0}); !errors.Is(err, store.ErrBadCommand) {
		t.Fatalf("ApplyTo a partition the group lacks: %v, want ErrBadCommand", err)
	}
	if _, err := c.group(0).Partition(-1); !errors.Is(err, store.ErrBadCommand) {
		t.Fatalf("Partition(-1): %v, want ErrBadCommand", err)
	}
}

// A follower behind the leader's compacted log installs the snapshot of
// every partition; a partition idle since the follower's files were
// written is kept as it is (its file holds the snapshot's state already),
// the others are replaced; a later restart restores nothing.
func TestGroup_PartitionsInstallSnapshot(t *testing.T) {
	conf := testRaftConfig()
	conf.TrailingLogs = 10
	conf.SnapshotThreshold = 1 << 20 // only the snapshots asked for below
	c := newClusterOpts(t, t.TempDir(), 3, conf, false, nParts)
	l := c.leader()
	f := (l + 1) % 3
	ctx := context.Background()
	acked := sendParts(t, c, "a", 16)
	c.identicalParts([]uint64{16, 16, 16, 16})
	// The follower's files hold everything so far.
	for part := range nParts {
		p, err := c.group(f).Partition(part)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	c.stop(f)
	// Partition 3 stays idle from here on.
	for k := range 60 {
		part := k % 3
		id := fmt.Sprintf("b-p%d-%d", part, k)
		res, err := c.applyTo(ctx, part, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg(id)}})
		if err != nil {
			t.Fatal(err)
		}
		acked[id] = ackAt{part, res.Acks[0].Offset}
	}
	l = c.leader()
	if err := c.group(l).Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	c.start(f)
	logs := c.identicalParts([]uint64{36, 36, 36, 16})
	checkAcked(t, logs, acked)
	if n := c.group(f).fsm.restores.Load(); n == 0 {
		t.Fatalf("%s caught up without installing a snapshot", c.ids[f])
	}
	c.stop(f)
	c.start(f)
	c.identicalParts([]uint64{36, 36, 36, 16})
	if n := c.group(f).fsm.restores.Load(); n != 0 {
		t.Fatalf("%s restored the snapshot again at its restart", c.ids[f])
	}
}

func partPath(dir string, part int) string {
	if part == 0 {
		return filepath.Join(dir, "partition.db")
	}
	return filepath.Join(dir, fmt.Sprintf("partition-%d.db", part))
}

// manyEntry builds a version-2 entry of cmds, cmds[i] for parts[i].
func manyEntry(parts []int, cmds []store.Command) []byte {
	var buf []byte
	for i := range cmds {
		buf = appendEntryCommand(buf, entryMany, parts[i], &cmds[i])
	}
	return append(entryHeader(nil, entryMany, 3, len(cmds)), buf...)
}

// raftApply proposes data on the leader and returns the FSM's answer.
func raftApply(t *testing.T, c *cluster, data []byte) (*entryResult, uint64) {
	t.Helper()
	for range 50 {
		l := c.leader()
		f := c.group(l).Raft().Apply(data, 5*time.Second)
		if err := f.Error(); err != nil {
			t.Logf("raft apply: %v (retrying)", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		er, ok := f.Response().(*entryResult)
		if !ok {
			t.Fatalf("FSM answered %T", f.Response())
		}
		return er, f.Index()
	}
	t.Fatal("could not apply an entry")
	return nil, 0
}

// nextOf returns replica i's partition part's Next, or an error.
func nextOf(c *cluster, i, part int) (uint64, error) {
	g := c.group(i)
	if g == nil {
		return 0, errors.New("down")
	}
	p, err := g.Partition(part)
	if err != nil {
		return 0, err
	}
	return p.Stats().Next, nil
}

// waitNextOf waits up to d for replica i's partition part to end at next;
// it reports what it ends at.
func waitNextOf(c *cluster, i, part int, next uint64, d time.Duration) (uint64, error) {
	deadline := time.Now().Add(d)
	for {
		got, err := nextOf(c, i, part)
		if err == nil && got == next {
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func msgIDs(log []store.Message) []string {
	var ids []string
	for _, m := range log {
		ids = append(ids, m.ID)
	}
	return ids
}

// sendMixed sends n messages to each of parts partitions concurrently (so
// that entries carry commands of several partitions) and returns the acked
// IDs per partition.
func sendMixed(t *testing.T, c *cluster, prefix string, parts, n int) map[string]ackAt {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var mu sync.Mutex
	acked := map[string]ackAt{}
	var wg sync.WaitGroup
	for part := range parts {
		for s := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := s; k < n; k += 4 {
					id := fmt.Sprintf("%s-p%d-%d", prefix, part, k)
					res, err := c.applyTo(ctx, part, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg(id)}})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					acked[id] = ackAt{part, res.Acks[0].Offset}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return acked
}

// TestGroup_PartitionsBadCommandFailsAlone: one caller's command that
// store.AppendCommand encodes but store.DecodeCommand refuses (a Limit
// beyond int32, or a negative one) shares an entry with other callers'
// valid commands for other partitions. Every valid command is applied (or
// at worst fails with an outcome the caller can retry), never answered
// ErrBadCommand for a neighbour's fault: a command that does not decode
// fails alone, and store refuses such a Limit before it is proposed. This
// broke when the whole entry was refused.
func TestGroup_PartitionsBadCommandFailsAlone(t *testing.T) {
	c := newClusterOpts(t, t.TempDir(), 3, stableConfig(), false, 3)
	g := c.group(c.leader())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	var mu sync.Mutex
	var victims []string
	var badErrs []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for s := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				part := s % 3
				id := fmt.Sprintf("s%d-%d", s, k)
				_, err := g.ApplyTo(ctx, part, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}})
				if errors.Is(err, store.ErrBadCommand) {
					mu.Lock()
					victims = append(victims, fmt.Sprintf("%s (partition %d): %v", id, part, err))
					mu.Unlock()
				} else if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 50 {
		time.Sleep(10 * time.Millisecond)
		// A release limit past int32: check() accepts any non-negative
		// limit, the entry decoder refuses it.
		_, err := g.ApplyTo(ctx, 1, &store.Command{Op: store.OpRelease, Now: t0, Limit: math.MaxInt32 + 1})
		badErrs = append(badErrs, err)
		mu.Lock()
		n := len(victims)
		mu.Unlock()
		if n > 0 {
			break
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("entries %d, commands %d; the bad command's answers: %v", g.prop.entries.Load(), g.prop.proposedCmd.Load(), badErrs[:min(2, len(badErrs))])
	if len(victims) > 0 {
		t.Fatalf("%d valid commands sharing an entry with a neighbour's undecodable one were refused; first: %s", len(victims), victims[0])
	}
}

// TestGroup_PartitionsReopenFewerRefused: every replica of a 3-partition
// group reopened with Partitions 2 (a config change) after a crash set
// partition.db back to an earlier copy. Open refuses the changed count
// (raft.db records it), so partition 0 still holds every acked message:
// the log's entries that also carry partition 2's commands are the only
// record of partition 0's commands in them. This broke when Open accepted
// the new count: 18 acks were lost.
func TestGroup_PartitionsReopenFewerRefused(t *testing.T) {
	conf := stableConfig()
	conf.SnapshotThreshold = 1 << 20
	conf.SnapshotInterval = time.Hour
	c := newClusterOpts(t, t.TempDir(), 3, conf, false, 3)
	c.leader()
	a1 := sendMixed(t, c, "a", 3, 8)
	c.identicalParts([]uint64{8, 8, 8})
	for i := range 3 {
		c.stop(i)
		copyFile(t, partPath(c.dirs[i], 0), partPath(c.dirs[i], 0)+".bak")
	}
	for i := range 3 {
		c.start(i)
	}
	c.leader()
	a2 := sendMixed(t, c, "b", 3, 24)
	c.identicalParts([]uint64{32, 32, 32})
	for i := range 3 {
		c.stop(i)
		// The crash: partition.db as it stood at the first stop.
		copyFile(t, partPath(c.dirs[i], 0)+".bak", partPath(c.dirs[i], 0))
	}
	c.parts = 2
	opened := true
	func() {
		// c.start fails the test on an Open error: probe first with
		// a direct Open on a throwaway transport.
		_, tr := raft.NewInmemTransport("probe")
		w, l, err := openNodeLog(filepath.Join(c.dirs[0], "wal"))
		if err != nil {
			t.Fatal(err)
		}
		g, err := Open(Config{ID: c.ids[0], Dir: c.dirs[0], Transport: tr, Raft: conf, Partitions: 2, LogStore: l})
		if err != nil {
			opened = false
			t.Logf("Open with a changed partition count: %v (a clear error: held)", err)
		} else {
			g.Close()
		}
		w.Close()
	}()
	if !opened {
		return
	}
	for i := range 3 {
		c.start(i)
	}
	l := c.leader()
	if _, err := c.group(l).LeaderPartition(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, a := range a1 {
		if a.part == 0 {
			want++
		}
	}
	for _, a := range a2 {
		if a.part == 0 {
			want++
		}
	}
	for i := range 3 {
		wait := 3 * time.Second
		if i > 0 {
			wait = 300 * time.Millisecond
		}
		got, err := waitNextOf(c, i, 0, uint64(want), wait)
		if got != uint64(want) {
			t.Errorf("%s reopened with Partitions 2 (silently): partition 0 ends at %d, %d messages were acked (%v)", c.ids[i], got, want, err)
		}
	}
}

// TestGroup_PartitionsReplicaWithOtherCountRefused: one replica restarted
// with another Partitions count than the two others (here the default, 1:
// a config that forgot the field) while the group takes commands of
// several partitions. Open refuses the other count (raft.db records it),
// and a replica whose directory is new, so has no record, fails at the
// first entry naming another count instead of applying part of it. This
// broke when such a replica applied the entries that carried only
// partition 0 and refused whole those that also carried partitions 1 and
// 2, which the others applied: partition 0 diverged.
func TestGroup_PartitionsReplicaWithOtherCountRefused(t *testing.T) {
	conf := stableConfig()
	conf.SnapshotThreshold = 1 << 20
	conf.SnapshotInterval = time.Hour
	c := newClusterOpts(t, t.TempDir(), 3, conf, false, 3)
	l := c.leader()
	f := (l + 1) % 3
	sendMixed(t, c, "a", 3, 4)
	c.identicalParts([]uint64{4, 4, 4})
	c.stop(f)
	_, tr := raft.NewInmemTransport("probe")
	w, lg, err := openNodeLog(filepath.Join(c.dirs[f], "wal"))
	if err != nil {
		t.Fatal(err)
	}
	if g, err := Open(Config{ID: c.ids[f], Dir: c.dirs[f], Transport: tr, Raft: conf, Partitions: 1, LogStore: lg}); err == nil {
		g.Close()
		t.Fatal("Open of a replica of 3 partitions with Partitions 1 succeeded")
	} else {
		t.Logf("reopened with another count: %v", err)
	}
	w.Close()
	// A new directory: no record; the entries name the group's count.
	if err := os.RemoveAll(c.dirs[f]); err != nil {
		t.Fatal(err)
	}
	c.parts = 1
	c.start(f)
	c.parts = 3
	sendMixed(t, c, "b", 3, 12)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := c.group(f).Partition(0)
		if errors.Is(err, errPartitions) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s, new with Partitions 1 in a group of 3, did not fail: %v", c.ids[f], err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGroup_PartitionsCatchUpMidEntry: a crash sets a partition's file
// back to the state it held in the middle of entry S (a trim drains the
// partition's earlier commands of S into the file, the rest waits for the
// materializer), and the replica's newest snapshot is at S with every
// other partition at S. catchUp restores when a file stands at or before
// the snapshot's index, and readSnapshot compares whole positions, so
// nothing of S is lost. This broke when catchUp decided by raft index
// only: no restore ran, raft replayed only after S, and the rest of S was
// lost.
func TestGroup_PartitionsCatchUpMidEntry(t *testing.T) {
	conf := stableConfig()
	conf.SnapshotThreshold = 1 << 20
	conf.SnapshotInterval = time.Hour
	for attempt := range 3 {
		c := newClusterOpts(t, t.TempDir(), 3, conf, false, 3)
		l := c.leader()
		f := (l + 1) % 3
		ctx := context.Background()
		for part := range 3 {
			if _, err := c.applyTo(ctx, part, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg(fmt.Sprint("pre", part))}}); err != nil {
				t.Fatal(err)
			}
		}
		c.identicalParts([]uint64{1, 1, 1})
		for part := range 3 { // the follower's files hold everything so far
			p, _ := c.group(f).Partition(part)
			if _, err := p.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		parts := []int{1, 1, 1, 0, 2}
		cmds := []store.Command{
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a1")}},
			{Op: store.OpTrim, Now: t0},
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b1")}},
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("c0")}},
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("d2")}},
		}
		er, S := raftApply(t, c, manyEntry(parts, cmds))
		if er.err != nil {
			t.Fatal(er.err)
		}
		for k, e := range er.errs {
			if e != nil {
				t.Fatalf("command %d: %v", k, e)
			}
		}
		if got, _ := waitNextOf(c, f, 1, 3, 5*time.Second); got != 3 {
			t.Fatalf("follower partition 1 at %d", got)
		}
		p1, _ := c.group(f).Partition(1)
		bak := partPath(c.dirs[f], 1) + ".bak"
		pos := p1.Position()
		copyFile(t, partPath(c.dirs[f], 1), bak)
		if pos2 := p1.Position(); pos != (store.Position{Index: S, Cmds: 1}) || pos2 != pos {
			t.Logf("attempt %d: file at %+v/%+v, wanted {%d 1}: timing; retrying", attempt, pos, pos2, S)
			c.close()
			continue
		}
		// The follower's own snapshot at S (Persist syncs the files).
		sf := c.group(f).Raft().Snapshot()
		if err := sf.Error(); err != nil {
			t.Fatal(err)
		}
		meta, rc, err := sf.Open()
		if err != nil {
			t.Fatal(err)
		}
		rc.Close()
		if meta.Index != S {
			t.Logf("attempt %d: snapshot at %d, entry at %d; retrying", attempt, meta.Index, S)
			c.close()
			continue
		}
		c.stop(f)
		// The crash: partition-1.db as it stood in the middle of S.
		copyFile(t, bak, partPath(c.dirs[f], 1))
		c.start(f)
		if _, err := c.applyTo(ctx, 1, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg("after")}}); err != nil {
			t.Fatal(err)
		}
		if got, _ := waitNextOf(c, f, 1, 4, 3*time.Second); got != 4 {
			t.Fatalf("%s partition 1 ends at %d, the others at 4: %v vs %v (the rest of entry %d was lost: catchUp compares raft indexes, not positions)",
				c.ids[f], got, msgIDs(c.logOf(f, 1)), msgIDs(c.logOf(l, 1)), S)
		}
		if a, b := c.logOf(f, 1), c.logOf(c.leader(), 1); !reflect.DeepEqual(a, b) {
			t.Fatalf("partition 1 differs: %v vs %v", msgIDs(a), msgIDs(b))
		}
		return
	}
	t.Skip("could not catch the file mid-entry")
}

// TestGroup_PartitionsMixedFailuresInOneEntry: one entry mixes partitions
// where some commands fail on their own (ErrDecided, a zero Op:
// ErrBadCommand at apply, ErrStaleGeneration) and others succeed. Each
// command gets its own answer; the others are applied once on every
// replica, also after a restart of all three.
func TestGroup_PartitionsMixedFailuresInOneEntry(t *testing.T) {
	conf := stableConfig()
	conf.SnapshotThreshold = 1 << 20
	c := newClusterOpts(t, t.TempDir(), 3, conf, false, 3)
	c.leader()
	ctx := context.Background()
	if _, err := c.applyTo(ctx, 1, store.Command{Op: store.OpPrepare, TxID: "t", Producer: "p", Msgs: []store.Message{msg("half")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.applyTo(ctx, 1, store.Command{Op: store.OpRollbackTx, TxID: "t"}); err != nil {
		t.Fatal(err)
	}
	parts := []int{0, 1, 2, 1, 0, 2}
	x := msg("x")
	x.FreshID = true // a second application would store it twice
	cmds := []store.Command{
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{x}},
		{Op: store.OpPrepare, Now: t0, TxID: "t", Producer: "p", Msgs: []store.Message{msg("again")}},
		{Op: 0, Now: t0},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("y")}},
		{Op: store.OpAppend, Now: 0, Msgs: []store.Message{msg("zero-now")}},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("z")}},
	}
	er, _ := raftApply(t, c, manyEntry(parts, cmds))
	if er.err != nil {
		t.Fatalf("entry failed whole: %v", er.err)
	}
	wantErr := []error{nil, store.ErrDecided, store.ErrBadCommand, nil, store.ErrBadCommand, nil}
	for k, e := range er.errs {
		if wantErr[k] == nil && e != nil || wantErr[k] != nil && !errors.Is(e, wantErr[k]) {
			t.Errorf("command %d: %v, want %v", k, e, wantErr[k])
		}
	}
	c.identicalParts([]uint64{1, 1, 1})
	for i := range 3 {
		c.stop(i)
	}
	for i := range 3 {
		c.start(i)
	}
	c.leader()
	logs := c.identicalParts([]uint64{1, 1, 1})
	if got := [][]string{msgIDs(logs[0]), msgIDs(logs[1]), msgIDs(logs[2])}; !reflect.DeepEqual(got, [][]string{{"x"}, {"y"}, {"z"}}) {
		t.Fatalf("logs %v", got)
	}
}

// TestGroup_PartitionsMalformedEntries: malformed entries proposed
// straight to raft (a partition index past the group's, a truncated
// command, garbage): every replica answers ErrBadCommand, none applies any
// of the entry's commands, nobody panics, and the group goes on.
func TestGroup_PartitionsMalformedEntries(t *testing.T) {
	conf := stableConfig()
	c := newClusterOpts(t, t.TempDir(), 3, conf, false, 3)
	c.leader()
	good := store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("g")}}
	outOfRange := manyEntry([]int{0, 3}, []store.Command{good, good})
	huge := entryHeader(nil, entryMany, 3, 1)
	huge = binary.AppendUvarint(huge, math.MaxUint64)
	trunc := manyEntry([]int{0, 1}, []store.Command{good, good})
	trunc = trunc[:len(trunc)-3]
	v1 := append([]byte{'Z', 'Q', 1}, 1)
	v1 = append(v1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)
	for name, data := range map[string][]byte{"outOfRange": outOfRange, "hugePart": huge, "truncated": trunc, "garbage": []byte("ZQ\x02\x03\x05junk"), "empty": nil, "v1hugeLen": v1, "zeroCount": entryHeader(nil, entryMany, 3, 0)} {
		er, _ := raftApply(t, c, data)
		if name == "zeroCount" {
			if er.err != nil {
				t.Errorf("%s: %v", name, er.err)
			}
			continue
		}
		if !errors.Is(er.err, store.ErrBadCommand) {
			t.Errorf("%s: %v, want ErrBadCommand", name, er.err)
		}
	}
	if _, err := c.applyTo(context.Background(), 2, good); err != nil {
		t.Fatal(err)
	}
	c.identicalParts([]uint64{0, 0, 1})
	for _, i := range []int{-1, 3, math.MaxInt} {
		g := c.group(c.leader())
		if _, err := g.ApplyTo(context.Background(), i, &good); !errors.Is(err, store.ErrBadCommand) {
			t.Errorf("ApplyTo(%d): %v", i, err)
		}
		if _, err := g.Partition(i); !errors.Is(err, store.ErrBadCommand) {
			t.Errorf("Partition(%d): %v", i, err)
		}
		if _, err := g.LeaderPartition(context.Background(), i); !errors.Is(err, store.ErrBadCommand) {
			t.Errorf("LeaderPartition(%d): %v", i, err)
		}
	}
}

// newTestFSM opens an fsm of n partitions in dir.
// newTestFSM opens an fsm over n partition files in dir, closed at
// cleanup.
func newTestFSM(t *testing.T, dir string, n int) *fsm {
	t.Helper()
	var paths []string
	for i := range n {
		paths = append(paths, partPath(dir, i))
	}
	f, err := openFSM(paths)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.close() })
	return f
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }

// applyEntry applies, at index, one entry of cmds (cmds[i] for parts[i])
// to f.
func applyEntry(t *testing.T, f *fsm, index uint64, parts []int, cmds []store.Command) {
	t.Helper()
	out := f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: manyEntry(parts, cmds)}).(*entryResult)
	if out.err != nil {
		t.Fatal(out.err)
	}
	for _, e := range out.errs {
		if e != nil {
			t.Fatal(e)
		}
	}
}

// TestFSM_RestoreRefusesBadSnapshot: snapshot headers whose partition
// count differs from the group's (fewer, more, absurd), cut short in the
// middle of a section, with a damaged section after intact ones, or with
// bytes after the last section: Restore is an error, no panic, leaves no
// .restore file, and the partitions are as they were and still served.
// This broke when Restore accepted some of them and replaced the files.
func TestFSM_RestoreRefusesBadSnapshot(t *testing.T) {
	src := newTestFSM(t, t.TempDir(), 3)
	for k := range 5 {
		applyEntry(t, src, uint64(10+k), []int{0, 1, 2}, []store.Command{
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(fmt.Sprint("a", k))}},
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(fmt.Sprint("b", k))}},
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(fmt.Sprint("c", k))}},
		})
	}
	snap, _ := src.Snapshot()
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	full := sink.Bytes()
	head := len(snapGroupMagic) + 1
	body := full[head:]
	withCount := func(n uint64, b []byte) []byte {
		return append(binary.AppendUvarint([]byte(snapGroupMagic), n), b...)
	}
	cases := map[string][]byte{
		"fewer":      withCount(2, body),
		"more":       withCount(4, body),
		"huge":       withCount(math.MaxUint64, body),
		"cut":        full[:head+len(body)/2],
		"cutLast":    full[:len(full)-2],
		"damageLast": append(append([]byte(nil), full[:len(full)-1]...), full[len(full)-1]^0xff),
		"trailing":   append(append([]byte(nil), full...), 'X'),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			dst := newTestFSM(t, dir, 3)
			applyEntry(t, dst, 5, []int{0, 1, 2}, []store.Command{
				{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("own0")}},
				{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("own1")}},
				{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("own2")}},
			})
			if err := dst.Restore(io.NopCloser(bytes.NewReader(data))); err == nil {
				t.Fatalf("Restore of a %s snapshot: nil error", name)
			}
			for i := range 3 {
				if _, err := os.Lstat(partPath(dir, i) + ".restore"); err == nil {
					t.Errorf("partition %d: .restore left behind", i)
				}
				p, perr := dst.partition(i)
				if perr != nil {
					t.Fatalf("partition %d not served after a refused restore: %v", i, perr)
				}
				if p.Stats().Next != 1 {
					t.Errorf("partition %d changed by a refused restore: Next %d", i, p.Stats().Next)
				}
			}
		})
	}
}

// TestGroup_PartitionsSnapshotsUnderLoadAndHalfRenamed: snapshots taken
// on the leader while senders of every partition run (some partitions
// idle), a follower far behind installs one, then a crash leaves it as a
// restore leaves it half done: some partitions' files renamed from the
// restore, one set back to its old copy with a leftover .restore.
// Everything acked is on every replica once, the replicas agree, and no
// .restore remains.
func TestGroup_PartitionsSnapshotsUnderLoadAndHalfRenamed(t *testing.T) {
	conf := stableConfig()
	conf.TrailingLogs = 8
	conf.SnapshotThreshold = 1 << 20
	conf.SnapshotInterval = time.Hour
	c := newClusterOpts(t, t.TempDir(), 3, conf, false, nParts)
	l := c.leader()
	f := (l + 1) % 3
	acked := sendParts(t, c, "a", 8)
	c.identicalParts([]uint64{8, 8, 8, 8})
	c.stop(f)
	for part := range nParts {
		copyFile(t, partPath(c.dirs[f], part), partPath(c.dirs[f], part)+".old")
	}
	// Partitions 0 and 1 busy, 2 and 3 idle, snapshots during the load.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var snaps int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			for i := range 3 {
				if g := c.group(i); g != nil && g.State() == raft.Leader {
					if err := g.Raft().Snapshot().Error(); err == nil {
						mu.Lock()
						snaps++
						mu.Unlock()
					} else {
						t.Logf("snapshot: %v", err)
					}
				}
			}
		}
	}()
	var sw sync.WaitGroup
	for part := range 2 {
		for s := range 4 {
			sw.Add(1)
			go func() {
				defer sw.Done()
				for k := s; k < 400; k += 4 {
					id := fmt.Sprintf("b-p%d-%d", part, k)
					res, err := c.applyTo(ctx, part, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg(id)}})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					acked[id] = ackAt{part, res.Acks[0].Offset}
					mu.Unlock()
				}
			}()
		}
	}
	t0w := time.Now()
	sw.Wait()
	t.Logf("load took %v", time.Since(t0w))
	close(stop)
	wg.Wait()
	t.Logf("%d snapshots during the load", snaps)
	if err := c.group(c.leader()).Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	c.start(f)
	logs := c.identicalParts([]uint64{408, 408, 8, 8})
	checkAcked(t, logs, acked)
	if c.group(f).fsm.restores.Load() == 0 {
		t.Fatalf("no restore")
	}
	// The crash in the middle of replace: partition 0 renamed, partition
	// 1 not (its old file back, the restored one left as .restore).
	c.stop(f)
	p1 := partPath(c.dirs[f], 1)
	if err := os.Rename(p1, p1+".restore"); err != nil {
		t.Fatal(err)
	}
	copyFile(t, p1+".old", p1)
	c.start(f)
	c.leader()
	if _, err := c.applyTo(ctx, 3, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg("idle-wakes")}}); err != nil {
		t.Fatal(err)
	}
	acked["idle-wakes"] = ackAt{3, 8}
	logs = c.identicalParts([]uint64{408, 408, 8, 9})
	checkAcked(t, logs, acked)
	for part := range nParts {
		if _, err := os.Lstat(partPath(c.dirs[f], part) + ".restore"); err == nil {
			t.Errorf("partition %d: .restore left behind", part)
		}
	}
	// And all three restart: nothing applied twice.
	for i := range 3 {
		c.stop(i)
	}
	for i := range 3 {
		c.start(i)
	}
	c.leader()
	checkAcked(t, c.identicalParts([]uint64{408, 408, 8, 9}), acked)
}

// TestGroup_PartitionsInstallDuringLoad: a follower far behind comes back
// while senders of partitions 0 and 1 run and the leader snapshots every
// few ms (partitions 2 and 3 idle): it installs snapshots taken under
// load, possibly several, while entries keep arriving. Everything acked is
// on every replica once.
func TestGroup_PartitionsInstallDuringLoad(t *testing.T) {
	conf := stableConfig()
	conf.TrailingLogs = 4
	conf.SnapshotThreshold = 1 << 20
	conf.SnapshotInterval = time.Hour
	c := newClusterOpts(t, t.TempDir(), 3, conf, false, nParts)
	l := c.leader()
	f := (l + 1) % 3
	acked := sendParts(t, c, "a", 8)
	c.identicalParts([]uint64{8, 8, 8, 8})
	c.stop(f)
	for k := range 40 {
		id := fmt.Sprint("pre-", k)
		res, err := c.applyTo(context.Background(), k%2, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg(id)}})
		if err != nil {
			t.Fatal(err)
		}
		acked[id] = ackAt{k % 2, res.Acks[0].Offset}
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			for i := range 3 {
				if g := c.group(i); g != nil && g.State() == raft.Leader {
					_ = g.Raft().Snapshot().Error()
				}
			}
			if n == 5 {
				c.start(f)
			}
		}
	}()
	var sw sync.WaitGroup
	for part := range 2 {
		for s := range 4 {
			sw.Add(1)
			go func() {
				defer sw.Done()
				for k := s; k < 400; k += 4 {
					id := fmt.Sprintf("b-p%d-%d", part, k)
					res, err := c.applyTo(ctx, part, store.Command{Op: store.OpAppend, Msgs: []store.Message{msg(id)}})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					acked[id] = ackAt{part, res.Acks[0].Offset}
					mu.Unlock()
				}
			}()
		}
	}
	sw.Wait()
	close(stop)
	wg.Wait()
	if c.group(f) == nil {
		c.start(f)
	}
	logs := c.identicalParts([]uint64{428, 428, 8, 8})
	checkAcked(t, logs, acked)
	t.Logf("%s restores: %d", c.ids[f], c.group(f).fsm.restores.Load())
	for i := range 3 {
		c.stop(i)
	}
	for i := range 3 {
		c.start(i)
	}
	c.leader()
	checkAcked(t, c.identicalParts([]uint64{428, 428, 8, 8}), acked)
}

// TestGroup_PartitionsLeaderChangesUnderLoad: leadership moves three
// times while senders of every partition run (retrying with the same IDs
// after an unknown outcome). Each partition ends with exactly its acked
// IDs, densely, on every replica.
func TestGroup_PartitionsLeaderChangesUnderLoad(t *testing.T) {
	c := newClusterOpts(t, t.TempDir(), 3, testRaftConfig(), false, nParts)
	c.leader()
	done := make(chan map[string]ackAt)
	go func() { done <- sendParts(t, c, "a", 600) }()
	for range 3 {
		time.Sleep(20 * time.Millisecond)
		if g := c.group(c.leader()); g != nil {
			if err := g.Raft().LeadershipTransfer().Error(); err != nil {
				t.Logf("transfer: %v", err)
			}
		}
		t.Logf("leader now %s", c.ids[c.leader()])
	}
	acked := <-done
	checkAcked(t, c.identicalParts([]uint64{600, 600, 600, 600}), acked)
}
