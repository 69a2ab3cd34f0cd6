package remote

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// cpuTime is the CPU time the process used so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports, as cpu-ns/op, the CPU the process used from now to
// the end of b (both ends of the connection run in it): on a shared
// machine it varies less than the time per op, which waits for the
// others' load.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() { b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op") }
}

// BenchmarkApply appends one 1 KiB message per call, from many goroutines,
// to a partition on the same node (Local) and through RPC (Remote): the
// cost the network path adds to a send.
func BenchmarkApply(b *testing.B) {
	body := make([]byte, 1024)
	run := func(b *testing.B, p partition.Partition) {
		b.SetParallelism(32) // × GOMAXPROCS senders
		b.ReportAllocs()
		defer reportCPU(b)()
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

// BenchmarkCall is the RPC path alone, without a disk under it (whose
// fsyncs make BenchmarkApply noisy on a shared machine): Echo answers at
// once, Batched answers every call together at the next tick of a 200 µs
// "group commit", as a store does; Parallel runs 32 × GOMAXPROCS callers,
// Serial one (Echo only).
func BenchmarkCall(b *testing.B) {
	req := make([]byte, 1024)
	resp := make([]byte, 40)
	echo := func(context.Context, string, []byte) ([]byte, error) { return resp, nil }
	var mu sync.Mutex
	tick := make(chan struct{})
	batched := func(ctx context.Context, _ string, _ []byte) ([]byte, error) {
		mu.Lock()
		t := tick
		mu.Unlock()
		select {
		case <-t:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return resp, nil
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(200 * time.Microsecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-stop:
				return
			}
			mu.Lock()
			close(tick)
			tick = make(chan struct{})
			mu.Unlock()
		}
	}()
	b.Cleanup(func() { close(stop); wg.Wait() })
	for _, h := range []struct {
		name string
		fn   Handler
	}{{"Echo", echo}, {"Batched", batched}} {
		n := newNode(b, ServerConfig{}, ClientConfig{}, func(s *Server) { s.Handle(FirstOp, h.fn) })
		call := func(b *testing.B) {
			if _, err := n.client.Call(context.Background(), FirstOp, req); err != nil {
				b.Error(err)
			}
		}
		b.Run(h.name+"/Parallel", func(b *testing.B) {
			b.SetParallelism(32)
			b.ReportAllocs()
			defer reportCPU(b)()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					call(b)
				}
			})
		})
		if h.name == "Batched" {
			continue // a serial call waits for a tick: the timer's, not the RPC's
		}
		b.Run(h.name+"/Serial", func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				call(b)
			}
		})
	}
}

// BenchmarkFetch reads batches of 256 messages of 1 KiB, as a draining
// consumer does, from a partition on the same node (Local) and through RPC
// (Remote); ns/op is per batch.
func BenchmarkFetch(b *testing.B) {
	const n, batch = 4096, 256
	body := make([]byte, 1024)
	run := func(b *testing.B, p partition.Partition) {
		for range n / batch {
			msgs := make([]store.Message, 0, batch)
			for range batch {
				msgs = append(msgs, store.Message{ID: partition.NewID(), Body: body, FreshID: true})
			}
			if _, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Msgs: msgs}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		defer reportCPU(b)()
		var dst []store.Message
		from := uint64(0)
		for b.Loop() {
			var err error
			dst, err = p.Fetch(context.Background(), from, batch, 1<<20, dst[:0])
			if err != nil || len(dst) != batch {
				b.Fatalf("Fetch from %d: %d messages, %v", from, len(dst), err)
			}
			from = (from + batch) % n
		}
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
