package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/zeze-go/mq/store"
)

var appendTests = []test{
	{"Dense", func(t *testing.T, p Partition) {
		batch := make([]store.Message, 300)
		for i := range batch {
			batch[i] = msg(fmt.Sprint(i))
		}
		acks := appendAt(t, p, t0, batch...)
		for i, a := range acks {
			if a != (store.Ack{Offset: uint64(i)}) {
				t.Fatalf("ack %d = %+v, want offset %d", i, a, i)
			}
		}
		equal(t, "offsets of the next sends", offsetsOf(appendAt(t, p, t0+sec, msg("x"), msg("y"))), []uint64{300, 301})
		equal(t, "offset of a send alone", offsetsOf(appendAt(t, p, t0+sec, msg("z"))), []uint64{302})
		st := p.Stats()
		if st.Low != 0 || st.Next != 303 || st.Bytes <= 0 || st.Delayed != 0 || st.LastStored != t0+sec {
			t.Fatalf("Stats = %+v, want [0, 303), bytes, stored last at t0+1s", st)
		}
		got := readAll(t, p)
		for i, m := range got[:300] {
			if string(m.Body) != fmt.Sprintf("body-%d", i) {
				t.Fatalf("offset %d holds %q", i, m.Body)
			}
		}
	}},
	{"RoundTrip", func(t *testing.T, p Partition) {
		in := []store.Message{
			{ID: "a", Key: "k1", Tags: []string{"x", "y"}, Properties: map[string]string{"p": "1", "q": ""},
				Body: []byte("one"), Timestamp: t0 - 5, ReconsumeTimes: 3, StoredAt: 7, Offset: 99},
			{Body: []byte("two"), DeliverAt: t0}, // due now: in the log, DeliverAt kept
			{ID: "c", Body: []byte("three"), DeliverAt: t0 - sec, FreshID: true},
		}
		appendAt(t, p, t0, in...)
		for i := range in {
			in[i].StoredAt, in[i].Offset, in[i].FreshID = t0, uint64(i), false
		}
		equal(t, "read back", readAll(t, p), in)
		for i := range in {
			m, ok, err := p.Get(uint64(i))
			if err != nil || !ok {
				t.Fatalf("Get(%d) = %v, %v", i, ok, err)
			}
			equal(t, fmt.Sprintf("Get(%d)", i), m, in[i])
		}
	}},
	{"CallerKeepsItsMessages", func(t *testing.T, p Partition) {
		// The partition reads a command's messages while applying it, never
		// after: the caller may reuse them.
		m := store.Message{ID: "a", Tags: []string{"t"}, Properties: map[string]string{"k": "v"}, Body: []byte("body")}
		cmd := &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{m}}
		apply(t, p, cmd)
		m.Body[0], m.Tags[0], m.Properties["k"] = 'X', "X", "X"
		got := readAll(t, p)[0]
		if string(got.Body) != "body" || got.Tags[0] != "t" || got.Properties["k"] != "v" {
			t.Fatalf("stored message changed with the caller's: %+v", got)
		}
		got.Body[0] = 'Y' // and what a read returns is the reader's
		if again := readAll(t, p)[0]; string(again.Body) != "body" {
			t.Fatalf("stored body changed with a reader's: %q", again.Body)
		}
	}},
	{"StoredAtNeverDecreases", func(t *testing.T, p Partition) {
		appendAt(t, p, t0+10, msg("a"))
		appendAt(t, p, t0, msg("b")) // a proposer's clock stepped back
		got := readAll(t, p)
		if got[0].StoredAt != t0+10 || got[1].StoredAt != t0+10 {
			t.Fatalf("StoredAt = %d, %d, want both t0+10", got[0].StoredAt-t0, got[1].StoredAt-t0)
		}
		if st := p.Stats(); st.LastStored != t0+10 {
			t.Fatalf("LastStored = t0%+d, want t0+10", st.LastStored-t0)
		}
	}},
	{"DedupSecondCommand", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("x"), msg("a"))
		equal(t, "acks of the repeat", appendAt(t, p, t0+sec, msg("b"), msg("a")),
			[]store.Ack{{Offset: 2}, {Offset: 1, Duplicate: true}})
		equal(t, "log", bodies(t, p), []string{"body-x", "body-a", "body-b"})
	}},
	{"DedupSameCommand", func(t *testing.T, p Partition) {
		equal(t, "acks", appendAt(t, p, t0, msg("a"), msg("a")),
			[]store.Ack{{Offset: 0}, {Offset: 0, Duplicate: true}})
		equal(t, "log", bodies(t, p), []string{"body-a"})
	}},
	{"DedupByIDOnly", func(t *testing.T, p Partition) {
		// A repeat is known by its ID alone: its body may differ, the first
		// copy stays.
		appendAt(t, p, t0, msg("a"))
		other := msg("a")
		other.Body = []byte("other")
		equal(t, "acks", appendAt(t, p, t0, other), []store.Ack{{Offset: 0, Duplicate: true}})
		equal(t, "log", bodies(t, p), []string{"body-a"})
	}},
	{"NoID", func(t *testing.T, p Partition) {
		m := store.Message{Body: []byte("anonymous")}
		equal(t, "acks", appendAt(t, p, t0, m, m), []store.Ack{{Offset: 0}, {Offset: 1}})
		equal(t, "acks", appendAt(t, p, t0, m), []store.Ack{{Offset: 2}})
		equal(t, "log", bodies(t, p), []string{"anonymous", "anonymous", "anonymous"})
	}},
	{"FreshID", func(t *testing.T, p Partition) {
		// FreshID skips the lookup (a new copy even of a known ID) but
		// indexes the ID: a resend dedups to the newest copy.
		appendAt(t, p, t0, msg("a"))
		fresh := msg("a")
		fresh.FreshID = true
		equal(t, "fresh ack", appendAt(t, p, t0, fresh), []store.Ack{{Offset: 1}})
		equal(t, "resend", appendAt(t, p, t0, msg("a")), []store.Ack{{Offset: 1, Duplicate: true}})
		fresh2 := msg("b")
		fresh2.FreshID = true
		equal(t, "fresh new ID, then resent", appendAt(t, p, t0, fresh2, msg("b")),
			[]store.Ack{{Offset: 2}, {Offset: 2, Duplicate: true}})
		equal(t, "log", bodies(t, p), []string{"body-a", "body-a", "body-b"})
	}},
	{"Concurrent", func(t *testing.T, p Partition) {
		const senders, each = 8, 25
		var wg sync.WaitGroup
		offs := make([][]uint64, senders)
		errs := make([]error, senders)
		for s := range senders {
			wg.Go(func() {
				for i := range each {
					res, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0,
						Msgs: []store.Message{msg(fmt.Sprintf("%d-%d", s, i))}})
					if err != nil {
						errs[s] = err
						return
					}
					offs[s] = append(offs[s], res.Acks[0].Offset)
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		for s, o := range offs {
			for i, off := range o {
				if seen[off] || off >= senders*each || (i > 0 && off <= o[i-1]) {
					t.Fatalf("sender %d got offset %d after %v", s, off, o[:i])
				}
				seen[off] = true
			}
		}
		if st := p.Stats(); st.Next != senders*each {
			t.Fatalf("Next = %d, want %d", st.Next, senders*each)
		}
	}},
}

// delaySetup appends, at t0, messages due later (c, a1, b, a2), due now
// (exact) and overdue (past), in that mixed order.
func delaySetup(t *testing.T, p Partition) []store.Ack {
	t.Helper()
	return appendAt(t, p, t0, delayed("c", t0+30*sec), delayed("a1", t0+10*sec), msg("now"),
		delayed("b", t0+20*sec), delayed("a2", t0+10*sec), delayed("past", t0-sec), delayed("exact", t0))
}

var delayTests = []test{
	{"Held", func(t *testing.T, p Partition) {
		acks := delaySetup(t, p)
		for i, want := range []bool{true, true, false, true, true, false, false} {
			if acks[i].Delayed != want || acks[i].Duplicate {
				t.Fatalf("ack %d = %+v, want Delayed %v", i, acks[i], want)
			}
		}
		equal(t, "offsets of the messages due", []uint64{acks[2].Offset, acks[5].Offset, acks[6].Offset}, []uint64{0, 1, 2})
		if st := p.Stats(); st.Delayed != 4 || st.Next != 3 || st.Low != 0 {
			t.Fatalf("Stats = %+v, want 4 delayed, log [0, 3)", st)
		}
		equal(t, "log", bodies(t, p), []string{"body-now", "body-past", "body-exact"})
		if _, ok, err := p.Get(3); ok || err != nil {
			t.Fatalf("Get(3) = %v, %v: a delayed message has no offset", ok, err)
		}
		if due, ok := nextDue(t, p); due != t0+10*sec || !ok {
			t.Fatalf("NextDue = t0%+d, %v; want t0+10s", due-t0, ok)
		}
	}},
	{"Release", func(t *testing.T, p Partition) {
		delaySetup(t, p)
		release := func(now int64, limit int) store.Result {
			return apply(t, p, &store.Command{Op: store.OpRelease, Now: now, Limit: limit})
		}
		if c := release(t0+10*sec-1, 0); c.Count != 0 || c.More {
			t.Fatalf("release before due: Count %d More %v", c.Count, c.More)
		}
		if st := p.Stats(); st.Next != 3 || st.Delayed != 4 {
			t.Fatalf("Stats after an early release = %+v", st)
		}
		if c := release(t0+20*sec, 2); c.Count != 2 || !c.More {
			t.Fatalf("release with limit 2: Count %d More %v, want 2, true", c.Count, c.More)
		}
		if c := release(t0+20*sec, 0); c.Count != 1 || c.More {
			t.Fatalf("release the rest due: Count %d More %v, want 1, false", c.Count, c.More)
		}
		// by due time, then arrival: a1 and a2 (due together) in send order
		got := readAll(t, p)
		equal(t, "log", bodies(t, p), []string{"body-now", "body-past", "body-exact", "body-a1", "body-a2", "body-b"})
		for _, m := range got[3:] {
			if m.StoredAt != t0+20*sec || m.DeliverAt == 0 {
				t.Fatalf("released %s: StoredAt t0%+d, DeliverAt %d; want the release time t0+20s, DeliverAt kept", m.ID, m.StoredAt-t0, m.DeliverAt)
			}
		}
		if st := p.Stats(); st.Delayed != 1 || st.Next != 6 || st.LastStored != t0+20*sec {
			t.Fatalf("Stats = %+v, want 1 delayed, Next 6, stored last at t0+20s", st)
		}
		if due, ok := nextDue(t, p); due != t0+30*sec || !ok {
			t.Fatalf("NextDue = t0%+d, %v; want t0+30s", due-t0, ok)
		}
		release(t0+3600*sec, 0)
		if _, ok := nextDue(t, p); ok {
			t.Fatal("NextDue reports a message after all were released")
		}
		if st := p.Stats(); st.Delayed != 0 || st.Next != 7 {
			t.Fatalf("Stats = %+v, want none delayed, Next 7", st)
		}
	}},
	{"Dedup", func(t *testing.T, p Partition) {
		m := delayed("later", t0+10*sec)
		appendAt(t, p, t0, msg("first"), m)
		acks := appendAt(t, p, t0, m)
		if len(acks) != 1 || !acks[0].Delayed || !acks[0].Duplicate {
			t.Fatalf("repeat of a delayed message = %+v, want Delayed and Duplicate", acks)
		}
		if st := p.Stats(); st.Delayed != 1 || st.Next != 1 {
			t.Fatalf("Stats = %+v, want the delayed message stored once", st)
		}
		apply(t, p, &store.Command{Op: store.OpRelease, Now: t0 + 10*sec})
		equal(t, "repeat after release", appendAt(t, p, t0+11*sec, m), []store.Ack{{Offset: 1, Duplicate: true}})
		equal(t, "log", bodies(t, p), []string{"body-first", "body-later"})
	}},
	{"StoredAtOfDelayedCounts", func(t *testing.T, p Partition) {
		// A delayed message takes its StoredAt when it arrives too: a later
		// send stamped earlier is stored no earlier than it.
		appendAt(t, p, t0+5*sec, delayed("later", t0+60*sec))
		appendAt(t, p, t0, msg("a"))
		if got := readAll(t, p); got[0].StoredAt != t0+5*sec {
			t.Fatalf("StoredAt = t0%+d, want t0+5s", got[0].StoredAt-t0)
		}
	}},
}

var fetchTests = []test{
	{"Ready", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("a"), msg("b"), msg("c"))
		if got := fetch(t, p, 0, 10, 0); len(got) != 3 || got[0].Offset != 0 {
			t.Fatalf("Fetch(0) = %+v", got)
		}
		if got := fetch(t, p, 1, 10, 0); len(got) != 2 || got[0].Offset != 1 || string(got[1].Body) != "body-c" {
			t.Fatalf("Fetch(1) = %+v", got)
		}
		dst := []store.Message{{ID: "kept"}}
		got, err := p.Fetch(context.Background(), 2, 10, 0, dst)
		if err != nil || len(got) != 2 || got[0].ID != "kept" || got[1].Offset != 2 {
			t.Fatalf("Fetch appending to dst = %+v, %v", got, err)
		}
	}},
	{"Max", func(t *testing.T, p Partition) {
		for i := range 10 {
			appendAt(t, p, t0, msg(fmt.Sprint(i)))
		}
		got := fetch(t, p, 3, 4, 0)
		if len(got) != 4 || got[0].Offset != 3 || got[3].Offset != 6 {
			t.Fatalf("Fetch(3, max 4) = %d messages from %+v", len(got), got)
		}
	}},
	{"MaxBytes", func(t *testing.T, p Partition) {
		for i := range 10 {
			appendAt(t, p, t0, msg(fmt.Sprint(i))) // all of one size
		}
		st := p.Stats()
		per := int(st.Bytes / 10)
		if st.Bytes%10 != 0 || per == 0 {
			t.Fatalf("10 messages of one size take %d bytes", st.Bytes)
		}
		for _, tc := range []struct {
			maxBytes, want int
		}{
			{1, 1}, // below one message: the first is always returned
			{per, 1},
			{per + 1, 1},
			{3 * per, 3},
			{3*per + per/2, 3},
			{0, 10}, // no limit
		} {
			if got := fetch(t, p, 0, 100, tc.maxBytes); len(got) != tc.want {
				t.Errorf("Fetch(maxBytes %d, %d a message) = %d messages, want %d", tc.maxBytes, per, len(got), tc.want)
			}
		}
	}},
	{"FromBelowLow", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("0"), msg("1"), msg("2"))
		appendAt(t, p, t0+100*sec, msg("3"), msg("4"))
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, MaxAge: 50 * sec})
		for _, from := range []uint64{0, 2, 3} {
			if got := fetch(t, p, from, 10, 0); len(got) != 2 || got[0].Offset != 3 {
				t.Fatalf("Fetch(%d) after trimming [0, 3) = %+v, want offsets 3, 4", from, got)
			}
		}
	}},
	{"FromBelowLowWaits", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("0"), msg("1"))
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, MaxAge: sec}) // all of it
		w := startFetch(t, context.Background(), p, 0)
		w.blocked(t, "on a log trimmed empty")
		appendAt(t, p, t0+100*sec, msg("2"))
		got, err := w.result(t)
		if err != nil || len(got) != 1 || got[0].Offset != 2 {
			t.Fatalf("Fetch(0) = %+v, %v; want offset 2", got, err)
		}
	}},
	{"WakesOnAppend", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("a"), msg("b"))
		w := startFetch(t, context.Background(), p, 2)
		w.blocked(t, "at the end of the log")
		appendAt(t, p, t0, msg("c"))
		got, err := w.result(t)
		if err != nil || len(got) != 1 || got[0].Offset != 2 || string(got[0].Body) != "body-c" {
			t.Fatalf("Fetch(2) = %+v, %v; want c at 2", got, err)
		}
	}},
	{"WakesOnRelease", func(t *testing.T, p Partition) {
		w := startFetch(t, context.Background(), p, 0)
		w.blocked(t, "on an empty log")
		appendAt(t, p, t0, delayed("later", t0+10*sec))
		w.blocked(t, "after a delayed append")
		apply(t, p, &store.Command{Op: store.OpRelease, Now: t0 + 10*sec})
		got, err := w.result(t)
		if err != nil || len(got) != 1 || got[0].ID != "id-later" {
			t.Fatalf("Fetch = %+v, %v; want the released message", got, err)
		}
	}},
	{"WakesOnCommitTx", func(t *testing.T, p Partition) {
		w := startFetch(t, context.Background(), p, 0)
		apply(t, p, &store.Command{Op: store.OpPrepare, TxID: "tx", Msgs: []store.Message{msg("h")}})
		w.blocked(t, "after a prepare")
		apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx", Msgs: []store.Message{msg("o")}})
		got, err := w.result(t)
		if err != nil || len(got) != 2 || got[0].ID != "id-h" || got[1].ID != "id-o" {
			t.Fatalf("Fetch = %+v, %v; want the transaction's messages", got, err)
		}
	}},
	{"Cancel", func(t *testing.T, p Partition) {
		ctx, cancel := context.WithCancel(context.Background())
		w := startFetch(t, ctx, p, 0)
		w.blocked(t, "on an empty log")
		cancel()
		if _, err := w.result(t); !errors.Is(err, context.Canceled) {
			t.Fatalf("Fetch after cancel = %v, want context.Canceled", err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), quiet)
		defer cancel()
		if _, err := p.Fetch(ctx, 0, 10, 0, nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Fetch past its deadline = %v, want context.DeadlineExceeded", err)
		}
	}},
	{"Close", func(t *testing.T, p Partition) {
		w := startFetch(t, context.Background(), p, 0)
		w.blocked(t, "on an empty log")
		if err := p.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, err := w.result(t); !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Fetch waiting through Close = %v, want store.ErrClosed", err)
		}
	}},
}

var readTests = []test{
	{"Get", func(t *testing.T, p Partition) {
		if _, ok, err := p.Get(0); ok || err != nil {
			t.Fatalf("Get(0) of an empty log = %v, %v", ok, err)
		}
		appendAt(t, p, t0, msg("a"))
		appendAt(t, p, t0+100*sec, msg("b"), msg("c"))
		m, ok, err := p.Get(1)
		if err != nil || !ok || m.ID != "id-b" || m.Offset != 1 || m.StoredAt != t0+100*sec {
			t.Fatalf("Get(1) = %+v, %v, %v", m, ok, err)
		}
		for _, off := range []uint64{3, 1 << 40, noOffset} {
			if _, ok, err := p.Get(off); ok || err != nil {
				t.Fatalf("Get(%d) past the end = %v, %v", off, ok, err)
			}
		}
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, MaxAge: 50 * sec})
		if _, ok, err := p.Get(0); ok || err != nil {
			t.Fatalf("Get(0) after its trim = %v, %v", ok, err)
		}
		if m, ok, err := p.Get(2); !ok || err != nil || m.ID != "id-c" {
			t.Fatalf("Get(2) after the trim = %+v, %v, %v", m, ok, err)
		}
	}},
	{"Stats", func(t *testing.T, p Partition) {
		equal(t, "Stats of a new partition", p.Stats(), store.Stats{})
		appendAt(t, p, t0, msg("a"), delayed("later", t0+sec))
		one := p.Stats()
		if one.Low != 0 || one.Next != 1 || one.Bytes <= 0 || one.Delayed != 1 || one.LastStored != t0 {
			t.Fatalf("Stats = %+v", one)
		}
		apply(t, p, &store.Command{Op: store.OpRelease, Now: t0 + sec})
		two := p.Stats()
		if two.Next != 2 || two.Delayed != 0 || two.Bytes <= one.Bytes || two.LastStored != t0+sec {
			t.Fatalf("Stats after release = %+v (before %+v)", two, one)
		}
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + sec, MaxBytes: two.Bytes - 1})
		if st := p.Stats(); st.Low != 1 || st.Next != 2 || st.Bytes != two.Bytes-one.Bytes {
			t.Fatalf("Stats after trimming one = %+v (before %+v, %+v)", st, one, two)
		}
	}},
	{"SeekTime", func(t *testing.T, p Partition) {
		if got, err := p.SeekTime(t0); got != 0 || err != nil {
			t.Fatalf("SeekTime on an empty log = %d, %v", got, err)
		}
		for i := range 5 {
			appendAt(t, p, t0+int64(i)*10*sec, msg(fmt.Sprint(i)))
		}
		for _, tc := range []struct {
			at   int64
			want uint64
		}{
			{0, 0}, {t0 - 1, 0}, {t0, 0}, {t0 + 1, 1}, {t0 + 20*sec, 2}, {t0 + 40*sec, 4}, {t0 + 40*sec + 1, 5},
		} {
			if got, err := p.SeekTime(tc.at); got != tc.want || err != nil {
				t.Errorf("SeekTime(t0%+d) = %d, %v; want %d", tc.at-t0, got, err, tc.want)
			}
		}
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 25*sec, MaxAge: 10 * sec}) // drops 0, 1
		if got, err := p.SeekTime(0); got != 2 || err != nil {
			t.Errorf("SeekTime after the trim = %d, %v; want 2", got, err)
		}
	}},
}
