package upkeep

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// wakeRaceLog makes a delayed send commit right after the upkeeper reads the
// delay index, before its next turn.
type wakeRaceLog struct {
	Partition
	once   sync.Once
	inject func()
}

func (l *wakeRaceLog) NextDue() (int64, bool, error) {
	due, ok, err := l.Partition.NextDue()
	l.once.Do(l.inject)
	return due, ok, err
}

// TestUpkeep_DelayedSendAfterReadingTheIndex: a delayed message sent just
// after the upkeeper read the delay index is released when due. The loop
// took a fresh Changed channel at the top of each turn, so the change that
// closed the previous one (the send) was missed, and the message waited for
// an unrelated write or the next retention check (10 s).
func TestUpkeep_DelayedSendAfterReadingTheIndex(t *testing.T) {
	p, err := store.Open(filepath.Join(t.TempDir(), "0.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := Config{Clock: systemClock{}, DedupWindow: time.Minute, DecisionTTL: time.Hour, Interval: 10 * time.Second}
	due := time.Now().Add(100 * time.Millisecond).UnixNano()
	log := &wakeRaceLog{Partition: partition.NewLocal(p, time.Now)}
	log.inject = func() {
		_, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: time.Now().UnixNano(),
			Msgs: []store.Message{{ID: "late", Body: []byte("due in 100 ms"), DeliverAt: due}}})
		if err != nil {
			t.Error(err)
		}
	}
	u := &upkeeper{cfg: &cfg, log: log, logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		u.run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(3 * time.Second)
	for p.Stats().Next == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the message due at +100ms is still delayed 3 s later (stats %+v)", p.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
