package remote

import (
	"context"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// BenchmarkApply appends one 1 KiB message per call, from many goroutines,
// to a partition on the same node (Local) and through RPC (Remote): the
// cost the network path adds to a send.
func BenchmarkApply(b *testing.B) {
	body := make([]byte, 1024)
	run := func(b *testing.B, p partition.Partition) {
		b.SetParallelism(32) // × GOMAXPROCS senders
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				cmd := &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: partition.NewID(), Body: body, FreshID: true}}}
				if _, err := p.Apply(context.Background(), cmd); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	local := func(sp *store.Partition) partition.Partition { return partition.NewLocal(sp, time.Now) }
	b.Run("Local", func(b *testing.B) {
		s := serve(b, b.TempDir(), local, PartitionConfig{})
		b.Cleanup(func() { s.Close() })
		run(b, partition.NewLocal(s.sp, time.Now))
	})
	b.Run("Remote", func(b *testing.B) {
		s := serve(b, b.TempDir(), local, PartitionConfig{})
		b.Cleanup(func() { s.Close() })
		run(b, s.Partition)
	})
}
