package raftqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/zeze-go/mq/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Concurrent sends are packed into few entries, each acked with its own
// offset, and every replica ends with the same log. Sends retry with the
// same ID (deduplicated) should the leader change under load.
func TestGroup_Apply(t *testing.T) {
	c := newClusterWith(t, 3, stableConfig())
	l := c.leader()
	g := c.group(l)
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	term := g.Raft().CurrentTerm()
	const senders, each = 32, 40
	var mu sync.Mutex
	acked := map[string]uint64{}
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				id := fmt.Sprintf("s%d-%d", s, k)
				res, err := c.send(ctx, msg(id))
				if err != nil {
					errs <- fmt.Errorf("%s: %w", id, err)
					return
				}
				if len(res.Acks) != 1 {
					errs <- fmt.Errorf("%s: acks %+v", id, res.Acks)
					return
				}
				mu.Lock()
				acked[id] = res.Acks[0].Offset
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	const n = senders * each
	seen := make([]bool, n)
	for id, off := range acked {
		if off >= n || seen[off] {
			t.Fatalf("%s acked at offset %d: out of range or twice", id, off)
		}
		seen[off] = true
	}
	log := c.identical(n)
	for _, m := range log {
		if acked[m.ID] != m.Offset {
			t.Fatalf("offset %d holds %s, acked at %d", m.Offset, m.ID, acked[m.ID])
		}
	}
	// Counted on the first leader: without a failover, every command once.
	entries, cmds := g.prop.entries.Load(), g.prop.proposedCmd.Load()
	t.Logf("%d commands in %d entries on the first leader", cmds, entries)
	if g.State() == raft.Leader && g.Raft().CurrentTerm() == term && cmds != n {
		t.Fatalf("proposed %d commands, want %d", cmds, n)
	}
}

// A follower refuses, naming the leader; nothing is proposed.
func TestGroup_NotLeader(t *testing.T) {
	c := newClusterWith(t, 3, stableConfig())
	l := c.leader()
	f := (l + 1) % 3
	_, err := c.group(f).Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}})
	var nl *NotLeaderError
	if !errors.Is(err, ErrNotLeader) || !errors.As(err, &nl) {
		t.Fatalf("Apply on a follower: %v, want a NotLeaderError", err)
	}
	deadline := time.Now().Add(patience)
	for nl.LeaderID != c.ids[l] && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		_, err = c.group(f).Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}})
		errors.As(err, &nl)
	}
	if nl.LeaderID != c.ids[l] || nl.Leader != c.addrs[l] {
		t.Fatalf("NotLeaderError names %s at %s, want %s at %s", nl.LeaderID, nl.Leader, c.ids[l], c.addrs[l])
	}
	c.identical(0)
}

// The leader is closed while sends go on, four times: each time a new leader
// is elected, the sends go on through it, and the old leader is restarted
// from its directory. No acked message is lost or stored twice, and the
// three replicas end with the same log.
func TestGroup_LeaderKill(t *testing.T) {
	c := newCluster(t, 3)
	c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 4*patience)
	defer cancel()
	var mu sync.Mutex
	acked := map[string]uint64{}
	var sent atomic.Int64
	stop := make(chan struct{})
	var stopOnce sync.Once
	var wg sync.WaitGroup
	halt := func() { // the senders end before the test does, even when it fails
		stopOnce.Do(func() { close(stop) })
		wg.Wait()
	}
	defer func() { cancel(); halt() }()
	errs := make(chan error, 16)
	for s := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("s%d-%d", s, k)
				res, err := c.send(ctx, msg(id))
				if err != nil {
					errs <- fmt.Errorf("%s: %w", id, err)
					return
				}
				mu.Lock()
				acked[id] = res.Acks[0].Offset
				mu.Unlock()
				sent.Add(1)
			}
		}()
	}
	waitSent := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(patience)
		for sent.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d sends acked, want %d", sent.Load(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitSent(100)
	for range 4 {
		old := c.leader()
		c.stop(old)
		before := sent.Load()
		if l := c.leader(); l == old {
			t.Fatalf("the closed replica leads")
		}
		waitSent(before + 100)
		c.start(old) // restart from its directory
		waitSent(sent.Load() + 100)
	}
	halt()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	l := c.leader()
	p, err := c.group(l).Partition(0)
	if err != nil {
		t.Fatal(err)
	}
	next := p.Stats().Next
	log := c.identical(next)
	at := map[string]uint64{}
	for _, m := range log {
		if _, dup := at[m.ID]; dup {
			t.Fatalf("%s stored twice", m.ID)
		}
		at[m.ID] = m.Offset
	}
	for id, off := range acked {
		if got, ok := at[id]; !ok || got != off {
			t.Fatalf("%s acked at %d, log has it at %d (present %v)", id, off, got, ok)
		}
	}
	t.Logf("%d acked, %d in the log", len(acked), len(log))
}

// Every replica closed and opened again from its directory holds what it
// held, applies nothing twice, and the group goes on.
func TestGroup_Restart(t *testing.T) {
	c := newClusterWith(t, 3, stableConfig())
	c.leader()
	ctx := context.Background()
	for k := range 100 {
		c.sendFresh(fmt.Sprintf("a%d", k))
	}
	before := c.identical(100)
	for i := range 3 {
		c.stop(i)
	}
	for i := range 3 {
		c.start(i)
	}
	c.leader()
	after := c.identical(100)
	if len(after) != len(before) {
		t.Fatalf("after the restart %d messages, before %d", len(after), len(before))
	}
	res, err := c.send(ctx, msg("b"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Acks[0].Offset != 100 {
		t.Fatalf("next send at %d, want 100", res.Acks[0].Offset)
	}
	// A resend of an acked message is a duplicate, on every replica.
	res, err = c.send(ctx, msg("a7"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Acks[0].Duplicate || res.Acks[0].Offset != 7 {
		t.Fatalf("resend: %+v, want a duplicate of offset 7", res.Acks[0])
	}
	c.identical(101)
	for i := range 3 {
		p, err := c.group(i).Partition(0)
		if err != nil {
			t.Fatal(err)
		}
		if pos, err := p.Sync(); err != nil || pos.Index == 0 {
			t.Fatalf("%s: Sync: %+v, %v", c.ids[i], pos, err)
		}
	}
}

// One replica restarts alone while the others go on.
func TestGroup_RestartFollower(t *testing.T) {
	c := newCluster(t, 3)
	l := c.leader()
	f := (l + 1) % 3
	ctx := context.Background()
	for k := range 50 {
		if _, err := c.send(ctx, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	c.identical(50)
	c.stop(f)
	for k := range 50 {
		if _, err := c.send(ctx, msg(fmt.Sprintf("b%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	c.start(f)
	c.identical(100)
}

// A follower that missed entries the leader compacted away installs the
// leader's snapshot (Restore) and ends with the same log.
func TestGroup_InstallSnapshot(t *testing.T) {
	conf := testRaftConfig()
	conf.TrailingLogs = 10
	conf.SnapshotThreshold = 20
	conf.SnapshotInterval = 50 * time.Millisecond
	c := newClusterWith(t, 3, conf)
	l := c.leader()
	f := (l + 1) % 3
	ctx := context.Background()
	for k := range 20 {
		if _, err := c.send(ctx, msg(fmt.Sprintf("a%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	c.identical(20)
	c.stop(f)
	for k := range 200 {
		if _, err := c.send(ctx, msg(fmt.Sprintf("b%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	l = c.leader()
	if err := c.group(l).Raft().Snapshot().Error(); err != nil {
		t.Logf("Snapshot: %v", err) // raft may have taken one already
	}
	c.start(f)
	c.identical(220)
	if n := c.group(f).fsm.restores.Load(); n == 0 {
		t.Fatalf("%s caught up without installing a snapshot", c.ids[f])
	}
	for k := range 10 {
		if _, err := c.send(ctx, msg(fmt.Sprintf("c%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	c.identical(230)
}

// A snapshot taken after the consumed head was trimmed holds the live state
// only (not the file, which keeps its freed pages), and a follower that
// installs it holds the same log, groups and dedup index as the leader.
func TestGroup_InstallSnapshotConsumed(t *testing.T) {
	conf := testRaftConfig()
	conf.TrailingLogs = 10
	conf.SnapshotThreshold = 1 << 20 // only the snapshot asked for below
	c := newClusterWith(t, 3, conf)
	l := c.leader()
	f := (l + 1) % 3
	ctx := context.Background()
	c.stop(f)
	body := bytes.Repeat([]byte{'x'}, 4096)
	for k := range 200 {
		m := msg(fmt.Sprintf("a%d", k))
		m.Body = body
		if _, err := c.send(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.apply(ctx, store.Command{Op: store.OpCommitOffset, Group: "g", Offset: 195}); err != nil {
		t.Fatal(err)
	}
	res, err := c.apply(ctx, store.Command{Op: store.OpTrim, Now: t0 + 1, Consumed: true})
	if err != nil || res.Count != 195 {
		t.Fatalf("trim of the consumed head: %+v, %v; want 195 deleted", res, err)
	}
	for k := range 20 { // entries past the trim, so the log is compacted behind it
		if _, err := c.send(ctx, msg(fmt.Sprintf("b%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	l = c.leader()
	if err := c.group(l).Raft().Snapshot().Error(); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	snaps, err := raft.NewFileSnapshotStore(c.dirs[l], 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	list, err := snaps.List()
	if err != nil || len(list) == 0 {
		t.Fatalf("the leader's snapshots: %v, %v", list, err)
	}
	if size := list[0].Size; size > 100<<10 {
		t.Fatalf("snapshot of %d bytes after trimming 195 of 200 messages of 4 KiB (the partition file holds them in freed pages)", size)
	} else {
		t.Logf("snapshot of %d bytes", size)
	}
	c.start(f)
	log := c.identical(220)
	if n := c.group(f).fsm.restores.Load(); n == 0 {
		t.Fatalf("%s caught up without installing a snapshot", c.ids[f])
	}
	if len(log) != 25 || log[0].Offset != 195 {
		t.Fatalf("log after the trim: %d messages from %d, want 25 from 195", len(log), log[0].Offset)
	}
	p, err := c.group(f).Partition(0)
	if err != nil {
		t.Fatal(err)
	}
	if off, ok, err := p.GroupOffset("g"); err != nil || !ok || off != 195 {
		t.Fatalf("%s's group g: %d %v %v, want 195", c.ids[f], off, ok, err)
	}
	// The dedup index came with the snapshot: a retried a199 is a duplicate
	// at its first offset, wherever the leader now is.
	c.stop(l)
	m := msg("a199")
	m.Body = body
	res, err = c.send(ctx, m)
	if err != nil || !res.Acks[0].Duplicate || res.Acks[0].Offset != 199 {
		t.Fatalf("a199 again after the leader's loss: %+v, %v; want a duplicate at 199", res.Acks, err)
	}
}

// A leader cut off while its entry is being committed steps down: the
// caller learns that the outcome is unknown (not a failure), and a retry
// with the same ID through the new leader stores the message once.
func TestGroup_LeadershipLost(t *testing.T) {
	c := newCluster(t, 3)
	old := c.leader()
	ctx := context.Background()
	if _, err := c.send(ctx, msg("a")); err != nil {
		t.Fatal(err)
	}
	c.isolate(old)
	_, err := c.group(old).Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b")}})
	if !errors.Is(err, ErrUnknownOutcome) || !errors.Is(err, raft.ErrLeadershipLost) {
		t.Fatalf("Apply on a leader cut off: %v, want ErrUnknownOutcome wrapping raft.ErrLeadershipLost", err)
	}
	if errors.Is(err, ErrNotLeader) {
		t.Fatalf("Apply on a leader cut off: %v, an outcome-unknown error must not be ErrNotLeader", err)
	}
	c.heal(old)
	res, err := c.send(ctx, msg("b"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Acks[0].Offset != 1 {
		t.Fatalf("b acked at %+v, want offset 1", res.Acks[0])
	}
	log := c.identical(2)
	if log[1].ID != "b" {
		t.Fatalf("offset 1 holds %s", log[1].ID)
	}
}

// A replica whose file is behind its raft log (what a crash leaves: the
// file is as of its last materialized batch) replays the rest, once: here
// every replica's file is set back to a copy taken earlier, and the group
// restarted.
func TestGroup_ReplayBehindFile(t *testing.T) {
	c := newClusterWith(t, 3, stableConfig())
	c.leader()
	ctx := context.Background()
	for k := range 50 {
		c.sendFresh(fmt.Sprintf("a%d", k))
	}
	c.identical(50)
	for i := range 3 { // copy each file as it is at 50 messages
		c.stop(i)
		copyFile(t, filepath.Join(c.dirs[i], "partition.db"), filepath.Join(c.dirs[i], "old.db"))
		c.start(i)
	}
	c.leader()
	for k := range 50 {
		c.sendFresh(fmt.Sprintf("b%d", k))
	}
	want := c.identical(100)
	for i := range 3 {
		c.stop(i)
	}
	for i := range 3 {
		if err := os.Rename(filepath.Join(c.dirs[i], "old.db"), filepath.Join(c.dirs[i], "partition.db")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		c.start(i)
	}
	c.leader()
	got := c.identical(100)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after the replay the log differs from before")
	}
	res, err := c.send(ctx, msg("c"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Acks[0].Offset != 100 {
		t.Fatalf("next send at %d, want 100", res.Acks[0].Offset)
	}
}

// TestGroup_LeaderChanged: a watcher that takes LeaderChanged, then looks
// at State, and waits for the channel while the state is not yet the one
// it waits for, sees each change without polling: the leader cut off stops
// leading, another replica starts, and a closing replica's channel closes.
// (A channel may close for a change that came just before it was taken:
// the watcher looks at State again.)
func TestGroup_LeaderChanged(t *testing.T) {
	// Timeouts of 3 s and waits of 2 minutes: with 200 ms timeouts an
	// election beside other packages' fsyncs and -race found no leader in
	// 20 s once (a vote's fsync outlasting the candidate's timeout, round
	// after round), and with 1 s ones none in a minute in CI. The waits end
	// as soon as the change is seen; a leader found by looking at State
	// whose change LeaderChanged did not signal fails the test.
	const patience = 2 * time.Minute
	c := newClusterWith(t, 3, raftConfig(3*time.Second))
	waitState := func(what string, g *Group, leads bool) {
		t.Helper()
		deadline := time.After(patience)
		for {
			ch := g.LeaderChanged()
			if (g.State() == raft.Leader) == leads {
				return
			}
			select {
			case <-ch:
			case <-deadline:
				t.Fatalf("%s: no leadership change seen (state %v)", what, g.State())
			}
		}
	}
	old := c.leader()
	others := []*Group{c.group((old + 1) % 3), c.group((old + 2) % 3)}
	c.isolate(old)
	waitState("the leader cut off", c.group(old), false)
	// One of the others starts leading: a watcher of each sees it, or
	// sees that it does not (the watch of the one that does not lead
	// would wait forever: watch both at once).
	type seen struct {
		g      *Group
		missed bool // leading, and LeaderChanged did not say so
	}
	done, stop := make(chan seen, 2), make(chan struct{})
	for _, g := range others {
		go func() {
			deadline := time.After(patience)
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				ch := g.LeaderChanged()
				if g.State() == raft.Leader {
					done <- seen{g: g}
					return
				}
				select {
				case <-ch:
				case <-tick.C:
					if g.State() != raft.Leader {
						continue
					}
					select { // it leads: the signal is due
					case <-ch:
					case <-time.After(5 * time.Second):
						done <- seen{g: g, missed: true}
						return
					}
				case <-stop:
					done <- seen{}
					return
				case <-deadline:
					done <- seen{}
					return
				}
			}
		}()
	}
	first := <-done
	close(stop)
	<-done
	switch {
	case first.missed:
		t.Fatal("a replica leads, and LeaderChanged did not signal it")
	case first.g == nil:
		t.Fatalf("no new leader in %v (states %v, %v)", patience, others[0].State(), others[1].State())
	}
	c.heal(old)
	closing := c.group(old).LeaderChanged()
	c.stop(old)
	select {
	case <-closing:
	case <-time.After(10 * time.Second):
		t.Fatal("LeaderChanged not closed by Close")
	}
}

// TestGroup_DamagedStableNames: raft.db with a damaged bucket name (raft-
// boltdb would make the bucket anew, empty: the replica would forget its
// term and vote), a foreign bucket, or terms without the partition count,
// is refused by Open with ErrCorrupt; the intact file opens.
func TestGroup_DamagedStableNames(t *testing.T) {
	c := newCluster(t, 3)
	c.sendFresh("a")
	c.stop(0)
	clean, err := os.ReadFile(filepath.Join(c.dirs[0], "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	reopen := func(t *testing.T, damage func(tx *bolt.Tx) error) error {
		dir := t.TempDir()
		path := filepath.Join(dir, "raft.db")
		if err := os.WriteFile(path, clean, 0o600); err != nil {
			t.Fatal(err)
		}
		if damage != nil {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(damage)
			db.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		_, trans := raft.NewInmemTransport("x")
		g, err := Open(Config{ID: c.ids[0], Dir: dir, Transport: trans, Raft: testRaftConfig()})
		if err == nil {
			g.Close()
		}
		return err
	}
	rename := func(from, to string) func(tx *bolt.Tx) error {
		return func(tx *bolt.Tx) error {
			old := tx.Bucket([]byte(from))
			nb, err := tx.CreateBucket([]byte(to))
			if err != nil {
				return err
			}
			if err := old.ForEach(func(k, v []byte) error { return nb.Put(k, v) }); err != nil {
				return err
			}
			return tx.DeleteBucket([]byte(from))
		}
	}
	for name, damage := range map[string]func(tx *bolt.Tx) error{
		"ConfRenamed": rename("conf", "cpnf"),
		"LogsRenamed": rename("logs", "lmgs"),
		"Foreign": func(tx *bolt.Tx) error {
			_, err := tx.CreateBucket([]byte("other"))
			return err
		},
		"NoPartitionCount": func(tx *bolt.Tx) error { return tx.Bucket([]byte("conf")).Delete(partitionsKey) },
	} {
		t.Run(name, func(t *testing.T) {
			if err := reopen(t, damage); !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
		})
	}
	t.Run("Intact", func(t *testing.T) {
		if err := reopen(t, nil); err != nil {
			t.Fatalf("Open of the intact raft.db: %v", err)
		}
	})
}
