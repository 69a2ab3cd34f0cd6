package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/zeze-go/mq/store"
)

// trimCase appends ten messages of one size, one a second from t0, and
// trims them with the command cmd makes from the Stats before.
func trimCase(cmd func(st store.Stats) store.Command, wantCount int, wantMore bool) func(*testing.T, Partition) {
	return func(t *testing.T, p Partition) {
		for i := range 10 {
			appendAt(t, p, t0+int64(i)*sec, msg(fmt.Sprint(i)))
		}
		before := p.Stats()
		c := cmd(before)
		c.Op = store.OpTrim
		res := apply(t, p, &c)
		if res.Count != wantCount || res.More != wantMore {
			t.Fatalf("Count, More = %d, %v; want %d, %v", res.Count, res.More, wantCount, wantMore)
		}
		low := uint64(wantCount)
		st := p.Stats()
		if st.Low != low || st.Next != 10 {
			t.Fatalf("Stats = %+v, want log [%d, 10)", st, low)
		}
		if want := before.Bytes / 10 * int64(10-wantCount); st.Bytes != want {
			t.Fatalf("Bytes = %d, want %d", st.Bytes, want)
		}
		if got := readAll(t, p); len(got) > 0 && got[0].ID != fmt.Sprintf("id-%d", low) {
			t.Fatalf("log starts with %s", got[0].ID)
		}
		if _, ok, _ := p.Get(low - 1); low > 0 && ok {
			t.Fatalf("Get(%d) still finds a trimmed message", low-1)
		}
		// Appends go on at Next, after trimming everything too.
		equal(t, "next offset", offsetsOf(appendAt(t, p, t0+200*sec, msg("new"))), []uint64{10})
	}
}

func per(st store.Stats) int64 { return st.Bytes / 10 }

var trimTests = []test{
	{"KeepAll", trimCase(func(store.Stats) store.Command {
		return store.Command{Now: t0 + 100*sec}
	}, 0, false)},
	{"ByAge", trimCase(func(store.Stats) store.Command {
		// older than 5s at t0+9.5s: stored before t0+4.5s, offsets 0..4
		return store.Command{Now: t0 + 9*sec + sec/2, MaxAge: 5 * sec}
	}, 5, false)},
	{"ByAgeBoundary", trimCase(func(store.Stats) store.Command {
		// stored before t0+4s goes; stored exactly at it stays
		return store.Command{Now: t0 + 9*sec, MaxAge: 5 * sec}
	}, 4, false)},
	{"ByAgeAll", trimCase(func(store.Stats) store.Command {
		return store.Command{Now: t0 + 100*sec, MaxAge: sec}
	}, 10, false)},
	{"ByBytes", trimCase(func(st store.Stats) store.Command {
		return store.Command{Now: t0, MaxBytes: 3 * per(st)} // keeps the newest 3
	}, 7, false)},
	{"ByBytesBetweenSizes", trimCase(func(st store.Stats) store.Command {
		return store.Command{Now: t0, MaxBytes: 3*per(st) + per(st)/2}
	}, 7, false)},
	{"ByBytesAll", trimCase(func(store.Stats) store.Command {
		return store.Command{Now: t0, MaxBytes: 1}
	}, 10, false)},
	{"AgeOrBytes", trimCase(func(st store.Stats) store.Command {
		// bytes keep 6, age keeps 8: the stricter wins
		return store.Command{Now: t0 + 9*sec, MaxAge: 7 * sec, MaxBytes: 6 * per(st)}
	}, 4, false)},
	{"Limit", trimCase(func(store.Stats) store.Command {
		return store.Command{Now: t0 + 100*sec, MaxAge: sec, Limit: 4}
	}, 4, true)},
	{"LimitExactlyReached", trimCase(func(store.Stats) store.Command {
		// 5 to delete, limit 5: done, nothing more to do
		return store.Command{Now: t0 + 9*sec + sec/2, MaxAge: 5 * sec, Limit: 5}
	}, 5, false)},
	{"DedupForgottenWhenTrimmed", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("a"), msg("b"))
		if c := apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 10*sec, MaxAge: 5 * sec}); c.Count != 2 {
			t.Fatalf("trim deleted %d, want 2", c.Count)
		}
		equal(t, "resend of a trimmed message", appendAt(t, p, t0+10*sec, msg("a")), []store.Ack{{Offset: 2}})
	}},
	{"DedupTTL", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("a"), delayed("later", t0+1000*sec))
		appendAt(t, p, t0+100*sec, msg("b"))
		c := apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 150*sec, DedupTTL: 120 * sec})
		if c.Count != 0 || c.More {
			t.Fatalf("dedup pruning: Count %d, More %v; want nothing deleted from the log", c.Count, c.More)
		}
		// a (150s old) is forgotten, b (50s old) is not, and a delayed
		// message's ID is kept until it is released.
		equal(t, "resends", appendAt(t, p, t0+150*sec, msg("a"), msg("b")), []store.Ack{{Offset: 2}, {Offset: 1, Duplicate: true}})
		if acks := appendAt(t, p, t0+150*sec, delayed("later", t0+1000*sec)); !acks[0].Duplicate || !acks[0].Delayed {
			t.Fatalf("resend of the delayed message = %+v, want Delayed and Duplicate", acks)
		}
		equal(t, "log", bodies(t, p), []string{"body-a", "body-b", "body-a"})
	}},
	{"DedupTTLThenTrim", func(t *testing.T, p Partition) {
		// An ID pruned by its time to live and sent again points at the new
		// copy; trimming the old copy later leaves that entry alone.
		appendAt(t, p, t0, msg("a"))
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 150*sec, DedupTTL: 120 * sec})
		equal(t, "send after the TTL", appendAt(t, p, t0+150*sec, msg("a")), []store.Ack{{Offset: 1}})
		if c := apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 150*sec, MaxAge: 100 * sec}); c.Count != 1 {
			t.Fatalf("trim deleted %d, want the old copy", c.Count)
		}
		equal(t, "resend", appendAt(t, p, t0+150*sec, msg("a")), []store.Ack{{Offset: 1, Duplicate: true}})
	}},
	{"TrimDropsIDOfNewerCopy", func(t *testing.T, p Partition) {
		// The store's rule as it is: trimming a record deletes its ID's
		// dedup entry even when a FreshID send made that entry point at a
		// newer copy, which is still in the log. A resend then gets a third
		// copy. Changing the rule means changing this case.
		appendAt(t, p, t0, msg("a"))
		fresh := msg("a")
		fresh.FreshID = true
		appendAt(t, p, t0+100*sec, fresh)
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, MaxAge: 50 * sec})
		equal(t, "resend", appendAt(t, p, t0+100*sec, msg("a")), []store.Ack{{Offset: 2}})
		equal(t, "log", bodies(t, p), []string{"body-a", "body-a"})
	}},
}

var commandTests = []test{
	{"ErrBadCommand", func(t *testing.T, p Partition) {
		long := strings.Repeat("k", store.MaxKeyBytes+1)
		for _, cmd := range []*store.Command{
			{Op: 0, Now: t0},
			{Op: 200, Now: t0},
			{Op: store.OpAppend, Msgs: []store.Message{msg("a")}}, // Now zero
			{Op: store.OpAppend, Now: -1, Msgs: []store.Message{msg("a")}},
			{Op: store.OpRelease}, // Now zero
			{Op: store.OpCommitOffset, Now: t0, Offset: 1},
			{Op: store.OpDeleteGroup, Now: t0},
			{Op: store.OpClaim, Now: t0},
			{Op: store.OpResetOffset, Now: t0},
			{Op: store.OpPrepare, Now: t0, Msgs: []store.Message{msg("a")}},
			{Op: store.OpCommitTx, Now: t0},
			{Op: store.OpRollbackTx, Now: t0},
			{Op: store.OpTxChecked, Now: t0},
			{Op: store.OpRelease, Now: t0, Limit: -1},
			{Op: store.OpTrim, Now: t0, MaxAge: -1},
			{Op: store.OpTrim, Now: t0, MaxBytes: -1},
			{Op: store.OpTrim, Now: t0, DedupTTL: -1},
			{Op: store.OpTrim, Now: t0, DecideTTL: -1},
			{Op: store.OpCommitOffset, Now: t0, Group: long},
			{Op: store.OpClaim, Now: t0, Group: long},
			{Op: store.OpRollbackTx, Now: t0, TxID: long},
			{Op: store.OpPrepare, Now: t0, TxID: "tx", Producer: long},
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("ok"), {ID: long}}},
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("ok"), {FreshID: true}}},
			{Op: store.OpCommitTx, Now: t0, TxID: "tx", Msgs: []store.Message{{ID: long}}},
			{Op: store.OpCommitOffset, Now: t0, Group: "g", Msgs: []store.Message{msg("a")}},
			{Op: store.OpRelease, Now: t0, Msgs: []store.Message{msg("a")}},
		} {
			if _, err := p.Apply(context.Background(), cmd); !errors.Is(err, store.ErrBadCommand) {
				t.Errorf("Apply(op %d, Now %d, group %d, txid %d, producer %d bytes, %d msgs) = %v, want store.ErrBadCommand",
					cmd.Op, cmd.Now, len(cmd.Group), len(cmd.TxID), len(cmd.Producer), len(cmd.Msgs), err)
			}
		}
		// Nothing changed, and the partition goes on.
		equal(t, "Stats", p.Stats(), store.Stats{})
		noGroup(t, p, "g")
		equal(t, "decision", decision(t, p, "tx"), store.Undecided)
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx(nil))
		if _, ok := nextDue(t, p); ok {
			t.Fatal("NextDue reports a message")
		}
		equal(t, "a send after", appendAt(t, p, t0, msg("ok")), []store.Ack{{Offset: 0}})
	}},
	{"KeysAtTheLimit", func(t *testing.T, p Partition) {
		key := strings.Repeat("k", store.MaxKeyBytes)
		appendAt(t, p, t0, store.Message{ID: key})
		equal(t, "resend", appendAt(t, p, t0, store.Message{ID: key}), []store.Ack{{Offset: 0, Duplicate: true}})
		apply(t, p, &store.Command{Op: store.OpCommitOffset, Group: key, Offset: 1})
		equal(t, "offset", group(t, p, key).Offset, uint64(1))
		prepare(t, p, t0, key, key, "h")
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx{{TxID: key, Producer: key, FirstSeen: t0, Messages: 1}})
	}},
	{"ApplyCtxDone", func(t *testing.T, p Partition) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}}); !errors.Is(err, context.Canceled) {
			t.Fatalf("Apply with a cancelled ctx = %v, want context.Canceled", err)
		}
	}},
	{"ErrClosed", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("a"), delayed("later", t0+sec))
		prepare(t, p, t0, "tx", "node-1", "h")
		apply(t, p, &store.Command{Op: store.OpCommitOffset, Group: "g"})
		if err := p.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		ctx := context.Background()
		for _, c := range []struct {
			name string
			call func() error
		}{
			{"Apply", func() error {
				_, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b")}})
				return err
			}},
			{"ApplyClaim", func() error {
				_, err := p.Apply(ctx, &store.Command{Op: store.OpClaim, Now: t0, Group: "g"})
				return err
			}},
			{"Fetch", func() error { _, err := p.Fetch(ctx, 0, 10, 0, nil); return err }},
			{"FetchAtEnd", func() error { _, err := p.Fetch(ctx, 1, 10, 0, nil); return err }},
			{"Get", func() error { _, _, err := p.Get(0); return err }},
			{"GetPastEnd", func() error { _, _, err := p.Get(5); return err }},
			{"Group", func() error { _, _, err := p.Group("g"); return err }},
			{"SeekTime", func() error { _, err := p.SeekTime(0); return err }},
			{"NextDue", func() error { _, _, err := p.NextDue(); return err }},
			{"HalfTxs", func() error { return p.HalfTxs(func(store.HalfTx) bool { return true }) }},
			{"Decision", func() error { _, err := p.Decision("tx"); return err }},
		} {
			if err := c.call(); !errors.Is(err, store.ErrClosed) {
				t.Errorf("%s after Close = %v, want store.ErrClosed", c.name, err)
			}
		}
	}},
}
