package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq"
)

func init() {
	register("consume", "drain rate of a pre-filled backlog by one consumer group", runConsume)
}

const (
	consumeMaxBacklog = 1_000_000 // messages; the fill stops here or after -duration
	consumeFillBatch  = 1000      // messages per SendMessage while filling
)

// runConsume fills the topic for -duration, with at most consumeMaxBacklog
// messages sent in batches by -c senders, then opens one consumer of a new
// group and times how long it takes to deliver the whole backlog. The rate
// is the drain rate; the note gives the fill and the peak heap in use during
// the drain. There is no per-message latency.
func runConsume(ctx context.Context, b *bench) (result, error) {
	m, err := b.openMQ(ctx)
	if err != nil {
		return result{}, err
	}
	defer m.Close()
	fillStart := time.Now()
	backlog, err := b.fill(ctx, m)
	if err != nil {
		return result{}, err
	}
	fillTime := time.Since(fillStart)

	var received atomic.Int64
	done := make(chan struct{})
	listener := mq.ListenerFunc(func(context.Context, string, *mq.Message) error {
		b.meter.count.Add(1) // drives the progress line
		if received.Add(1) == backlog {
			close(done)
		}
		return nil
	})
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapInuse
	peak, stopSampling := sampleHeap()
	start := time.Now()
	c, err := m.NewConsumer("bench", "consume", listener)
	if err != nil {
		stopSampling()
		return result{}, err
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	elapsed := time.Since(start)
	stopSampling()
	if err := c.Close(); err != nil {
		return result{}, err
	}
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	return result{
		msgs:    backlog,
		bytes:   backlog * int64(b.size),
		elapsed: elapsed,
		note: fmt.Sprintf("backlog %d msgs filled in %.1fs; heap in use %.1f MiB before the drain, peak %.1f MiB during it",
			backlog, fillTime.Seconds(), float64(before)/(1<<20), float64(peak.Load())/(1<<20)),
	}, nil
}

// fill sends keyed messages in batches from -c senders for -duration or
// until consumeMaxBacklog are stored, and returns how many were stored. A
// batch started before the deadline is finished, so every message stored
// was acknowledged.
func (b *bench) fill(ctx context.Context, m *mq.MQ) (int64, error) {
	p, err := m.NewProducer("bench")
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.Now().Add(b.duration)
	var (
		wg       sync.WaitGroup
		claimed  atomic.Int64 // batches
		stored   atomic.Int64
		errOnce  sync.Once
		firstErr error
	)
	for w := range b.conc {
		wg.Go(func() {
			msgs := make([]*mq.Message, consumeFillBatch)
			for ctx.Err() == nil && time.Now().Before(deadline) {
				seq := claimed.Add(1) - 1
				if (seq+1)*consumeFillBatch > consumeMaxBacklog {
					return
				}
				for i := range msgs {
					msgs[i] = &mq.Message{Key: benchKeys[benchKey(w, seq*consumeFillBatch+int64(i))], Body: b.body}
				}
				if _, err := p.SendMessage(ctx, msgs...); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				stored.Add(consumeFillBatch)
			}
		})
	}
	wg.Wait()
	return stored.Load(), firstErr
}

// sampleHeap records the peak HeapInuse every 20 ms until stop is called.
func sampleHeap() (peak *atomic.Uint64, stop func()) {
	peak = new(atomic.Uint64)
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-quit:
				return
			case <-t.C:
			}
		}
	}()
	return peak, func() { close(quit); <-stopped }
}
