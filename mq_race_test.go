package mq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// TestMQ_CloseRacesEverything: every call of the API from many
// goroutines while Close runs. Each returns (nil or an error), none panics
// or hangs, and once Close has returned each one fails with ErrClosed.
func TestMQ_CloseRacesEverything(t *testing.T) {
	noLeaks(t)
	for round := 0; round < 4; round++ {
		dir := t.TempDir()
		m, err := mq.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, m, "t", 3)
		prod, err := m.NewProducer("t")
		if err != nil {
			t.Fatal(err)
		}
		var s sink
		if _, err := m.NewConsumer("t", "g", &s, mq.WithConsumeMode(mq.Concurrent)); err != nil {
			t.Fatal(err)
		}
		calls := []func(i int) error{
			func(i int) error {
				_, err := prod.SendMessage(context.Background(), &mq.Message{Key: fmt.Sprint(i), Body: []byte("x")})
				return err
			},
			func(i int) error { _, err := m.NewProducer("t"); return err },
			func(i int) error {
				c, err := m.NewConsumer("t", fmt.Sprintf("g%d", i%3), &s, mq.WithKeyParallel(2))
				if err == nil {
					defer c.Close()
				}
				return err
			},
			func(i int) error { return m.ResetOffset(context.Background(), "t", "g", mq.SeekFirst()) },
			func(i int) error { _, err := m.Lag(context.Background(), "t", "g"); return err },
			func(i int) error { return m.DeleteGroup(context.Background(), "t", fmt.Sprintf("d%d", i)) },
			func(i int) error {
				return m.CreateMQ(context.Background(), fmt.Sprintf("n%d-%d", round, i), 2, mq.Options{Type: mq.Single})
			},
			func(i int) error { return m.AlterMQ(context.Background(), "t", 3+i%4) },
			func(i int) error { _, err := m.RedriveDeadLetters(context.Background(), "g"); return err },
			func(i int) error {
				_, err := m.NewConsumer(mq.DeadLetterTopic("g"), "dl", &s)
				return err
			},
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		panics := make(chan any, 100)
		for i := 0; i < 40; i++ {
			fn := calls[i%len(calls)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if r := recover(); r != nil {
						panics <- r
					}
				}()
				<-start
				for j := 0; j < 5; j++ {
					_ = fn(i*5 + j)
				}
			}()
		}
		close(start)
		time.Sleep(time.Duration(round) * time.Millisecond)
		returns(t, async(m.Close), "Close racing every call")
		returns(t, async(func() error { wg.Wait(); return nil }), "the calls racing Close")
		select {
		case r := <-panics:
			t.Fatalf("a call racing Close panicked: %v", r)
		default:
		}
		for i, fn := range calls {
			if err := fn(1000 + i); !errors.Is(err, mq.ErrClosed) {
				t.Errorf("round %d: call %d after Close: %v, want ErrClosed", round, i, err)
			}
		}
	}
}

// TestMQ_AlterDuringReset: a reset of every partition races AlterMQ;
// the consumer ends up consuming every message of every partition,
// those of the new partitions included, in order per partition.
func TestMQ_AlterDuringReset(t *testing.T) {
	noLeaks(t)
	for _, mode := range consumeModes {
		t.Run(mode.name, func(t *testing.T) {
			m := openNode(t, "")
			mustCreate(t, m, "t", 2)
			var s sink
			consume(t, m, "t", "g", &s, mode.opts...)
			p, err := m.NewProducer("t")
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 20; i++ {
				if _, err := p.SendMessage(context.Background(), (&mq.Message{Key: "k", Body: []byte(fmt.Sprintf("a%d", i))}).ToPartition(i%2)); err != nil {
					t.Fatal(err)
				}
			}
			done := async(func() error { return m.AlterMQ(context.Background(), "t", 6) })
			for i := 0; i < 5; i++ {
				if err := m.ResetOffset(context.Background(), "t", "g", mq.SeekFirst()); err != nil {
					t.Fatal(err)
				}
			}
			if err := returns(t, done, "AlterMQ"); err != nil {
				t.Fatal(err)
			}
			for part := 0; part < 6; part++ {
				if _, err := p.SendMessage(context.Background(), (&mq.Message{Body: []byte(fmt.Sprintf("b%d", part))}).ToPartition(part)); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, 10*time.Second, "every message", func() bool {
				all := s.all()
				for part := 0; part < 6; part++ {
					if !seen(all, fmt.Sprintf("b%d", part)) {
						return false
					}
				}
				for i := 0; i < 20; i++ {
					if !seen(all, fmt.Sprintf("a%d", i)) {
						return false
					}
				}
				return true
			})
			lags, err := m.Lag(context.Background(), "t", "g")
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "lag 0", func() bool {
				lags, err = m.Lag(context.Background(), "t", "g")
				if err != nil {
					t.Fatal(err)
				}
				for _, l := range lags {
					if l.Lag != 0 {
						return false
					}
				}
				return true
			})
		})
	}
}
