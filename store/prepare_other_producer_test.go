package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/zeze-go/mq/store"
)

// TestPrepare_AnotherProducersHalfRefused: transaction ids are the
// application's (txn.Begin takes them), so another node can guess one. A
// prepare of txid naming producer "x" where "a" holds its half messages
// must not join them: the half stays a's, and x's messages are committed
// by a's decision; prepared by x first, a's half is x's, whose check-back
// (no marker at x) rolls back a's committed messages and whose producer
// check refuses a's commit from a's node (node.authorize).
func TestPrepare_AnotherProducersHalfRefused(t *testing.T) {
	p, _ := open(t)
	apply(t, p, &store.Command{Op: store.OpPrepare, TxID: "order-42", Producer: "x", Msgs: []store.Message{msg("squat")}})
	_, err := p.Apply(context.Background(), &store.Command{Op: store.OpPrepare, Now: t0, TxID: "order-42", Producer: "a", Msgs: []store.Message{msg("a")}})
	if !errors.Is(err, store.ErrOtherProducer) {
		t.Fatalf("a's prepare of x's order-42: %v, want ErrOtherProducer", err)
	}
	var half []store.HalfTx
	if err := p.HalfTxs(func(h store.HalfTx) bool { half = append(half, h); return true }); err != nil {
		t.Fatal(err)
	}
	if len(half) != 1 || half[0].Producer != "x" || half[0].Messages != 1 {
		t.Fatalf("the half messages of order-42 after the refused prepare: %+v, want x's one message", half)
	}
}
