package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/zeze-go/mq/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestPartition_Append(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, p *store.Partition)
	}{
		{"ReadBack", func(t *testing.T, p *store.Partition) {
			in := []store.Message{
				{ID: "a", Key: "k1", Tags: []string{"x", "y"}, Properties: map[string]string{"p": "1"}, Body: []byte("one"), Timestamp: t0 - 5},
				{ID: "b", Body: []byte("two"), ReconsumeTimes: 3},
				{Body: []byte{}}, // no ID, empty body
			}
			acks := appendAt(t, p, t0, in...)
			equal(t, "offsets", offsetsOf(acks), []uint64{0, 1, 2})
			got, err := p.Read(0, 10, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range in {
				in[i].StoredAt = t0
				in[i].Offset = uint64(i)
			}
			in[2].Body = nil // msgpack does not tell an empty body from none
			got[2].Body = nil
			equal(t, "read back", got, in)
			m, ok, err := p.Get(1)
			if err != nil || !ok || m.ID != "b" || m.Offset != 1 {
				t.Fatalf("Get(1) = %+v, %v, %v", m, ok, err)
			}
			if _, ok, err := p.Get(3); ok || err != nil {
				t.Fatalf("Get(3) past the end = %v, %v", ok, err)
			}
			st := p.Stats()
			if st.Low != 0 || st.Next != 3 || st.Bytes <= 0 || st.LastStored != t0 {
				t.Fatalf("Stats = %+v", st)
			}
		}},
		{"ReadLimits", func(t *testing.T, p *store.Partition) {
			for i := 0; i < 10; i++ {
				appendAt(t, p, t0, msg(fmt.Sprint(i)))
			}
			got, err := p.Read(3, 4, 0, nil)
			if err != nil || len(got) != 4 || got[0].Offset != 3 || got[3].Offset != 6 {
				t.Fatalf("Read(3, max 4) = %d messages from %v, %v", len(got), got, err)
			}
			got, err = p.Read(0, 10, 1, nil) // maxBytes below one record: still one
			if err != nil || len(got) != 1 {
				t.Fatalf("Read(maxBytes 1) = %d messages, %v", len(got), err)
			}
			got, err = p.Read(10, 10, 0, nil)
			if err != nil || len(got) != 0 {
				t.Fatalf("Read at the end = %d messages, %v", len(got), err)
			}
			dst := []store.Message{{ID: "kept"}}
			got, err = p.Read(9, 10, 0, dst)
			if err != nil || len(got) != 2 || got[0].ID != "kept" || got[1].Offset != 9 {
				t.Fatalf("Read appending to dst = %+v, %v", got, err)
			}
		}},
		{"StoredAtNeverDecreases", func(t *testing.T, p *store.Partition) {
			appendAt(t, p, t0+10)
			appendAt(t, p, t0+10, msg("a"))
			appendAt(t, p, t0, msg("b")) // a proposer's clock stepped back
			got, _ := p.Read(0, 10, 0, nil)
			if got[0].StoredAt != t0+10 || got[1].StoredAt != t0+10 {
				t.Fatalf("StoredAt = %d, %d, want both %d", got[0].StoredAt, got[1].StoredAt, t0+10)
			}
		}},
		{"GroupCommit", func(t *testing.T, p *store.Partition) {
			const senders, each = 16, 50
			var wg sync.WaitGroup
			errs := make(chan error, senders)
			offs := make([][]uint64, senders)
			for g := 0; g < senders; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						cmd := &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(fmt.Sprintf("%d-%d", g, i))}}
						res, err := p.Apply(context.Background(), cmd)
						if err != nil {
							errs <- err
							return
						}
						offs[g] = append(offs[g], res.Acks[0].Offset)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			seen := map[uint64]bool{}
			for g, o := range offs {
				for i, off := range o {
					if seen[off] || off >= senders*each || (i > 0 && off <= o[i-1]) {
						t.Fatalf("sender %d got offset %d (after %v)", g, off, o[:i])
					}
					seen[off] = true
				}
			}
			if st := p.Stats(); st.Next != senders*each {
				t.Fatalf("Next = %d, want %d", st.Next, senders*each)
			}
		}},
		{"ErrBadCommand", func(t *testing.T, p *store.Partition) {
			for _, cmd := range []*store.Command{
				{Op: 0},
				{Op: 200},
				{Op: store.OpCommitOffset, Offset: 1},
				{Op: store.OpDeleteGroup},
				{Op: store.OpPrepare, Msgs: []store.Message{msg("a")}},
				{Op: store.OpCommitTx},
				{Op: store.OpRollbackTx},
				{Op: store.OpTxChecked},
				{Op: store.OpRelease, Limit: -1},
				{Op: store.OpTrim, MaxAge: -1},
				{Op: store.OpCommitOffset, Group: string(make([]byte, store.MaxKeyBytes+1))},
				{Op: store.OpAppend, Msgs: []store.Message{{ID: string(make([]byte, store.MaxKeyBytes+1))}}},
				{Op: store.OpAppend, Msgs: []store.Message{{FreshID: true}}},
				{Op: store.OpCommitOffset, Group: "g", Msgs: []store.Message{msg("a")}},
			} {
				if cmd.Now == 0 {
					cmd.Now = t0
				}
				if _, err := p.Apply(context.Background(), cmd); !errors.Is(err, store.ErrBadCommand) {
					t.Errorf("Apply(%+v) = %v, want ErrBadCommand", cmd, err)
				}
			}
			// A bad command fails alone: the partition still works.
			equal(t, "offsets after", offsetsOf(appendAt(t, p, t0, msg("a"))), []uint64{0})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := open(t)
			tt.run(t, p)
		})
	}
}

func TestPartition_Dedup(t *testing.T) {
	tests := []struct {
		name      string
		run       func(t *testing.T, p *store.Partition) []store.Ack // acks of the repeat
		wantAcks  []store.Ack
		wantCount int // messages in the log
	}{
		{"SecondCommand", func(t *testing.T, p *store.Partition) []store.Ack {
			appendAt(t, p, t0, msg("x"), msg("a"))
			return appendAt(t, p, t0+sec, msg("b"), msg("a"))
		}, []store.Ack{{Offset: 2}, {Offset: 1, Duplicate: true}}, 3},
		{"SameCommand", func(t *testing.T, p *store.Partition) []store.Ack {
			return appendAt(t, p, t0, msg("a"), msg("a"))
		}, []store.Ack{{Offset: 0}, {Offset: 0, Duplicate: true}}, 1},
		{"NoIDNoDedup", func(t *testing.T, p *store.Partition) []store.Ack {
			m := store.Message{Body: []byte("anonymous")}
			appendAt(t, p, t0, m)
			return appendAt(t, p, t0, m)
		}, []store.Ack{{Offset: 1}}, 2},
		{"Delayed", func(t *testing.T, p *store.Partition) []store.Ack {
			m := msg("later")
			m.DeliverAt = t0 + 10*sec
			appendAt(t, p, t0, m)
			return appendAt(t, p, t0, m)
		}, []store.Ack{{Offset: ^uint64(0), Delayed: true, Duplicate: true}}, 0},
		{"AfterRelease", func(t *testing.T, p *store.Partition) []store.Ack {
			m := msg("later")
			m.DeliverAt = t0 + 10*sec
			appendAt(t, p, t0, msg("first"), m)
			apply(t, p, &store.Command{Op: store.OpRelease, Now: t0 + 10*sec})
			return appendAt(t, p, t0+11*sec, m)
		}, []store.Ack{{Offset: 1, Duplicate: true}}, 2},
		{"PrunedAfterTTL", func(t *testing.T, p *store.Partition) []store.Ack {
			appendAt(t, p, t0, msg("a"))
			appendAt(t, p, t0+100*sec, msg("b"))
			apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 150*sec, DedupTTL: 120 * sec})
			// a is forgotten, b (50s old) is not
			return appendAt(t, p, t0+150*sec, msg("a"), msg("b"))
		}, []store.Ack{{Offset: 2}, {Offset: 1, Duplicate: true}}, 3},
		{"ForgottenWhenTrimmed", func(t *testing.T, p *store.Partition) []store.Ack {
			appendAt(t, p, t0, msg("a"), msg("b"))
			c := apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 10*sec, MaxAge: 5 * sec})
			if c.Count != 2 {
				t.Fatalf("trim deleted %d, want 2", c.Count)
			}
			return appendAt(t, p, t0+10*sec, msg("a"))
		}, []store.Ack{{Offset: 2}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := open(t)
			equal(t, "acks", tt.run(t, p), tt.wantAcks)
			bodies, _ := readAll(t, p)
			if len(bodies) != tt.wantCount {
				t.Fatalf("log holds %v, want %d messages", bodies, tt.wantCount)
			}
		})
	}
}

func TestPartition_GroupOffset(t *testing.T) {
	p, _ := open(t)
	if _, ok, err := p.GroupOffset("g1"); ok || err != nil {
		t.Fatalf("GroupOffset of a new group = %v, %v", ok, err)
	}
	apply(t, p, &store.Command{Op: store.OpCommitOffset, Group: "g1", Offset: 7})
	apply(t, p, &store.Command{Op: store.OpCommitOffset, Group: "g2", Offset: 0})
	apply(t, p, &store.Command{Op: store.OpCommitOffset, Group: "g1", Offset: 9})
	if off, ok, err := p.GroupOffset("g1"); off != 9 || !ok || err != nil {
		t.Fatalf("GroupOffset(g1) = %d, %v, %v; want 9", off, ok, err)
	}
	if off, ok, err := p.GroupOffset("g2"); off != 0 || !ok || err != nil {
		t.Fatalf("GroupOffset(g2) = %d, %v, %v; want 0 (committed)", off, ok, err)
	}
	groups, err := p.Groups()
	equal(t, "Groups", groups, map[string]uint64{"g1": 9, "g2": 0})
	if err != nil {
		t.Fatal(err)
	}
	apply(t, p, &store.Command{Op: store.OpDeleteGroup, Group: "g1"})
	if _, ok, _ := p.GroupOffset("g1"); ok {
		t.Fatal("g1 still has an offset after OpDeleteGroup")
	}
	apply(t, p, &store.Command{Op: store.OpDeleteGroup, Group: "never"}) // no-op
}

func TestPartition_Trim(t *testing.T) {
	// ten messages, one a second from t0; every record has the same size
	setup := func(t *testing.T) *store.Partition {
		p, _ := open(t)
		for i := 0; i < 10; i++ {
			appendAt(t, p, t0+int64(i)*sec, msg(fmt.Sprint(i)))
		}
		return p
	}
	tests := []struct {
		name      string
		cmd       func(st store.Stats) store.Command
		wantCount int
		wantMore  bool
		wantLow   uint64
	}{
		{"KeepAll", func(store.Stats) store.Command {
			return store.Command{Now: t0 + 100*sec}
		}, 0, false, 0},
		{"ByAge", func(store.Stats) store.Command {
			// older than 5s at t0+9.5s: stored before t0+4.5s, offsets 0..4
			return store.Command{Now: t0 + 9*sec + sec/2, MaxAge: 5 * sec}
		}, 5, false, 5},
		{"ByAgeAll", func(store.Stats) store.Command {
			return store.Command{Now: t0 + 100*sec, MaxAge: sec}
		}, 10, false, 10},
		{"ByBytes", func(st store.Stats) store.Command {
			per := st.Bytes / 10
			return store.Command{Now: t0, MaxBytes: 3 * per} // keeps the newest 3
		}, 7, false, 7},
		{"ByBytesBetweenSizes", func(st store.Stats) store.Command {
			per := st.Bytes / 10
			return store.Command{Now: t0, MaxBytes: 3*per + per/2}
		}, 7, false, 7},
		{"Limit", func(store.Stats) store.Command {
			return store.Command{Now: t0 + 100*sec, MaxAge: sec, Limit: 4}
		}, 4, true, 4},
		{"LimitExactlyReached", func(store.Stats) store.Command {
			// 5 to delete, limit 5: done, nothing more to do
			return store.Command{Now: t0 + 9*sec + sec/2, MaxAge: 5 * sec, Limit: 5}
		}, 5, false, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := setup(t)
			before := p.Stats()
			cmd := tt.cmd(before)
			cmd.Op = store.OpTrim
			res := apply(t, p, &cmd)
			if res.Count != tt.wantCount || res.More != tt.wantMore {
				t.Fatalf("Count, More = %d, %v; want %d, %v", res.Count, res.More, tt.wantCount, tt.wantMore)
			}
			st := p.Stats()
			if st.Low != tt.wantLow || st.Next != 10 {
				t.Fatalf("Stats = %+v, want Low %d Next 10", st, tt.wantLow)
			}
			if want := before.Bytes / 10 * int64(10-tt.wantCount); st.Bytes != want {
				t.Fatalf("Bytes = %d, want %d", st.Bytes, want)
			}
			_, offsets := readAll(t, p)
			if len(offsets) != 10-tt.wantCount || (len(offsets) > 0 && offsets[0] != tt.wantLow) {
				t.Fatalf("log holds offsets %v after trimming %d", offsets, tt.wantCount)
			}
			if _, ok, _ := p.Get(tt.wantLow - 1); tt.wantLow > 0 && ok {
				t.Fatalf("Get(%d) still finds a trimmed message", tt.wantLow-1)
			}
			// Appends go on at Next, after trimming everything too.
			equal(t, "next offset", offsetsOf(appendAt(t, p, t0+200*sec, msg("new"))), []uint64{10})
		})
	}
}

func TestPartition_Transactions(t *testing.T) {
	ctx := context.Background()
	prepare := func(t *testing.T, p *store.Partition, txid string, names ...string) {
		t.Helper()
		cmd := &store.Command{Op: store.OpPrepare, Now: t0, TxID: txid, Producer: "node-1"}
		for _, n := range names {
			cmd.Msgs = append(cmd.Msgs, msg(n))
		}
		apply(t, p, cmd)
	}
	decision := func(t *testing.T, p *store.Partition, txid string) store.Decision {
		t.Helper()
		d, err := p.Decision(txid)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	halves := func(t *testing.T, p *store.Partition) []store.HalfTx {
		t.Helper()
		var out []store.HalfTx
		if err := p.HalfTxs(func(h store.HalfTx) bool { out = append(out, h); return true }); err != nil {
			t.Fatal(err)
		}
		return out
	}

	t.Run("PrepareCommit", func(t *testing.T) {
		p, _ := open(t)
		appendAt(t, p, t0, msg("before"))
		prepare(t, p, "tx1", "h1", "h2")
		prepare(t, p, "tx1", "h3") // prepare again in the same transaction
		if bodies, _ := readAll(t, p); len(bodies) != 1 {
			t.Fatalf("half messages visible before commit: %v", bodies)
		}
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx{{TxID: "tx1", Producer: "node-1", FirstSeen: t0, Messages: 3}})
		equal(t, "decision before commit", decision(t, p, "tx1"), store.Undecided)
		if prod, ok, err := p.HalfProducer("tx1"); err != nil || !ok || prod != "node-1" {
			t.Fatalf("HalfProducer(tx1) before commit: %q, %v, %v", prod, ok, err)
		}
		if _, ok, err := p.HalfProducer("tx2"); err != nil || ok {
			t.Fatalf("HalfProducer(tx2), never prepared: %v, %v", ok, err)
		}

		c := apply(t, p, &store.Command{Op: store.OpCommitTx, Now: t0 + sec, TxID: "tx1", Msgs: []store.Message{msg("outbox")}})
		if _, ok, err := p.HalfProducer("tx1"); err != nil || ok {
			t.Fatalf("HalfProducer(tx1) after commit: %v, %v", ok, err)
		}
		equal(t, "commit acks", offsetsOf(c.Acks), []uint64{1, 2, 3, 4})
		if c.Count != 4 || c.Previous != store.Undecided {
			t.Fatalf("commit Count, Previous = %d, %v", c.Count, c.Previous)
		}
		bodies, _ := readAll(t, p)
		equal(t, "log", bodies, []string{"body-before", "body-h1", "body-h2", "body-h3", "body-outbox"})
		equal(t, "HalfTxs after commit", halves(t, p), []store.HalfTx(nil))
		equal(t, "decision", decision(t, p, "tx1"), store.Committed)

		// The first decision wins; later ones change nothing.
		c = apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx1", Msgs: []store.Message{msg("again")}})
		if c.Previous != store.Committed || len(c.Acks) != 0 || c.Count != 0 {
			t.Fatalf("second commit: Previous %v, Acks %v, Count %d", c.Previous, c.Acks, c.Count)
		}
		c = apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: "tx1"})
		if c.Previous != store.Committed {
			t.Fatalf("rollback after commit: Previous %v, want committed", c.Previous)
		}
		_, err := p.Apply(ctx, &store.Command{Op: store.OpPrepare, Now: t0, TxID: "tx1", Msgs: []store.Message{msg("late")}})
		if !errors.Is(err, store.ErrDecided) {
			t.Fatalf("prepare after commit = %v, want ErrDecided", err)
		}
		if bodies2, _ := readAll(t, p); len(bodies2) != len(bodies) {
			t.Fatalf("log changed after the decision: %v", bodies2)
		}
	})

	t.Run("PrepareRollback", func(t *testing.T) {
		p, _ := open(t)
		prepare(t, p, "tx2", "h1", "h2")
		c := apply(t, p, &store.Command{Op: store.OpRollbackTx, Now: t0, TxID: "tx2"})
		if c.Count != 2 || c.Previous != store.Undecided {
			t.Fatalf("rollback Count, Previous = %d, %v; want 2, undecided", c.Count, c.Previous)
		}
		equal(t, "decision", decision(t, p, "tx2"), store.RolledBack)
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx(nil))
		c = apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx2", Msgs: []store.Message{msg("outbox")}})
		if c.Previous != store.RolledBack || len(c.Acks) != 0 {
			t.Fatalf("commit after rollback: Previous %v, Acks %v; want rolled back, none", c.Previous, c.Acks)
		}
		if bodies, _ := readAll(t, p); len(bodies) != 0 {
			t.Fatalf("rolled-back messages visible: %v", bodies)
		}
		c = apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: "tx2"})
		if c.Previous != store.RolledBack || c.Count != 0 {
			t.Fatalf("second rollback: Previous %v, Count %d", c.Previous, c.Count)
		}
		_, err := p.Apply(ctx, &store.Command{Op: store.OpPrepare, Now: t0, TxID: "tx2", Msgs: []store.Message{msg("late")}})
		if !errors.Is(err, store.ErrDecided) {
			t.Fatalf("prepare after rollback = %v, want ErrDecided", err)
		}
		equal(t, "HalfTxs after a refused prepare", halves(t, p), []store.HalfTx(nil))
	})

	t.Run("RollbackUnknown", func(t *testing.T) {
		// A rollback that arrives before the prepare (or instead of it)
		// still decides: a late prepare is refused.
		p, _ := open(t)
		c := apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: "tx3"})
		if c.Count != 0 || c.Previous != store.Undecided {
			t.Fatalf("rollback of an unknown tx: Count %d, Previous %v", c.Count, c.Previous)
		}
		_, err := p.Apply(ctx, &store.Command{Op: store.OpPrepare, Now: t0, TxID: "tx3", Msgs: []store.Message{msg("late")}})
		if !errors.Is(err, store.ErrDecided) {
			t.Fatalf("prepare after rollback = %v, want ErrDecided", err)
		}
	})

	t.Run("OutboxOnly", func(t *testing.T) {
		p, _ := open(t)
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx4", Msgs: []store.Message{msg("a"), msg("b")}})
		equal(t, "acks", offsetsOf(c.Acks), []uint64{0, 1})
		equal(t, "decision", decision(t, p, "tx4"), store.Committed)
	})

	t.Run("TxChecked", func(t *testing.T) {
		p, _ := open(t)
		prepare(t, p, "tx5", "h")
		apply(t, p, &store.Command{Op: store.OpTxChecked, Now: t0 + 10*sec, TxID: "tx5"})
		c := apply(t, p, &store.Command{Op: store.OpTxChecked, Now: t0 + 20*sec, TxID: "tx5"})
		if c.Count != 2 {
			t.Fatalf("Count = %d, want 2 checks", c.Count)
		}
		equal(t, "HalfTxs", halves(t, p), []store.HalfTx{{TxID: "tx5", Producer: "node-1", FirstSeen: t0, LastCheck: t0 + 20*sec, Checks: 2, Messages: 1}})
		c = apply(t, p, &store.Command{Op: store.OpTxChecked, TxID: "unknown"})
		if c.Count != 0 {
			t.Fatalf("check of an unknown tx: Count %d", c.Count)
		}
	})

	t.Run("DecisionTTL", func(t *testing.T) {
		p, _ := open(t)
		apply(t, p, &store.Command{Op: store.OpRollbackTx, Now: t0, TxID: "old"})
		apply(t, p, &store.Command{Op: store.OpCommitTx, Now: t0 + 50*sec, TxID: "new"})
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, DecideTTL: 60 * sec})
		equal(t, "pruned decision", decision(t, p, "old"), store.Undecided)
		equal(t, "kept decision", decision(t, p, "new"), store.Committed)
	})

	t.Run("CommitDelayedHalf", func(t *testing.T) {
		p, _ := open(t)
		m := msg("later")
		m.DeliverAt = t0 + 10*sec
		apply(t, p, &store.Command{Op: store.OpPrepare, Now: t0, TxID: "tx6", Msgs: []store.Message{m}})
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, Now: t0, TxID: "tx6"})
		if len(c.Acks) != 1 || !c.Acks[0].Delayed {
			t.Fatalf("acks = %+v, want one delayed", c.Acks)
		}
		if st := p.Stats(); st.Delayed != 1 || st.Next != 0 {
			t.Fatalf("Stats = %+v, want one delayed message", st)
		}
	})
}

func TestPartition_Delay(t *testing.T) {
	p, _ := open(t)
	at := func(name string, due int64) store.Message {
		m := msg(name)
		m.DeliverAt = due
		return m
	}
	acks := appendAt(t, p, t0,
		at("c", t0+30*sec), at("a1", t0+10*sec), msg("now"), at("b", t0+20*sec), at("a2", t0+10*sec), at("past", t0-sec))
	for i, want := range []bool{true, true, false, true, true, false} {
		if acks[i].Delayed != want {
			t.Fatalf("ack %d = %+v, Delayed want %v", i, acks[i], want)
		}
	}
	equal(t, "immediate offsets", []uint64{acks[2].Offset, acks[5].Offset}, []uint64{0, 1})
	if st := p.Stats(); st.Delayed != 4 || st.Next != 2 {
		t.Fatalf("Stats = %+v, want 4 delayed, Next 2", st)
	}
	if due, ok, err := p.NextDue(); due != t0+10*sec || !ok || err != nil {
		t.Fatalf("NextDue = %d, %v, %v", due, ok, err)
	}

	release := func(now int64, limit int) store.Result {
		return apply(t, p, &store.Command{Op: store.OpRelease, Now: now, Limit: limit})
	}
	if c := release(t0+10*sec-1, 0); c.Count != 0 || c.More {
		t.Fatalf("release before due: Count %d More %v", c.Count, c.More)
	}
	if c := release(t0+20*sec, 2); c.Count != 2 || !c.More {
		t.Fatalf("release with limit: Count %d More %v, want 2, true", c.Count, c.More)
	}
	if c := release(t0+20*sec, 0); c.Count != 1 || c.More {
		t.Fatalf("release the rest due: Count %d More %v, want 1, false", c.Count, c.More)
	}
	bodies, _ := readAll(t, p)
	// by due time, then arrival: a1 and a2 (same due) in send order
	equal(t, "log", bodies, []string{"body-now", "body-past", "body-a1", "body-a2", "body-b"})
	got, _ := p.Read(2, 10, 0, nil)
	if got[0].StoredAt != t0+20*sec {
		t.Fatalf("released StoredAt = %d, want the release time %d", got[0].StoredAt, t0+20*sec)
	}
	if st := p.Stats(); st.Delayed != 1 {
		t.Fatalf("Delayed = %d, want 1", st.Delayed)
	}
	release(t0+time.Hour.Nanoseconds(), 0)
	if _, ok, _ := p.NextDue(); ok {
		t.Fatal("NextDue reports a message after all were released")
	}
	if st := p.Stats(); st.Delayed != 0 || st.Next != 6 {
		t.Fatalf("Stats = %+v, want none delayed, Next 6", st)
	}
}

func TestPartition_SeekTime(t *testing.T) {
	p, _ := open(t)
	for i := 0; i < 5; i++ {
		appendAt(t, p, t0+int64(i)*10*sec, msg(fmt.Sprint(i)))
	}
	for _, tc := range []struct {
		at   int64
		want uint64
	}{
		{0, 0}, {t0, 0}, {t0 + 1, 1}, {t0 + 20*sec, 2}, {t0 + 40*sec, 4}, {t0 + 41*sec, 5},
	} {
		if got, err := p.SeekTime(tc.at); got != tc.want || err != nil {
			t.Errorf("SeekTime(t0%+d) = %d, %v; want %d", tc.at-t0, got, err, tc.want)
		}
	}
	apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 25*sec, MaxAge: 10 * sec}) // drops 0, 1
	if got, err := p.SeekTime(0); got != 2 || err != nil {
		t.Errorf("SeekTime after trim = %d, %v; want 2", got, err)
	}
}

func TestPartition_Reopen(t *testing.T) {
	p, path := open(t)
	delayed := msg("delayed")
	delayed.DeliverAt = t0 + 60*sec
	appendAt(t, p, t0, msg("a"), msg("b"), msg("c"), delayed)
	apply(t, p, &store.Command{Op: store.OpTrim, Now: t0, MaxBytes: 1}) // drops a, b, c
	appendAt(t, p, t0+sec, msg("d"))
	apply(t, p, &store.Command{Op: store.OpCommitOffset, Group: "g", Offset: 4})
	apply(t, p, &store.Command{Op: store.OpPrepare, Now: t0, TxID: "open-tx", Msgs: []store.Message{msg("half")}})
	apply(t, p, &store.Command{Op: store.OpRollbackTx, TxID: "done-tx"})
	apply(t, p, &store.Command{Op: store.OpAppend, Msgs: []store.Message{msg("replicated")}})
	before := p.Stats()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p = openAt(t, path)
	equal(t, "Stats after reopen", p.Stats(), before)
	bodies, offsets := readAll(t, p)
	equal(t, "log", bodies, []string{"body-d", "body-replicated"})
	equal(t, "offsets", offsets, []uint64{3, 4})
	if off, ok, _ := p.GroupOffset("g"); off != 4 || !ok {
		t.Fatalf("GroupOffset = %d, %v", off, ok)
	}
	if due, ok, _ := p.NextDue(); due != t0+60*sec || !ok {
		t.Fatalf("NextDue = %d, %v", due, ok)
	}
	n := 0
	p.HalfTxs(func(h store.HalfTx) bool { n += h.Messages; return true })
	if n != 1 {
		t.Fatalf("half messages after reopen: %d, want 1", n)
	}
	if d, _ := p.Decision("done-tx"); d != store.RolledBack {
		t.Fatalf("decision after reopen: %v", d)
	}
	// Dedup and the next offset survive.
	equal(t, "dedup after reopen", appendAt(t, p, t0+2*sec, msg("d")), []store.Ack{{Offset: 3, Duplicate: true}})
	equal(t, "dedup after reopen", appendAt(t, p, t0+2*sec, msg("replicated")), []store.Ack{{Offset: 4, Duplicate: true}})
	equal(t, "next offset", offsetsOf(appendAt(t, p, t0+2*sec, msg("e"))), []uint64{5})
	// the delayed message still releases, and its ID is still known
	apply(t, p, &store.Command{Op: store.OpRelease, Now: t0 + 60*sec})
	bodies, _ = readAll(t, p)
	equal(t, "log after release", bodies, []string{"body-d", "body-replicated", "body-e", "body-delayed"})
	equal(t, "dedup of the released message", appendAt(t, p, t0+61*sec, delayed), []store.Ack{{Offset: 6, Duplicate: true}})
}

func TestPartition_Close(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.db")
	p, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	appendAt(t, p, t0, msg("a"))
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := context.Background()
	calls := []struct {
		name string
		call func() error
	}{
		{"Apply", func() error {
			_, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b")}})
			return err
		}},
		{"Read", func() error { _, err := p.Read(0, 10, 0, nil); return err }},
		{"Get", func() error { _, _, err := p.Get(0); return err }},
		{"GroupOffset", func() error { _, _, err := p.GroupOffset("g"); return err }},
		{"Groups", func() error { _, err := p.Groups(); return err }},
		{"SeekTime", func() error { _, err := p.SeekTime(0); return err }},
		{"NextDue", func() error { _, _, err := p.NextDue(); return err }},
		{"HalfTxs", func() error { return p.HalfTxs(func(store.HalfTx) bool { return true }) }},
		{"Decision", func() error { _, err := p.Decision("tx"); return err }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			if err := c.call(); !errors.Is(err, store.ErrClosed) {
				t.Fatalf("%s after Close = %v, want ErrClosed", c.name, err)
			}
		})
	}

	t.Run("Concurrent", func(t *testing.T) {
		// Close while senders are queued: each send either lands or
		// returns ErrClosed, and Close waits for the writer.
		p, err := store.Open(filepath.Join(t.TempDir(), "1.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		// A send that Close strands would wait forever: bound it.
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					_, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg(fmt.Sprintf("%d-%d", g, i))}})
					if err != nil {
						errs <- err
						return
					}
					if i == 20 && g == 0 {
						go p.Close()
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if !errors.Is(err, store.ErrClosed) {
				t.Errorf("send during Close = %v, want ErrClosed", err)
			}
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestOpen_FormatVersion(t *testing.T) {
	tests := []struct {
		name    string
		version []byte
		want    error
	}{
		{"Current", be64(store.FormatVersion), nil},
		{"Newer", be64(store.FormatVersion + 1), store.ErrFormat},
		{"Zero", be64(0), store.ErrFormat},
		{"Garbled", []byte("v1"), store.ErrFormat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := rewritten(t, func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("meta")).Put([]byte("version"), tt.version)
			})
			p, err := store.Open(path, store.Options{})
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Open = %v", err)
				}
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				if err == nil {
					p.Close()
				}
				t.Fatalf("Open = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestPartition_Corrupt(t *testing.T) {
	setup := func(t *testing.T) (*store.Partition, string) {
		p, path := open(t)
		for i := 0; i < 6; i++ {
			appendAt(t, p, t0+int64(i)*sec, msg(fmt.Sprint(i)))
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		return p, path
	}

	// A key of the log renamed by a flipped byte: the record is missing
	// from the range the state says the log holds. Get reported it as not
	// stored (ok false, no error), so ReadMessage said ErrNoMessage for an
	// acked message.
	t.Run("MissingRecord", func(t *testing.T) {
		_, path := setup(t)
		updateBolt(t, path, func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("log"))
			v := bytes.Clone(b.Get(be64(5)))
			if err := b.Delete(be64(5)); err != nil {
				return err
			}
			return b.Put(append(be64(5), 0), v) // a key no offset has
		})
		p := openAt(t, path)
		if m, ok, err := p.Get(5); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("Get(5) of a missing record = %q, %v, %v; want ErrCorrupt", m.Body, ok, err)
		}
		if m, ok, err := p.Get(4); err != nil || !ok || string(m.Body) != "body-4" {
			t.Fatalf("Get(4) next to the damage = %q, %v, %v", m.Body, ok, err)
		}
	})

	t.Run("Read", func(t *testing.T) {
		_, path := setup(t)
		flipInBucket(t, path, "log", be64(3), "body-3")
		p := openAt(t, path)
		if _, _, err := p.Get(3); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("Get(3) = %v, want ErrCorrupt", err)
		}
		for _, off := range []uint64{2, 4} {
			if m, ok, err := p.Get(off); err != nil || !ok || string(m.Body) != fmt.Sprintf("body-%d", off) {
				t.Fatalf("Get(%d) next to the damage = %q, %v, %v", off, m.Body, ok, err)
			}
		}
		// Read returns what comes before the damaged record without an
		// error, and the error when it starts there.
		got, err := p.Read(0, 10, 0, nil)
		if err != nil || len(got) != 3 {
			t.Fatalf("Read(0) = %d messages, %v; want 3, nil", len(got), err)
		}
		got, err = p.Read(3, 10, 0, got[:0])
		if !errors.Is(err, store.ErrCorrupt) || len(got) != 0 {
			t.Fatalf("Read(3) = %d messages, %v; want 0, ErrCorrupt", len(got), err)
		}
		if got, err := p.Read(4, 10, 0, nil); err != nil || len(got) != 2 {
			t.Fatalf("Read(4) = %d messages, %v; want 2", len(got), err)
		}
		if _, err := p.SeekTime(t0 + 3*sec); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("SeekTime onto the damaged record = %v, want ErrCorrupt", err)
		}
	})

	t.Run("MovedRecord", func(t *testing.T) {
		// A record copied under another key fails its check: the CRC covers
		// the key, so a record is never read at the wrong offset.
		_, path := setup(t)
		updateBolt(t, path, func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("log"))
			return b.Put(be64(1), bytes.Clone(b.Get(be64(2))))
		})
		p := openAt(t, path)
		if _, _, err := p.Get(1); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("Get of a moved record = %v, want ErrCorrupt", err)
		}
	})

	t.Run("TrimOverDamage", func(t *testing.T) {
		// Retention neither stops at nor fails on a damaged record: a
		// failed trim would fail every send batched with it.
		_, path := setup(t)
		flipInBucket(t, path, "log", be64(0), "body-0")
		flipInBucket(t, path, "log", be64(2), "body-2")
		p := openAt(t, path)
		// By age, a damaged record is as old as the intact one after it at
		// most: 0 goes (1 is old enough), 2 stays while 3 is too young.
		c := apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 4*sec, MaxAge: sec + sec/2})
		if c.Count != 2 || p.Stats().Low != 2 {
			t.Fatalf("trim by age over damage deleted %d, Low %d; want 2, 2", c.Count, p.Stats().Low)
		}
		c = apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 5*sec, MaxAge: sec + sec/2})
		if c.Count != 2 || p.Stats().Low != 4 {
			t.Fatalf("second trim deleted %d, Low %d; want 2, 4", c.Count, p.Stats().Low)
		}
		// the dedup entries of the damaged records went with them, and
		// only theirs
		acks := appendAt(t, p, t0+6*sec, msg("0"), msg("2"), msg("4"))
		equal(t, "acks", acks, []store.Ack{{Offset: 6}, {Offset: 7}, {Offset: 4, Duplicate: true}})
	})

	t.Run("TrimDamagedTail", func(t *testing.T) {
		// With no intact record after it, a damaged record's age is
		// unknown: it is kept by age, and still deleted by size.
		_, path := setup(t)
		flipInBucket(t, path, "log", be64(5), "body-5")
		p := openAt(t, path)
		c := apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, MaxAge: sec})
		if c.Count != 5 || p.Stats().Low != 5 {
			t.Fatalf("trim by age deleted %d, Low %d; want 5, 5", c.Count, p.Stats().Low)
		}
		c = apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, MaxBytes: 1})
		if c.Count != 1 || p.Stats().Low != 6 || p.Stats().Bytes != 0 {
			t.Fatalf("trim by size deleted %d, Stats %+v; want 1, empty", c.Count, p.Stats())
		}
		equal(t, "acks", appendAt(t, p, t0+100*sec, msg("5")), []store.Ack{{Offset: 6}})
	})

	t.Run("ReleaseDamaged", func(t *testing.T) {
		// A damaged delayed record is not dropped: it moves into the log,
		// where reading it reports ErrCorrupt at its offset.
		p, path := open(t)
		a, b := msg("a"), msg("b")
		a.DeliverAt, b.DeliverAt = t0+sec, t0+2*sec
		appendAt(t, p, t0, a, b)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		var key []byte
		updateBolt(t, path, func(tx *bolt.Tx) error {
			key, _ = tx.Bucket([]byte("delay")).Cursor().First()
			key = bytes.Clone(key)
			return nil
		})
		flipInBucket(t, path, "delay", key, "body-a")
		p = openAt(t, path)
		c := apply(t, p, &store.Command{Op: store.OpRelease, Now: t0 + 2*sec})
		if c.Count != 2 || p.Stats().Delayed != 0 || p.Stats().Next != 2 {
			t.Fatalf("release over damage moved %d, Stats %+v; want 2, none delayed", c.Count, p.Stats())
		}
		if _, _, err := p.Get(0); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("Get(0) of the damaged released record = %v, want ErrCorrupt", err)
		}
		if m, _, err := p.Get(1); err != nil || string(m.Body) != "body-b" {
			t.Fatalf("Get(1) = %q, %v", m.Body, err)
		}
	})
}

// TestPartition_TrimConsumed: OpTrim with Consumed deletes the head every
// group has committed past once out of the dedup window, and nothing while
// the partition has no group or one group has not moved.
func TestPartition_TrimConsumed(t *testing.T) {
	tests := []struct {
		name      string
		groups    map[string]uint64
		cmd       store.Command
		wantCount int
		wantMore  bool
	}{
		{"NoGroup", nil, store.Command{}, 0, false},
		{"LowestGroup", map[string]uint64{"g1": 6, "g2": 3, "b@i": 9}, store.Command{}, 3, false},
		{"GroupAtZero", map[string]uint64{"g1": 6, "g2": 0}, store.Command{}, 0, false},
		{"PastTheEnd", map[string]uint64{"g1": 50}, store.Command{}, 10, false},
		{"Limit", map[string]uint64{"g1": 6}, store.Command{Limit: 2}, 2, true},
		// Stored before t0+4.5s: out of the dedup window (offsets 0..4).
		{"DedupWindow", map[string]uint64{"g1": 8}, store.Command{Now: t0 + 9*sec + sec/2, DedupTTL: 5 * sec}, 5, false},
		{"InDedupWindow", map[string]uint64{"g1": 8}, store.Command{Now: t0 + 9*sec + sec/2, DedupTTL: 10 * sec}, 0, false},
		{"AgeFirst", map[string]uint64{"g1": 3}, store.Command{Now: t0 + 9*sec + sec/2, MaxAge: 5 * sec}, 5, false},
		{"ConsumedPastAge", map[string]uint64{"g1": 8}, store.Command{Now: t0 + 9*sec + sec/2, MaxAge: 5 * sec}, 8, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := open(t)
			for i := 0; i < 10; i++ {
				appendAt(t, p, t0+int64(i)*sec, msg(fmt.Sprint(i)))
			}
			for g, off := range tt.groups {
				apply(t, p, &store.Command{Op: store.OpCommitOffset, Now: t0, Group: g, Offset: off})
			}
			cmd := tt.cmd
			cmd.Op, cmd.Consumed = store.OpTrim, true
			if cmd.Now == 0 {
				cmd.Now = t0 + 100*sec
			}
			res := apply(t, p, &cmd)
			if res.Count != tt.wantCount || res.More != tt.wantMore {
				t.Fatalf("Count, More = %d, %v; want %d, %v", res.Count, res.More, tt.wantCount, tt.wantMore)
			}
			if st := p.Stats(); st.Low != uint64(tt.wantCount) || st.Next != 10 {
				t.Fatalf("Stats = %+v, want Low %d Next 10", st, tt.wantCount)
			}
			if _, offsets := readAll(t, p); len(offsets) != 10-tt.wantCount {
				t.Fatalf("log holds %v after deleting %d", offsets, tt.wantCount)
			}
		})
	}
	t.Run("OnlyTrim", func(t *testing.T) {
		p, _ := open(t)
		if _, err := p.Apply(t.Context(), &store.Command{Op: store.OpRelease, Now: t0, Consumed: true}); !errors.Is(err, store.ErrBadCommand) {
			t.Fatalf("OpRelease with Consumed: %v, want ErrBadCommand", err)
		}
	})
}

// TestOpen_NewFileStaysSmall: a partition file is mapped ahead of its data
// (openBolt's boltMapSize) but grows in small steps. bbolt sizes a file
// whose mapping is within its AllocSize to the whole mapping, which made
// every new partition file 16 MiB or more in an earlier attempt.
func TestOpen_NewFileStaysSmall(t *testing.T) {
	p, path := open(t)
	for i := range 100 {
		appendAt(t, p, t0+int64(i), msg(fmt.Sprint(i)))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 2<<20 {
		t.Fatalf("a file holding 100 small messages is %d bytes", fi.Size())
	}
	p = openAt(t, path)
	if bodies, _ := readAll(t, p); len(bodies) != 100 {
		t.Fatalf("reopened: %d messages, want 100", len(bodies))
	}
}

// TestOpen_FormatOne: a file of format 1 (state and half transactions as
// msgpack maps keyed by Go field names) opens, keeps its data and is
// upgraded; unknown fields are damage, not zeros.
func TestOpen_FormatOne(t *testing.T) {
	type legacyHalf struct {
		Producer  string   `msgpack:"p"`
		FirstSeen int64    `msgpack:"f"`
		LastCheck int64    `msgpack:"l"`
		Checks    int      `msgpack:"c"`
		Records   [][]byte `msgpack:"r"`
	}
	build := func(t *testing.T, state any) string {
		// Write the file with the current code, then rewrite meta and the
		// half bucket as format 1 had them.
		p, path := open(t)
		appendAt(t, p, t0, msg("a"), msg("b"))
		apply(t, p, &store.Command{Op: store.OpPrepare, TxID: "tx", Producer: "node", Msgs: []store.Message{msg("h")}})
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = db.Update(func(tx *bolt.Tx) error {
			meta := tx.Bucket([]byte("meta"))
			meta.Put([]byte("version"), be64(1))
			s, _ := msgpack.Marshal(state)
			meta.Put([]byte("state"), s)
			var recs [][]byte
			p2 := tx.Bucket([]byte("half"))
			// the record inside stays as it is: its layout did not change
			store.HalfRecords(p2.Get([]byte("tx")), func(r []byte) { recs = append(recs, bytes.Clone(r)) })
			h, _ := msgpack.Marshal(legacyHalf{Producer: "node", FirstSeen: t0, Records: recs})
			return p2.Put([]byte("tx"), h)
		})
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
	type v1State struct {
		Next, Low  uint64
		Bytes      int64
		DedupLow   uint64
		Applied    uint64
		LastStored int64
		DelaySeq   uint64
		Delayed    int64
	}
	t.Run("Upgrades", func(t *testing.T) {
		path := build(t, v1State{Next: 2, Bytes: 100, LastStored: t0, Applied: 3})
		p := openAt(t, path)
		bodies, _ := readAll(t, p)
		equal(t, "log", bodies, []string{"body-a", "body-b"})
		equal(t, "next", offsetsOf(appendAt(t, p, t0, msg("c"))), []uint64{2})
		var half []store.HalfTx
		p.HalfTxs(func(h store.HalfTx) bool { half = append(half, h); return true })
		equal(t, "half", half, []store.HalfTx{{TxID: "tx", Producer: "node", FirstSeen: t0, Messages: 1}})
		c := apply(t, p, &store.Command{Op: store.OpCommitTx, TxID: "tx"})
		equal(t, "commit", offsetsOf(c.Acks), []uint64{3})
	})
	t.Run("RenamedField", func(t *testing.T) {
		path := build(t, map[string]any{"NextOffset": 2, "Low": 0})
		_, err := store.Open(path, store.Options{})
		if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Fatalf("state with an unknown field: %v, want ErrCorrupt naming the file", err)
		}
	})
}
