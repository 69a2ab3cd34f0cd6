package raftqueue

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// BenchmarkGroup_Apply sends 1 KiB messages from 64 goroutines
// (SetParallelism(32) on 2 cores) to the leader of a three-replica group
// on the in-memory transport: the batching of the proposer, not a network.
// Each replica's raft log is in a WAL of its own (one fdatasync per append)
// or in raft-boltdb (two).
func BenchmarkGroup_Apply(b *testing.B) {
	for _, log := range []string{"wal", "raft-boltdb"} {
		b.Run(log, func(b *testing.B) { benchApply(b, log == "raft-boltdb") })
	}
}

func benchApply(b *testing.B, boltLog bool) {
	// Timeouts as on a LAN: 200 ms lost the leader under
	// fsync load here.
	c := newClusterOpts(b, b.TempDir(), 3, raftConfig(time.Second), boltLog, 1)
	g := c.group(c.leader())
	body := make([]byte, 1024)
	var n atomic.Uint64
	e0, c0 := g.prop.entries.Load(), g.prop.proposedCmd.Load()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := fmt.Sprintf("m%d", n.Add(1))
			m := store.Message{ID: id, Body: body, Timestamp: t0, FreshID: true}
			if _, err := g.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{m}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if e := g.prop.entries.Load() - e0; e > 0 {
		b.ReportMetric(float64(g.prop.proposedCmd.Load()-c0)/float64(e), "cmds/entry")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sends/s")
}
