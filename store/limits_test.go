package store_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/zeze-go/mq/store"
)

// TestPartition_CommandTooLarge: a command whose effects would exceed what
// one log record (and recovery) holds is refused before anything is
// written; the partition goes on and reopens.
func TestPartition_CommandTooLarge(t *testing.T) {
	p, path := open(t)
	body := make([]byte, 210<<20)
	msgs := make([]store.Message, 5)
	for i := range msgs {
		msgs[i] = store.Message{ID: fmt.Sprint(i), Body: body}
	}
	_, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0, Msgs: msgs})
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("5 x 210 MiB: %v, want ErrTooLarge", err)
	}
	_, err = p.Apply(context.Background(), &store.Command{Op: store.OpCommitTx, Now: t0, TxID: "tx", Msgs: msgs})
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("commit of 5 x 210 MiB: %v, want ErrTooLarge", err)
	}
	equal(t, "send after", offsetsOf(appendAt(t, p, t0, msg("a"))), []uint64{0})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openAt(t, path)
	bodies, _ := readAll(t, p)
	equal(t, "after reopen", bodies, []string{"body-a"})
}

// TestPartition_EdgeInputs: edge inputs give ErrBadCommand or ErrTooLarge
// or work, never a panic, and survive a replay.
func TestPartition_EdgeInputs(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	p := n.p
	key := strings.Repeat("k", store.MaxKeyBytes)
	bad := []store.Command{
		{Op: 0, Now: t0},
		{Op: 200, Now: t0},
		{Op: store.OpAppend, Now: 0},
		{Op: store.OpAppend, Now: -1},
		{Op: store.OpAppend, Now: math.MinInt64},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: key + "x"}}},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{FreshID: true}}},
		{Op: store.OpCommitOffset, Now: t0},
		{Op: store.OpCommitOffset, Now: t0, Group: key + "x"},
		{Op: store.OpPrepare, Now: t0},
		{Op: store.OpPrepare, Now: t0, TxID: key + "x"},
		{Op: store.OpTrim, Now: t0, Limit: -1},
		{Op: store.OpTrim, Now: t0, MaxAge: -1},
		{Op: store.OpTrim, Now: t0, Msgs: []store.Message{{}}},
		{Op: store.OpRelease, Now: t0, Msgs: []store.Message{{}}},
		{Op: store.OpRollbackTx, Now: t0},
	}
	for i := range bad {
		if _, err := p.Apply(context.Background(), &bad[i]); !errors.Is(err, store.ErrBadCommand) {
			t.Fatalf("bad command %d %+v: %v, want ErrBadCommand", i, bad[i], err)
		}
	}
	good := []store.Command{
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: key, Body: []byte("max id")}}},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{}}},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{Body: []byte{}}}},
		{Op: store.OpAppend, Now: t0},
		{Op: store.OpAppend, Now: math.MaxInt64, Msgs: []store.Message{{ID: "late", DeliverAt: math.MinInt64, Timestamp: math.MinInt64}}},
		{Op: store.OpAppend, Now: 1, Msgs: []store.Message{{ID: "early-delayed", DeliverAt: math.MaxInt64}}},
		{Op: store.OpCommitOffset, Now: t0, Group: key, Offset: math.MaxUint64},
		{Op: store.OpPrepare, Now: t0, TxID: key, Producer: key, Msgs: []store.Message{{ID: key}}},
		{Op: store.OpTxChecked, Now: t0, TxID: key},
		{Op: store.OpTrim, Now: math.MaxInt64, MaxAge: math.MaxInt64, DedupTTL: math.MaxInt64, DecideTTL: math.MaxInt64},
		{Op: store.OpRelease, Now: math.MaxInt64 - 1},
		{Op: store.OpCommitTx, Now: t0, TxID: key},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{{ID: key, Body: []byte("dup")}}},
	}
	for i := range good {
		if _, err := p.Apply(context.Background(), &good[i]); err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
	}
	st := p.Stats()
	msgs, err := p.Read(0, 100, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	r := mustWALNode(t, crash)
	equal(t, "stats after replay", r.p.Stats(), st)
	m2, err := r.p.Read(0, 100, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "messages after replay", fmt.Sprint(m2), fmt.Sprint(msgs))
	if off, ok, err := r.p.GroupOffset(key); err != nil || !ok || off != math.MaxUint64 {
		t.Fatalf("group after replay: %d %v %v", off, ok, err)
	}
}
