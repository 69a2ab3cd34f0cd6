package fake_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/zeze-go/mq/internal/partition/fake"
	"github.com/zeze-go/mq/store"
	"github.com/zeze-go/mq/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var _ storetest.Partition = (*fake.Partition)(nil)

const t0 = int64(1_700_000_000_000_000_000)

func TestPartition_Conformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Partition { return fake.New() })
}

func send(p *fake.Partition, ctx context.Context, id string) (store.Result, error) {
	return p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: id}}})
}

// sendAsync sends id from a goroutine; the result arrives on the channel.
func sendAsync(p *fake.Partition, ctx context.Context, id string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := send(p, ctx, id)
		done <- err
	}()
	return done
}

func blocked(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("Apply returned %v while paused", err)
	case <-time.After(30 * time.Millisecond):
	}
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Apply still blocked")
		return nil
	}
}

func TestPartition_FailNext(t *testing.T) {
	p := fake.New()
	defer p.Close()
	ctx := context.Background()
	boom := errors.New("boom")
	p.FailNext(boom)
	if _, err := send(p, ctx, "a"); !errors.Is(err, boom) {
		t.Fatalf("Apply after FailNext = %v, want boom", err)
	}
	if st := p.Stats(); st.Next != 0 {
		t.Fatalf("the failed Apply changed the partition: %+v", st)
	}
	res, err := send(p, ctx, "a")
	if err != nil || res.Acks[0] != (store.Ack{Offset: 0}) {
		t.Fatalf("the Apply after = %+v, %v; want a first send", res, err)
	}
	p.FailNext(boom)
	p.FailNext(nil)
	if _, err := send(p, ctx, "b"); err != nil {
		t.Fatalf("Apply after FailNext(nil) = %v", err)
	}
}

func TestPartition_Pause(t *testing.T) {
	ctx := context.Background()
	t.Run("Resume", func(t *testing.T) {
		p := fake.New()
		defer p.Close()
		p.Pause()
		done := sendAsync(p, ctx, "a")
		blocked(t, done)
		if _, ok, err := p.Get(0); ok || err != nil { // reads go on
			t.Fatalf("Get while paused = %v, %v", ok, err)
		}
		p.Resume()
		if err := result(t, done); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Next != 1 {
			t.Fatalf("Stats after Resume = %+v", st)
		}
	})
	t.Run("CtxEnds", func(t *testing.T) {
		p := fake.New()
		defer p.Close()
		p.Pause()
		ctx, cancel := context.WithCancel(ctx)
		done := sendAsync(p, ctx, "a")
		blocked(t, done)
		cancel()
		if err := result(t, done); !errors.Is(err, context.Canceled) {
			t.Fatalf("paused Apply after cancel = %v", err)
		}
		p.Resume()
		if st := p.Stats(); st.Next != 0 {
			t.Fatalf("a cancelled Apply changed the partition: %+v", st)
		}
	})
	t.Run("Close", func(t *testing.T) {
		p := fake.New()
		p.Pause()
		done := sendAsync(p, ctx, "a")
		blocked(t, done)
		p.Close()
		if err := result(t, done); !errors.Is(err, store.ErrClosed) {
			t.Fatalf("paused Apply through Close = %v", err)
		}
	})
}

// TestPartition_RecordBytes: the fake counts a message's bytes as the
// store's log does, so flow limits (Fetch's maxBytes, trim by size) cut
// where they would on a store.
func TestPartition_RecordBytes(t *testing.T) {
	msgs := []store.Message{
		{},
		{ID: "a", Key: "k", Body: []byte("body"), Timestamp: t0, ReconsumeTimes: 2},
		{ID: strings.Repeat("i", 200), Tags: []string{"x", strings.Repeat("t", 40)}, Properties: map[string]string{"k": "v", "long": strings.Repeat("v", 300)}},
		{Body: make([]byte, 70_000)},  // a three-byte length
		{Body: make([]byte, 300_000)}, // and a longer one
		{Body: []byte{}, DeliverAt: t0 - 1},
	}
	s, err := store.Open(filepath.Join(t.TempDir(), "0.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f := fake.New()
	defer f.Close()
	for i, m := range msgs {
		cmd := &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{m}}
		for _, p := range []storetest.Partition{s, f} {
			if _, err := p.Apply(context.Background(), cmd); err != nil {
				t.Fatal(err)
			}
		}
		if sb, fb := s.Stats().Bytes, f.Stats().Bytes; sb != fb {
			t.Fatalf("after message %d: the store holds %d bytes, the fake %d", i, sb, fb)
		}
	}
}
