package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/store"
)

// The fault matrix of issue 12. Each scenario runs three replicas with
// writers appending messages of their own IDs (each retried with the same ID
// until acked) and readers reading one offset at a time through
// LeaderPartition, while a fault happens; then it heals the cluster and
// checks (history.check): every acked ID in the final log at its acked
// offset (none lost, none acked by a deposed leader), acked by the leader of
// a term whose entry holds it, no ID stored twice, the replicas alike, and
// the history linearizable against a sequential log (porcupine). The
// scenarios run a few seconds each; ZEZE_RAFT_SOAK=1 repeats each fault ten
// times.

const (
	faultWriters = 6
	faultReaders = 2
	// attemptTimeout bounds one Apply or read of a client.
	attemptTimeout = 2 * time.Second
)

// soak reports whether the fault scenarios run long (ZEZE_RAFT_SOAK=1).
func soak() bool { return os.Getenv("ZEZE_RAFT_SOAK") == "1" }

// rounds is n, or ten times n in a soak.
func rounds(n int) int {
	if soak() {
		return 10 * n
	}
	return n
}

// faultConfig is for failover: 200 ms timeouts, and a raft log never
// compacted, since the checks read every entry of the leader's log.
func faultConfig() *raft.Config {
	c := testRaftConfig()
	c.TrailingLogs = 1 << 20
	return c
}

// faultCluster is a cluster whose replicas talk through faultTransports,
// over raft's in-memory transport or over TCP on 127.0.0.1, each with its
// raft log in its WAL (WALLog) as in a node.
type faultCluster struct {
	*cluster
	net *faultNet
	tcp bool
	// Guarded by cluster.mu.
	layers []*tcpLayer // TCP: replica i's stream layer
	logs   []*WALLog   // replica i's raft log, nil while down
	// openLog opens replica i's WAL and its raft log, given the replica's
	// directory; nil: openNodeLog in it.
	openLog func(i int, dir string) (*store.WAL, *WALLog, error)
	parts   int // the group's partitions (Config.Partitions)
}

func newFaultCluster(t testing.TB, tcp bool) *faultCluster {
	t.Helper()
	return newFaultClusterWith(t, tcp, 1, nil)
}

// newFaultClusterWith is newFaultCluster with a group of parts partitions
// and the replicas' WALs opened by openLog (nil: in their directories).
func newFaultClusterWith(t testing.TB, tcp bool, parts int, openLog func(i int, dir string) (*store.WAL, *WALLog, error)) *faultCluster {
	t.Helper()
	const n = 3
	base := t.TempDir()
	c := &faultCluster{cluster: &cluster{t: t, conf: faultConfig()}, tcp: tcp, openLog: openLog, parts: parts}
	c.layers, c.logs = make([]*tcpLayer, n), make([]*WALLog, n)
	c.trans, c.groups, c.wals = make([]*raft.InmemTransport, n), make([]*Group, n), make([]*store.WAL, n)
	t.Cleanup(c.close)
	var servers []raft.Server
	for i := range n {
		id, addr := raft.ServerID(fmt.Sprintf("r%d", i)), raft.ServerAddress(fmt.Sprintf("addr-r%d", i))
		if tcp {
			l, err := listenTCP("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			c.layers[i], addr = l, raft.ServerAddress(l.Addr().String())
		}
		c.dirs, c.ids, c.addrs = append(c.dirs, filepath.Join(base, string(id))), append(c.ids, id), append(c.addrs, addr)
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: id, Address: addr})
	}
	c.net = newFaultNet(c.addrs)
	for i := range n {
		c.start(i)
	}
	if err := c.group(0).Bootstrap(servers); err != nil {
		t.Fatalf("Bootstrap: %v", err)
	}
	return c
}

// start opens replica i from its directory (over TCP at the address it had).
func (c *faultCluster) start(i int) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var inner raft.Transport
	if c.tcp {
		if c.layers[i] == nil {
			l, err := listenTCP(string(c.addrs[i]))
			if err != nil {
				c.t.Fatalf("%s: %v", c.ids[i], err)
			}
			c.layers[i] = l
		}
		// The node's transport (no pipeline), with a shorter timeout.
		cfg := transport.RaftTransportConfig(c.layers[i])
		cfg.Timeout = time.Second
		inner = raft.NewNetworkTransportWithConfig(cfg)
	} else {
		inner = c.inmem(i)
	}
	trans := newFaultTransport(inner, c.net, i, c.ids[i], c.tcp)
	var w *store.WAL
	var l *WALLog
	var err error
	if c.openLog != nil {
		w, l, err = c.openLog(i, c.dirs[i])
	} else {
		w, l, err = openNodeLog(filepath.Join(c.dirs[i], "wal"))
	}
	if err != nil {
		trans.Close()
		c.t.Fatalf("open the log of %s: %v", c.ids[i], err)
	}
	logs := &hookedLog{LogStore: l, before: func() error { return c.net.thawed(i, trans.closed) }}
	g, err := Open(Config{ID: c.ids[i], Dir: c.dirs[i], Transport: trans, LogStore: logs, Raft: c.conf, Partitions: c.parts})
	if err != nil {
		trans.Close()
		w.Close()
		c.t.Fatalf("Open %s: %v", c.ids[i], err)
	}
	c.groups[i], c.wals[i], c.logs[i] = g, w, l
}

// stop closes replica i (a kill: its directory stays as it is).
func (c *faultCluster) stop(i int) {
	c.t.Helper()
	c.mu.Lock()
	layer := c.layers[i]
	c.layers[i], c.logs[i] = nil, nil
	c.mu.Unlock()
	c.cluster.stop(i)
	if layer != nil {
		layer.Close() // closed with its transport already, unless the replica never opened
	}
}

func (c *faultCluster) close() {
	c.heal() // RPCs held for a paused replica go through: raft's shutdown waits for them
	for i := range c.groups {
		c.stop(i)
	}
}

// isolate cuts replica i from the others, both ways.
func (c *faultCluster) isolate(i int) {
	if !c.tcp {
		c.net.isolate(i)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.layers[i].setCut(true)
}

// heal brings every link up and resumes every paused replica.
func (c *faultCluster) heal() {
	c.net.heal()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.layers {
		if l != nil {
			l.setCut(false)
		}
	}
}

// leaderBesides waits until a live replica other than old leads (old may
// still think it does) and returns it.
func (c *faultCluster) leaderBesides(old int) int {
	c.t.Helper()
	deadline := time.Now().Add(patience)
	for time.Now().Before(deadline) {
		for i := range c.groups {
			if g := c.group(i); i != old && g != nil && g.State() == raft.Leader {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("no leader besides %s within %v", c.ids[old], patience)
	return -1
}

// settle heals the cluster and returns the log of each partition every
// replica holds once the leader has applied everything proposed to it (a
// barrier: acks before the commit leave entries in flight), and the terms
// of the entries holding each ID in the leader's raft log.
func (c *faultCluster) settle() ([][]store.Message, map[string][]uint64) {
	c.t.Helper()
	c.heal()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for {
		l := c.leader()
		g := c.group(l)
		err := g.Raft().Barrier(patience).Error()
		next := make([]uint64, c.parts)
		for part := range next {
			var p *store.Partition
			if err == nil {
				if p, err = g.LeaderPartition(ctx, part); err == nil {
					next[part] = p.Stats().Next
				}
			}
		}
		if err == nil {
			return c.identicalParts(next), c.entryTerms(l)
		}
		if ctx.Err() != nil {
			c.t.Fatalf("settle: %v", err)
		}
	}
}

// entryTerms reads replica i's raft log: the terms of the entries holding
// each message ID.
func (c *faultCluster) entryTerms(i int) map[string][]uint64 {
	c.t.Helper()
	c.mu.Lock()
	logs := c.logs[i]
	c.mu.Unlock()
	first, err := logs.FirstIndex()
	if err != nil {
		c.t.Fatal(err)
	}
	last, err := logs.LastIndex()
	if err != nil {
		c.t.Fatal(err)
	}
	if first > 1 {
		c.t.Fatalf("%s: the raft log starts at %d: compacted", c.ids[i], first)
	}
	terms := map[string][]uint64{}
	for idx := first; idx <= last; idx++ {
		var l raft.Log
		if err := logs.GetLog(idx, &l); err != nil {
			c.t.Fatalf("%s: entry %d: %v", c.ids[i], idx, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		cmds, _, err := decodeEntry(l.Data, c.parts, nil, nil)
		if err != nil {
			c.t.Fatalf("%s: entry %d: %v", c.ids[i], idx, err)
		}
		for _, cmd := range cmds {
			for _, m := range cmd.Msgs {
				terms[m.ID] = append(terms[m.ID], l.Term)
			}
		}
	}
	return terms
}

// workload is a scenario's clients: writers appending messages of their
// own IDs, each until acked, and readers reading one offset at a time, all
// recorded in the history of the partition: writer k's is k%parts, a
// reader's any, chosen at each read.
type workload struct {
	*clients
	c  *faultCluster
	hs []*history // by partition
	h  *history   // hs[0]
}

func startWorkload(c *faultCluster) *workload {
	w := &workload{c: c, clients: newClients(c.t)}
	for range c.parts {
		w.hs = append(w.hs, newHistory())
	}
	w.h = w.hs[0]
	c.t.Cleanup(func() { // before the cluster closes; healed, so that each writer's last send is acked
		c.heal()
		w.halt()
	})
	w.start(w.send, w.read)
	return w
}

// send appends id until it is acked: at the replica the last refusal named
// as the leader, else at each in turn. Each attempt is an operation of the
// history, but for those that proposed nothing (ErrNotLeader, ErrClosed,
// the ctx ending before the proposal): should one of those have been
// proposed after all, the ID would be stored by no append of the history.
func (w *workload) send(client int, id string) error {
	cmd := &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(id)}}
	part := client % w.c.parts
	h := w.hs[part]
	deadline := time.Now().Add(patience)
	try := client % 3
	for time.Now().Before(deadline) {
		g := w.c.group(try)
		if g == nil {
			try = (try + 1) % 3
			time.Sleep(time.Millisecond)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		call := h.now()
		res, err := g.ApplyTo(ctx, part, cmd)
		ret := h.now()
		cancel()
		var nl *NotLeaderError
		switch {
		case err == nil && len(res.Acks) == 1:
			h.appended(client, id, call, ret, res.Acks[0], g.ID())
			w.acked.Add(1)
			return nil
		case err == nil:
			return fmt.Errorf("%s: %d acks", id, len(res.Acks))
		case errors.Is(err, ErrUnknownOutcome):
			h.unknown(client, id, call)
			try = (try + 1) % 3
		case errors.As(err, &nl):
			if j := w.c.net.index(nl.Leader); j >= 0 {
				try = j
			} else {
				try = (try + 1) % 3
			}
		case errors.Is(err, ErrClosed), errors.Is(err, context.DeadlineExceeded):
			try = (try + 1) % 3
		default:
			return fmt.Errorf("send %s to %s: %w", id, g.ID(), err)
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("%s not acked within %v", id, patience)
}

// read reads, until the workload stops, mostly the highest offset acked
// before the read began (it must find it), else the one after it or any
// below.
func (w *workload) read(client int) {
	rng := rand.New(rand.NewPCG(uint64(client), 0))
	for !w.stopped() {
		part := rng.IntN(w.c.parts) // each partition's readers
		h := w.hs[part]
		var off uint64
		switch hi, r := h.highest(), rng.IntN(8); {
		case hi < 0:
		case r < 5:
			off = uint64(hi)
		case r < 6:
			off = uint64(hi) + 1
		default:
			off = rng.Uint64N(uint64(hi) + 1)
		}
		call := h.now()
		if id, replica, ok := w.readAt(part, off, rng.IntN(3)); ok {
			h.read(client, off, id, call, h.now(), replica)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// readAt reads the ID at off of partition part ("" for none) from the
// first replica from first on whose LeaderPartition answers, and returns
// that replica; ok is false when none did.
func (w *workload) readAt(part int, off uint64, first int) (id string, replica raft.ServerID, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	for k := range 3 {
		g := w.c.group((first + k) % 3)
		if g == nil {
			continue
		}
		p, err := g.LeaderPartition(ctx, part)
		if err != nil {
			continue
		}
		got, err := p.Read(off, 1, 0, nil)
		switch {
		case err != nil:
			return "", "", false
		case len(got) == 0:
			return "", g.ID(), true
		case got[0].Offset != off:
			w.errs <- fmt.Errorf("read %d from %s: got offset %d", off, g.ID(), got[0].Offset)
			return "", "", false
		}
		return got[0].ID, g.ID(), true
	}
	return "", "", false
}

// verify stops the clients, settles the cluster and checks the history of
// each partition.
func (w *workload) verify() verdict {
	w.c.t.Helper()
	w.halt()
	final, terms := w.c.settle()
	var v verdict
	for part, h := range w.hs {
		pv := h.check(w.c.t, final[part], terms, w.c.net.leaderOf)
		w.c.t.Logf("partition %d: %v; its log holds %d messages", part, pv, len(final[part]))
		v.add(pv)
	}
	_, v.splitTerms = w.c.net.terms()
	return v
}

// transports are the two networks the TCP-covered scenarios run on.
var transports = []struct {
	name string
	tcp  bool
}{{"Inmem", false}, {"TCP", true}}

// runFaults starts a cluster and its clients, runs fault times times
// (healing after each, acks going on between), and checks the history.
func runFaults(t *testing.T, tcp bool, times int, fault func(c *faultCluster, w *workload)) verdict {
	t.Helper()
	return runFaultsOn(t, newFaultCluster(t, tcp), times, fault)
}

// runFaultsOn is runFaults on the cluster c.
func runFaultsOn(t *testing.T, c *faultCluster, times int, fault func(c *faultCluster, w *workload)) verdict {
	t.Helper()
	w := startWorkload(c)
	w.progress(30)
	start := time.Now()
	for range times {
		fault(c, w)
		c.heal()
		w.progress(30)
	}
	every := time.Since(start) / time.Duration(times)
	v := w.verify()
	terms, _ := c.net.terms()
	t.Logf("%d faults, one every %v; %d terms had a leader", times, every.Round(time.Millisecond), terms)
	return v
}

// The leader is closed and reopened from its directory, a second after the
// last kill at the earliest: twenty times on the in-memory transport, eight
// over TCP.
func TestFault_LeaderKill(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			kills := rounds(20)
			if tr.tcp {
				kills = rounds(8)
			}
			var last time.Time
			runFaults(t, tr.tcp, kills, func(c *faultCluster, w *workload) {
				time.Sleep(time.Until(last.Add(time.Second)))
				last = time.Now()
				old := c.leader()
				c.stop(old)
				w.progress(20) // through a new leader
				c.start(old)
			}).report(t)
		})
	}
}

// isolateLeader cuts the leader off until the others elected a new one and
// acks went on through it.
func isolateLeader(c *faultCluster, w *workload) {
	c.t.Helper()
	old := c.leader()
	c.isolate(old)
	c.leaderBesides(old)
	w.progress(50)
}

// The leader is cut from both followers while clients still reach it, and
// healed once the followers elected a new one.
func TestFault_LeaderIsolated(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			runFaults(t, tr.tcp, rounds(1), isolateLeader).report(t)
		})
	}
}

// A follower is cut off while the others go on, then healed: it catches up.
func TestFault_FollowerIsolated(t *testing.T) {
	t.Parallel()
	runFaults(t, false, rounds(1), func(c *faultCluster, w *workload) {
		c.isolate((c.leader() + 1) % 3)
		w.progress(100)
	}).report(t)
}

// Links down in one direction only: the leader hears nothing from a
// follower it still reaches; reaches nothing of a follower it still hears;
// hears neither follower (its entries reach them, their answers are lost).
func TestFault_OneWay(t *testing.T) {
	t.Parallel()
	runFaults(t, false, rounds(1), func(c *faultCluster, w *workload) {
		for _, cut := range []func(l, f1, f2 int){
			func(l, f1, _ int) { c.net.setLink(f1, l, true) },
			func(l, f1, _ int) { c.net.setLink(l, f1, true) },
			func(l, f1, f2 int) { c.net.setLink(f1, l, true); c.net.setLink(f2, l, true) },
		} {
			l := c.leader()
			cut(l, (l+1)%3, (l+2)%3)
			w.progress(60)
			c.heal()
			w.progress(30)
		}
	}).report(t)
}

// Links go down and up at random: every 100 to 400 ms, twenty times, each
// direction of each link is down with a chance of one in three.
func TestFault_Flapping(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	runFaults(t, false, rounds(1), func(c *faultCluster, w *workload) {
		for range 20 {
			for from := range 3 {
				for to := range 3 {
					if from != to {
						c.net.setLink(from, to, rng.IntN(3) == 0)
					}
				}
			}
			time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		}
	}).report(t)
}

// The leader is paused until the others elected a new leader and acks went
// on, then resumed. Network: every RPC to and from it is held unanswered,
// and delivered late when it resumes; its raft runs on meanwhile and steps
// down when its lease runs out. Frozen: as a stopped process, raft's main
// loop stops too, at its next log write (a barrier makes it write at once),
// so the leader does not step down when its lease runs out: it still says
// it leads while the others elect a new leader and ack. Reads through it
// must not miss those acks.
func TestFault_Pause(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		frozen bool
	}{{"Network", false}, {"Frozen", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runFaults(t, false, rounds(1), func(c *faultCluster, w *workload) {
				old := c.leader()
				if !tc.frozen {
					c.net.pause(old)
				} else {
					c.net.freeze(old)
					enqueued := make(chan struct{})
					go func() {
						defer close(enqueued)
						c.group(old).Raft().Barrier(0) // waits while a client's entry froze the loop already
					}()
					defer func() { c.heal(); <-enqueued }()
				}
				c.leaderBesides(old)
				w.progress(50)
			}).report(t)
		})
	}
}

// The negative control: with a proposer that acks each entry as soon as it
// is handed to raft, the leader-isolation scenario must fail the checks.
func TestFault_NegativeControl(t *testing.T) {
	t.Parallel()
	v := runFaults(t, false, rounds(1), func(c *faultCluster, w *workload) {
		for i := range 3 {
			c.group(i).prop.ackBeforeCommit.Store(true)
		}
		isolateLeader(c, w)
	})
	if v.ok() {
		t.Fatalf("the checks passed a proposer that acks before the commit: %v", v)
	}
	t.Logf("the checks failed the proposer that acks before the commit, as they must: %v", v)
}

// TestFault_Partitions runs the fault matrix on a group of three
// partitions (Config.Partitions): the writers and readers of each
// partition share the group's entries, and each partition's history is
// checked on its own. The leader killed (in-memory and TCP), isolated,
// and paused past the election timeout.
func TestFault_Partitions(t *testing.T) {
	t.Parallel()
	const parts = 3
	t.Run("LeaderKill", func(t *testing.T) {
		t.Parallel()
		for _, tr := range transports {
			t.Run(tr.name, func(t *testing.T) {
				var last time.Time
				runFaultsOn(t, newFaultClusterWith(t, tr.tcp, parts, nil), rounds(6), func(c *faultCluster, w *workload) {
					time.Sleep(time.Until(last.Add(time.Second)))
					last = time.Now()
					old := c.leader()
					c.stop(old)
					w.progress(20)
					c.start(old)
				}).report(t)
			})
		}
	})
	t.Run("LeaderIsolated", func(t *testing.T) {
		t.Parallel()
		runFaultsOn(t, newFaultClusterWith(t, false, parts, nil), rounds(3), isolateLeader).report(t)
	})
	t.Run("Pause", func(t *testing.T) {
		t.Parallel()
		runFaultsOn(t, newFaultClusterWith(t, false, parts, nil), rounds(2), func(c *faultCluster, w *workload) {
			old := c.leader()
			c.net.pause(old)
			c.leaderBesides(old)
			w.progress(50)
		}).report(t)
	})
}

// TestFault_PartitionsNegativeControl: the checks of TestFault_Partitions
// fail a proposer that acks before the commit.
func TestFault_PartitionsNegativeControl(t *testing.T) {
	t.Parallel()
	v := runFaultsOn(t, newFaultClusterWith(t, false, 3, nil), rounds(1), func(c *faultCluster, w *workload) {
		for i := range 3 {
			c.group(i).prop.ackBeforeCommit.Store(true)
		}
		isolateLeader(c, w)
	})
	if v.ok() {
		t.Fatalf("the checks passed a proposer that acks before the commit: %v", v)
	}
	t.Logf("the checks failed the proposer that acks before the commit, as they must: %v", v)
}
