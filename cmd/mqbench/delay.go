package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/zeze-go/mq"
)

func init() {
	register("delay", "lateness of delayed messages (OnMessage time - DeliverAt) at a fixed rate (-rate)", runDelay)
}

// Delays are spread over [delayMin, delayMin+delaySpread), so that due times
// interleave with send order and most messages are released on their own.
const (
	delayMin    = 100 * time.Millisecond
	delaySpread = time.Second
)

// runDelay sends -rate delayed messages per second for -duration, each due
// between 0.1 s and 1.1 s after its send, and records for each how long after
// its DeliverAt it reached OnMessage. A message delivered before its
// DeliverAt fails the case. The rate is the send rate.
func runDelay(ctx context.Context, b *bench) (result, error) {
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
		mu    sync.Mutex // guards late and early: OnMessage runs on one goroutine per partition
		late  []time.Duration
		early int
	)
	c, err := m.NewConsumer("bench", "delay", mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
		d := time.Since(msg.DeliverAt)
		mu.Lock()
		defer mu.Unlock()
		if d < 0 {
			early++
		}
		late = append(late, d)
		b.meter.count.Add(1) // drives the progress line
		return nil
	}))
	if err != nil {
		return result{}, err
	}
	defer c.Close()

	start := time.Now()
	sent, err := b.paced(ctx, func(ctx context.Context, w int, seq int64, _ time.Time) error {
		// Due from the actual send, so a sender falling behind its schedule
		// does not count as lateness of the release.
		delay := delayMin + time.Duration(seq*7919%int64(delaySpread/time.Millisecond))*time.Millisecond
		msg := &mq.Message{Key: benchKeys[benchKey(w, seq)], Body: b.body, DeliverAt: time.Now().Add(delay)}
		_, err := p.SendMessage(ctx, msg)
		return err
	})
	elapsed := time.Since(start)
	if err != nil {
		return result{}, err
	}
	delivered := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(late))
	}
	deadline := time.Now().Add(delayMin + delaySpread + 30*time.Second)
	for delivered() < sent && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Close(); err != nil {
		return result{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	if n := int64(len(late)); n < sent {
		return result{}, fmt.Errorf("sent %d delayed messages, %d delivered", sent, n)
	}
	if early > 0 {
		return result{}, fmt.Errorf("%d of %d messages delivered before their DeliverAt", early, sent)
	}
	slices.Sort(late)
	return result{
		msgs:    int64(len(late)),
		bytes:   int64(len(late)) * int64(b.size),
		elapsed: elapsed,
		lat:     late,
		note:    fmt.Sprintf("rate %d/s; lateness after DeliverAt, max %s", b.rate, fmtDur(late[len(late)-1])),
	}, nil
}
