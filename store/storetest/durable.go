package storetest

import (
	"testing"

	"github.com/zeze-go/mq/store"
)

// A durableTest gets the opener of one partition's data: each call opens it
// again, so close the one before first.
type durableTest struct {
	name string
	run  func(t *testing.T, open func() Partition)
}

func closed(t testing.TB, p Partition) {
	t.Helper()
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

var durableTests = []durableTest{
	{"Log", func(t *testing.T, open func() Partition) {
		p := open()
		appendAt(t, p, t0, msg("a"), msg("b"), msg("c"), delayed("later", t0+60*sec))
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0, MaxBytes: 1}) // drops a, b, c
		appendAt(t, p, t0+sec, msg("d"), msg("e"))
		before := p.Stats()
		closed(t, p)

		p = open()
		equal(t, "Stats after reopen", p.Stats(), before)
		equal(t, "log", bodies(t, p), []string{"body-d", "body-e"})
		if due, ok := nextDue(t, p); due != t0+60*sec || !ok {
			t.Fatalf("NextDue = t0%+d, %v; want t0+60s", due-t0, ok)
		}
		// Dedup and the next offset survive; what the trim forgot stays
		// forgotten.
		equal(t, "resends", appendAt(t, p, t0+2*sec, msg("d"), msg("a")), []store.Ack{{Offset: 3, Duplicate: true}, {Offset: 5}})
		if acks := appendAt(t, p, t0+2*sec, delayed("later", t0+60*sec)); !acks[0].Duplicate || !acks[0].Delayed {
			t.Fatalf("resend of the delayed message = %+v", acks)
		}
		apply(t, p, &store.Command{Op: store.OpRelease, Now: t0 + 60*sec})
		equal(t, "log after release", bodies(t, p), []string{"body-d", "body-e", "body-a", "body-later"})
		if got, err := p.SeekTime(t0 + 60*sec); got != 6 || err != nil {
			t.Fatalf("SeekTime = %d, %v; want 6", got, err)
		}
	}},
	{"Transactions", func(t *testing.T, open func() Partition) {
		p := open()
		prepare(t, p, t0, "open", "node-1", "h1", "h2")
		apply(t, p, &store.Command{Op: store.OpTxChecked, Now: t0 + sec, TxID: "open"})
		apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: "rolled"})
		closed(t, p)

		p = open()
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx{{TxID: "open", Producer: "node-1", FirstSeen: t0, LastCheck: t0 + sec, Checks: 1, Messages: 2}})
		equal(t, "decision", decision(t, p, "rolled"), store.RolledBack)
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "open", Msgs: []store.Message{msg("o")}})
		equal(t, "commit acks", offsetsOf(c.Acks), []uint64{0, 1, 2})
		equal(t, "log", bodies(t, p), []string{"body-h1", "body-h2", "body-o"})
	}},
	{"Groups", func(t *testing.T, open func() Partition) {
		p := open()
		a := claim(t, p, t0, "a", store.StartAt, 0, 0)
		apply(t, p, commitOffset("a", 4, a.Generation))
		b := claim(t, p, t0, "b", store.StartAt, 0, a.Generation)
		apply(t, p, &store.Command{Op: store.OpDeleteGroup, Group: "b"}) // held the highest generation
		want := group(t, p, "a")
		closed(t, p)

		p = open()
		equal(t, "Group after reopen", group(t, p, "a"), want)
		noGroup(t, p, "b")
		apply(t, p, commitOffset("a", 5, a.Generation))
		// The counter survives the reopen, also past a deleted group's.
		claim(t, p, t0+60*sec, "c", store.StartAt, 0, b.Generation)
	}},
}
