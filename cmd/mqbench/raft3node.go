package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq"
)

func init() {
	register("raft3", "three cluster nodes in this process, a Raft3 topic of P partitions (-raft-group of them per raft group): C producers spread over the nodes send keyed messages", runRaft3Node)
	register("raft3-own", "raft3 with a raft group of its own for each partition (PartitionsPerRaftGroup 1)", func(ctx context.Context, b *bench) (result, error) {
		b.raftGroup = 1
		return runRaft3Node(ctx, b)
	})
	register("doublewrite", "the three nodes of raft3 with a DoubleWrite topic of P partitions (-raft-group of them per pair: a leader and a follower, placed by load): C producers spread over the nodes send keyed messages", runDoubleWrite)
	register("doublewrite-own", "doublewrite with a pair of its own for each partition (PartitionsPerPair 1)", func(ctx context.Context, b *bench) (result, error) {
		b.doubleWrite, b.raftGroup = true, 1
		return runRaft3Node(ctx, b)
	})
	register("raft3-leader", "raft3 with every producer on a node that leads: no send forwarded (what forwarding costs, against raft3)", func(ctx context.Context, b *bench) (result, error) {
		b.leaderOnly = true
		return runRaft3Node(ctx, b)
	})
}

func runDoubleWrite(ctx context.Context, b *bench) (result, error) {
	b.doubleWrite = true
	return runRaft3Node(ctx, b)
}

// raft3Nodes are the nodes of the raft3 case, one replica of every
// partition each.
var raft3Nodes = []string{"r1", "r2", "r3"}

// runRaft3Node measures SendMessage to a Raft3 topic through the public
// API: three cluster nodes on 127.0.0.1 in this process, worker w's
// producer on node w%3. A send reaches its partition's leader through the
// node's own replica when it leads there, by RPC to the leader's node
// otherwise, for two thirds of the sends: the whole path a user's send
// takes.
func runRaft3Node(ctx context.Context, b *bench) (res result, err error) {
	nodes, err := openRaft3Cluster(ctx, b)
	defer func() {
		if cerr := closeNodes(nodes); err == nil {
			err = cerr
		}
	}()
	if err != nil {
		return result{}, err
	}
	from := nodes
	if b.leaderOnly {
		from = nil
		for _, m := range nodes {
			if len(m.ClusterStatus().Leading) > 0 {
				from = append(from, m)
			}
		}
		if len(from) != 1 {
			return result{}, fmt.Errorf("raft3-leader: %d nodes lead some partitions (-raft-group below -p?)", len(from))
		}
	}
	producers := make([]*mq.Producer, b.conc)
	for w := range producers {
		if producers[w], err = from[w%len(from)].NewProducer("bench"); err != nil {
			return result{}, err
		}
	}
	var retried atomic.Int64
	elapsed, err := b.closedLoop(ctx, func(ctx context.Context, w int, seq int64) error {
		msg := &mq.Message{Key: benchKeys[benchKey(w, seq)], Body: b.body}
		for {
			_, err := producers[w].SendMessage(ctx, msg)
			if err == nil || ctx.Err() != nil || !isUnknownOutcome(err) {
				return err
			}
			retried.Add(1) // the same message again: its ID finds a stored copy
		}
	})
	note := ""
	if n := retried.Load(); n > 0 {
		note = fmt.Sprintf("%d sends resent after a leader change", n)
	}
	return result{elapsed: elapsed, note: note}, err
}

func isUnknownOutcome(err error) bool { return errors.Is(err, mq.ErrUnknownOutcome) }

// openRaft3Cluster opens the three nodes of the raft3 cases on 127.0.0.1
// and a Raft3 topic "bench" of -p partitions, and waits until every group
// has a leader. The caller closes the nodes returned, even with an error.
func openRaft3Cluster(ctx context.Context, b *bench) ([]*mq.MQ, error) {
	var nodes []*mq.MQ
	var seeds []string
	for _, id := range raft3Nodes {
		// Timeouts as on a LAN under load, 1 s: the machine runs three
		// nodes and their fsyncs on two cores.
		m, err := b.openNodeWith(id, time.Second, seeds...)
		if err != nil {
			return nodes, err
		}
		nodes = append(nodes, m)
		seeds = append(seeds, m.ClusterStatus().Addr)
	}
	if err := waitUntil(ctx, 20*time.Second, "three nodes up", func() bool {
		up := 0
		for _, nd := range nodes[0].ClusterStatus().Nodes {
			if nd.Up {
				up++
			}
		}
		return up == len(raft3Nodes)
	}); err != nil {
		return nodes, err
	}
	opts := mq.Options{Type: mq.Raft3, PartitionsPerRaftGroup: b.raftGroup}
	if b.doubleWrite {
		opts = mq.Options{Type: mq.DoubleWrite, PartitionsPerPair: b.raftGroup}
	}
	if err := nodes[0].CreateMQ(ctx, "bench", b.partitions, opts); err != nil {
		return nodes, err
	}
	err := waitUntil(ctx, 60*time.Second, "a leader of every partition", func() bool {
		led := 0
		for _, m := range nodes {
			if m.Topics()["bench"] != b.partitions {
				return false
			}
			led += len(m.ClusterStatus().Leading)
		}
		return led == b.partitions
	})
	return nodes, err
}

// closeNodes closes nodes, last opened first, and returns the first error.
func closeNodes(nodes []*mq.MQ) error {
	var err error
	for i := len(nodes) - 1; i >= 0; i-- {
		if cerr := nodes[i].Close(); err == nil {
			err = cerr
		}
	}
	return err
}

func init() {
	register("raft3-idle", "three cluster nodes with a Raft3 topic of P partitions, idle for -duration: goroutines, CPU and loopback traffic of the groups' heartbeats", runRaft3Idle)
}

// runRaft3Idle measures what P Raft3 groups cost at rest on three nodes in
// this process: every group heartbeats its two followers about ten times a
// second, since hashicorp/raft has no quiescence. It reports the process's
// goroutines, its CPU per second of idling, and the bytes per second over
// the loopback interface, the whole machine's, from /proc/net/dev.
func runRaft3Idle(ctx context.Context, b *bench) (res result, err error) {
	nodes, err := openRaft3Cluster(ctx, b)
	defer func() {
		if cerr := closeNodes(nodes); err == nil {
			err = cerr
		}
	}()
	if err != nil {
		return result{}, err
	}
	time.Sleep(time.Second) // the elections' aftermath
	lo0, cpu0, t0 := loopbackBytes(), cpuTime(), time.Now()
	select {
	case <-ctx.Done():
		return result{}, ctx.Err()
	case <-time.After(b.duration):
	}
	secs := time.Since(t0).Seconds()
	cpu := (cpuTime() - cpu0).Seconds() / secs
	lo := float64(loopbackBytes()-lo0) / secs
	perGroup := cmp.Or(b.raftGroup, mq.DefaultPartitionsPerRaftGroup)
	note := fmt.Sprintf("%d partitions in %d groups on 3 nodes: %d goroutines, CPU %.0f%% of a core, loopback %.0f KB/s",
		b.partitions, (b.partitions+perGroup-1)/perGroup, runtime.NumGoroutine(), 100*cpu, lo/1000)
	return result{elapsed: time.Since(t0), note: note}, nil
}

// loopbackBytes is the bytes received on the loopback interface so far, 0
// where /proc/net/dev cannot be read.
func loopbackBytes() int64 {
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != "lo" {
			continue
		}
		if f := strings.Fields(rest); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			return n
		}
	}
	return 0
}
