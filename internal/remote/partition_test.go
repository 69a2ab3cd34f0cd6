package remote

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/store"

	"github.com/zeze-go/mq/store/storetest"
)

// The conformance suite over the network: a store partition served by one
// node, reached from another through a remote Partition. The store is
// served as it is (not as partition.Local), so that a command without Now
// is ErrBadCommand, as the suite requires.
func TestRun_Remote(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Partition {
		return serve(t, t.TempDir(), nil, PartitionConfig{MaxWait: 200 * time.Millisecond})
	})
}

func TestRunDurable_Remote(t *testing.T) {
	storetest.RunDurable(t, func(t *testing.T, dir string) storetest.Partition {
		return serve(t, dir, nil, PartitionConfig{})
	})
}

const t0 = int64(1_700_000_000_000_000_000)

func appendMsgs(t testing.TB, p *Partition, msgs ...store.Message) store.Result {
	t.Helper()
	res, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: msgs})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return res
}

// TestPartition_Local: served as partition.Local, a command without Now is
// stamped by the serving node, and the caller's command is left as it was.
func TestPartition_Local(t *testing.T) {
	leakCheck(t)
	clock := time.Unix(0, t0+42)
	s := serve(t, t.TempDir(), func(sp *store.Partition) partition.Partition {
		return partition.NewLocal(sp, func() time.Time { return clock })
	}, PartitionConfig{})
	t.Cleanup(func() { s.Close() })
	cmd := &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: "a", Body: []byte("x")}}}
	if _, err := s.Apply(ctxT(t), cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.Now != 0 {
		t.Fatalf("cmd.Now = %d, want it untouched", cmd.Now)
	}
	m, ok, err := s.Get(0)
	if err != nil || !ok || m.StoredAt != t0+42 {
		t.Fatalf("Get(0) = %+v, %v, %v; want stored at the server's clock", m, ok, err)
	}
}

// TestPartition_Fetch_Cancel: a long poll ends at once when ctx does, also
// between its requests, and the served Fetch is cancelled with it.
func TestPartition_Fetch_Cancel(t *testing.T) {
	leakCheck(t)
	s := serve(t, t.TempDir(), nil, PartitionConfig{MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { s.Close() })
	for _, after := range []time.Duration{0, 10 * time.Millisecond, 250 * time.Millisecond} {
		t.Run(after.String(), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { _, err := s.Fetch(ctx, 0, 10, 0, nil); errc <- err }()
			time.Sleep(after)
			cancel()
			select {
			case err := <-errc:
				if err != context.Canceled {
					t.Fatalf("Fetch = %v, want context.Canceled", err)
				}
			case <-time.After(patience):
				t.Fatal("Fetch did not return")
			}
		})
	}
	t.Run("Deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if _, err := s.Fetch(ctx, 0, 10, 0, nil); err != context.DeadlineExceeded {
			t.Fatalf("Fetch = %v, want context.DeadlineExceeded", err)
		}
	})
	// The served Fetches ended: nothing runs on the server.
	waitFor(t, "the server's handlers to end", func() bool { return s.n.running() == 0 })
	// A message arriving during a long poll ends it.
	errc := make(chan error, 1)
	go func() {
		msgs, err := s.Fetch(ctxT(t), 0, 10, 0, nil)
		if err == nil && (len(msgs) != 1 || string(msgs[0].Body) != "late") {
			err = fmt.Errorf("got %+v", msgs)
		}
		errc <- err
	}()
	time.Sleep(250 * time.Millisecond) // past a request or two
	appendMsgs(t, s.Partition, store.Message{Body: []byte("late")})
	if err := <-errc; err != nil {
		t.Fatalf("Fetch: %v", err)
	}
}

// TestPartition_Fetch_FrameBound: a reply holds what fits a frame; a
// message that fits none is store.ErrTooLarge.
func TestPartition_Fetch_FrameBound(t *testing.T) {
	leakCheck(t)
	s := serve(t, t.TempDir(), nil, PartitionConfig{})
	t.Cleanup(func() { s.Close() })
	body := make([]byte, 1<<20)
	for range 6 {
		appendMsgs(t, s.Partition, store.Message{Body: body})
	}
	got, err := s.Fetch(ctxT(t), 0, 100, 0, nil)
	if err != nil || len(got) != 3 { // 4 MiB frames
		t.Fatalf("Fetch = %d messages, %v; want the 3 that fit a frame", len(got), err)
	}
	if got, err = s.Fetch(ctxT(t), 3, 100, 0, got); err != nil || len(got) != 6 || got[5].Offset != 5 {
		t.Fatalf("Fetch from 3 = %d messages, %v; want 6 in dst", len(got), err)
	}
	huge := store.Message{Body: make([]byte, wire.DefaultMaxFrameBytes-replyReserve)}
	if _, err := s.sp.Apply(ctxT(t), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{huge}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fetch(ctxT(t), 6, 100, 0, nil); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("Fetch of a message larger than a reply = %v, want ErrTooLarge", err)
	}
	if _, _, err := s.Get(6); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("Get of a message larger than a reply = %v, want ErrTooLarge", err)
	}
	if _, err := s.Apply(ctxT(t), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{huge, huge}}); !errors.Is(err, store.ErrTooLarge) || !errors.Is(err, wire.ErrFrameTooLarge) {
		t.Fatalf("Apply of a command larger than a frame = %v, want ErrTooLarge", err)
	}
}

// TestPartition_HalfTxs_Pages: transactions come in pages, and fn may call
// the partition, also to decide the transaction it is given.
func TestPartition_HalfTxs_Pages(t *testing.T) {
	leakCheck(t)
	s := serve(t, t.TempDir(), nil, PartitionConfig{HalfPage: 2})
	t.Cleanup(func() { s.Close() })
	var want []string
	for i := range 7 {
		txid := fmt.Sprintf("tx-%d", i)
		want = append(want, txid)
		if _, err := s.Apply(ctxT(t), &store.Command{Op: store.OpPrepare, Now: t0, TxID: txid, Producer: "n1",
			Msgs: []store.Message{{ID: txid, Body: []byte("h")}}}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	err := s.HalfTxs(func(h store.HalfTx) bool {
		got = append(got, h.TxID)
		if _, err := s.Apply(ctxT(t), &store.Command{Op: store.OpRollbackTx, Now: t0, TxID: h.TxID}); err != nil {
			t.Errorf("Apply from fn: %v", err)
		}
		return h.TxID != "tx-5"
	})
	if err != nil || !reflect.DeepEqual(got, want[:6]) {
		t.Fatalf("HalfTxs = %v, %v; want %v", got, err, want[:6])
	}
	got = got[:0]
	if err := s.HalfTxs(func(h store.HalfTx) bool { got = append(got, h.TxID); return true }); err != nil || !reflect.DeepEqual(got, want[6:]) {
		t.Fatalf("HalfTxs after the rollbacks = %v, %v; want %v", got, err, want[6:])
	}
}

// TestPartition_Unavailable: with the server gone, calls fail with
// ErrUnavailable, Stats returns the last it knew, and a restarted server
// is dialed again.
func TestPartition_Unavailable(t *testing.T) {
	leakCheck(t)
	s := serve(t, t.TempDir(), nil, PartitionConfig{CallTimeout: 2 * time.Second})
	t.Cleanup(func() { s.Close() })
	appendMsgs(t, s.Partition, store.Message{Body: []byte("a")})
	before := s.Stats()
	s.n.stop()
	if st := s.Stats(); st != before {
		t.Fatalf("Stats with the server down = %+v, want the last known %+v", st, before)
	}
	if _, _, err := s.Get(0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get = %v, want ErrUnavailable", err)
	}
	if _, err := s.Apply(ctxT(t), &store.Command{Op: store.OpAppend, Now: t0}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Apply = %v, want ErrUnavailable", err)
	}
	s.n.start()
	if m, ok, err := s.Get(0); err != nil || !ok || string(m.Body) != "a" {
		t.Fatalf("Get after the restart = %+v, %v, %v", m, ok, err)
	}
}

// TestPartition_NoSuchPartition: lookup's error reaches the caller as its
// registered sentinel.
func TestPartition_NoSuchPartition(t *testing.T) {
	leakCheck(t)
	s := serve(t, t.TempDir(), nil, PartitionConfig{})
	t.Cleanup(func() { s.Close() })
	other := NewPartition(s.n.client, "t", 1, PartitionConfig{})
	defer other.Close()
	if _, err := other.Decision("x"); !errors.Is(err, errNoPartition) {
		t.Fatalf("Decision = %v, want errNoPartition", err)
	}
}

// TestPartition_RepliesBeyondRequest: a reply holding more than its call
// asked for, or an append's acks not one per message, is ErrProtocol, so
// that a lying peer makes its caller neither allocate for elements it did
// not ask for nor read acks that are not there.
func TestPartition_RepliesBeyondRequest(t *testing.T) {
	acks := func(n int) *partResp { return &partResp{res: store.Result{Acks: make([]store.Ack, n)}} }
	for name, c := range map[string]struct {
		op   uint16
		a    *partResp
		call func(t testing.TB, p *Partition) error
	}{
		"ApplyMoreAcks": {OpApply, acks(3), func(t testing.TB, p *Partition) error {
			_, err := p.Apply(ctxT(t), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{}}})
			return err
		}},
		"ApplyFewerAcks": {OpApply, acks(1), func(t testing.TB, p *Partition) error {
			_, err := p.Apply(ctxT(t), &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{}, {}}})
			return err
		}},
		"AcksOfNoAppend": {OpApply, acks(1), func(t testing.TB, p *Partition) error {
			_, err := p.Apply(ctxT(t), &store.Command{Op: store.OpTrim, Now: t0})
			return err
		}},
		"FetchMoreThanMax": {OpFetch, &partResp{msgs: make([]store.Message, 3)}, func(t testing.TB, p *Partition) error {
			_, err := p.Fetch(ctxT(t), 0, 2, 0, nil)
			return err
		}},
		"HalfTxsOverPage": {OpHalfTxs, &partResp{halves: []store.HalfTx{{TxID: "a"}, {TxID: "b"}, {TxID: "c"}}}, func(t testing.TB, p *Partition) error {
			return p.HalfTxs(func(store.HalfTx) bool { return true })
		}},
	} {
		t.Run(name, func(t *testing.T) {
			leakCheck(t)
			reply, _, err := appendReply(nil, c.op, c.a, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			n := newNode(t, ServerConfig{}, ClientConfig{}, func(s *Server) {
				s.Handle(c.op, func(context.Context, string, []byte) ([]byte, error) { return reply, nil })
			})
			p := NewPartition(n.client, "t", 0, PartitionConfig{HalfPage: 2})
			t.Cleanup(func() { p.Close() })
			if err := c.call(t, p); !errors.Is(err, ErrProtocol) {
				t.Fatalf("call: %v, want ErrProtocol", err)
			}
		})
	}
}
