package store_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
)

// TestPartition_FreshIDIsAnInput: FreshID travels with the command, so what
// a send is acknowledged with is what the file holds, also when a sender
// marks an ID fresh that the dedup index knows (the old fast path acked a
// new offset, the materializer found a duplicate, and the partition refused
// every later send).
func TestPartition_FreshIDIsAnInput(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNode(t, dir)
	appendAt(t, n.p, t0, msg("a"))
	fresh := msg("a")
	fresh.FreshID = true
	acks := appendAt(t, n.p, t0, fresh)
	equal(t, "fresh ack", acks, []store.Ack{{Offset: 1}})
	acks = appendAt(t, n.p, t0, msg("a")) // a resend dedups to the newest copy
	equal(t, "resend", acks, []store.Ack{{Offset: 1, Duplicate: true}})
	equal(t, "later send", offsetsOf(appendAt(t, n.p, t0, msg("b"))), []uint64{2})
	n.close(t)
	r := mustWALNode(t, dir)
	bodies, offsets := readAll(t, r.p)
	equal(t, "bodies", bodies, []string{"body-a", "body-a", "body-b"})
	equal(t, "offsets", offsets, []uint64{0, 1, 2})
}

// TestPartition_ApplyBatch: the batch form applies commands in order in one
// batch; a command's own error fails that command only.
func TestPartition_ApplyBatch(t *testing.T) {
	p, _ := open(t)
	cmds := []*store.Command{
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}},
		{Op: store.OpCommitOffset, Now: t0}, // no group
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("b"), msg("a")}},
		{Op: store.OpAppend, Msgs: []store.Message{msg("c")}}, // no Now
		{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 2},
	}
	res, errs, err := p.ApplyBatch(context.Background(), cmds)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, store.ErrBadCommand, nil, store.ErrBadCommand, nil} {
		if !errors.Is(errs[i], want) || (want == nil) != (errs[i] == nil) {
			t.Fatalf("command %d: %v, want %v", i, errs[i], want)
		}
	}
	equal(t, "acks", res[2].Acks, []store.Ack{{Offset: 1}, {Offset: 0, Duplicate: true}})
	if off, ok, _ := p.GroupOffset("g"); !ok || off != 2 {
		t.Fatalf("group offset %d %v", off, ok)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := p.ApplyBatch(ctx, cmds); !errors.Is(err, context.Canceled) {
		t.Fatalf("ApplyBatch with an ended ctx: %v", err)
	}
	bodies, _ := readAll(t, p)
	equal(t, "log", bodies, []string{"body-a", "body-b"})
}

// TestPartition_StateOnlyChangeKept: a command whose only effect is on the
// partition's state (a dedup prune over records without an ID advances
// DedupLow and deletes nothing) is kept, alone as well as batched with
// others: two partitions given the same commands end in the same state.
// This broke when such a command was dropped as an empty batch when it
// came alone.
func TestPartition_StateOnlyChangeKept(t *testing.T) {
	ms := int64(time.Millisecond)
	cmds := []*store.Command{
		{Op: store.OpAppend, Now: t0 + 4*ms, Msgs: []store.Message{{Body: []byte("no id")}}},
		{Op: store.OpTrim, Now: t0 + 12*ms, DedupTTL: 2 * ms},
	}
	dir := t.TempDir()
	_, _, alone, err := simReference(dir, cmds, len(cmds))
	if err != nil {
		t.Fatal(err)
	}
	p, err := store.Open(filepath.Join(dir, "batched.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, _, err := p.ApplyBatch(context.Background(), append(cmds, &store.Command{Op: store.OpCommitOffset, Now: t0 + 12*ms, Group: "g"})); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(context.Background(), &store.Command{Op: store.OpDeleteGroup, Now: t0 + 12*ms, Group: "g"}); err != nil {
		t.Fatal(err)
	}
	batched, err := store.Dump(p)
	if err != nil {
		t.Fatal(err)
	}
	if alone[0] != batched {
		t.Fatalf("the same commands, alone and batched, end in different states:\n%s", dumpDiff(alone[0], batched))
	}
	if !strings.Contains(batched, "DedupLow:1") {
		t.Fatalf("the prune did not advance DedupLow:\n%s", batched)
	}
}
