package mq_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// backlogHeapLimit bounds the heap in use while one consumer drains a
// backlog of millions of messages. The consumer holds at most its flow
// control window per partition (256 messages, 1 MiB by default) and the
// backlog stays in the partition files (bbolt's mmap is not heap), so the
// heap does not grow with the backlog: what remains is the node, the
// window, and garbage the collector has not reclaimed yet.
const backlogHeapLimit = 64 << 20

// TestConsumer_Backlog stores 2,000,000 small messages (500,000 by default,
// 2,000,000 with ZEZE_FULL=1), then one consumer drains them in order; the heap in use, sampled during the drain, stays
// under backlogHeapLimit.
func TestConsumer_Backlog(t *testing.T) {
	const (
		parts   = 4
		batch   = 10_000
		senders = 4
	)
	total := sized(500_000, 2_000_000) // still many flow-control windows per partition
	if testing.Short() {
		total = 200_000
	}
	m := openNode(t, "", mq.WithSyncInterval(time.Second))
	mustCreate(t, m, "backlog", parts)
	p, _ := m.NewProducer("backlog")
	ctx := context.Background()

	// Fill with a few senders at once, so that building one batch overlaps
	// with storing another.
	start := time.Now()
	var (
		fill    sync.WaitGroup
		fillErr atomic.Value
	)
	for s := range senders {
		fill.Add(1)
		go func() {
			defer fill.Done()
			msgs := make([]*mq.Message, batch)
			for sent := s * batch; sent < total; sent += senders * batch {
				for i := range msgs {
					msgs[i] = &mq.Message{Body: fmt.Appendf(nil, "%016d", sent+i)}
				}
				if _, err := p.SendMessage(ctx, msgs...); err != nil {
					fillErr.CompareAndSwap(nil, fmt.Errorf("SendMessage at %d: %w", sent, err))
					return
				}
			}
		}()
	}
	fill.Wait()
	if err, _ := fillErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	sendTime := time.Since(start)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapInuse

	var (
		received atomic.Int64
		mu       sync.Mutex // guards next and bad: each partition calls from its own goroutine
		next     [parts]int64
		bad      []string
	)
	listener := mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
		mu.Lock()
		if msg.Offset != next[msg.PartitionIndex] && len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("partition %d: offset %d, want %d", msg.PartitionIndex, msg.Offset, next[msg.PartitionIndex]))
		}
		next[msg.PartitionIndex] = msg.Offset + 1
		mu.Unlock()
		received.Add(1)
		return nil
	})

	// Sample the heap while draining.
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			}
		}
	}()

	start = time.Now()
	c := mustConsume(t, m, "backlog", "drain", listener)
	waitFor(t, 10*time.Minute, "the backlog to drain", func() bool { return received.Load() >= int64(total) })
	drainTime := time.Since(start)
	close(stop)
	<-sampled
	c.Close()

	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("out of order: %v", bad)
	}
	if n := received.Load(); n != int64(total) {
		t.Errorf("received %d messages, want %d", n, total)
	}
	t.Logf("backlog of %d messages: sent in %v (%.0f msgs/s), drained in %v (%.0f msgs/s)",
		total, sendTime.Round(time.Millisecond), float64(total)/sendTime.Seconds(),
		drainTime.Round(time.Millisecond), float64(total)/drainTime.Seconds())
	t.Logf("heap in use: %.1f MiB before the drain, peak %.1f MiB during it (limit %d MiB)",
		float64(before)/(1<<20), float64(peak.Load())/(1<<20), backlogHeapLimit>>20)
	if peak.Load() > backlogHeapLimit {
		t.Errorf("heap in use reached %d bytes during the drain, limit %d", peak.Load(), backlogHeapLimit)
	}
}
