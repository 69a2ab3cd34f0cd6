package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/store"
)

// replicaState is what replicas must agree on once caught up.
type replicaState struct {
	Stats  store.Stats
	Log    []store.Message
	Groups map[string]store.GroupState
	Half   []store.HalfTx
	Due    int64
	HasDue bool
}

func (c *cluster) stateOf(i int) replicaState {
	c.t.Helper()
	p, err := c.group(i).Partition(0)
	if err != nil {
		c.t.Fatalf("%s: %v", c.ids[i], err)
	}
	s := replicaState{Stats: p.Stats(), Log: c.log(i)}
	if s.Groups, err = p.GroupStates(); err != nil {
		c.t.Fatal(err)
	}
	if err := p.HalfTxs(func(h store.HalfTx) bool { s.Half = append(s.Half, h); return true }); err != nil {
		c.t.Fatal(err)
	}
	if s.Due, s.HasDue, err = p.NextDue(); err != nil {
		c.t.Fatal(err)
	}
	return s
}

// sameState waits until every live replica holds next messages and checks
// that they hold the same state.
func (c *cluster) sameState(next uint64) replicaState {
	c.t.Helper()
	c.identical(next)
	var want replicaState
	first := -1
	deadline := time.Now().Add(patience)
	for i := range c.groups {
		if c.group(i) == nil {
			continue
		}
		if first < 0 {
			want, first = c.stateOf(i), i
			continue
		}
		for {
			got := c.stateOf(i)
			if reflect.DeepEqual(got, want) {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("%s and %s differ:\n%+v\n%+v\n%+v\n%+v", c.ids[first], c.ids[i],
					want.Stats, got.Stats, want.Groups, got.Groups)
			}
			time.Sleep(20 * time.Millisecond)
			want = c.stateOf(first)
		}
	}
	return want
}

// TestGroup_SnapshotPersistDuringApply: raft snapshots taken (Persist)
// while sends are applied; the follower that was down installs one of
// them and replays the entries after it. Every replica then holds the
// same state: no message twice (the snapshot holding entries past its
// index), none missing, the same groups, half messages and delayed
// message, and a re-sent ID is a duplicate on the new leader.
func TestGroup_SnapshotPersistDuringApply(t *testing.T) {
	conf := stableConfig()
	conf.TrailingLogs = 4
	conf.SnapshotThreshold = 1 << 20
	conf.SnapshotInterval = time.Hour
	c := newClusterWith(t, 3, conf)
	l := c.leader()
	f := (l + 1) % 3
	c.stop(f)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := c.apply(ctx, store.Command{Op: store.OpPrepare, TxID: "open", Producer: "p", Msgs: []store.Message{msg("half")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.apply(ctx, store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: "late", Body: []byte("x"), DeliverAt: t0 + 3600e9}}}); err != nil {
		t.Fatal(err)
	}
	const senders, each = 4, 60
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				if _, err := c.send(ctx, msg(fmt.Sprintf("s%d-%d", s, k))); err != nil {
					errs <- err
					return
				}
				if k%15 == 0 {
					if _, err := c.apply(ctx, store.Command{Op: store.OpCommitOffset, Group: fmt.Sprint("g", s), Offset: uint64(k)}); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	snaps := 0
loop:
	for {
		select {
		case <-done:
			break loop
		default:
		}
		err := c.group(l).Raft().Snapshot().Error()
		switch {
		case err == nil:
			snaps++
		case errors.Is(err, raft.ErrNothingNewToSnapshot):
		default:
			t.Fatalf("Snapshot: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if _, err := c.apply(ctx, store.Command{Op: store.OpTrim, Now: t0 + 1, Consumed: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.group(l).Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	for k := range 8 { // past the last snapshot
		if _, err := c.send(ctx, msg(fmt.Sprint("tail", k))); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d snapshots taken during the sends", snaps)
	c.start(f)
	const next = senders*each + 8
	st := c.sameState(next)
	if n := c.group(f).fsm.restores.Load(); n == 0 {
		t.Fatalf("%s caught up without installing a snapshot", c.ids[f])
	}
	seen := map[string]uint64{}
	for k, m := range st.Log {
		if prev, ok := seen[m.ID]; ok {
			t.Fatalf("%s at %d and %d", m.ID, prev, m.Offset)
		}
		seen[m.ID] = m.Offset
		if k > 0 && m.Offset != st.Log[k-1].Offset+1 {
			t.Fatalf("gap before offset %d", m.Offset)
		}
	}
	if len(st.Half) != 1 || !st.HasDue {
		t.Fatalf("half messages %+v, delayed %v", st.Half, st.HasDue)
	}
	// The restored follower deduplicates as the leader does.
	c.stop(l)
	res, err := c.send(ctx, msg("tail7"))
	if err != nil || !res.Acks[0].Duplicate || res.Acks[0].Offset != next-1 {
		t.Fatalf("tail7 again: %+v %v", res.Acks, err)
	}
}

// TestGroup_CrashMidRestore: a replica that crashed in the middle of
// installing the leader's snapshot: raft had saved the snapshot, the fsm
// had written part of partition.db.restore (here, a leftover of another,
// complete file, and then a garbage one), the partition file stayed
// behind. Reopened, the replica restores the snapshot (catchUp), ignores
// the leftover, and catches up with the same state; no .restore file
// remains.
func TestGroup_CrashMidRestore(t *testing.T) {
	for _, leftover := range []string{"garbage", "complete"} {
		t.Run(leftover, func(t *testing.T) {
			conf := stableConfig()
			conf.TrailingLogs = 4
			conf.SnapshotThreshold = 1 << 20
			conf.SnapshotInterval = time.Hour
			c := newClusterWith(t, 3, conf)
			l := c.leader()
			f := (l + 1) % 3
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			if _, err := c.send(ctx, msg("first")); err != nil {
				t.Fatal(err)
			}
			c.identical(1)
			c.stop(f)
			for k := range 60 {
				if _, err := c.send(ctx, msg(fmt.Sprint("a", k))); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := c.apply(ctx, store.Command{Op: store.OpCommitOffset, Group: "g", Offset: 50}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.apply(ctx, store.Command{Op: store.OpTrim, Now: t0 + 1, Consumed: true}); err != nil {
				t.Fatal(err)
			}
			for k := range 10 {
				if _, err := c.send(ctx, msg(fmt.Sprint("b", k))); err != nil {
					t.Fatal(err)
				}
			}
			l = c.leader()
			if err := c.group(l).Raft().Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
			// The follower's disk as a crash inside Restore leaves it: the
			// snapshot saved, the .restore file begun.
			copyDir(t, filepath.Join(c.dirs[l], "snapshots"), filepath.Join(c.dirs[f], "snapshots"))
			tmp := filepath.Join(c.dirs[f], "partition.db.restore")
			switch leftover {
			case "garbage":
				if err := os.WriteFile(tmp, []byte("half a bbolt file"), 0o600); err != nil {
					t.Fatal(err)
				}
			case "complete":
				// The follower's own, older file under the temporary name.
				copyDir(t, filepath.Join(c.dirs[f], "partition.db"), tmp)
			}
			for k := range 5 { // the leader goes on meanwhile
				if _, err := c.send(ctx, msg(fmt.Sprint("c", k))); err != nil {
					t.Fatal(err)
				}
			}
			c.start(f)
			if n := c.group(f).fsm.restores.Load(); n == 0 {
				t.Fatalf("%s reopened behind its snapshot without restoring it", c.ids[f])
			}
			st := c.sameState(76)
			if len(st.Log) != 26 || st.Log[0].Offset != 50 {
				t.Fatalf("log of %d messages from %d, want 26 from 50", len(st.Log), st.Log[0].Offset)
			}
			if _, err := os.Lstat(tmp); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s left behind: %v", tmp, err)
			}
			// Restarted again, it neither restores nor replays twice.
			c.stop(f)
			c.start(f)
			c.sameState(76)
		})
	}
}
