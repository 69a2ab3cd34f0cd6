package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeze-go/mq"
)

func init() {
	register("e2e", "latency from send to OnMessage at a fixed rate (-rate)", runE2E)
}

// runE2E sends -rate messages per second for -duration from -c senders and
// measures, for each message, the time from its scheduled send time to its
// OnMessage call. Latency counts from the schedule, not from the actual
// SendMessage call, so a sender falling behind shows up in the figures
// instead of hiding, which is coordinated omission.
func runE2E(ctx context.Context, b *bench) (result, error) {
	m, err := b.openMQ(ctx)
	if err != nil {
		return result{}, err
	}
	defer m.Close()
	p, err := m.NewProducer("bench")
	if err != nil {
		return result{}, err
	}

	var (
		received atomic.Int64
		mu       sync.Mutex // guards rec: OnMessage runs on one goroutine per partition
		rec      = b.meter.recorder()
	)
	c, err := m.NewConsumer("bench", "e2e", mq.ListenerFunc(func(ctx context.Context, topic string, msg *mq.Message) error {
		d := time.Since(msg.Timestamp)
		mu.Lock()
		rec.add(d)
		mu.Unlock()
		received.Add(1)
		return nil
	}))
	if err != nil {
		return result{}, err
	}
	defer c.Close()

	start := time.Now()
	sent, sendErr := b.paced(ctx, func(ctx context.Context, w int, seq int64, at time.Time) error {
		msg := &mq.Message{Key: benchKeys[benchKey(0, seq)], Body: b.body, Timestamp: at}
		_, err := p.SendMessage(ctx, msg)
		return err
	})
	elapsed := time.Since(start)
	if sendErr != nil {
		return result{}, sendErr
	}
	// Wait for the tail to be delivered.
	deadline := time.Now().Add(30 * time.Second)
	for received.Load() < sent && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Close(); err != nil {
		return result{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	res := result{msgs: received.Load(), elapsed: elapsed, note: fmt.Sprintf("rate %d/s", b.rate)}
	if res.msgs < sent {
		return res, fmt.Errorf("sent %d messages, %d delivered within 30s", sent, res.msgs)
	}
	res.bytes = res.msgs * int64(b.size)
	res.lat = b.meter.latencies()
	return res, nil
}

// paced calls op -rate times per second for -duration on -c workers; at is
// the time the call was scheduled for. It returns how many calls succeeded
// and the first error.
func (b *bench) paced(ctx context.Context, op func(ctx context.Context, w int, seq int64, at time.Time) error) (int64, error) {
	type job struct {
		seq int64
		at  time.Time
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan job, b.conc)
	var (
		wg       sync.WaitGroup
		ok       atomic.Int64
		errOnce  sync.Once
		firstErr error
	)
	for w := 0; w < b.conc; w++ {
		wg.Go(func() {
			for j := range jobs {
				if err := op(ctx, w, j.seq, j.at); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					continue
				}
				ok.Add(1)
			}
		})
	}
	interval := time.Second / time.Duration(b.rate)
	start := time.Now()
	end := start.Add(b.duration)
	var seq int64
schedule:
	for ctx.Err() == nil {
		now := time.Now()
		if !now.Before(end) {
			break
		}
		// Emit every job due by now, then sleep until the next one.
		for due := start.Add(time.Duration(seq) * interval); !due.After(now); due = start.Add(time.Duration(seq) * interval) {
			select {
			case jobs <- job{seq: seq, at: due}:
			case <-ctx.Done():
				break schedule
			}
			seq++
		}
		time.Sleep(time.Until(start.Add(time.Duration(seq) * interval)))
	}
	close(jobs)
	wg.Wait()
	return ok.Load(), firstErr
}
