package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/zeze-go/mq/store"
)

// prepare stores the messages named by names as half messages of txid,
// prepared by producer at now.
func prepare(t testing.TB, p Partition, now int64, txid, producer string, names ...string) store.Result {
	t.Helper()
	cmd := &store.Command{Op: store.OpPrepare, Now: now, TxID: txid, Producer: producer}
	for _, n := range names {
		cmd.Msgs = append(cmd.Msgs, msg(n))
	}
	return apply(t, p, cmd)
}

// decided checks what a decided txid leaves: later decisions report it in
// Previous and change nothing, a prepare fails with store.ErrDecided.
func decided(t testing.TB, p Partition, txid string, d store.Decision) {
	t.Helper()
	equal(t, "decision", decision(t, p, txid), d)
	before, stats := bodies(t, p), p.Stats()
	c := apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: txid, Msgs: []store.Message{msg("again")}})
	if c.Previous != d || len(c.Acks) != 0 || c.Count != 0 {
		t.Fatalf("commit of a decided tx: Previous %v, Acks %v, Count %d; want %v, none", c.Previous, c.Acks, c.Count, d)
	}
	c = apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: txid})
	if c.Previous != d || c.Count != 0 {
		t.Fatalf("rollback of a decided tx: Previous %v, Count %d; want %v, 0", c.Previous, c.Count, d)
	}
	c = applyErr(t, p, &store.Command{Op: store.OpPrepare, Now: t0, TxID: txid, Msgs: []store.Message{msg("late")}}, store.ErrDecided)
	if c.Previous != d {
		t.Fatalf("prepare of a decided tx: Previous %v, want %v", c.Previous, d)
	}
	equal(t, "decision after more", decision(t, p, txid), d)
	equal(t, "log after the decision", bodies(t, p), before)
	equal(t, "Stats after the decision", p.Stats(), stats)
	for _, h := range halves(t, p) {
		if h.TxID == txid {
			t.Fatalf("HalfTxs lists %s after its decision: %+v", txid, h)
		}
	}
}

var txTests = []test{
	{"PrepareInvisible", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("before"))
		before := p.Stats()
		if c := prepare(t, p, t0, "tx1", "node-1", "h1", "h2"); c.Count != 2 {
			t.Fatalf("prepare Count = %d, want 2", c.Count)
		}
		// Another prepare of the same transaction by its producer adds
		// to it; the first prepare's time stays. Another producer's is
		// refused, changing nothing.
		if c := prepare(t, p, t0+sec, "tx1", "node-1", "h3"); c.Count != 1 {
			t.Fatalf("second prepare Count = %d, want 1", c.Count)
		}
		other := &store.Command{Op: store.OpPrepare, Now: t0 + sec, TxID: "tx1", Producer: "node-2", Msgs: []store.Message{msg("h4")}}
		if _, err := p.Apply(context.Background(), other); !errors.Is(err, store.ErrOtherProducer) {
			t.Fatalf("another producer's prepare of tx1: %v, want ErrOtherProducer", err)
		}
		equal(t, "log", bodies(t, p), []string{"body-before"})
		equal(t, "Stats", p.Stats(), before)
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx{{TxID: "tx1", Producer: "node-1", FirstSeen: t0, Messages: 3}})
		equal(t, "decision", decision(t, p, "tx1"), store.Undecided)
	}},
	{"Commit", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("before"))
		prepare(t, p, t0, "tx1", "node-1", "h1", "h2")
		prepare(t, p, t0, "tx1", "node-1", "h3")
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, Now: t0 + 2*sec, TxID: "tx1", Msgs: []store.Message{msg("outbox")}})
		equal(t, "commit acks", c.Acks, []store.Ack{{Offset: 1}, {Offset: 2}, {Offset: 3}, {Offset: 4}})
		if c.Count != 4 || c.Previous != store.Undecided {
			t.Fatalf("commit Count, Previous = %d, %v; want 4, undecided", c.Count, c.Previous)
		}
		got := readAll(t, p)
		equal(t, "log", bodies(t, p), []string{"body-before", "body-h1", "body-h2", "body-h3", "body-outbox"})
		for _, m := range got[1:] {
			if m.StoredAt != t0+2*sec {
				t.Fatalf("%s stored at t0%+d, want the commit's t0+2s", m.ID, m.StoredAt-t0)
			}
		}
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx(nil))
		decided(t, p, "tx1", store.Committed)
	}},
	{"CommitDedup", func(t *testing.T, p Partition) {
		// Half messages and the outbox are deduplicated against the log
		// as sends are.
		appendAt(t, p, t0, msg("a"))
		prepare(t, p, t0, "tx", "node-1", "a", "b")
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx", Msgs: []store.Message{msg("b"), msg("c")}})
		equal(t, "acks", c.Acks, []store.Ack{{Offset: 0, Duplicate: true}, {Offset: 1}, {Offset: 1, Duplicate: true}, {Offset: 2}})
		equal(t, "log", bodies(t, p), []string{"body-a", "body-b", "body-c"})
	}},
	{"CommitDelayedHalf", func(t *testing.T, p Partition) {
		apply(t, p, &store.Command{Op: store.OpPrepare, TxID: "tx", Msgs: []store.Message{delayed("later", t0+10*sec)}})
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx"})
		if len(c.Acks) != 1 || !c.Acks[0].Delayed {
			t.Fatalf("acks = %+v, want one delayed", c.Acks)
		}
		if st := p.Stats(); st.Delayed != 1 || st.Next != 0 {
			t.Fatalf("Stats = %+v, want one delayed message", st)
		}
		if due, ok := nextDue(t, p); due != t0+10*sec || !ok {
			t.Fatalf("NextDue = t0%+d, %v", due-t0, ok)
		}
	}},
	{"OutboxOnly", func(t *testing.T, p Partition) {
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx", Msgs: []store.Message{msg("a"), msg("b")}})
		equal(t, "acks", c.Acks, []store.Ack{{Offset: 0}, {Offset: 1}})
		decided(t, p, "tx", store.Committed)
	}},
	{"Rollback", func(t *testing.T, p Partition) {
		prepare(t, p, t0, "tx", "node-1", "h1", "h2")
		c := apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: "tx"})
		if c.Count != 2 || c.Previous != store.Undecided || len(c.Acks) != 0 {
			t.Fatalf("rollback Count, Previous, Acks = %d, %v, %v; want 2, undecided, none", c.Count, c.Previous, c.Acks)
		}
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx(nil))
		equal(t, "log", bodies(t, p), []string(nil))
		decided(t, p, "tx", store.RolledBack)
		// The rolled-back messages' IDs were never indexed.
		equal(t, "send of a rolled-back ID", appendAt(t, p, t0, msg("h1")), []store.Ack{{Offset: 0}})
	}},
	{"RollbackUnknown", func(t *testing.T, p Partition) {
		// A rollback that comes before the prepare, or instead of it,
		// decides: a late prepare is refused.
		c := apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: "tx"})
		if c.Count != 0 || c.Previous != store.Undecided {
			t.Fatalf("rollback of an unknown tx: Count %d, Previous %v", c.Count, c.Previous)
		}
		decided(t, p, "tx", store.RolledBack)
	}},
	{"TxChecked", func(t *testing.T, p Partition) {
		prepare(t, p, t0, "tx", "node-1", "h")
		for i, now := range []int64{t0 + 10*sec, t0 + 20*sec} {
			if c := apply(t, p, &store.Command{Op: store.OpTxChecked, Now: now, TxID: "tx"}); c.Count != i+1 {
				t.Fatalf("check %d: Count %d", i+1, c.Count)
			}
		}
		want := []store.HalfTx{{TxID: "tx", Producer: "node-1", FirstSeen: t0, LastCheck: t0 + 20*sec, Checks: 2, Messages: 1}}
		equal(t, "HalfTxs", halves(t, p), want)
		if c := apply(t, p, &store.Command{Op: store.OpTxChecked, TxID: "unknown"}); c.Count != 0 {
			t.Fatalf("check of an unknown tx: Count %d", c.Count)
		}
		equal(t, "HalfTxs after checking an unknown tx", halves(t, p), want)
		apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx"})
		if c := apply(t, p, &store.Command{Op: store.OpTxChecked, TxID: "tx"}); c.Count != 0 {
			t.Fatalf("check of a committed tx: Count %d", c.Count)
		}
	}},
	{"HalfTxs", func(t *testing.T, p Partition) {
		prepare(t, p, t0, "txB", "node-2", "b")
		prepare(t, p, t0+sec, "txA", "node-1", "a1", "a2")
		prepare(t, p, t0+2*sec, "txC", "node-3", "c")
		prepare(t, p, t0+3*sec, "txD", "node-4") // no messages: still listed
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx{
			{TxID: "txA", Producer: "node-1", FirstSeen: t0 + sec, Messages: 2},
			{TxID: "txB", Producer: "node-2", FirstSeen: t0, Messages: 1},
			{TxID: "txC", Producer: "node-3", FirstSeen: t0 + 2*sec, Messages: 1},
			{TxID: "txD", Producer: "node-4", FirstSeen: t0 + 3*sec},
		})
		var seen []string
		err := p.HalfTxs(func(h store.HalfTx) bool { seen = append(seen, h.TxID); return len(seen) < 2 })
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "HalfTxs until fn returns false", seen, []string{"txA", "txB"})
		apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: "txB"})
		apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "txD"})
		seen = nil
		for _, h := range halves(t, p) {
			seen = append(seen, h.TxID)
		}
		equal(t, "HalfTxs after decisions", seen, []string{"txA", "txC"})
	}},
	{"HalfTxsReentrant", func(t *testing.T, p Partition) {
		// fn may call the partition, Apply included.
		prepare(t, p, t0, "txA", "node-1", "a")
		prepare(t, p, t0, "txB", "node-1", "b")
		// A deadlock fails the case rather than hanging it: the Apply's
		// ctx ends, and fn returns.
		var applyErr error
		err := p.HalfTxs(func(h store.HalfTx) bool {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			_, applyErr = p.Apply(ctx, &store.Command{Op: store.OpTxChecked, Now: t0 + sec, TxID: h.TxID})
			return applyErr == nil
		})
		if err != nil || applyErr != nil {
			t.Fatalf("HalfTxs = %v; Apply from its fn = %v", err, applyErr)
		}
		for _, h := range halves(t, p) {
			if h.Checks != 1 {
				t.Fatalf("%s checked %d times, want 1", h.TxID, h.Checks)
			}
		}
	}},
	{"DecisionTTL", func(t *testing.T, p Partition) {
		apply(t, p, &store.Command{Op: store.OpRollbackTx, Now: t0, TxID: "old"})
		apply(t, p, &store.Command{Op: store.OpCommitTx, Now: t0 + 50*sec, TxID: "new"})
		apply(t, p, &store.Command{Op: store.OpRollbackTx, Now: t0 + 40*sec, TxID: "edge"}) // decided exactly at the cutoff
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, DecideTTL: 60 * sec})
		equal(t, "pruned decision", decision(t, p, "old"), store.Undecided)
		equal(t, "kept decision", decision(t, p, "new"), store.Committed)
		equal(t, "decision at the cutoff", decision(t, p, "edge"), store.RolledBack)
	}},
}
