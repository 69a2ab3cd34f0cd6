package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

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
